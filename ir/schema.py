"""Op schemas: a one-line signature per op, and binding an op instance to it.

A schema reads like ATen's, so the exporter can map a node's arguments by name:

    aten.add(Tensor self, Tensor|Scalar other, Scalar alpha=1) -> Tensor
    aten.cat(Tensor[] tensors, int dim=0) -> Tensor
    aten.topk(Tensor self, int k, int dim=-1, bool largest=true, bool sorted=true) -> (Tensor, Tensor)
    kernel.call(Any[] inputs, str template, str variant, str target, **extra) -> Any[]

Argument kinds:
- operands: `Tensor`, `Index`, `Event`, `Any`; `X?` optional, `X[]` variadic (at most one
  variadic per op, and then no optional operand, so binding is never ambiguous);
- attributes: `int float bool str dtype Scalar Dim Any`, `K[]` lists, `K?` may be `none`;
  `=DEFAULT` in the IR's attribute syntax makes one optional;
- operand-or-attribute `X|K` (`Tensor|Scalar other`): an attribute when the op has an
  attribute of that name, else the next operand (ATen's Tensor-or-Scalar overloads);
- `**extra`: any further attributes are accepted (kernel.call carries the original op's).
Results: `Tensor`, `Index`, `Event`, `(T1, T2)`, `()`, or `Tensor[]`/`Any[]` (the shape rule
says how many).

Dynamic dims: a `Dim` attribute may hold `?` (DYN); each `?` takes one trailing `index`
operand, in schema order then list order (`dyn_slots`). `bind` returns an `Args` dict
(operand -> Value or list of Values, attribute -> value or its default) plus the dynamic
operands; `BindError` says what does not fit. Every op also accepts the attributes in
`GLOBAL_ATTRS` (e.g. `stream`, set by schedule-streams; `once`, set by hoist-invariants).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from dsv41c.ir.attrs import DYN, KINDS, check_kind, describe, format_attr
from dsv41c.ir.types import EventType, IndexType, TensorType

GLOBAL_ATTRS = {"stream": "int", "once": "bool"}  # once: hoist-invariants
OPERAND_KINDS = {"Tensor": TensorType, "Index": IndexType, "Event": EventType, "Any": object}
REQUIRED = object()


class BindError(ValueError):
    """An op instance that does not fit its schema."""


class Args(dict):
    """Bound arguments by schema name; attribute access (`a.self`, `a.dim`) for rules.

    An argument shadows a dict method of the same name (`a.values` is index_put's values)."""

    def __getattribute__(self, name):
        if not name.startswith("__") and dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        return super().__getattribute__(name)

    def __getattr__(self, name):
        raise AttributeError(name)


@dataclass(frozen=True)
class Arg:
    name: str
    operand: str | None  # "Tensor" | "Index" | "Event" | "Any" | None
    attr: str | None  # attribute kind ("int", "Dim[]", "Scalar?", ...) | None
    default: object = REQUIRED
    optional: bool = False  # optional operand (`Tensor?`)
    variadic: bool = False  # `Tensor[]`

    @property
    def has_default(self):
        return self.default is not REQUIRED


@dataclass(frozen=True)
class Schema:
    name: str
    args: tuple
    results: tuple  # kinds, e.g. ("Tensor", "Tensor"); ("Tensor[]",) for variadic results
    extra: bool = False  # **extra

    @property
    def variadic_results(self) -> bool:
        return len(self.results) == 1 and self.results[0].endswith("[]")

    def arg(self, name) -> Arg | None:
        for a in self.args:
            if a.name == name:
                return a
        return None

    def __str__(self):
        def fmt(a):
            kind = "|".join(k for k in (a.operand and a.operand + ("?" if a.optional else "") +
                                        ("[]" if a.variadic else ""), a.attr) if k)
            s = f"{kind} {a.name}"
            if a.has_default:
                s += "=" + format_attr(a.default)
            return s

        args = [fmt(a) for a in self.args] + (["**extra"] if self.extra else [])
        res = self.results[0] if len(self.results) == 1 else "(" + ", ".join(self.results) + ")"
        return f"{self.name}({', '.join(args)}) -> {res}"


_SCHEMA_RE = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\((.*)\)\s*->\s*(.+?)\s*\Z", re.DOTALL)


def parse_schema(text: str) -> Schema:
    from dsv41c.ir.parser import parse_attr

    m = _SCHEMA_RE.match(text)
    if not m:
        raise ValueError(f"bad schema {text!r}")
    name, body, res = m.groups()
    args, extra = [], False
    for part in _split_top(body):
        if part == "**extra":
            extra = True
            continue
        decl, _, default = part.partition("=")
        kind, _, argname = decl.strip().rpartition(" ")
        if not kind or not argname:
            raise ValueError(f"bad argument {part!r} in schema {name}")
        operand = attr = None
        optional = variadic = False
        for k in kind.split("|"):
            base = k.rstrip("?").removesuffix("[]").rstrip("?")
            if base in OPERAND_KINDS and operand is None:
                operand, optional, variadic = base, k.endswith("?"), k.endswith("[]")
            elif k in KINDS or (k.endswith("?") and k[:-1] in KINDS):
                attr = k
            else:
                raise ValueError(f"unknown kind {k!r} in schema {name}")
        dflt = parse_attr(default.strip()) if default else REQUIRED
        args.append(Arg(argname, operand, attr, dflt, optional, variadic))
    res = res.strip()
    results = tuple(r.strip() for r in res[1:-1].split(",") if r.strip()) if res.startswith("(") else (res,)
    vari = [a for a in args if a.variadic]
    if len(vari) > 1 or (vari and any(a.optional for a in args)):
        raise ValueError(f"schema {name}: at most one variadic operand, and none with optional operands")
    return Schema(name, tuple(args), results, extra)


def _split_top(body: str):
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def dyn_slots(schema: Schema, attrs: dict):
    """(attr name, list position or None) of each `?`, in the order index operands fill them."""
    out = []
    for a in schema.args:
        v = attrs.get(a.name)
        if v is DYN:
            out.append((a.name, None))
        elif isinstance(v, tuple):
            out.extend((a.name, i) for i, x in enumerate(v) if x is DYN)
    return out


def fill_dyn(attrs: dict, slots, values) -> dict:
    out = dict(attrs)
    for (name, pos), val in zip(slots, values):
        if pos is None:
            out[name] = val
        else:
            lst = list(out[name])
            lst[pos] = val
            out[name] = tuple(lst)
    return out


def bind(schema: Schema, operands, attrs: dict):
    """-> (Args, dynamic index operands). Raises BindError naming what does not fit."""
    slots = dyn_slots(schema, attrs)
    n_dyn = len(slots)
    if n_dyn > len(operands):
        raise BindError(f"has {n_dyn} '?' dimension(s) but only {len(operands)} operand(s) to fill them")
    main, dyn = list(operands[:len(operands) - n_dyn]), list(operands[len(operands) - n_dyn:])
    for v in dyn:
        if not isinstance(v.type, IndexType):
            raise BindError(f"a '?' dimension takes an index operand, got {v.type}")
    takes = []  # (arg, "one" | "opt" | "var")
    for a in schema.args:
        if a.operand is None or (a.attr is not None and a.name in attrs):
            continue
        optional = a.optional or (a.attr or "").endswith("?")
        takes.append((a, "var" if a.variadic else "opt" if optional else "one"))
    required = sum(1 for _, k in takes if k == "one")
    spare = len(main) - required
    has_var = any(k == "var" for _, k in takes)
    names = ", ".join(a.name for a, k in takes if k == "one") or "none"
    if spare < 0 or (spare > sum(1 for _, k in takes if k == "opt") and not has_var):
        raise BindError(f"expects {required} operand(s) ({names}), got {len(main)}")
    out = Args()
    i = 0
    for a, k in takes:
        if k == "var":
            out[a.name] = main[i:i + spare]
            i += spare
            spare = 0
            continue
        if k == "opt":
            if spare <= 0:
                out[a.name] = None
                continue
            spare -= 1
        v = main[i]
        i += 1
        want = OPERAND_KINDS[a.operand]
        if not isinstance(v.type, want):
            raise BindError(f"operand '{a.name}' must be {a.operand.lower()}, got {v.type}")
        out[a.name] = v
    for a in schema.args:
        if a.name in out:
            continue
        if a.attr is None:
            out[a.name] = None
            continue
        if a.name in attrs:
            err = check_kind(attrs[a.name], a.attr)
            if err:
                raise BindError(f"attribute '{a.name}': {err}")
            out[a.name] = attrs[a.name]
        elif a.has_default:
            out[a.name] = a.default
        else:
            raise BindError(f"missing attribute '{a.name}' ({a.attr})")
    for k, v in attrs.items():
        if schema.arg(k) is not None:
            continue
        if k in GLOBAL_ATTRS:
            err = check_kind(v, GLOBAL_ATTRS[k])
            if err:
                raise BindError(f"attribute '{k}': {err}")
        elif schema.extra:
            out[k] = v
        else:
            known = ", ".join(a.name for a in schema.args if a.attr) or "none"
            raise BindError(f"unknown attribute '{k}' = {describe(v)} (known: {known})")
    return out, dyn
