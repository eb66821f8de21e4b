"""torch.export ExportedProgram -> one IR Function (the converter the tracer uses).

Why here: `ir/from_export.py` (the IR engineer's general converter) did not exist when the
tracer was written; this one covers what the serving step's segments produce and fails
loudly (`TraceError`, naming the ATen op and its location) on anything else.

Algorithm, one forward walk over the FX graph:
- placeholders become the function's arguments (names given by the caller); a dynamic
  dim's sympy symbol becomes the IR symbol the caller names (`T`, `N`), an unbacked one
  (a data-dependent size, `u0`) keeps its name for the stamper to rename;
- SymInt nodes (`aten.sym_size.int`, `operator.add`, ...) become IR dims (from their
  `meta["val"]` expression), never ops; they fill `Dim` attributes directly, and where
  ATen takes a Scalar they become `sym.const` + `aten.scalar_tensor` (exact for ints);
- every other ATen node maps by name onto the IR op of the same name (ATen's argument
  names are the IR schema's), with a few spelled-out renames (`_to_copy`/`to.dtype` ->
  `aten.to`, `unflatten`/`_unsafe_view` -> `aten.view`, `numpy_T` -> `aten.permute`);
  result types come from the node's fake value; runtime asserts are dropped;
- `dsv41.*` custom ops map onto the registered domain ops by the same argument names;
- locations: `nn_module_stack`'s innermost path (`attn.indexer`), joined by the stamper
  to the layer prefix.
Known gaps: no in-place ops, no control flow ops (export never produced them here).
"""
from __future__ import annotations

import operator

import torch

from dsv41c.ir.core import Function, Op
from dsv41c.ir.registry import lookup
from dsv41c.ir.symbolic import floordiv, sym
from dsv41c.ir.types import INDEX, TensorType, dtype_from_torch, i64


class TraceError(RuntimeError):
    """An exported graph holds something the converter cannot express in the IR."""


_DROP = {"_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range_for_size", "_assert_async"}
_SYM_FNS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.ge, operator.le, operator.gt,
            operator.lt, operator.eq, operator.ne, operator.neg, operator.mod}
_RENAME = {"_to_copy": "to", "_softmax": "softmax", "_log_softmax": "log_softmax", "lift_fresh_copy": "clone"}
_VIEW_LIKE = {"unflatten", "_unsafe_view", "view", "reshape"}


class _Sym:
    """A host integer (SymInt or int) seen as an IR dim."""

    __slots__ = ("dim",)

    def __init__(self, dim):
        self.dim = dim


def sympy_to_dim(e, names: dict):
    """A sympy integer expression -> IR dim (ints, symbols, + * and floor division)."""
    import sympy

    if isinstance(e, (int, sympy.Integer)):
        return int(e)
    if isinstance(e, sympy.Symbol):
        return sym(names.get(e.name, e.name))
    if isinstance(e, sympy.Add):
        out = 0
        for t in e.args:
            out = out + sympy_to_dim(t, names)
        return out
    if isinstance(e, sympy.Mul):
        out = 1
        for t in e.args:
            out = out * sympy_to_dim(t, names)
        return out
    if isinstance(e, sympy.Pow) and isinstance(e.args[1], sympy.Integer) and int(e.args[1]) > 0:
        b, out = sympy_to_dim(e.args[0], names), 1
        for _ in range(int(e.args[1])):
            out = out * b
        return out
    fname = type(e).__name__
    if fname in ("FloorDiv", "CleanDiv") and isinstance(e.args[1], sympy.Integer):
        return floordiv(sympy_to_dim(e.args[0], names), int(e.args[1]))
    if fname in ("Mod", "PythonMod") and isinstance(e.args[1], sympy.Integer):
        a, k = sympy_to_dim(e.args[0], names), int(e.args[1])
        return a - k * floordiv(a, k)
    raise TraceError(f"size expression {e} ({fname}) has no IR form")


def _dim(v, names):
    if isinstance(v, torch.SymInt):
        return sympy_to_dim(v.node.expr, names)
    return int(v)


def tensor_type(val, names) -> TensorType:
    return TensorType(dtype_from_torch(val.dtype), tuple(_dim(d, names) for d in val.shape))


