"""Building IR from Python: what tracing and passes use to make ops.

    m = Module()
    f = m.add_function("decode", [("x", tensor(bf16, "T", 5120)), ("w", tensor(bf16, 5120, 1280))])
    b = Builder(f)
    with b.at("layers.0.attn.wq_a"):
        y = b.op("aten.mm", f.args[0], f.args[1])            # result type from the shape rule
    top, idx = b.op("aten.topk", y, k=8)                     # several results -> a tuple
    b.ret(y)                                                 # sets the return and result types

`op(name, *operands, result_types=None, name_hint=None, loc=None, **attrs)` appends an op (or
inserts it at `insert_at`), infers result types through the registry's shape rule unless
given, and refuses a wildcard dim (`?`) it cannot fill: pass `result_types` there
(data-dependent sizes, bare kernel.call). Locations nest: `with b.at("layers.0"):
with b.at("attn"):` gives "layers.0.attn"; an explicit `loc=` wins.
"""
from __future__ import annotations

from contextlib import contextmanager

from dsv41c.ir.core import Function, Op, Value
from dsv41c.ir.registry import get
from dsv41c.ir.symbolic import ANY
from dsv41c.ir.types import TensorType


class Builder:
    def __init__(self, func: Function, insert_at: int | None = None):
        self.func = func
        self.insert_at = insert_at  # None: append
        self._loc: list[str] = []

    @contextmanager
    def at(self, loc: str):
        self._loc.append(loc)
        try:
            yield self
        finally:
            self._loc.pop()

    @property
    def loc(self) -> str | None:
        return ".".join(self._loc) if self._loc else None

    def create(self, name: str, operands, attrs: dict, result_types=None, names=None, loc=None) -> Op:
        """Make an op (types inferred unless given) without inserting it."""
        if result_types is None:
            result_types = get(name).infer(list(operands), attrs)
            if result_types is None:
                raise ValueError(f"{name} has no shape rule: pass result_types")
            for t in result_types:
                if isinstance(t, TensorType) and any(d is ANY for d in t.shape):
                    raise ValueError(f"{name}: the shape rule leaves a dim open ({t}): pass result_types")
        return Op(name, operands, result_types, attrs, loc if loc is not None else self.loc, names)

    def insert(self, op: Op) -> Op:
        if self.insert_at is None:
            self.func.ops.append(op)
        else:
            self.func.ops.insert(self.insert_at, op)
            self.insert_at += 1
        return op

    def op(self, name: str, /, *operands: Value, result_types=None, name_hint=None, loc=None, **attrs):
        names = [name_hint] if isinstance(name_hint, str) else name_hint
        op = self.insert(self.create(name, list(operands), attrs, result_types, names, loc))
        if len(op.results) == 1:
            return op.results[0]
        return tuple(op.results) if op.results else None

    def ret(self, *values: Value) -> None:
        self.func.returns = list(values)
        self.func.result_types = [v.type for v in values]
