"""Helpers the op tables share: dtype promotion, broadcasting, dims, costs, ATen impls.

- `result_dtype(*items)`: torch's type promotion (`torch.result_type` semantics) over
  TensorTypes and Python scalars: dimensioned tensors decide the dtype; a 0-d tensor or a
  scalar of a higher category (bool < int < float) lifts it (0-d tensors to their own
  dtype, scalars to the default dtype of the category: i64 or f32). Storage-only dtypes
  (fp8/e8m0/fp4) do no arithmetic: promotion raises `ShapeError`.
- `broadcast(*shapes)`: numpy broadcasting over symbolic dims; two different symbols
  do not broadcast (tracing equates what torch.export proved equal).
- costs: `elementwise_cost` (one FLOP per output element), `reduction_cost` (one per input
  element), `memory_cost` (bytes only), `VIEW_COST` (metadata only: zero).
- `aten(name)`: a reference implementation that calls `torch.ops.aten.<name>` with the
  first argument positional and the rest by schema name (our schemas use ATen's names).
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch

from dsv41c.ir.registry import Cost, ShapeError, memory_cost, tensors_in  # noqa: F401 (re-exported)
from dsv41c.ir.symbolic import ANY, Dim, SymExpr, product
from dsv41c.ir.types import DType, TensorType, bool_, f32, i64

_CATEGORY = {"bool": 0, "int": 1, "float": 2}
VIEW_COST = Cost(0, 0)


def category(dt: DType) -> int:
    if dt.category not in _CATEGORY:
        raise ShapeError(f"{dt} is a storage format: unpack or dequantize it before arithmetic")
    return _CATEGORY[dt.category]


_INT_RANK = {"u8": 1, "i8": 1, "i32": 3, "i64": 4}
_FLOAT_RANK = {"f16": 1, "bf16": 1, "f32": 2, "f64": 3}


def promote(a: DType, b: DType) -> DType:
    """torch.promote_types over the IR's dtypes, without importing torch."""
    ca, cb = category(a), category(b)
    if a == b:
        return a
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:
        if {a.name, b.name} == {"f16", "bf16"}:
            return f32
        return a if _FLOAT_RANK[a.name] > _FLOAT_RANK[b.name] else b
    if {a.name, b.name} == {"u8", "i8"}:
        raise ShapeError("u8 and i8 promote to int16, which the IR has no dtype for")
    return a if _INT_RANK[a.name] > _INT_RANK[b.name] else b


def _promote_all(dts):
    out = dts[0]
    for d in dts[1:]:
        out = promote(out, d)
    return out


def _scalar_dtype(v) -> DType:
    return bool_ if isinstance(v, bool) else i64 if isinstance(v, int) else f32


def result_dtype(*items) -> DType:
    dimmed = [t.dtype for t in items if isinstance(t, TensorType) and t.rank > 0]
    zerod = [t.dtype for t in items if isinstance(t, TensorType) and t.rank == 0]
    scalars = [_scalar_dtype(v) for v in items if isinstance(v, (bool, int, float)) and not isinstance(v, TensorType)]
    res = _promote_all(dimmed) if dimmed else None
    for group, default in ((zerod, False), (scalars, True)):
        if not group:
            continue
        g = _promote_all(group)
        if res is None:
            res = g
        elif category(g) > category(res):
            res = g if not default else (f32 if category(g) == 2 else i64)
    if res is None:
        raise ShapeError("no operand to take a dtype from")
    return res


def same_dim(a: Dim, b: Dim) -> bool:
    return a is ANY or b is ANY or a == b


def broadcast(*shapes) -> tuple:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        d = 1
        for s in shapes:
            j = i - rank + len(s)
            if j < 0:
                continue
            x = s[j]
            if x == 1:
                continue
            if d == 1 or d is ANY:
                d = x if not (d is ANY and x is ANY) else ANY
            elif x is ANY or x == d:
                continue
            else:
                raise ShapeError(f"shapes {', '.join(_fmt_shape(s) for s in shapes)} do not broadcast "
                                 f"(dim {i}: {d} vs {x})")
        out.append(d)
    return tuple(out)


def _fmt_shape(s):
    return "[" + ", ".join(str(d) for d in s) + "]"


def norm_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not isinstance(d, int) or not -r <= d < r:
        raise ShapeError(f"dim {d} out of range for rank {rank}")
    return d % r


def norm_dims(dims, rank: int) -> tuple:
    out = tuple(norm_dim(d, rank) for d in dims)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated dim in {list(dims)}")
    return out


def reduce_shape(shape: tuple, dims, keepdim: bool) -> tuple:
    """Result shape of a reduction over `dims` (None, () or [] mean all dims)."""
    if dims is None or (isinstance(dims, tuple) and len(dims) == 0):
        rd = set(range(len(shape)))
    else:
        rd = set(norm_dims(dims if isinstance(dims, tuple) else (dims,), len(shape)))
    if keepdim:
        return tuple(1 if i in rd else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in rd)


def need_tensor(t, what="operand") -> TensorType:
    if not isinstance(t, TensorType):
        raise ShapeError(f"{what} must be a tensor, got {t}")
    return t


def need_float(t: TensorType, op: str) -> TensorType:
    if not t.dtype.is_float:
        raise ShapeError(f"{op} needs a floating-point tensor, got {t}")
    return t


def need_rank(t: TensorType, rank: int, op: str, name="operand"):
    if t.rank != rank:
        raise ShapeError(f"{op}: {name} must have rank {rank}, got {t}")


def eq_dims(a: Dim, b: Dim, what: str):
    if not same_dim(a, b):
        raise ShapeError(f"{what}: {a} vs {b}")


# ---------------------------------------------------------------------------- costs
def elementwise_cost(a, results) -> Cost:
    return Cost(results[0].numel if results else 0, memory_cost(a, results).bytes)


def reduction_cost(a, results) -> Cost:
    ins = tensors_in(a)
    return Cost(ins[0].numel if ins else 0, memory_cost(a, results).bytes)


def view_cost(a, results) -> Cost:
    return VIEW_COST


def numel(shape) -> Dim:
    return product(shape)


def is_static(d) -> bool:
    return isinstance(d, int) or (isinstance(d, SymExpr) and d is not ANY)


# ---------------------------------------------------------------------------- reference impls
def aten(name: str, positional: int = 1, drop=()):
    """Call torch.ops.aten.<name>(first `positional` args, **the rest by name)."""
    packet = None

    def impl(a):
        nonlocal packet
        if packet is None:
            packet = getattr(torch.ops.aten, name)
        items = [(k, v) for k, v in dict.items(a) if k not in drop]
        pos = [v for _, v in items[:positional]]
        kw = {k: v for k, v in items[positional:]}
        return packet(*pos, **kw)

    impl.__name__ = f"aten_{name}"
    return impl
