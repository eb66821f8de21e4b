"""Tracing: the serving step -> `ir.Module` with `@prefill` (chunk of T tokens) and `@decode`.

    module, info = trace(cfg, kv_quant=True)        # a config is enough: no weights are read

Algorithm ("export each distinct piece once, stamp it per layer"):
1. `frontend/step.py: serve_step` walks the layer plan and calls segments
   (`frontend/segments.py`); here its `call` STAMPS instead of computing.
2. The first time a segment is called it is exported with `torch.export` (non-strict),
   on fake example inputs (FakeTensorMode: nothing is allocated, so the `full` preset
   traces from its config alone), with the token dim `T` and every cache-length dim
   dynamic, and converted to an IR template function (`export_ir.py`).
3. Stamping copies the template's ops into the function being built: template argument
   dims are unified with the actual values' dims (T, N20, N20+n20, ...), weights become
   function arguments named `<prefix><local name>` = the checkpoint names
   (`layers.20.attn.wq_a.weight`), locations get the prefix (`layers.20.attn.indexer`), and a
   data-dependent size of the template (the compressor's emitted entries) gets a fresh
   symbol per layer (`n20`).
4. `@decode` is the same orchestration stamped with `ids: i64[1]`: unification binds T = 1
   everywhere (the `fold-shapes{bind="T=1"}` specialization, done while stamping), so it
   reuses the prefill exports and costs no extra export.
Cost controls: the MoE segment is exported with 2 stand-in experts and stamped with all
of them (export time grows with the argument count: 1152 expert matrices per layer in
`full`); exports are cached in-process per (config hash, kv_quant, dtype, segment key), so
a second compile of the same config in one process only re-converts and re-stamps; the
fake-tensor dispatch cache is switched off during export (with symbolic shapes it costs
more than it saves here).
Progress: a line per exported segment on `progress` (stderr); where that is a terminal, a bar
above them counts the layers stamped, both functions' (`dsv41c/progress.py`).

Function signature (both functions): `ids`, every `state.*` tensor of `step.new_state`
(placement = "persistent"; fixed-capacity buffers: the caches hold ceil(max_context / ratio)
rows, module attribute `max_context`), then the weights in first-use order. The state writes'
`name` attribute is stamped with the buffer's state name (`comp_kv` -> `state.comp_kv.2`). Results: logits [T, vocab] then the new state in the same order as the
state arguments; module attribute `outputs` names them.
Known gaps: decode is the prefill graph specialized at T = 1, not a separate static-shape
export (which would double the export time); DSpark is not traced.
"""
from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field

import torch

from dsv41c import formats
from dsv41c.frontend.export_ir import TraceError, convert
from dsv41c.frontend.inventory import expected_tensors
from dsv41c.frontend.layer_plan import plan_attr
from dsv41c.frontend.segments import Ffn, StepModel
from dsv41c.frontend.step import new_state, serve_step
from dsv41c.ir.core import Function, Module, Op
from dsv41c.ir.symbolic import SymExpr, subs_attr, sym
from dsv41c.ir.types import TensorType, bf16, dtype_from_torch, e8m0, f32, fp4e2m1x2, fp8e4m3, i64
from dsv41c.progress import NoBar, progress_bar

_EXPORTS: dict = {}  # in-process cache: (config hash, kv_quant, dtype, max_context, segment key) -> (program, dims)
_STATE_WRITES = ("dsv41.cache_append", "dsv41.ring_append")  # ops whose `name` is stamped per layer
_TRACED_EXPERTS = 2  # the MoE segment is exported with this many experts, stamped with all of them
_EXAMPLE = {"T": 5}  # example sizes of the dynamic dims (distinct, never 0 or 1)
_OTHER_EXAMPLES = (7, 11, 13, 17, 19, 23)


@dataclass
class TraceInfo:
    exports: dict = field(default_factory=dict)      # segment name -> seconds
    stamps: int = 0
    ops: dict = field(default_factory=dict)          # function -> op count
    seconds: float = 0.0


@functools.lru_cache(maxsize=4)
def inventory(cfg) -> dict:
    """`expected_tensors(cfg)`, computed once per config (the full preset lists ~96k tensors)."""
    return expected_tensors(cfg)


