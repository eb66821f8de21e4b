"""cse: merge ops that compute the same thing from the same values.

Algorithm: one forward sweep per function with a table keyed by (op name, operand
identities after substitution, attributes (`attr_key`: exact floats, bool != int), result
types and result value attributes). A later op with a key already in the table is erased
and its results map to the earlier op's. The location of the first op is kept.

Side effects: an op with side effects (registry `writes`/`sync`: cache appends, stream
record/wait) is never merged, and by default it empties the table. With `across_writes`
(`cse{across_writes=true}`, the pipeline's run after the domain rewrites, once
share-csa2-state has checked each layer's own chain), a write of the persistent state (`state.*` buffers, written in
place) drops from the table what was computed from the buffers it writes, and only that: a
value read before a write must not stand in for the same read after it, but the index
arithmetic of the positions, which every layer repeats between its cache appends, merges
across them. Each value's state roots (the `state.*` arguments it is computed from, through
any chain of ops, views included: the IR has no aliasing) decide what a write reaches. A
stream op, an op unknown to the registry, or a write whose buffers have no state root empty
the whole table: work is not hoisted across a stream event. Ops on different streams differ
by their `stream` attribute, so they do not merge either.

Stats: `eliminated` (total) and `eliminated:<op name>`.
Known gaps: no commutativity (add(a, b) and add(b, a) stay two ops).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.attrs import attrs_key
from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import has_side_effects


def _written_roots(op, roots: dict):
    """The state roots `op` writes in place; None when the whole table must go (a stream op, an unknown op,
    a write of a buffer with no state root)."""
    from dsv41c.ir.registry import lookup
    from dsv41c.ir.verify_streams import written_operands

    d = lookup(op.name)
    if d is None or d.sync or op.name.startswith("stream."):
        return None
    written = written_operands(op)
    hit = frozenset().union(*(roots.get(id(v), frozenset()) for v in written))
    if not written or any(not roots.get(id(v)) for v in written):
        return None
    return hit


@dataclass(frozen=True)
class CommonSubexpressionElimination(ModulePass):
    name: ClassVar[str] = "cse"
    across_writes: bool = False  # the fine barrier (above); off: every side effect empties the table

    def run(self, module) -> PassResult:
        stats: dict = {}
        total = 0
        for f in module.functions.values():
            table: dict = {}
            subst: dict = {}
            kept = []
            roots = ({id(a): frozenset([id(a)]) for a in f.args if a.name and a.name.startswith("state.")}
                     if self.across_writes else {})  # only the fine barrier reads the state roots
            by_root: dict = {}  # state root -> the table keys computed from it
            none = frozenset()
            for op in f.ops:
                op.operands = [subst.get(id(v), v) for v in op.operands]
                mine = frozenset().union(*(roots.get(id(v), none) for v in op.operands)) if roots else none
                for r in op.results:
                    if mine:
                        roots[id(r)] = mine
                if has_side_effects(op):
                    hit = _written_roots(op, roots) if self.across_writes else None
                    if hit is None:
                        table.clear()
                        by_root.clear()
                    else:
                        for root in hit:
                            for k in by_root.pop(root, ()):
                                table.pop(k, None)
                    kept.append(op)
                    continue
                if not op.results:
                    kept.append(op)
                    continue
                key = (op.name, tuple(id(v) for v in op.operands), attrs_key(op.attrs),
                       tuple((r.type, attrs_key(r.attrs)) for r in op.results))
                first = table.get(key)
                if first is None:
                    table[key] = op
                    for root in mine:
                        by_root.setdefault(root, []).append(key)
                    kept.append(op)
                    continue
                for r, r0 in zip(op.results, first.results):
                    subst[id(r)] = r0
                total += 1
                stats[f"eliminated:{op.name}"] = stats.get(f"eliminated:{op.name}", 0) + 1
            f.ops = kept
            if f.returns is not None:
                f.returns = [subst.get(id(v), v) for v in f.returns]
        return PassResult(module, total > 0, {"eliminated": total, **dict(sorted(stats.items()))})
