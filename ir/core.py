"""The IR's objects: Value, Op, Function, Module.

A `Module` holds named `Function`s (`prefill`, `decode`, ...) in order. A `Function` has
typed arguments (Values), a straight-line list of `Op`s in SSA form, the values it returns,
and its declared result types. An `Op` has a registered name (`aten.mm`, `dsv41.moe`,
`kernel.call`, `stream.wait`), operand Values, result Values, an attribute dict (frozen
values, see `ir/attrs.py`) and an optional source location (`"layers.20.attn.indexer"`).

A `Value` has a type, a name hint (the text form's `%name`; the printer makes names unique),
value attributes (buffer placement: `arena_offset` (int bytes), `placement`
("persistent" | "transient"); a weight argument stacked from per-expert checkpoint tensors:
`stack_of` (the members' name with `{e}` for the expert index), `stack_count`), and its owner: the defining Op, or the Function for an
argument.

There are no use lists: passes walk the op list forward with a substitution map
(`passes/rewrite.py`) or backward for liveness, which is linear and leaves no use list to
keep consistent. Values compare by identity; modules compare structurally (`==`, ignoring
value names): same functions, ops, types, attributes, locations and def-use edges.

Known gaps: no regions/blocks (control flow is unrolled by tracing); Function order is the
insertion order; `clone()` deep-copies ops and values but shares immutable attributes/types.
"""
from __future__ import annotations

import re

from dsv41c.ir.attrs import attr_key, attrs_key, freeze
from dsv41c.ir.types import Type

# What the text form can spell (the parser's identifiers); checked on construction so a
# module that prints always parses back.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_FUNC = re.compile(r"[A-Za-z0-9_.]+\Z")


def _attr_dict(attrs: dict | None) -> dict:
    out = {}
    for k, v in (attrs or {}).items():
        if not isinstance(k, str) or not _IDENT.match(k):
            raise ValueError(f"bad attribute name {k!r}: use letters, digits, '_' or '.', not starting with a digit")
        out[k] = freeze(v)
    return out


# Value attributes the IR knows; the verifier checks them.
VALUE_ATTRS = {"arena_offset": "int", "placement": "str", "stack_of": "str", "stack_count": "int"}
PLACEMENTS = ("persistent", "transient")


class _Attributed:
    """`attrs` is validated and frozen on every assignment (passes replace whole dicts)."""

    __slots__ = ()

    @property
    def attrs(self) -> dict:
        return self._attrs

    @attrs.setter
    def attrs(self, value):
        self._attrs = _attr_dict(value)


class Value(_Attributed):
    __slots__ = ("type", "name", "_attrs", "owner", "index")

    def __init__(self, type: Type, name: str | None = None, attrs: dict | None = None, owner=None, index: int = 0):
        if not isinstance(type, Type):
            raise TypeError(f"Value type must be an ir Type, got {type!r}")
        self.type = type
        self.name = name
        self.owner = owner  # Op (result) or Function (argument)
        self.index = index  # result number / argument number
        self.attrs = attrs

    @property
    def op(self) -> "Op | None":
        return self.owner if isinstance(self.owner, Op) else None

    def __repr__(self):
        return f"<Value %{self.name or '?'}: {self.type}>"


class Op(_Attributed):
    __slots__ = ("name", "operands", "results", "_attrs", "loc")

    def __init__(self, name: str, operands=(), result_types=(), attrs: dict | None = None, loc: str | None = None,
                 result_names=None):
        if not _IDENT.match(name):
            raise ValueError(f"bad op name {name!r}")
        self.name = name
        self.operands = list(operands)
        names = list(result_names or [None] * len(result_types))
        self.results = [Value(t, n, owner=self, index=i) for i, (t, n) in enumerate(zip(result_types, names))]
        self.attrs = attrs
        self.loc = loc

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.name} has {len(self.results)} results, not one")
        return self.results[0]

    def __repr__(self):
        return f"<Op {self.name} ({len(self.operands)} -> {len(self.results)})>"


