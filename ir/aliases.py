"""Results that share their operand's bytes, and how long a buffer is read once views of it are.

    ALIAS_OPS                         IR ops whose results may be views of operand 0 at run time
    is_alias_op(name)
    alias_bases(f)   -> {id(result): base value}     a view of a view maps to the first base
    last_reads(f, hb) -> {id(value): position}       the last op that may still read the value's bytes

At run time `aten.reshape`, `expand`, `permute`, `slice`, `split_with_sizes`, ... return a view
of their input where the strides allow (the runtime's targets for the IR's view ops, see
codegen/cpu.py), and the state writes (`cache_append`, `ring_append`) return the buffer they
wrote in place. Such a result owns no bytes: its base must stay untouched while any view is
read. `last_reads` folds each view's reads into its base's (transitively), extended like every
read to the last op that may still run concurrently with it (`ir/happens_before`: a read on a
side stream lasts until that stream has joined). plan-memory plans with it (a view gets no
arena bytes; its base lives until the view's last read) and the verifier's reuse rule checks
with it.

A returned view keeps its base for ever: `returned_bases(f)` names the bases of the values a
function returns, which must not live in a reusable arena.

Known gaps: the set is by op name, not by stride analysis: a view op whose runtime copies
(a reshape of a non-contiguous tensor) is still treated as a view, which only lengthens a
lifetime. An op outside the set whose implementation returns a view of its input is caught at
run time (the executor copies a result that shares the arena's bytes unplanned).
"""
from __future__ import annotations

ALIAS_OPS = frozenset({
    "aten.view", "aten.reshape", "aten.broadcast_to", "aten.expand", "aten.permute", "aten.transpose", "aten.t",
    "aten.unsqueeze", "aten.squeeze", "aten.flatten", "aten.slice", "aten.select", "aten.narrow", "aten.split",
    "aten.split_with_sizes", "aten.chunk", "aten.unbind",
    "dsv41.cache_append", "dsv41.ring_append",  # written in place by the runtime: the result is the buffer
})


def is_alias_op(name: str) -> bool:
    return name in ALIAS_OPS


def alias_bases(f) -> dict:
    """{id(result): the value whose bytes it shares} for every result of an alias op (transitively)."""
    base: dict = {}
    for op in f.ops:
        if op.name in ALIAS_OPS and op.operands:
            src = op.operands[0]
            root = base.get(id(src), src)
            for r in op.results:
                base[id(r)] = root
    return base


def last_reads(f, hb) -> dict:
    """{id(value): the last op position that may still read its bytes}: its own reads and its views'."""
    base = alias_bases(f)
    last: dict = {}
    for i, op in enumerate(f.ops):
        reach = max(i, hb.last_unaware(i))
        for v in op.operands:
            for key in {id(v), id(base.get(id(v), v))}:
                last[key] = max(last.get(key, -1), reach)
    return last


def returned_bases(f) -> set:
    """The ids of the returned values and of the bases of returned views."""
    base = alias_bases(f)
    out = set()
    for v in f.returns or []:
        out.add(id(v))
        out.add(id(base.get(id(v), v)))
    return out


__all__ = ["ALIAS_OPS", "is_alias_op", "alias_bases", "last_reads", "returned_bases"]
