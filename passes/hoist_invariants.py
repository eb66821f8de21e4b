"""hoist-invariants: the ops of a step that read only weights and constants run once, at the first step.

A serving step recomputes, every time it runs, whatever depends on nothing but the weights: the
casts of small float32 parameters to the activation dtype, views and reshapes of weights, constant
ranges and scalars. On `bench` decode for cuda:sm90 that is 557 of the step's 5,201 ops (364 of
them weight dequantizations). This pass marks them `once = true`; the runtime runs a marked op on
the first call of its function and keeps the results it needs for later calls (runtime/executor.py),
so every later step issues only the ops that depend on the step's inputs or state.

Algorithm: one forward sweep per function in program order. An op is invariant when it is pure
(no registry `writes` or `sync`, not a kernel call, not a stream op), every operand is a weight
argument (a function argument that is neither `ids` nor `state.*`) or an invariant result, and
no attribute holds a size symbol, and every result has a static shape whose bytes are at most `max_bytes` (default 1 MiB) -- except a
view (reshape, slice, unsqueeze, permute, expand, flatten, squeeze, transpose of an invariant),
which costs nothing to keep. So the dequantization of a large stored weight (an FP8 `wo_a` read
as bf16) stays in the step: keeping its result would be the dequantized copy of a weight that the
runtime is not to hold. A value some op writes in place is never invariant (nor what reads it).
Invariant results get `placement = "persistent"` (plan-memory leaves them out of the arena: they
are not a step's transient values).

Exact: the marked ops compute the same values from the same weights; the runtime only skips
recomputing them. Stats: `hoisted` and `hoisted:<function>`, `hoisted:<op>` per op kind,
`kept-large` (invariant ops left in the step for their size), `kept-bytes` (their result bytes).
Known gaps: the weights must not change between calls (the runtime binds them once at load); an
invariant computed only for a large kept value's sake stays in the step with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.symbolic import free_symbols
from dsv41c.ir.types import TensorType
from dsv41c.passes.base import ModulePass, PassResult

VIEWS = ("aten.reshape", "aten.view", "aten.slice", "aten.unsqueeze", "aten.squeeze", "aten.permute",
         "aten.expand", "aten.flatten", "aten.transpose", "aten.t", "aten.select", "aten.alias")
_NOT_PURE = ("kernel.", "stream.", "rt.")


def _static_bytes(t) -> int | None:
    if not isinstance(t, TensorType):
        return 0
    n = 1
    for d in t.shape:
        if not isinstance(d, int):
            return None
        n *= d
    return n * t.dtype.itemsize


def _symbolic(x) -> bool:
    """Does an attribute value hold a size symbol (its value would change between calls)?"""
    if isinstance(x, (tuple, list)):
        return any(_symbolic(v) for v in x)
    return bool(free_symbols(x))


def _is_view(name: str) -> bool:
    return any(name == v or name.startswith(v + ".") for v in VIEWS)


def invariant_ops(f, max_bytes: int) -> tuple[list, list]:
    """-> (the invariant ops of `f` in order, the invariant ops kept in the step for their result size)."""
    from dsv41c.ir.registry import lookup
    from dsv41c.ir.verify_streams import written_operands

    written = {id(v) for op in f.ops for v in written_operands(op)}
    inv = {id(a) for a in f.args if a.name != "ids" and not a.name.startswith("state.") and id(a) not in written}
    marked, large = [], []
    for op in f.ops:
        d = lookup(op.name)
        if (op.name.startswith(_NOT_PURE) or d is None or d.has_side_effects or not op.results
                or any(id(v) in written for v in op.results)):
            continue
        if not all(id(v) in inv for v in op.operands) or any(_symbolic(v) for v in op.attrs.values()):
            continue
        sizes = [_static_bytes(r.type) for r in op.results]
        if any(s is None for s in sizes):
            continue
        if not _is_view(op.name) and any(s > max_bytes for s in sizes):
            large.append(op)
            continue
        marked.append(op)
        inv.update(id(r) for r in op.results)
    return marked, large


@dataclass(frozen=True)
class HoistInvariants(ModulePass):
    name: ClassVar[str] = "hoist-invariants"
    max_bytes: int = 1 << 20

    def run(self, module) -> PassResult:
        stats: dict = {"hoisted": 0}
        kept, kept_bytes = 0, 0
        for fname, f in module.functions.items():
            marked, large = invariant_ops(f, int(self.max_bytes))
            for op in marked:
                op.attrs = {**op.attrs, "once": True}
                for r in op.results:
                    if isinstance(r.type, TensorType):
                        r.attrs = {**r.attrs, "placement": "persistent"}
                stats[f"hoisted:{op.name}"] = stats.get(f"hoisted:{op.name}", 0) + 1
            stats[f"hoisted:@{fname}"] = len(marked)
            stats["hoisted"] += len(marked)
            kept += len(large)
            kept_bytes += sum(_static_bytes(r.type) or 0 for op in large for r in op.results)
        stats.update({"kept-large": kept, "kept-bytes": kept_bytes})
        return PassResult(module, stats["hoisted"] > 0, dict(sorted(stats.items())))
