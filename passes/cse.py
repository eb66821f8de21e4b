"""cse: merge ops that compute the same thing from the same values.

Algorithm: one forward sweep per function with a table keyed by (op name, operand
identities after substitution, attributes (`attr_key`: exact floats, bool != int), result
types and result value attributes). A later op with a key already in the table is erased
and its results map to the earlier op's. The location of the first op is kept.

Side effects: an op with side effects (registry `writes`/`sync`: cache appends, stream
record/wait) is never merged, and it empties the table: a value read before a write must
not stand in for the same read after it, and work is not hoisted across a stream event.
Ops unknown to the registry are treated the same way. Ops on different streams differ by
their `stream` attribute, so they do not merge either.

Stats: `eliminated` (total) and `eliminated:<op name>`.
Known gaps: no commutativity (add(a, b) and add(b, a) stay two ops); the barrier is
coarse (a write clears everything, not just what reads the written value).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.attrs import attrs_key
from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import has_side_effects


@dataclass(frozen=True)
class CommonSubexpressionElimination(ModulePass):
    name: ClassVar[str] = "cse"

    def run(self, module) -> PassResult:
        stats: dict = {}
        total = 0
        for f in module.functions.values():
            table: dict = {}
            subst: dict = {}
            kept = []
            for op in f.ops:
                op.operands = [subst.get(id(v), v) for v in op.operands]
                if has_side_effects(op):
                    table.clear()
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
