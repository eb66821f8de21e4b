"""The verifier's stream rules: cross-stream uses are ordered, arena bytes are not reused early.

    verify_stream_errors(module) -> [message, ...]     (called by ir/verifier.py's verify)

1. A value defined on one stream and used on another (or returned, which stream 0 does)
   must be ordered: some `stream.wait` on the using stream must wait on an event recorded
   on the defining stream after the definition (transitively: `ir/happens_before.py`).
2. Two values whose arena bytes overlap (`arena_offset` + the type's bytes at the binding
   plan-memory recorded, module attribute `memory.<fn>.binding`) must not be live at once,
   where a value is live from its definition to the last op that may run concurrently with
   any of its uses: the later one may be defined only after every stream that reads the
   earlier one has joined the defining stream.
3. A buffer written in place (an op's `writes` operand, or a kernel contract's `writes`
   argument: the persistent state) and touched on another stream must be ordered against
   that write both ways: an earlier read or write on another stream must be ordered before
   the write (else the write may clobber what it still reads), a later read or write after
   it (else it may see the old bytes); a buffer written on a side stream must be ordered
   before stream 0's last op, where the function ends.
Only functions with stream attributes or arena offsets are checked. Messages name the op
as the main verifier does (`@f: op #N name (%x) at loc(...)`).

Algorithm: vector clocks for rules 1 and 3 (rule 3 compares each access with the latest write
before it and each write with the reads since the write before it; the rest follows by
transitivity); for rule 2 a sweep over definitions in program order
keeping the live buffers sorted by offset (a valid plan keeps them disjoint, so only the
two address neighbours of a new buffer need checking).

Known gaps: rule 2 is skipped for a function whose binding attribute is missing or does not
bind every symbol of a placed value's type; views are known by op name (`ir/aliases.py`: a
view's reads keep its base live).
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort

from dsv41c.ir.aliases import last_reads
from dsv41c.ir.happens_before import HappensBefore, op_stream
from dsv41c.ir.types import TensorType


def _where(names, f, i, op):
    from dsv41c.ir.printer import format_string

    res = ", ".join(names(r) for r in op.results)
    return f"@{f.name}: op #{i} {op.name}" + (f" ({res})" if res else "") + (
        f" at loc({format_string(op.loc)})" if op.loc is not None else "")


def written_operands(op) -> list:
    """The operand values `op` writes in place: its registry `writes`, or its kernel contract's."""
    from dsv41c.ir.registry import lookup

    if op.name == "kernel.call" and not op.attrs.get("op"):
        from dsv41c.ir.kernel_contracts import contract_of

        c = contract_of(op.attrs.get("template", ""))
        if c is None:
            return []
        return [v for a, v in zip(c.inputs, op.operands) if a.writes]
    if op.name == "kernel.call":
        d = lookup(op.attrs["op"])
        attrs = {k: v for k, v in op.attrs.items() if k not in ("template", "variant", "target", "op")}
    else:
        d, attrs = lookup(op.name), op.attrs
    if d is None or not d.writes:
        return []
    args, _ = d.bind(op.operands, attrs)
    out = []
    for w in d.writes:
        v = args.get(w)
        out += v if isinstance(v, list) else [v] if v is not None else []
    return out


def verify_stream_errors(module) -> list[str]:
    out = []
    for f in module.functions.values():
        uses_streams = any("stream" in op.attrs or op.name.startswith("stream.") for op in f.ops)
        placed = any("arena_offset" in r.attrs for op in f.ops for r in op.results)
        if uses_streams or placed:
            out.extend(_check_function(module, f, uses_streams, placed))
    return out


def _check_function(module, f, uses_streams, placed) -> list[str]:
    from dsv41c.ir.printer import function_namer

    names = function_namer(f)
    hb = HappensBefore(f)
    pos = {id(r): i for i, op in enumerate(f.ops) for r in op.results}
    errors = []
    if uses_streams:
        for j, op in enumerate(f.ops):
            for k, v in enumerate(op.operands):
                i = pos.get(id(v))
                if i is None or i >= j or hb.ordered(i, j):
                    continue
                errors.append(f"{_where(names, f, j, op)}: operand {k} ({names(v)}) is defined on stream "
                              f"{op_stream(f.ops[i])} at op #{i} and used on stream {op_stream(op)} with no wait on "
                              "an event recorded after its definition")
        last_main = max([i for i, op in enumerate(f.ops) if op_stream(op) == 0] + [-1])
        for k, v in enumerate(f.returns or []):
            i = pos.get(id(v))
            if i is None or op_stream(f.ops[i]) == 0 or (last_main >= 0 and hb.ordered(i, last_main)
                                                        and last_main > i):
                continue
            errors.append(f"@{f.name}: return value {k} ({names(v)}) is defined on stream {op_stream(f.ops[i])} at "
                          f"op #{i} and stream 0 never waits for it")
        errors += _check_writes(f, hb, names, last_main)
    if placed and not errors:
        errors += _check_reuse(module, f, hb, names)
    return errors


