"""The rewrite driver shared by passes: named patterns applied by one forward sweep.

A `Pattern(name, ops, fn)` looks at ops whose name is in `ops` ("*" for all). `fn(op, rw)`
returns:
- None/False: no match;
- True: it changed `op` in place (operands, attributes, name);
- a list of Values: they replace `op`'s results (same types, checked) and `op` is erased.
New ops a pattern needs go in with `rw.insert(...)`, before the op being rewritten.

`apply_patterns(func, patterns)` sweeps the ops in order keeping a substitution map (no use
lists: an op's operands are remapped when the sweep reaches it, the returns at the end);
the first matching pattern per op wins; sweeps repeat until one changes nothing (at most
`max_sweeps`). It returns a Counter of rewrites by pattern name (tinygrad's named rewrites).

`erase_dead_ops(func)` is the liveness sweep (backward: an op lives if it has side
effects, is unknown to the registry, or a result is used by a live op or returned).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from dsv41c.ir.core import Function, Op, Value
from dsv41c.ir.registry import lookup
from dsv41c.passes.base import PassError


@dataclass(frozen=True)
class Pattern:
    name: str
    ops: tuple
    fn: Callable


class Rewriter:
    def __init__(self, func: Function, out: list):
        self.func, self._out = func, out
        self.written: set[int] = set()  # ids of values some op mutates in place

    def insert(self, name: str, operands, attrs=None, result_types=None, loc=None, names=None) -> Op:
        from dsv41c.ir.builder import Builder

        op = Builder(self.func).create(name, list(operands), dict(attrs or {}), result_types, names, loc)
        self._out.append(op)
        return op


def producer(v: Value, *names: str) -> Op | None:
    """The op defining v, when its name is one of `names` (any name if none given)."""
    op = v.op
    if op is None or (names and op.name not in names):
        return None
    return op


def use_counts(f: Function) -> dict:
    """{id(value): how many operand slots and returns read it}."""
    n: dict = {}
    for op in f.ops:
        for v in op.operands:
            n[id(v)] = n.get(id(v), 0) + 1
    for v in f.returns or ():
        n[id(v)] = n.get(id(v), 0) + 1
    return n


def has_side_effects(op: Op) -> bool:
    d = lookup(op.name)
    return d is None or d.has_side_effects


def written_values(func: Function) -> set:
    out = set()
    for op in func.ops:
        d = lookup(op.name)
        if d is None or not d.writes:
            continue
        args, _ = d.bind(op.operands, op.attrs)
        for w in d.writes:
            v = args.get(w)
            for x in (v if isinstance(v, list) else [v]):
                if x is not None:
                    out.add(id(x))
    return out


def apply_patterns(func: Function, patterns, max_sweeps: int = 16) -> Counter:
    by_op: dict[str, list] = {}
    for p in patterns:
        for name in p.ops:
            by_op.setdefault(name, []).append(p)
    anywhere = by_op.pop("*", [])
    stats = Counter()
    for _ in range(max_sweeps):
        subst: dict[int, Value] = {}
        out: list[Op] = []
        rw = Rewriter(func, out)
        rw.written = written_values(func)
        changed = False
        for op in func.ops:
            op.operands = [subst.get(id(v), v) for v in op.operands]
            keep = True
            for p in by_op.get(op.name, []) + anywhere:
                res = p.fn(op, rw)
                if res is None or res is False:
                    continue
                stats[p.name] += 1
                changed = True
                if res is not True:
                    _replace(op, list(res), subst, p.name)
                    keep = False
                break
            if keep:
                out.append(op)
        func.ops = out
        if func.returns is not None:
            func.returns = [subst.get(id(v), v) for v in func.returns]
        if not changed:
            break
    return stats


def _replace(op: Op, values: list, subst: dict, pattern: str):
    if len(values) != len(op.results):
        raise PassError(f"rewrite '{pattern}' gave {len(values)} values for {op.name}'s {len(op.results)} results")
    if has_side_effects(op):
        raise PassError(f"rewrite '{pattern}' would erase {op.name}, which has side effects")
    for r, v in zip(op.results, values):
        if v.type != r.type:
            raise PassError(f"rewrite '{pattern}' replaced a {r.type} result of {op.name} with a {v.type} value")
        if v.name is None:  # a value made for this rewrite takes the name of the one it replaces
            v.name = r.name
        subst[id(r)] = v


def replace_uses(func: Function, subst: dict) -> None:
    """Remap operands and returns through `subst` (id(old) -> new), in one sweep."""
    if not subst:
        return
    for op in func.ops:
        op.operands = [subst.get(id(v), v) for v in op.operands]
    if func.returns is not None:
        func.returns = [subst.get(id(v), v) for v in func.returns]


def erase_dead_ops(func: Function, only=None) -> Counter:
    """Erase ops none of whose results is used; `only(op)` limits which ops may go."""
    live = {id(v) for v in func.returns or []}
    kept, erased = [], Counter()
    for op in reversed(func.ops):
        used = any(id(r) in live for r in op.results)
        if used or has_side_effects(op) or (only is not None and not only(op)):
            kept.append(op)
            live.update(id(v) for v in op.operands)
        else:
            erased[op.name] += 1
    kept.reverse()
    func.ops = kept
    return erased
