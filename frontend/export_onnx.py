"""`dsv41c compile ... --emit onnx FILE`: the target-independent IR of @prefill as one ONNX model.

Which IR: the module after the pipeline's target-independent passes (`passes/pipeline.py`,
everything before `specialize-kernels`: `target_independent_specs`), i.e. the IR every target
starts from, traced again for the compile's config, kv-quant, activation dtype and --max-context.
@prefill is the graph; @decode is the same graph at T = 1, so one model serves both.

Algorithm: one forward walk over the function's ops (`Graph`). Every IR value gets the ONNX name
the IR printer gives it (`plan.ir`'s names), arguments are graph inputs (the checkpoint's tensor
names, the state buffers, `ids`), the returned values are graph outputs named after the module's
`outputs` attribute (`logits`, and `next.<state buffer>` for each state buffer's value after the
step). An `aten.*` op becomes standard ONNX nodes (`export_onnx_aten.py`, which lists the mapping);
a `dsv41.*` op becomes one node of the custom domain `dsv41` whose definition is an ONNX function
in the model's `functions`, written in standard ONNX ops (`export_onnx_dsv41.py`: one function per
op, and one more, told apart by the `overload` field, for each attribute set that changes its body).
onnxruntime inlines the functions, so it runs the model as it is. Symbolic dims (`T`, and the fresh
symbols of data-dependent ops such as compressor_step's emitted rows) are read at run time with
Shape from the first value that has them, and shapes written with them (view sizes, slice bounds,
arange ends) are computed from those.

Types: f32/f64/bf16/f16/i8/u8/i32/i64/bool as themselves; fp8e4m3 codes, e8m0 scales and packed
fp4e2m1x2 bytes as UINT8 (opset 21's Slice, Concat, Gather and ScatterND take no FLOAT8E4M3FN,
ONNX's FLOAT8E8M0 needs opset 24 and its FLOAT4E2M1 counts unpacked elements); the functions
decode and encode them in arithmetic and lookup tables (`export_onnx_kv.py`).

Output: FILE, written under a temporary name beside it and renamed into place (an existing file
is replaced; a directory is refused before the compile, as is a path whose folder cannot be written).
Known gaps:
- kv-quant on: the packed KV functions equal the eager ops on the same inputs, but onnxruntime's
  float32 arithmetic differs from torch's in the last bits and a value on a rounding boundary takes
  the neighbouring code, so the logits follow the eager reference only loosely (tiny: rel-L2 about
  3e-2 with kv-quant on, 2e-6 off); compare with --kv-quant off.
- float32 activations only: with bfloat16 ones the checker rejects the model (opset 21's Einsum has
  no bfloat16 in its type constraint); refused before the compile (`exports.check_emits`).
- the weights are graph inputs, not initializers (the model is the program; the checkpoint is fed
  by name, as the IR binds it); `aten.index` with several index tensors and the ATen ops outside the
  table are refused, naming the op.
- state appends past the compiled capacity fail in ScatterND's bounds check, not with the eager
  op's message.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dsv41c.frontend.export_mlir import ExportError
from dsv41c.frontend.export_onnx_aten import ATEN
from dsv41c.frontend.export_onnx_dsv41 import NOT_WRITTEN, Body
from dsv41c.frontend.export_onnx_kv import FUNCS
from dsv41c.frontend.onnx_builder import DOMAIN, IR_VERSION, NP_DTYPE, OPSET, Nodes, onnx_dtype
from dsv41c.ir.core import Value
from dsv41c.ir.printer import function_namer
from dsv41c.ir.symbolic import FloorDiv, SymExpr
from dsv41c.ir.types import TensorType

NEXT = "next."  # graph output name of a state buffer after the step: next.<buffer>


class OnnxDim:
    """A `?` dim of an IR attribute: the ONNX name of the index operand that fills it."""

    def __init__(self, name: str):
        self.name = name


def check_onnx_path(path: str) -> None:
    """FILE must be a file path whose folder exists or can be made, and not a directory."""
    if os.path.isdir(path):
        raise ExportError(f"--emit onnx {path}: is a directory; give a file path, "
                          f"e.g. {os.path.join(path, 'model.onnx')}")
    probe = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:  # the nearest existing folder must take a new file (os.access says yes on /proc and read-only mounts)
        fd, tmp = tempfile.mkstemp(prefix=".dsv41c-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ExportError(f"--emit onnx {path}: cannot write into {probe} ({e.strerror or e})") from None


class Graph:
    """The ONNX nodes of one IR function; `functions` collects the domain ops' FunctionProtos."""

    def __init__(self, f):
        self.f, self.n = f, Nodes(prefix="x:")
        self.namer = function_namer(f)
        self.names, self.syms, self.lazy = {}, {}, {}
        self.functions, self.variants, self.calls, self.refused = {}, {}, {}, {}

    # ------------------------------------------------------------------ values and dims
    def name_of(self, v: Value) -> str:
        return self.namer(v).lstrip("%")

    def v(self, x: Value) -> str:
        return self.names[id(x)]

    @staticmethod
    def is_value(x) -> bool:
        return isinstance(x, Value)

    @staticmethod
    def dtype(x: Value) -> int:
        return onnx_dtype(x.type.dtype) if isinstance(x.type, TensorType) else 7  # an index is an INT64 scalar

    def bind(self, x: Value, name: str):
        self.names[id(x)] = name
        if isinstance(x.type, TensorType):
            for i, d in enumerate(x.type.shape):
                if isinstance(d, SymExpr) and len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1 \
                        and isinstance(d.terms[0][0][0], str):
                    s = d.terms[0][0][0]
                    if s not in self.syms and s not in self.lazy:
                        self.lazy[s] = (name, i)

    def symbol(self, s: str) -> str:
        if s not in self.syms:
            if s not in self.lazy:
                raise ExportError(f"--emit onnx: symbol {s} is used before any value of @{self.f.name} has it as a dim")
            name, i = self.lazy[s]
            self.syms[s] = self.n.dim(name, i)
        return self.syms[s]

    def dim(self, d) -> str:
        """A Dim (int, SymExpr, `?`) as a 1-d INT64 [1]."""
        n = self.n
        if isinstance(d, OnnxDim):
            return n.op("Reshape", n.cast(d.name, 7), n.i64(1))
        if isinstance(d, bool) or not isinstance(d, (int, SymExpr)):
            raise ExportError(f"--emit onnx: {d!r} is not a dimension")
        if isinstance(d, int):
            return n.i64(d)
        total = None
        for mono, c in d.terms:
            term = n.i64(c) if (not mono or c != 1) else None
            for atom in mono:
                x = self.symbol(atom) if isinstance(atom, str) else \
                    n.op("Div", self.dim(atom.num), n.i64(atom.den)) if isinstance(atom, FloorDiv) else None
                term = x if term is None else n.op("Mul", term, x)
            total = term if total is None else n.op("Add", total, term)
        return total

    def shape_of(self, x: Value) -> str:
        shape = x.type.shape
        if all(isinstance(d, int) for d in shape):
            return self.n.const(list(shape), 7)
        return self.n.op("Concat", *[self.dim(d) for d in shape], axis=0)

    def operand(self, x, t: int) -> str:
        """A Value cast to t, or a scalar attribute (number or Dim) as a 0-d constant of t."""
        if isinstance(x, Value):
            return self.n.cast(self.v(x), t, self.dtype(x))
        if isinstance(x, (SymExpr, OnnxDim)):
            return self.n.cast(self.n.squeeze0(self.dim(x)), t, 7)
        return self.n.scalar(x, t)

    @staticmethod
    def tensor_attr(value, t: int):
        return numpy_helper.from_array(np.array([value], dtype=NP_DTYPE[t]), "value")

    def unsupported(self, op, why: str) -> ExportError:
        return ExportError(f"--emit onnx: {op.name} at {op.loc or '?'}: {why}")

    # ------------------------------------------------------------------ ops
    def convert(self):
        from dsv41c.ir.ops_runtime import effective

        for a in self.f.args:
            self.bind(a, self.name_of(a))
        for op in self.f.ops:
            opdef, attrs = effective(op.name, op.attrs)
            args, dyn = opdef.bind(op.operands, attrs)
            if dyn:
                attrs = opdef.resolve_dyn(attrs, [OnnxDim(self.v(v)) for v in dyn])
                args.update({k: v for k, v in attrs.items() if k in args})
            if op.name in ATEN:
                start = len(self.n.nodes)
                outs = [self._rename(o, self.name_of(r), start) for o, r in zip(ATEN[op.name](self, op, args),
                                                                                 op.results)]
            elif op.name in FUNCS:
                outs = self.call(op, opdef, args)
            else:
                self.refused[op.name] = self.refused.get(op.name, 0) + 1
                continue
            for r, o in zip(op.results, outs):
                self.bind(r, o)
        if self.refused:
            raise ExportError("--emit onnx: no ONNX form for " + "; ".join(
                f"{k} (x{c}): {NOT_WRITTEN.get(k, 'not in the op table (export_onnx_aten.py, export_onnx_dsv41.py)')}"
                for k, c in sorted(self.refused.items())))

    def _rename(self, o: str, name: str, start: int) -> str:
        """Give the node (made since `start`) that produces o the IR value's name; an alias (o made before, or
        a shared constant) keeps its own."""
        if o in self.n._consts.values() or name in self.names.values():
            return o
        for node in self.n.nodes[start:]:
            for seq in (node.output, node.input):
                for i, x in enumerate(seq):
                    if x == o:
                        seq[i] = name
        return name if any(name in node.output for node in self.n.nodes[start:]) else o

    def call(self, op, opdef, a) -> list:
        body, specialize = FUNCS[op.name]
        formal, actual = [], []
        for arg in opdef.schema.args:
            v = a.get(arg.name)
            if isinstance(v, Value):
                formal.append(arg.name)
                actual.append(v)
            elif isinstance(v, list) and v and all(isinstance(x, Value) for x in v):
                for i, x in enumerate(v):
                    formal.append(f"e{i // 3}_w{i % 3 + 1}" if arg.name == "experts" else f"{arg.name}{i}")
                    actual.append(x)
        attrs = {}
        for k, v in dict.items(a):
            if k == "name" or isinstance(v, Value) or (isinstance(v, list) and any(isinstance(x, Value) for x in v)):
                continue  # operands, and the state buffer's name (it changes no arithmetic)
            attrs[k] = list(v) if isinstance(v, tuple) else v
        static = specialize(op, a) if specialize else {}
        dtypes = {nm: onnx_dtype(x.type.dtype) for nm, x in zip(formal, actual)}
        out_dtypes = [onnx_dtype(r.type.dtype) for r in op.results]
        key = (op.name, tuple(dtypes.items()), repr(sorted((k, repr(v)) for k, v in attrs.items())),
               tuple(sorted(static.items())), tuple(out_dtypes))
        if key not in self.functions:
            self.functions[key] = self._function(op, body, formal, dtypes, attrs, out_dtypes, static)
        fp = self.functions[key]
        self.calls[op.name] = self.calls.get(op.name, 0) + 1
        outs = [self.name_of(r) for r in op.results]
        self.n.op(fp.name, *[self.v(x) for x in actual], out_names=outs, domain=DOMAIN, overload=fp.overload)
        return outs

    def _function(self, op, body, formal, dtypes, attrs, out_dtypes, static):
        short = op.name.split(".", 1)[1]
        variants = self.variants.setdefault(short, [])
        n = Nodes()
        outs = body(Body(n, dtypes, attrs, out_dtypes, static))
        desc = ", ".join(f"{k} = {v}" for k, v in sorted({**attrs, **static}.items()))
        fp = helper.make_function(DOMAIN, short, formal, outs, n.nodes, [helper.make_opsetid("", OPSET)],
                                  doc_string=f"{op.name} {{{desc}}}; inputs: " +
                                  ", ".join(f"{k}: {onnx.TensorProto.DataType.Name(t)}" for k, t in dtypes.items()))
        fp.overload = "" if not variants else f"v{len(variants) + 1}"
        variants.append(fp.overload)
        return fp


