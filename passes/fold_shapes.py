"""fold-shapes: resolve sizes that are known at compile time and fold the size ops.

torch.export leaves size computations in the graph (`aten.sym_size`, SymInt arithmetic)
feeding `?` dims (`aten.view(%x, %n) {size = [?, 512]}`). This pass makes them static
or symbolic dims of the IR's types and attributes:

1. `bind` (option, e.g. `fold-shapes{bind="T=1"}` to specialize decode): substitute the
   given symbols everywhere (argument/result types, attributes) and simplify (`bound-symbols`
   counts the types and attributes that changed).
2. Forward sweep with a table of known `index` values: `aten.sym_size`/`aten.sym_numel`
   read the operand's type; `sym.const` is its value; `sym.add/sub/mul/floordiv` compute
   once their inputs are known. A known index operand that fills a `?` dim or an
   `Index|Dim` slot (or an `Index|Scalar` slot, when static) is moved into the attribute
   (`index-operands-folded`).
3. Type refinement: each op's shape rule is re-run; a declared dim that is a symbol not
   bound by the arguments (one a data-dependent `?` introduced) but which the rule now
   computes is replaced everywhere by the computed dim (`symbols-resolved`); a -1 in a
   view/reshape/expand size is written out (`sizes-inferred`). Steps 2-3 repeat until
   nothing changes.
4. A known index value still used (returned, or by an op that takes it as a scalar) gets
   its producer rewritten to `sym.const {value = ...}` (`sym-ops-to-const`); index ops
   left unused are erased (`sym-ops-erased`).

Known gaps: symbolic facts beyond the polynomial algebra (e.g. `2*(L//2) == L` for even
L) are not used; ops unknown to the registry are left alone.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.attrs import DYN
from dsv41c.ir.registry import lookup
from dsv41c.ir.schema import dyn_slots, fill_dyn
from dsv41c.ir.symbolic import ANY, SymExpr, floordiv, is_dim, parse_dim, product, subs_attr
from dsv41c.ir.types import IndexType, TensorType
from dsv41c.passes.base import ModulePass, PassError, PassResult
from dsv41c.passes.rewrite import erase_dead_ops

_SIZE_ATTR_OPS = ("aten.view", "aten.reshape", "aten.expand")
_MAX_ROUNDS = 8


def parse_bind(text: str) -> dict:
    env = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError("missing '='")
            SymExpr.symbol(name.strip())
            env[name.strip()] = parse_dim(value)
        except ValueError as e:
            raise PassError(f"fold-shapes: bad bind {item!r} ({e}); want NAME=DIM[,NAME=DIM...], e.g. T=1") from None
    return env


def substitute(f, env) -> int:
    """Substitute symbols in every type and attribute of f; returns how many changed."""
    n = 0

    def sub_t(t):
        nonlocal n
        new = t.subs(env)
        n += new != t
        return new

    for a in f.args:
        a.type = sub_t(a.type)
    f.result_types = [sub_t(t) for t in f.result_types]
    for op in f.ops:
        for r in op.results:
            r.type = sub_t(r.type)
        new = {k: subs_attr(v, env) for k, v in op.attrs.items()}
        n += sum(1 for k in new if new[k] != op.attrs[k] or type(new[k]) is not type(op.attrs[k]))
        op.attrs = new
    return n


def _index_value(op):
    """The dim an index-producing op computes, when its inputs are known; else None."""
    a = op.attrs
    if op.name == "aten.sym_size" and op.operands:
        t = op.operands[0].type
        if isinstance(t, TensorType) and t.rank and isinstance(a.get("dim"), int):
            return t.shape[a["dim"] % t.rank]
    if op.name == "aten.sym_numel" and op.operands and isinstance(op.operands[0].type, TensorType):
        return product(op.operands[0].type.shape)
    if op.name == "sym.const" and is_dim(a.get("value")):
        return a["value"]
    if op.name in ("sym.add", "sym.sub", "sym.mul", "sym.floordiv") and not op.operands:
        x, y = a.get("a"), a.get("b")
        if not (is_dim(x) and is_dim(y)):
            return None
        if op.name == "sym.floordiv":
            return floordiv(x, y) if isinstance(y, int) and y > 0 else None
        return {"sym.add": lambda: x + y, "sym.sub": lambda: x - y, "sym.mul": lambda: x * y}[op.name]()
    return None


def _fold_index_operands(op, d, known) -> int:
    """Move known index operands into the attributes they fill; returns how many."""
    slots = dyn_slots(d.schema, op.attrs)
    n_dyn = len(slots)
    main, dyn = op.operands[:len(op.operands) - n_dyn], op.operands[len(op.operands) - n_dyn:]
    folded = 0
    attrs = dict(op.attrs)
    if slots:
        vals = [known.get(id(v), DYN) for v in dyn]
        if any(v is not DYN for v in vals):
            attrs = fill_dyn(attrs, slots, vals)
            dyn = [v for v, k in zip(dyn, vals) if k is DYN]
            folded += n_dyn - len(dyn)
    args, _ = d.bind(op.operands, op.attrs)
    for a in d.schema.args:
        v = args.get(a.name)
        if a.operand != "Index" or a.attr not in ("Dim", "Scalar") or not hasattr(v, "type") or id(v) not in known:
            continue
        if a.attr == "Dim" or isinstance(known[id(v)], int):  # a Scalar slot takes only a static size
            for k, x in enumerate(main):
                if x is v:
                    main = main[:k] + main[k + 1:]
                    break
            attrs[a.name] = known[id(v)]
            folded += 1
    if folded:
        op.operands, op.attrs = main + dyn, attrs
    return folded


def _refine(f, stats) -> dict:
    """Re-run shape rules: unbound symbols to resolve, and -1 sizes written out."""
    bound = f.bound_symbols()
    renames = {}
    for op in f.ops:
        d = lookup(op.name)
        if d is None:
            continue
        try:
            inferred = d.infer(op.operands, op.attrs)
        except (ValueError, TypeError, KeyError, IndexError):
            continue  # the verifier reports it
        if inferred is None or len(inferred) != len(op.results):
            continue
        for r, t in zip(op.results, inferred):
            if not (isinstance(t, TensorType) and isinstance(r.type, TensorType) and t.rank == r.type.rank):
                continue
            for dd, di in zip(r.type.shape, t.shape):
                if di is ANY or dd == di or not isinstance(dd, SymExpr):
                    continue
                syms = dd.free_symbols()
                if dd == SymExpr.symbol(next(iter(syms))) and not (syms & bound) and not _has_any(di):
                    renames.setdefault(next(iter(syms)), di)
        size = op.attrs.get("size")
        if op.name in _SIZE_ATTR_OPS and isinstance(size, tuple) and -1 in size and len(op.operands) == 1:
            shape = inferred[0].shape
            if not any(x is ANY for x in shape):
                op.attrs = {**op.attrs, "size": tuple(shape)}
                stats["sizes-inferred"] += 1
    return renames


def _has_any(d):
    return d is ANY


@dataclass(frozen=True)
class FoldShapes(ModulePass):
    name: ClassVar[str] = "fold-shapes"
    bind: str = ""

    def run(self, module) -> PassResult:
        env = parse_bind(self.bind)
        stats = Counter()
        for f in module.functions.values():
            if env:
                stats["bound-symbols"] += substitute(f, env)
            self._fold(f, stats)
        stats = {k: v for k, v in sorted(stats.items()) if v}
        return PassResult(module, bool(stats), stats)

    def _fold(self, f, stats):
        known: dict = {}
        for _ in range(_MAX_ROUNDS):
            before = sum(stats.values())
            known = {}
            for op in f.ops:
                d = lookup(op.name)
                if d is None:
                    continue
                stats["index-operands-folded"] += _fold_index_operands(op, d, known)
                val = _index_value(op)
                if val is not None:
                    known[id(op.results[0])] = val
            renames = _refine(f, stats)
            if renames:
                stats["symbols-resolved"] += len(renames)
                substitute(f, renames)
            if sum(stats.values()) == before:
                break
        used = {id(v) for op in f.ops for v in op.operands} | {id(v) for v in f.returns or []}
        for op in f.ops:
            if op.name != "sym.const" and len(op.results) == 1 and id(op.results[0]) in known \
                    and id(op.results[0]) in used:
                op.name, op.operands, op.attrs = "sym.const", [], {"value": known[id(op.results[0])]}
                stats["sym-ops-to-const"] += 1
        only_index = lambda op: op.results and all(isinstance(r.type, IndexType) for r in op.results)  # noqa: E731
        stats["sym-ops-erased"] += sum(erase_dead_ops(f, only=only_index).values())
