"""The IR verifier: every rule a well-formed module keeps, with messages that say where.

Checks, per function, walking ops in order:
- the op is registered (`unknown op`);
- operands are defined before use in this function (`use of %x before its definition`,
  or `%x is not defined in @f` for a value from elsewhere or from an erased op);
- operands and attributes fit the schema (count, operand kinds, attribute names and kinds,
  required attributes, `?` dims with their index operands);
- the result count and each result type equal what the shape rule infers (dims compared
  structurally; a rule's wildcard `?` accepts any declared dim, and that dim's symbols
  become known from there on);
- every symbol in a result type is bound by the arguments or introduced by a
  data-dependent result before (the interpreter must be able to bind it);
- value attributes: `arena_offset` a non-negative int, `placement` persistent|transient;
- the function ends in `return` and returns values of its declared result types;
- then the stream rules (`ir/verify_streams.py`) and the state rules (`ir/verify_state.py`: no
  read or second write of a state buffer's old value after an in-place write replaced it).

Each message reads `@func: op #N aten.mm (%3) at loc("layers.0.attn.wq_a"): what`, naming
values as the printer does. `verify(m)` raises `VerifyError` (all messages in `.errors`;
the text says the first and how many more); `verify_errors(m)` returns the list.
"""
from __future__ import annotations

from dsv41c.ir.attrs import check_kind
from dsv41c.ir.core import PLACEMENTS, VALUE_ATTRS, Module
from dsv41c.ir.printer import format_string, function_namer
from dsv41c.ir.registry import lookup
from dsv41c.ir.schema import BindError
from dsv41c.ir.symbolic import ANY
from dsv41c.ir.types import EventType, IndexType, TensorType

_RESULT_KINDS = {"Tensor": TensorType, "Index": IndexType, "Event": EventType}


class VerifyError(ValueError):
    """A module that breaks an IR rule; `.errors` lists every message."""

    def __init__(self, errors):
        self.errors = list(errors)
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(self.errors[0] + more)


def verify(module: Module) -> None:
    errors = verify_errors(module)
    if errors:
        raise VerifyError(errors)


def verify_errors(module: Module) -> list[str]:
    out = []
    for f in module.functions.values():
        out.extend(_verify_function(f))
    if out:
        return out
    from dsv41c.ir.verify_state import verify_state_errors  # reads and writes of in-place state buffers
    from dsv41c.ir.verify_streams import verify_stream_errors  # stream order and arena reuse
    return verify_stream_errors(module) + verify_state_errors(module)


def types_match(declared, inferred) -> bool:
    if type(declared) is not type(inferred):
        return False
    if not isinstance(declared, TensorType):
        return True
    return declared.dtype == inferred.dtype and declared.rank == inferred.rank and all(
        i is ANY or d == i for d, i in zip(declared.shape, inferred.shape))


def _value_attr_errors(v) -> list[str]:
    out = []
    for k, val in v.attrs.items():
        if k not in VALUE_ATTRS:
            out.append(f"unknown value attribute '{k}' (known: {', '.join(VALUE_ATTRS)})")
        elif check_kind(val, VALUE_ATTRS[k]):
            out.append(f"value attribute '{k}': {check_kind(val, VALUE_ATTRS[k])}")
        elif k == "arena_offset" and val < 0:
            out.append(f"arena_offset must be >= 0, got {val}")
        elif k == "placement" and val not in PLACEMENTS:
            out.append(f"placement must be one of {', '.join(PLACEMENTS)}, got {val!r}")
    return out


def _verify_function(f) -> list[str]:
    errors = []
    names = function_namer(f)
    where_f = f"@{f.name}"
    defined = {id(a) for a in f.args}
    later = {id(r): i for i, op in enumerate(f.ops) for r in op.results}
    known_syms = set(f.bound_symbols())
    for a in f.args:
        errors += [f"{where_f}: argument {names(a)}: {e}" for e in _value_attr_errors(a)]

    for i, op in enumerate(f.ops):
        res = ", ".join(names(r) for r in op.results)
        where = f"{where_f}: op #{i} {op.name}" + (f" ({res})" if res else "") + (
            f" at loc({format_string(op.loc)})" if op.loc is not None else "")

        def err(msg):
            errors.append(f"{where}: {msg}")

        ok = True
        for k, v in enumerate(op.operands):
            if id(v) in defined:
                continue
            ok = False
            if id(v) in later:
                err(f"use of {names(v)} (operand {k}) before its definition at op #{later[id(v)]}")
            else:
                err(f"operand {k} ({names(v)}) is not defined in {where_f}")
        for r in op.results:
            errors += [f"{where}: result {names(r)}: {e}" for e in _value_attr_errors(r)]
        opdef = lookup(op.name)
        if opdef is None:
            err(f"unknown op '{op.name}'")
        elif ok:
            _check_op(op, opdef, names, known_syms, err)
        defined.update(id(r) for r in op.results)

    if f.returns is None:
        errors.append(f"{where_f}: missing return")
    else:
        for k, v in enumerate(f.returns):
            if id(v) not in defined:
                errors.append(f"{where_f}: return value {k} ({names(v)}) is not defined in {where_f}")
        got = [v.type for v in f.returns]
        if len(got) != len(f.result_types):
            errors.append(f"{where_f}: returns {len(got)} value(s) but the signature declares "
                          f"{len(f.result_types)}")
        else:
            for k, (g, d) in enumerate(zip(got, f.result_types)):
                if g != d:
                    errors.append(f"{where_f}: return value {k} ({names(f.returns[k])}) has type {g}, "
                                  f"the signature declares {d}")
    return errors


def _check_op(op, opdef, names, known_syms, err):
    schema = opdef.schema
    try:
        opdef.bind(op.operands, op.attrs)
    except BindError as e:
        err(f"{e} (schema: {schema})")
        return
    if not schema.variadic_results:
        if len(op.results) != len(schema.results):
            err(f"has {len(op.results)} result(s), the schema has {len(schema.results)} (schema: {schema})")
            return
        for r, kind in zip(op.results, schema.results):
            want = _RESULT_KINDS.get(kind)
            if want is not None and not isinstance(r.type, want):
                err(f"result {names(r)} must be {kind.lower()}, got {r.type}")
                return
    try:
        inferred = opdef.infer(op.operands, op.attrs)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        err(f"shape rule: {e}")
        return
    if inferred is not None:
        if len(inferred) != len(op.results):
            err(f"has {len(op.results)} result(s), the shape rule gives {len(inferred)}")
            return
        for r, t in zip(op.results, inferred):
            if not types_match(r.type, t):
                err(f"result {names(r)} has type {r.type}, the shape rule gives {t}")
            elif isinstance(t, TensorType):
                for d, g in zip(r.type.shape, t.shape):
                    if g is ANY:
                        known_syms |= _syms(d)
    for r in op.results:
        unbound = sorted(r.type.free_symbols() - known_syms)
        if unbound and inferred is None:
            known_syms |= set(unbound)  # a bare kernel.call defines what it declares
        elif unbound:
            err(f"result {names(r)}: symbol(s) {', '.join(unbound)} not bound by the function's arguments")


def _syms(d):
    return d.free_symbols() if hasattr(d, "free_symbols") else set()
