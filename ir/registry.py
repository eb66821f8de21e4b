"""The op registry: one `OpDef` per op name, registered from one-line schemas.

    register("aten.mm(Tensor self, Tensor mat2) -> Tensor",
             shape=lambda a: ...,          # Args of types/attrs -> result Type(s)
             impl=lambda a: ...,           # Args of torch tensors/ints -> tensor(s)
             cost=lambda a, results: Cost(flops, bytes),
             writes=(), sync=False)

- schema: `ir/schema.py` (operands, attributes with kinds and defaults, results);
- shape rule: gets `Args` with operand *types* (TensorType/IndexType/EventType; lists for
  variadics) and attribute values (`?` dims replaced by the wildcard `ANY`); returns the
  result type(s). Raise `ShapeError` for operands that cannot go together;
- reference implementation (`impl`): gets `Args` with torch tensors (index operands as
  Python ints) and concrete attributes (symbols evaluated, `?` filled, dtypes as torch
  dtypes); returns a tensor, a tuple, or None. The interpreter runs any module with these;
- cost: FLOPs and bytes moved as dims (symbolic where the shapes are);
- effects: `writes` names operands the op mutates in place (cache appends), `sync` marks
  ordering ops (stream record/wait). Ops with effects are never removed by DCE nor merged
  by CSE (`OpDef.has_side_effects`). `updates` pairs a written operand with the result that
  is its buffer after the write (`(("cache", 0),)`: an op functional in form, in place in
  effect); `ir/verify_state.py` follows a state buffer through them.

Op families register from tables in `OP_MODULES` (imported on the first lookup, so
`import dsv41c.ir` stays cheap); the domain file (`ir/ops_dsv41.py`: sparse attention,
indexer, FP4/FP8 pack, compressor, MoE, Engram, mHC) plugs in the same way and is imported
when present.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

from dsv41c.ir.attrs import DYN
from dsv41c.ir.schema import Args, Schema, bind, fill_dyn, dyn_slots, parse_schema
from dsv41c.ir.symbolic import ANY, Dim
from dsv41c.ir.types import TensorType, Type

OP_MODULES = ["dsv41c.ir.ops_aten", "dsv41c.ir.ops_aten_shape", "dsv41c.ir.ops_aten_index",
              "dsv41c.ir.ops_runtime", "dsv41c.ir.ops_dsv41", "dsv41c.ir.ops_state",
              "dsv41c.ir.ops_indexer_int8", "dsv41c.ir.ops_compressor_fused"]


class ShapeError(ValueError):
    """Operands (or attributes) a shape rule cannot accept."""


@dataclass(frozen=True)
class Cost:
    flops: Dim = 0
    bytes: Dim = 0

    def __add__(self, other):
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


def tensors_in(a) -> list:
    """The tensor types among a shape rule's Args (variadic lists flattened)."""
    out = []
    for v in dict.values(a):
        if isinstance(v, TensorType):
            out.append(v)
        elif isinstance(v, list):
            out.extend(x for x in v if isinstance(x, TensorType))
    return out


def memory_cost(a, results) -> Cost:
    """The default cost: no FLOPs, every operand and result tensor moved once."""
    moved = 0
    for t in tensors_in(a) + list(results):
        moved = moved + (t.nbytes if isinstance(t, TensorType) else 0)
    return Cost(0, moved)


@dataclass(frozen=True)
class OpDef:
    name: str
    schema: Schema
    shape: Callable
    impl: Callable
    cost_fn: Callable | None = None
    writes: tuple = ()
    sync: bool = False
    doc: str = field(default="", compare=False)
    updates: tuple = ()  # (written operand, result index of its buffer after the write)

    @property
    def has_side_effects(self) -> bool:
        return bool(self.writes) or self.sync

    def bind(self, operands, attrs):
        return bind(self.schema, operands, attrs)

    def infer(self, operands, attrs) -> list[Type] | None:
        """Result types from operand Values and attributes (ANY where only run time knows;
        None where the op has no rule and its declared types stand)."""
        args, _ = self.bind(operands, attrs)
        return self.infer_args(_types_of(args))

    def infer_args(self, targs: Args) -> list[Type]:
        for a in self.schema.args:
            if a.attr and targs.get(a.name) is not None:
                targs[a.name] = _dyn_to_any(targs[a.name])
        out = self.shape(targs)
        if out is None:  # no rule (a bare kernel.call): the declared types stand
            return None
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        if not self.schema.variadic_results and len(out) != len(self.schema.results):
            raise AssertionError(f"shape rule of {self.name} returned {len(out)} types for {self.schema}")
        return out

    def cost(self, operands, attrs, result_types) -> Cost:
        args, _ = self.bind(operands, attrs)
        targs = _types_of(args)
        if self.cost_fn is None:
            return memory_cost(targs, result_types)
        return self.cost_fn(targs, result_types)

    def resolve_dyn(self, attrs: dict, values) -> dict:
        return fill_dyn(attrs, dyn_slots(self.schema, attrs), values)


def _dyn_to_any(v):
    if v is DYN:
        return ANY
    if isinstance(v, tuple):
        return tuple(_dyn_to_any(x) for x in v)
    return v


def _types_of(args: Args) -> Args:
    from dsv41c.ir.core import Value

    out = Args()
    for k, v in dict.items(args):
        if isinstance(v, Value):
            out[k] = v.type
        elif isinstance(v, list):
            out[k] = [x.type for x in v]
        else:
            out[k] = v
    return out


_REGISTRY: dict[str, OpDef] = {}
_loaded = False


def register(schema: str, *, shape: Callable, impl: Callable, cost: Callable | None = None, writes=(),
             sync: bool = False, doc: str = "", replace: bool = False, updates=()) -> OpDef:
    s = parse_schema(schema)
    if s.name in _REGISTRY and not replace:
        raise ValueError(f"op {s.name} is already registered")
    for w in writes:
        if s.arg(w) is None or s.arg(w).operand is None:
            raise ValueError(f"op {s.name}: writes={w!r} is not an operand of {s}")
    for w, r in updates:
        if w not in writes or not 0 <= r < len(s.results):
            raise ValueError(f"op {s.name}: updates ({w!r}, {r}) needs a written operand and a result of {s}")
    d = OpDef(s.name, s, shape, impl, cost, tuple(writes), sync, doc, tuple(updates))
    _REGISTRY[s.name] = d
    return d


def _ensure_loaded():
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in OP_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)


def lookup(name: str) -> OpDef | None:
    _ensure_loaded()
    return _REGISTRY.get(name)


def get(name: str) -> OpDef:
    d = lookup(name)
    if d is None:
        raise KeyError(f"unknown op '{name}'")
    return d


def all_ops() -> dict[str, OpDef]:
    _ensure_loaded()
    return dict(_REGISTRY)


def infer_types(name: str, operands, attrs: dict) -> list[Type]:
    return get(name).infer(operands, attrs)