class Function:
    def __init__(self, name: str, args=(), result_types=(), ops=None, returns=None):
        if not _FUNC.match(name):
            raise ValueError(f"bad function name {name!r}: use letters, digits, '_' or '.'")
        self.name = name
        self.args: list[Value] = []
        for i, a in enumerate(args):
            if isinstance(a, Value):
                v = a
            else:  # (name, type) or (name, type, attrs)
                v = Value(a[1], a[0], a[2] if len(a) > 2 else None)
            v.owner, v.index = self, i
            self.args.append(v)
        self.result_types: list[Type] = list(result_types)
        self.ops: list[Op] = list(ops or [])
        self.returns: list[Value] | None = returns  # None: no `return` (the verifier reports it)

    def add_arg(self, name: str, type: Type, attrs: dict | None = None) -> Value:
        v = Value(type, name, attrs, owner=self, index=len(self.args))
        self.args.append(v)
        return v

    def bound_symbols(self) -> frozenset:
        """Symbols fixed by the argument types (the interpreter binds them from inputs)."""
        out = frozenset()
        for a in self.args:
            out |= a.type.free_symbols()
        return out

    def __repr__(self):
        return f"<Function @{self.name}: {len(self.args)} args, {len(self.ops)} ops>"


class Module:
    def __init__(self, functions=None, attrs: dict | None = None):
        self.functions: dict[str, Function] = {}
        for f in functions or []:
            self.add(f)
        self.attrs = _attr_dict(attrs)

    def add(self, f: Function) -> Function:
        if f.name in self.functions:
            raise ValueError(f"module already has a function @{f.name}")
        self.functions[f.name] = f
        return f

    def add_function(self, name: str, args=(), result_types=()) -> Function:
        return self.add(Function(name, args, result_types))

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    def ops(self):
        for f in self.functions.values():
            yield from f.ops

    def clone(self) -> "Module":
        return Module([clone_function(f) for f in self.functions.values()], dict(self.attrs))

    def __eq__(self, other):
        return isinstance(other, Module) and structural_key(self) == structural_key(other)

    __hash__ = None

    def __str__(self):
        from dsv41c.ir.printer import print_module

        return print_module(self)


def clone_function(f: Function) -> Function:
    remap: dict[int, Value] = {}
    nf = Function(f.name, [(a.name, a.type, dict(a.attrs)) for a in f.args], list(f.result_types))
    for old, new in zip(f.args, nf.args):
        remap[id(old)] = new
    pairs = []
    for op in f.ops:  # results first, operands second: a use-before-def stays one (the verifier reports it)
        nop = Op(op.name, [], [r.type for r in op.results], dict(op.attrs), op.loc, [r.name for r in op.results])
        for old, new in zip(op.results, nop.results):
            new.attrs = dict(old.attrs)
            remap[id(old)] = new
        pairs.append((op, nop))
    for op, nop in pairs:
        nop.operands = [remap.get(id(v), v) for v in op.operands]
        nf.ops.append(nop)
    nf.returns = None if f.returns is None else [remap.get(id(v), v) for v in f.returns]
    return nf


def structural_key(m: Module):
    """A hashable description of a module that ignores value names (def-use by position)."""
    out = [attrs_key(m.attrs)]
    for f in m.functions.values():
        num: dict[int, object] = {}
        for i, a in enumerate(f.args):
            num[id(a)] = ("arg", i)
        for j, op in enumerate(f.ops):
            for r in op.results:
                num[id(r)] = ("op", j, r.index)
        fk = [f.name, tuple((a.type, attrs_key(a.attrs)) for a in f.args), tuple(f.result_types)]
        for op in f.ops:
            fk.append((op.name, tuple(num.get(id(v), ("free", id(v))) for v in op.operands),
                       tuple((r.type, attrs_key(r.attrs)) for r in op.results), attrs_key(op.attrs), op.loc))
        fk.append(None if f.returns is None else tuple(num.get(id(v), ("free", id(v))) for v in f.returns))
        out.append(tuple(fk))
    return tuple(out)


__all__ = ["Value", "Op", "Function", "Module", "clone_function", "structural_key", "attr_key", "VALUE_ATTRS",
           "PLACEMENTS"]