def _value_info(name: str, t) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, onnx_dtype(t.dtype), [d if isinstance(d, int) else str(d)
                                                                     for d in t.shape])


def to_onnx(module, function: str = "prefill") -> tuple[onnx.ModelProto, dict]:
    """-> (the ONNX model of module's @function, a report: node counts, functions per domain op)."""
    f = module.functions[function]
    g = Graph(f)
    g.convert()
    out_names = list(module.attrs.get("outputs") or [f"out{i}" for i in range(len(f.returns))])
    inputs = {a.name for a in f.args}
    outputs = []
    for i, (v, t) in enumerate(zip(f.returns, f.result_types)):
        name = out_names[i] if i < len(out_names) else f"out{i}"
        name = NEXT + name if name in inputs else name
        g.n.op("Identity", g.v(v), out_names=[name])
        outputs.append(_value_info(name, t))
    graph = helper.make_graph(g.n.nodes, f"dsv41c_{function}", [_value_info(g.name_of(a), a.type) for a in f.args],
                              outputs, doc_string=f"dsv41c @{function}, config hash {module.attrs.get('config_hash')}")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                              functions=list(g.functions.values()), producer_name="dsv41c", ir_version=IR_VERSION)
    funcs = {}
    for fp in g.functions.values():
        funcs.setdefault(f"{DOMAIN}.{fp.name}", []).append(fp.overload or "")
    report = {"function": function, "nodes": len(g.n.nodes), "inputs": len(f.args), "outputs": len(outputs),
              "domain_ops": dict(sorted(g.calls.items())), "functions": dict(sorted(funcs.items())),
              "not_written": dict(sorted(NOT_WRITTEN.items()))}
    return model, report