def _check_writes(f, hb, names, last_main) -> list[str]:
    """Rule 3: in-place writes against every access of the same buffer on another stream."""
    errors = []
    last_write: dict = {}   # id(buffer) -> position of the latest write
    reads: dict = {}        # id(buffer) -> positions of reads since that write
    label = {}

    def unordered(i, j, v, what):
        if op_stream(f.ops[i]) != op_stream(f.ops[j]) and not hb.ordered(i, j):
            errors.append(f"{_where(names, f, j, f.ops[j])}: {what} {names(v)}, which op #{i} on stream "
                          f"{op_stream(f.ops[i])} {'writes in place' if i in label.get(id(v), ()) else 'reads'} "
                          f"before it, with no wait on an event recorded after op #{i}")

    for j, op in enumerate(f.ops):
        written = {id(v): v for v in written_operands(op)}
        for v in op.operands:
            w = last_write.get(id(v))
            if w is not None and id(v) not in written:
                unordered(w, j, v, "reads")
        for key, v in written.items():
            w = last_write.get(key)
            for i in ([w] if w is not None else []) + reads.get(key, []):
                if i != j:
                    unordered(i, j, v, "writes")
            last_write[key] = j
            label.setdefault(key, set()).add(j)
            reads[key] = []
        for v in op.operands:
            if id(v) not in written:
                reads.setdefault(id(v), []).append(j)
        if len(errors) >= 20:
            return errors
    for key, w in last_write.items():
        if op_stream(f.ops[w]) != 0 and not (last_main > w and hb.ordered(w, last_main)):
            v = next(x for x in f.ops[w].operands if id(x) == key)
            errors.append(f"{_where(names, f, w, f.ops[w])}: writes {names(v)} in place on stream "
                          f"{op_stream(f.ops[w])} and stream 0 never waits for it before the function ends")
    return errors


def _binding(module, f):
    text = module.attrs.get(f"memory.{f.name}.binding")
    if not isinstance(text, str):
        return None
    env = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        try:
            env[k.strip()] = int(v)
        except ValueError:
            return None
    return env


def _check_reuse(module, f, hb, names) -> list[str]:
    env = _binding(module, f)
    if env is None:
        return []
    last = last_reads(f, hb)  # a view's reads count as its base's
    bufs = []
    for i, op in enumerate(f.ops):
        for r in op.results:
            off = r.attrs.get("arena_offset")
            if off is None or not isinstance(r.type, TensorType):
                continue
            try:
                n = r.type.nbytes if isinstance(r.type.nbytes, int) else int(r.type.nbytes.evaluate(env))
            except KeyError:
                return []
            if n:
                bufs.append((i, max(i, hb.last_unaware(i), last.get(id(r), i)), off, n, r))
    active: list = []   # (offset, serial) sorted by offset
    ends: list = []     # heap of (end, offset, serial)
    info: dict = {}
    errors = []
    for serial, (s, e, off, n, r) in enumerate(bufs):
        while ends and ends[0][0] < s:
            _, o, k = heapq.heappop(ends)
            del active[bisect_left(active, (o, k))]
        at = bisect_left(active, (off, serial))
        for nb in (active[at - 1:at] if at else []) + active[at:at + 1]:
            o2, k2 = nb
            s2, e2, _, n2, r2 = info[k2]
            if o2 < off + n and off < o2 + n2:
                errors.append(f"{_where(names, f, s, f.ops[s])}: result {names(r)} at arena bytes [{off}, {off + n}) "
                              f"reuses bytes of {names(r2)} (op #{s2}, bytes [{o2}, {o2 + n2})), which may still be "
                              f"read until op #{e2}: no stream that reads it has joined before this definition")
                break
        insort(active, (off, serial))
        heapq.heappush(ends, (e, off, serial))
        info[serial] = (s, e, off, n, r)
        if len(errors) >= 20:
            break
    return errors


__all__ = ["verify_stream_errors", "written_operands"]
