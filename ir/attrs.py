"""Attribute values: what an op's `{...}` dictionary may hold, frozen and comparable.

An attribute value is one of: `int`, `float`, `bool`, `str`, `None`, a `DType`, a symbolic
dimension (`SymExpr`), the dynamic-dimension marker `DYN` (printed `?`: "take the next
`index` operand", MLIR's mixed static/dynamic sizes), or a tuple of attribute values
(printed as a list `[...]`). `freeze` turns user-given lists into tuples so attributes
are hashable (CSE keys) and cannot be mutated behind an op's back.

`attr_key` is the canonical, hashable identity of a value: it keeps `True` apart from `1`
and `1.0`, and compares floats by their exact text (`repr`), so `nan` equals itself and
`-0.0` differs from `0.0`. Structural equality and CSE both use it.

`check_kind(value, kind)` tests a value against a schema kind (`int`, `float`, `Scalar`,
`Dim`, `Dim[]`, `dtype`, ... see `ir/schema.py`) and returns an error string or None.
`format_attr(value)` is a value's IR text (the printer's and the diagnostics' one spelling).
"""
from __future__ import annotations

from dsv41c.ir.symbolic import SymExpr, is_dim
from dsv41c.ir.types import DType


class _Dyn:
    """`?` in a dimension attribute: the value comes from the next `index` operand."""

    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self):
        return "DYN"

    def __str__(self):
        return "?"

    def __reduce__(self):
        return (_Dyn, ())


DYN = _Dyn()


def freeze(v):
    if isinstance(v, list):
        return tuple(freeze(x) for x in v)
    if isinstance(v, tuple):
        return tuple(freeze(x) for x in v)
    if v is None or v is DYN or isinstance(v, (bool, int, float, str, DType, SymExpr)):
        return v
    raise TypeError(f"not an attribute value: {v!r} ({type(v).__name__})")


def attr_key(v):
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v)
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, tuple):
        return ("l", tuple(attr_key(x) for x in v))
    if v is None:
        return ("n",)
    if v is DYN:
        return ("?",)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, DType):
        return ("d", v.name)
    if isinstance(v, SymExpr):
        return ("e", v)
    raise TypeError(f"not an attribute value: {v!r}")


def attrs_key(attrs: dict):
    return tuple(sorted((k, attr_key(v)) for k, v in attrs.items()))


def attrs_equal(a: dict, b: dict) -> bool:
    return attrs_key(a) == attrs_key(b)


def count_dyn(v) -> int:
    if v is DYN:
        return 1
    if isinstance(v, tuple):
        return sum(count_dyn(x) for x in v)
    return 0


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_dim_or_dyn(v):
    return v is DYN or is_dim(v)


_SCALAR_CHECKS = {
    "int": _is_int,
    "float": lambda v: isinstance(v, float) or _is_int(v),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dtype": lambda v: isinstance(v, DType),
    "Scalar": lambda v: isinstance(v, (bool, int, float)),
    "Dim": _is_dim_or_dyn,
    "Any": lambda v: True,
}

KINDS = frozenset(_SCALAR_CHECKS) | frozenset(k + "[]" for k in _SCALAR_CHECKS)


def check_kind(v, kind: str) -> str | None:
    """None if `v` fits `kind` (optional kinds end in '?'), else what was wrong."""
    if kind.endswith("?"):
        if v is None:
            return None
        kind = kind[:-1]
    if kind.endswith("[]"):
        if not isinstance(v, tuple):
            return f"expected a list of {kind[:-2]}, got {describe(v)}"
        for x in v:
            err = check_kind(x, kind[:-2])
            if err:
                return err
        return None
    if not _SCALAR_CHECKS[kind](v):
        return f"expected {kind}, got {describe(v)}"
    return None


def describe(v) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "str", tuple: "list"}
    kind = "dtype" if isinstance(v, DType) else "dim" if isinstance(v, SymExpr) else names.get(type(v), type(v).__name__)
    if v is None:
        kind = "none"
    return f"{kind} {format_attr(v)}"


_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def format_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESC:
            out.append(_ESC[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def format_attr(v) -> str:
    if v is None:
        return "none"
    if v is DYN:
        return "?"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return format_string(v)
    if isinstance(v, (DType, SymExpr)):
        return str(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r}")