def target_independent_specs(ced_split: bool = False) -> list:
    """The pipeline's entries before the first target-dependent one (`specialize-kernels`)."""
    from dsv41c.passes.pipeline import pipeline_specs

    specs = pipeline_specs("cpu", 0, ced_split)
    return specs[:next(i for i, s in enumerate(specs) if s.startswith("specialize-kernels"))]


def target_independent_ir(cfg, kv_quant: bool = True, dtype: str = "float32", max_context: int | None = None):
    """cfg traced and run through the pipeline's target-independent passes."""
    import torch

    from dsv41c.frontend.trace import trace
    from dsv41c.passes.manager import PassManager
    from dsv41c.passes.pipeline import build_pipeline

    module, _ = trace(cfg, kv_quant=kv_quant, dtype=getattr(torch, dtype), progress=None, max_context=max_context)
    return PassManager(build_pipeline(target_independent_specs())).run(module).module


def emit_onnx(cfg, path: str, kv_quant: bool = True, dtype: str = "float32", max_context: int | None = None,
              log=None) -> dict:
    """Write cfg's target-independent @prefill as an ONNX model at path; returns the report."""
    check_onnx_path(path)
    model, report = to_onnx(target_independent_ir(cfg, kv_quant, dtype, max_context))
    out = os.path.abspath(path)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.tmp-", dir=os.path.dirname(out))
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is private; the model is an ordinary output
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    report["bytes"] = os.path.getsize(out)
    if log is not None:
        print(f"  onnx: {report['nodes']} nodes, {len(report['functions'])} dsv41 functions "
              f"({', '.join(k.split('.', 1)[1] for k in report['functions'])})", file=log, flush=True)
    return report