def weight_types(cfg, dtype=torch.float32) -> dict:
    """Checkpoint name -> IR type of the dequantized weight (scales folded in)."""
    dt = dtype_from_torch(dtype)
    out = {}
    for name, spec in inventory(cfg).items():
        if name.endswith(".scale"):
            continue
        shape = tuple(spec.shape)
        if spec.dtype == "I8":  # packed FP4 pairs: two values per byte
            shape = shape[:-1] + (shape[-1] * 2,)
        out[name] = TensorType(dt, shape)
    return out


_STORED_DTYPES = {"F8_E4M3": fp8e4m3, "F8_E8M0": e8m0, "I8": fp4e2m1x2, "BF16": bf16, "F32": f32}


def stored_types(cfg) -> dict:
    """Checkpoint name -> IR type of the tensor as the checkpoint stores it (scales included)."""
    out = {}
    for name, spec in inventory(cfg).items():
        if spec.dtype not in _STORED_DTYPES:
            raise TraceError(f"checkpoint tensor '{name}' has dtype {spec.dtype}, which the IR cannot bind")
        out[name] = TensorType(_STORED_DTYPES[spec.dtype], tuple(spec.shape))
    return out


def model_widths(cfg) -> str:
    """The config's integer widths as `name=value ...` (module attribute `widths`): what kernel selection
    needs of the config, carried by the module so that a pass run on a dumped module sees it too."""
    import dataclasses

    items = [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]
    return " ".join(f"{k}={v}" for k, v in items if type(v) is int)


def _unify(tmpl_t, actual_t, env, where):
    if not isinstance(tmpl_t, TensorType):
        return
    if tmpl_t.dtype != actual_t.dtype or tmpl_t.rank != actual_t.rank:
        raise TraceError(f"{where}: template expects {tmpl_t}, got {actual_t}")
    for d, a in zip(tmpl_t.shape, actual_t.shape):
        if isinstance(d, SymExpr) and len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1 \
                and isinstance(d.terms[0][0][0], str):
            name = d.terms[0][0][0]
            if name in env and env[name] != a:
                raise TraceError(f"{where}: {name} = {env[name]} and {a}")
            env[name] = a
        elif d != a:
            raise TraceError(f"{where}: template dim {d} vs {a} ({tmpl_t} vs {actual_t})")


def _cache_rows_dynamic(name: str, t):
    if name in ("comp_kv", "index_k") and isinstance(t, TensorType) and t.rank == 2:
        return TensorType(t.dtype, (sym("N"),) + tuple(t.shape[1:]))
    return t


