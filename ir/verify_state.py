"""The verifier's state rules: a buffer written in place is never read, or written again, through its old value.

    verify_state_errors(module) -> [message, ...]     (called by ir/verifier.py's verify)

An op whose registry entry `writes` an operand and `updates` it (`dsv41.cache_append`,
`dsv41.ring_append`, `dsv41.compressor_step`'s carry) is functional in form but in place in
effect: its result IS the operand's buffer after the write, and a runtime may write the
buffer it was given. So for every value v that such an op W writes:
1. every other use of v (an operand of another op, or a return of the function) must be
   ordered before W: earlier in program order and, where streams are used, happens-before W
   (`ir/happens_before.py`): otherwise it reads bytes W has overwritten (a read of the old
   buffer value after the write that replaced it, or a read on another stream racing it);
2. no second op may write v: two writes of one buffer version are unordered by construction
   (each would replace what the other wrote).
A buffer is named by its root: the function argument (`state.comp_kv.2`) or the op result
that the chain of writes starts from, followed through the `updates` results. Messages name
the function, the buffer and both ops, as the main verifier names ops
(`@f: op #N name (%x) at loc(...)`). A buffer with no elements (the ratio-1 compressor's empty
carry) has nothing to overwrite and is not checked.

Algorithm: one forward walk (use positions and writers per value), then one pass over the
written values; linear in ops and operands, plus one happens-before query per use where the
function uses streams.
Known gaps: views are not followed (a `aten.view` of a state buffer read after the write is
not seen; the traced step reads state buffers directly); a `kernel.call` is checked only when
it carries `op` (its contract's `writes` are not yet mapped to results).
"""
from __future__ import annotations

from dsv41c.ir.happens_before import HappensBefore, op_stream
from dsv41c.ir.registry import lookup


def _where(names, f, i, op):
    from dsv41c.ir.printer import format_string

    res = ", ".join(names(r) for r in op.results)
    return f"@{f.name}: op #{i} {op.name}" + (f" ({res})" if res else "") + (
        f" at loc({format_string(op.loc)})" if op.loc is not None else "")


def _updates(op):
    """[(written operand value, result value after the write)] of one op."""
    from dsv41c.ir.ops_runtime import effective

    name, attrs = op.name, op.attrs
    try:
        d, attrs = effective(name, attrs)
    except KeyError:
        return []
    if not d.updates:
        return []
    try:
        args, _ = d.bind(op.operands, attrs)
    except Exception:  # noqa: BLE001 - a malformed op: the main verifier reports it
        return []
    out = []
    for w, r in d.updates:
        v = args.get(w)
        if v is not None and r < len(op.results):
            out.append((v, op.results[r]))
    return out


def _empty(v) -> bool:
    from dsv41c.ir.types import TensorType

    return isinstance(v.type, TensorType) and any(d == 0 for d in v.type.shape if isinstance(d, int))


def verify_state_errors(module) -> list[str]:
    out = []
    for f in module.functions.values():
        out.extend(_check_function(f))
    return out


def _check_function(f) -> list[str]:
    writers: dict = {}   # id(value) -> [op index writing it]
    root: dict = {}      # id(value) -> the value its buffer starts from
    for i, op in enumerate(f.ops):
        for v, new in _updates(op):
            if _empty(v):  # no bytes to overwrite (the ratio-1 compressor's carry)
                continue
            writers.setdefault(id(v), []).append((i, new))
            root[id(new)] = root.get(id(v), v)
    if not writers:
        return []
    from dsv41c.ir.printer import function_namer

    names = function_namer(f)
    uses: dict = {}      # id(value) -> [(op index, operand index)]
    for j, op in enumerate(f.ops):
        for k, v in enumerate(op.operands):
            if id(v) in writers:
                uses.setdefault(id(v), []).append((j, k))
    values = {id(v): v for op in f.ops for v in op.operands}
    hb = HappensBefore(f) if any(op_stream(op) or op.name.startswith("stream.") for op in f.ops) else None
    errors = []
    for vid, ws in writers.items():
        v = values[vid]
        buf = names(root.get(vid, v))
        w, new = ws[0]
        wop = f.ops[w]
        for w2, _ in ws[1:]:
            errors.append(f"{_where(names, f, w2, f.ops[w2])}: writes buffer {buf} through {names(v)}, which op #{w} "
                          f"{wop.name} at loc({wop.loc}) already wrote in place: two writes of one buffer version "
                          f"are unordered (write the result of the first)")
        for j, k in uses.get(vid, ()):
            if j == w:
                continue
            if j < w and (hb is None or hb.ordered(j, w)):
                continue
            op = f.ops[j]
            when = "after" if j > w else "on another stream, not ordered before"
            errors.append(f"{_where(names, f, j, op)}: operand {k} reads {names(v)}, the old value of buffer {buf}, "
                          f"{when} op #{w} {wop.name} at loc({wop.loc}) wrote that buffer in place "
                          f"(read {names(new)} or move the read before the write)")
        for k, r in enumerate(f.returns or ()):
            if r is v:
                errors.append(f"@{f.name}: return value {k} ({names(v)}) is the old value of buffer {buf}, which op "
                              f"#{w} {wop.name} at loc({wop.loc}) wrote in place (return the written value)")
        if len(errors) >= 20:
            break
    return errors


__all__ = ["verify_state_errors"]