def _loc(node) -> str | None:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [p for p, _cls in stack.values() if p]
    return paths[-1] if paths else None


class Converter:
    def __init__(self, ep, fname: str, arg_names, sym_names: dict, arg_attrs=None):
        self.ep, self.names = ep, {}
        self.f = Function(fname)
        self.env: dict = {}
        placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(arg_names):
            raise TraceError(f"{fname}: {len(placeholders)} exported inputs for {len(arg_names)} names")
        # name the dynamic dims first: sym_names maps (input index, dim) -> IR symbol
        for (i, d), name in sym_names.items():
            e = placeholders[i].meta["val"].shape[d]
            if isinstance(e, torch.SymInt):
                self.names[str(e.node.expr)] = name
        for node, name in zip(placeholders, arg_names):
            val = node.meta["val"]
            t = tensor_type(val, self.names) if isinstance(val, torch.Tensor) else INDEX
            self.env[node] = self.f.add_arg(name, t, (arg_attrs or {}).get(name))

    # ------------------------------------------------------------------ values
    def dim(self, v):
        if isinstance(v, _Sym):
            return v.dim
        return _dim(v, self.names)

    def types_of(self, node):
        val = node.meta["val"]
        if isinstance(val, torch.Tensor):
            return [tensor_type(val, self.names)]
        return [tensor_type(v, self.names) for v in val]

    def emit(self, name, operands, attrs, node, result_types=None):
        op = Op(name, operands, result_types if result_types is not None else self.types_of(node), attrs,
                _loc(node) if node is not None else None, None)
        self.f.ops.append(op)
        return op

    def scalar_operand(self, s: _Sym, node):
        """An integer size used as a tensor operand: sym.const + aten.scalar_tensor (i64, exact)."""
        idx = self.emit("sym.const", [], {"value": s.dim}, node, [INDEX]).results[0]
        return self.emit("aten.scalar_tensor", [idx], {"dtype": i64}, node, [TensorType(i64, ())]).results[0]

    # ------------------------------------------------------------------ the walk
    def run(self, out_names):
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outs = node.args[0]
                vals = [self.env[o] for o in outs]
                if len(vals) != len(out_names):
                    raise TraceError(f"{self.f.name}: {len(vals)} outputs for {len(out_names)} names")
                self.f.returns = vals
                self.f.result_types = [v.type for v in vals]
                continue
            if node.op != "call_function":
                raise TraceError(f"{self.f.name}: unsupported FX node {node.op} {node.target}")
            self.env[node] = self.call(node)
        return self.f

    def call(self, node):
        t = node.target
        if t is operator.getitem:
            return self.env[node.args[0]][node.args[1]]
        v = node.meta.get("val")
        if t in _SYM_FNS or (isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool)):
            # a host integer (sym_size, SymInt arithmetic): kept as its dim expression, not an op
            return _Sym(self.dim(v)) if isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool) else None
        if not isinstance(t, torch._ops.OpOverload):
            raise TraceError(f"{self.f.name}: unsupported call {t} at loc({_loc(node)})")
        packet = t._overloadpacket.__name__
        if packet in _DROP or isinstance(node.meta.get("val"), torch.SymBool):
            return None
        ns = t.namespace
        bound = self.bind(t, node)
        if ns == "aten":
            special = getattr(self, "_aten_" + packet.lstrip("_"), None)
            if special is not None:
                return special(node, bound)
            return self.generic("aten." + _RENAME.get(packet, packet), node, bound)
        if ns == "dsv41":
            return self.generic("dsv41." + packet, node, bound)
        raise TraceError(f"{self.f.name}: op {t} (namespace {ns}) has no IR form, at loc({_loc(node)})")

    def bind(self, t, node) -> dict:
        out = {}
        sargs = t._schema.arguments
        for a, v in zip(sargs, node.args):
            out[a.name] = v
        out.update(node.kwargs)
        return {k: self._lift(v) for k, v in out.items()}

    def _lift(self, v):
        if isinstance(v, torch.fx.Node):
            return self.env[v]
        if isinstance(v, (list, tuple)):
            return [self._lift(x) for x in v]
        return v

    def _result(self, op):
        return op.results[0] if len(op.results) == 1 else tuple(op.results)

    def generic(self, ir_name, node, bound):
        opdef = lookup(ir_name)
        if opdef is None:
            raise TraceError(f"{self.f.name}: ATen op {node.target} has no IR op {ir_name} (register it), "
                             f"at loc({_loc(node)})")
        operands, attrs = [], {}
        for a in opdef.schema.args:
            if a.name not in bound:
                continue  # the IR default stands
            v = bound[a.name]
            if a.operand and a.variadic:
                operands.extend(v)
            elif a.operand and _is_value(v):
                operands.append(v)
            elif a.operand and isinstance(v, _Sym) and not (a.attr or "").startswith("Dim"):
                operands.append(self.scalar_operand(v, node))  # a size used as a number
            elif v is None and (a.optional or not (a.attr or "").endswith("?")):
                continue
            elif a.attr:
                attrs[a.name] = self.attr(v)
            else:
                raise TraceError(f"{ir_name}: operand '{a.name}' is {v!r}, at loc({_loc(node)})")
        return self._result(self.emit(ir_name, operands, attrs, node))

    def attr(self, v):
        if isinstance(v, _Sym):
            return v.dim
        if isinstance(v, torch.SymInt):
            return self.dim(v)
        if isinstance(v, torch.dtype):
            return dtype_from_torch(v)
        if isinstance(v, (list, tuple)):
            return tuple(self.attr(x) for x in v)
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        raise TraceError(f"{self.f.name}: attribute value {v!r} has no IR form")

    # ------------------------------------------------------------------ special ATen ops
    def _view(self, node, bound):
        out = self.types_of(node)[0]
        return self._result(self.emit("aten.view", [bound["self"]], {"size": out.shape}, node))

    _aten_unflatten = _aten_unsafe_view = _aten_view = _aten_reshape = _view

    def _aten_numpy_T(self, node, bound):
        rank = self.types_of(node)[0].rank
        return self._result(self.emit("aten.permute", [bound["self"]], {"dims": tuple(range(rank - 1, -1, -1))},
                                      node))

    def _aten_to(self, node, bound):
        dt = node.meta["val"].dtype
        return self._result(self.emit("aten.to", [bound["self"]], {"dtype": dtype_from_torch(dt)}, node))

    _aten_to_copy = _aten_to

    def _aten_arange(self, node, bound):
        dt = dtype_from_torch(node.meta["val"].dtype)
        attrs = {"end": self.attr(bound["end"]), "dtype": dt}
        for k in ("start", "step"):
            if k in bound:
                attrs[k] = self.attr(bound[k])
        return self._result(self.emit("aten.arange", [], attrs, node))

    def _creation(self, ir_name, node, bound, fill=None):
        dt = dtype_from_torch(node.meta["val"].dtype)
        attrs = {"dtype": dt}
        if "size" in bound:
            attrs["size"] = self.attr(bound["size"])
        if fill is not None:
            attrs["fill_value"] = bound["fill_value"]
        operands = [bound["self"]] if "self" in bound else []
        return self._result(self.emit(ir_name, operands, attrs, node))

    def _aten_new_zeros(self, node, bound):
        return self._creation("aten.new_zeros", node, bound)

    def _aten_full_like(self, node, bound):
        return self._creation("aten.full_like", node, bound, fill=True)

    def _aten_zeros_like(self, node, bound):
        return self._creation("aten.zeros_like", node, bound)

    def _aten_index(self, node, bound):
        idx = bound["indices"]
        positions = tuple(i for i, v in enumerate(idx) if v is not None)
        tensors = [v for v in idx if v is not None]
        attrs = {} if positions == tuple(range(len(tensors))) else {"positions": positions}
        return self._result(self.emit("aten.index", [bound["self"]] + tensors, attrs, node))


def _is_value(v) -> bool:
    from dsv41c.ir.core import Value

    return isinstance(v, Value)


def convert(ep, fname: str, arg_names, out_names, sym_names: dict, arg_attrs=None) -> Function:
    """ExportedProgram -> Function named `fname` (see the module docstring)."""
    return Converter(ep, fname, arg_names, sym_names, arg_attrs).run(out_names)