class Tracer:
    def __init__(self, cfg, kv_quant=True, dtype=torch.float32, progress=None, max_context=None):
        self.cfg, self.dtype = cfg, dtype
        self.max_context = int(max_context or cfg.max_position_embeddings)
        self.model = StepModel(cfg, kv_quant=kv_quant, dtype=dtype)
        self.wtypes = weight_types(cfg, dtype)
        self.stypes = stored_types(cfg)
        self.block = cfg.weight_block_size[0]
        self.templates: dict = {}
        self.info = TraceInfo()
        self.progress = progress
        self.bar = NoBar(progress or None)  # run() puts a bar here on a terminal
        self._layers_started: set = set()
        self._where = None

    def log(self, msg):
        if self.progress:
            self.bar.write(msg)

    # ------------------------------------------------------------------ export
    def template(self, seg, ins: dict, prefix: str) -> Function:
        key = id(seg)
        if key in self.templates:
            return self.templates[key]
        t0 = time.perf_counter()
        traced = seg
        if isinstance(seg, Ffn) and seg.n_experts > _TRACED_EXPERTS:
            traced = Ffn(self.model, _TRACED_EXPERTS)  # export cost grows with the argument count
        # a cache's capacity differs per group (ratio): exported with dynamic rows, fixed again by stamping
        types = [_cache_rows_dynamic(n, ins[n].type) if n in ins else self.wtypes[prefix + n]
                 for n in traced.input_names]
        ckey = (self.cfg.hash(), self.model.kv_quant, str(self.dtype), self.max_context, traced.key())
        hit = ckey in _EXPORTS
        if not hit:
            _EXPORTS[ckey] = self.export(traced, types)
        ep, sym_names = _EXPORTS[ckey]
        name = type(seg).__name__
        f = convert(ep, name, traced.input_names, traced.out_names, sym_names)
        f.traced_experts = traced.n_experts if traced is not seg else None
        self.templates[key] = f
        dt = time.perf_counter() - t0
        self.info.exports[f"{name}@{prefix or 'model'}"] = round(dt, 3)
        self.log(f"  {'reused' if hit else 'exported'} {name} (first used at {prefix or 'model'}): "
                 f"{len(f.ops)} ops, {dt:.1f} s")
        return f

    @staticmethod
    def export(seg, types):
        """torch.export of `seg` on fake inputs of `types` (symbolic dims -> dynamic dims)."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.export import Dim, export
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        dims, examples, specs, sym_names = {}, [], [], {}
        mode = FakeTensorMode(shape_env=ShapeEnv())
        for i, (name, t) in enumerate(zip(seg.input_names, types)):
            shape, spec = [], {}
            for d, x in enumerate(t.shape):
                if isinstance(x, int):
                    shape.append(x)
                    continue
                if x not in dims:
                    k = len(dims)
                    label = "T" if x == sym("T") else f"N{k}"
                    dims[x] = (Dim(label, min=1 if label == "T" else 0),
                               _EXAMPLE.get(label, _OTHER_EXAMPLES[k % len(_OTHER_EXAMPLES)]), label)
                dim, ex, label = dims[x]
                shape.append(ex)
                spec[d] = dim
                sym_names[(i, d)] = label
            with mode:
                examples.append(torch.empty(shape, dtype=t.dtype.torch))
            specs.append(spec or None)
        with torch._dynamo.config.patch(fake_tensor_cache_enabled=False):  # symbolic-shape caching costs more here
            ep = export(seg, tuple(examples), dynamic_shapes=(tuple(specs),), strict=False)
        return ep, sym_names

    # ------------------------------------------------------------------ stamping
    def stamp(self, fn: Function, seg, ins: dict, prefix: str):
        root = prefix[:-1] if prefix else {"Prologue": "prologue", "Epilogue": "epilogue"}.get(type(seg).__name__)
        layer = prefix.split(".")[1] if prefix.startswith("layers.") else ""
        self._show(fn.name, layer, root)
        tmpl = self.template(seg, ins, prefix)
        vals, env = {}, {}
        expand = getattr(tmpl, "traced_experts", None)
        for a in tmpl.args:
            if expand and a.name.startswith("ffn.experts."):
                continue  # the stand-in's experts: replaced by every expert at the moe op
            v = ins[a.name] if a.name in ins else self.weight(fn, prefix + a.name)
            _unify(a.type, v.type, env, f"{prefix}{type(seg).__name__}.{a.name}")
            vals[id(a)] = v
        for op in tmpl.ops:
            for r in op.results:
                for s in (r.type.free_symbols() if isinstance(r.type, TensorType) else ()):
                    if s not in env:  # a data-dependent size: one fresh symbol per stamp
                        env[s] = sym(f"n{layer}" if s.startswith("u") and s == "u0" else f"{s}_{layer}")
            types = [r.type.subs(env) for r in op.results]
            attrs = {k: subs_attr(v, env) for k, v in op.attrs.items()} if env else op.attrs
            if op.name in _STATE_WRITES:  # the buffer's state name: the layer of a window, the group of a cache
                attrs = {**attrs, "name": f"state.{attrs['name']}.{layer}"}
            loc = op.loc if root is None else (root if op.loc is None else f"{root}.{op.loc}")
            operands = [vals.get(id(v)) for v in op.operands]
            if expand and op.name == "dsv41.moe":  # x, gate_w, gate_bias, experts..., sw1, sw2, sw3
                experts = [self.weight(fn, f"{prefix}ffn.experts.{e}.{w}.weight")
                           for e in range(self.cfg.n_routed_experts) for w in ("w1", "w2", "w3")]
                operands = operands[:3] + experts + operands[3 + 3 * expand:]
            new = Op(op.name, operands, types, attrs, loc)
            for old, nr in zip(op.results, new.results):
                vals[id(old)] = nr
            fn.ops.append(new)
        self.info.stamps += 1
        return {n: vals[id(v)] for n, v in zip(seg.out_names, tmpl.returns)}

    def _show(self, fn_name: str, layer: str, root):
        """The bar: one step per layer as its first segment is stamped; where the stamping is."""
        if layer and (fn_name, layer) not in self._layers_started:
            self._layers_started.add((fn_name, layer))
            self.bar.update(1)
        where = f"@{fn_name} {f'layers.{layer}' if layer else root}"
        if where != self._where:  # a redraw when the place changes, not at every segment
            self._where = where
            self.bar.set_postfix_str(where)

    def weight(self, fn: Function, name: str):
        """The compute-dtype value of checkpoint tensor `name` in `fn`: its stored argument(s), dequantized by a
        `dsv41.dequant_weight` op placed at the first use (a tensor stored in the compute dtype is used as is)."""
        v = self._values[fn.name].get(name)
        if v is not None:
            return v
        if name not in self.wtypes:
            raise TraceError(f"the step needs weight '{name}', which the inventory of this config lacks")
        w, scale = self.stored_arg(fn, name)
        want = self.wtypes[name]
        if scale is None and w.type == want:
            v = w
        else:
            fmt = formats.stored_format(name, inventory(self.cfg)[name].dtype, scale is not None)
            op = Op("dsv41.dequant_weight", [w] if scale is None else [w, scale], [want],
                    {"fmt": fmt, "dtype": want.dtype, "bf16_round": formats.rounds_through_bf16(name), "block": self.block},
                    name[: -len(".weight")] if name.endswith(".weight") else name)
            fn.ops.append(op)
            v = op.result
        self._values[fn.name][name] = v
        return v

    def stored_arg(self, fn: Function, name: str):
        """(stored tensor, its scale or None) as arguments of `fn`, added on first request."""
        args = self._weights[fn.name]
        sname = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
        if name not in args:
            args[name] = fn.add_arg(name, self.stypes[name])
            if sname in self.stypes:
                args[sname] = fn.add_arg(sname, self.stypes[sname])
        return args[name], args.get(sname)

    # ------------------------------------------------------------------ functions
    def function(self, name: str, T, weight_order=()) -> tuple[Function, list]:
        fn = Function(name)
        self._weights[name], self._values[name] = {}, {}
        ids = fn.add_arg("ids", TensorType(i64, (T,)))
        values = {"ids": ids}
        for k, t in new_state(self.cfg, self.dtype, self.max_context).items():
            values[k] = fn.add_arg(k, TensorType(dtype_from_torch(t.dtype), tuple(t.shape)), {"placement": "persistent"})
        for w in weight_order:
            if w in self.wtypes:  # scales come with their weight
                self.stored_arg(fn, w)
        logits, new = serve_step(self.model, values, lambda seg, ins, p: self.stamp(fn, seg, ins, p))
        outs = ["logits"] + [k for k in values if k.startswith("state.")]
        fn.returns = [logits] + [new[k] for k in outs[1:]]
        fn.result_types = [v.type for v in fn.returns]
        self.info.ops[name] = len(fn.ops)
        return fn, outs

    def run(self) -> Module:
        t0 = time.perf_counter()
        self._weights, self._values = {}, {}
        self.bar = progress_bar(self.progress, 2 * self.cfg.num_hidden_layers, "tracing", unit="layer")
        try:
            prefill, outs = self.function("prefill", sym("T"))
            order = list(self._weights["prefill"])
            decode, _ = self.function("decode", 1, order)
        finally:
            self.bar.close()
            self.bar = NoBar(self.progress or None)
        m = Module([prefill, decode], {"config_hash": self.cfg.hash(), "kv_quant": self.model.kv_quant,
                                       "outputs": tuple(outs), "widths": model_widths(self.cfg),
                                       "max_context": self.max_context,
                                       "layer_plan": plan_attr(self.cfg)})
        self.info.seconds = time.perf_counter() - t0
        return m


def trace(cfg, kv_quant: bool = True, dtype=torch.float32, progress=sys.stderr, max_context: int | None = None):
    """-> (ir.Module with @prefill and @decode, TraceInfo). See the module docstring. max_context: the
    positions the state caches hold (default: the config's max_position_embeddings)."""
    tr = Tracer(cfg, kv_quant, dtype, progress, max_context)
    return tr.run(), tr.info
