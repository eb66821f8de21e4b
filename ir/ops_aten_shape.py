"""Core ATen ops, part 2: views and reshapes, concatenation and splits, tensor creation.

Size arguments are `Dim` attributes: ints, symbolic expressions (`[T, 64, 512]`), or `?`
filled by trailing `index` operands (`ir/schema.py`). `view`/`reshape` accept one -1.
Reference implementations use `reshape` for every view (the interpreter has no strides,
so a view of a non-contiguous tensor is a copy there, never an error); `empty`/`empty_like`
return zeros so that interpreter runs are deterministic.

Known gaps: `squeeze` drops only dims that are literally 1 (a symbolic dim is never
squeezed); `split`/`unbind`/`chunk` need a static size on the split dim (their result count
is part of the IR); `slice` trusts a symbolic `end` to be within the dim.
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch

from dsv41c.ir.registry import ShapeError, register
from dsv41c.ir.shape_rules import (broadcast, elementwise_cost, eq_dims, memory_cost, need_tensor, norm_dim, norm_dims,
                                   numel, promote, view_cost)
from dsv41c.ir.symbolic import ANY, SymExpr, exact_div, floordiv, product
from dsv41c.ir.types import TensorType, bool_, f32, i64

BIG = 2 ** 62  # ATen's "to the end" (INT64_MAX) and anything past it


def infer_view_shape(t: TensorType, size) -> tuple:
    size = tuple(size)
    holes = [i for i, d in enumerate(size) if d == -1]
    if len(holes) > 1:
        raise ShapeError(f"view: only one -1 allowed in {list(size)}")
    known = product(d for d in size if d != -1)
    total = t.numel
    if holes:
        q = exact_div(total, known)
        if q is None:
            raise ShapeError(f"view: cannot infer -1: {total} elements into {list(size)}")
        size = size[:holes[0]] + (q,) + size[holes[0] + 1:]
    elif ANY not in size and not _has_floordiv(total) and not _has_floordiv(known) and total != known:
        raise ShapeError(f"view: {t} has {total} elements, shape {list(size)} has {known}")
    return size


def _has_floordiv(d):
    return isinstance(d, SymExpr) and d is not ANY and d.has_floordiv()


def _view(a):
    t = need_tensor(a.self)
    return t.with_shape(infer_view_shape(t, a.size))


def _reshape_impl(a):
    return a.self.reshape(a.size)


for _n in ("view", "reshape"):
    register(f"aten.{_n}(Tensor self, Dim[] size) -> Tensor", shape=_view, impl=_reshape_impl, cost=view_cost)


def _permute(a):
    t = need_tensor(a.self)
    dims = norm_dims(a.dims, t.rank)
    if len(dims) != t.rank:
        raise ShapeError(f"permute: {list(a.dims)} is not a permutation of {t.rank} dims")
    return t.with_shape(tuple(t.shape[d] for d in dims))


def _transpose(a):
    t = need_tensor(a.self)
    d0, d1 = norm_dim(a.dim0, t.rank), norm_dim(a.dim1, t.rank)
    s = list(t.shape)
    if t.rank:
        s[d0], s[d1] = s[d1], s[d0]
    return t.with_shape(s)


def _t(a):
    t = need_tensor(a.self)
    if t.rank > 2:
        raise ShapeError(f"t: rank must be <= 2, got {t}")
    return t.with_shape(t.shape[::-1])


register("aten.permute(Tensor self, int[] dims) -> Tensor", shape=_permute, impl=lambda a: a.self.permute(a.dims),
         cost=view_cost)
register("aten.transpose(Tensor self, int dim0, int dim1) -> Tensor", shape=_transpose,
         impl=lambda a: a.self.transpose(a.dim0, a.dim1), cost=view_cost)
register("aten.t(Tensor self) -> Tensor", shape=_t, impl=lambda a: a.self.t(), cost=view_cost)


def _unsqueeze(a):
    t = need_tensor(a.self)
    d = norm_dim(a.dim, t.rank + 1)
    return t.with_shape(t.shape[:d] + (1,) + t.shape[d:])


def _squeeze(a):
    t = need_tensor(a.self)
    dims = set(range(t.rank)) if a.dim is None else set(norm_dims(a.dim, t.rank))
    return t.with_shape(tuple(d for i, d in enumerate(t.shape) if not (i in dims and d == 1)))


def _squeeze_impl(a):
    return a.self.squeeze() if a.dim is None else a.self.squeeze(tuple(a.dim))


def _expand(a):
    t = need_tensor(a.self)
    size = tuple(a.size)
    if len(size) < t.rank:
        raise ShapeError(f"expand: {list(size)} has fewer dims than {t}")
    lead = len(size) - t.rank
    out = list(size[:lead])
    for d, s in zip(t.shape, size[lead:]):
        if s == -1 or s == d or s is ANY:
            out.append(d if s == -1 else s)
        elif d == 1:
            out.append(s)
        else:
            raise ShapeError(f"expand: cannot expand dim {d} to {s}")
    return t.with_shape(out)


def _flatten(a):
    t = need_tensor(a.self)
    if t.rank == 0:
        return t.with_shape((1,))
    s, e = norm_dim(a.start_dim, t.rank), norm_dim(a.end_dim, t.rank)
    return t.with_shape(t.shape[:s] + (product(t.shape[s:e + 1]),) + t.shape[e + 1:])


register("aten.unsqueeze(Tensor self, int dim) -> Tensor", shape=_unsqueeze, impl=lambda a: a.self.unsqueeze(a.dim),
         cost=view_cost)
register("aten.squeeze(Tensor self, int[]? dim=none) -> Tensor", shape=_squeeze, impl=_squeeze_impl, cost=view_cost)
register("aten.expand(Tensor self, Dim[] size) -> Tensor", shape=_expand, impl=lambda a: a.self.expand(a.size),
         cost=view_cost)
register("aten.flatten(Tensor self, int start_dim=0, int end_dim=-1) -> Tensor", shape=_flatten,
         impl=lambda a: a.self.flatten(a.start_dim, a.end_dim), cost=view_cost)
for _n in ("clone", "alias", "detach", "contiguous"):
    register(f"aten.{_n}(Tensor self) -> Tensor", shape=lambda a: need_tensor(a.self), impl=lambda a: a.self.clone(),
             cost=memory_cost if _n in ("clone", "contiguous") else view_cost)


# ---------------------------------------------------------------------------- cat / stack / split
def _cat(a):
    ts = [need_tensor(t) for t in a.tensors]
    if not ts:
        raise ShapeError("cat of no tensors")
    d = norm_dim(a.dim, ts[0].rank)
    dt, total = ts[0].dtype, 0
    for t in ts:
        if t.rank != ts[0].rank:
            raise ShapeError(f"cat: ranks differ ({ts[0]} vs {t})")
        for i, (x, y) in enumerate(zip(ts[0].shape, t.shape)):
            if i != d:
                eq_dims(x, y, f"cat: dim {i} differs")
        dt = promote(dt, t.dtype)
        total = total + t.shape[d]
    return TensorType(dt, ts[0].shape[:d] + (total,) + ts[0].shape[d + 1:])


def _stack(a):
    ts = [need_tensor(t) for t in a.tensors]
    if not ts:
        raise ShapeError("stack of no tensors")
    d = norm_dim(a.dim, ts[0].rank + 1)
    dt = ts[0].dtype
    for t in ts[1:]:
        if t.rank != ts[0].rank:
            raise ShapeError(f"stack: ranks differ ({ts[0]} vs {t})")
        for x, y in zip(ts[0].shape, t.shape):
            eq_dims(x, y, "stack: shapes differ")
        dt = promote(dt, t.dtype)
    return TensorType(dt, ts[0].shape[:d] + (len(ts),) + ts[0].shape[d:])


register("aten.cat(Tensor[] tensors, int dim=0) -> Tensor", shape=_cat, impl=lambda a: torch.cat(a.tensors, a.dim),
         cost=memory_cost)
register("aten.stack(Tensor[] tensors, int dim=0) -> Tensor", shape=_stack,
         impl=lambda a: torch.stack(a.tensors, a.dim), cost=memory_cost)


def _static(d, what):
    if not isinstance(d, int):
        raise ShapeError(f"{what} needs a static size, got {d}")
    return d


def _split_sizes(a):
    t = need_tensor(a.self)
    d = norm_dim(a.dim, t.rank)
    if "split_sizes" in a:
        sizes = list(a.split_sizes)
        total = sum(sizes[1:], sizes[0]) if sizes else 0
        eq_dims(total, t.shape[d], "split_with_sizes: sizes do not add up to the dim")
    elif "chunks" in a:
        n = _static(t.shape[d], "chunk")
        step = -(-n // a.chunks)
        sizes = [min(step, n - i) for i in range(0, n, step)] if n else [0]
    elif "split_size" in a:
        n = _static(t.shape[d], "split")
        s = a.split_size
        sizes = [min(s, n - i) for i in range(0, n, s)] if n else [0]
    else:
        n = _static(t.shape[d], "unbind")
        return [t.with_shape(t.shape[:d] + t.shape[d + 1:])] * n
    return [t.with_shape(t.shape[:d] + (sz,) + t.shape[d + 1:]) for sz in sizes]


register("aten.split_with_sizes(Tensor self, Dim[] split_sizes, int dim=0) -> Tensor[]", shape=_split_sizes,
         impl=lambda a: torch.split(a.self, list(a.split_sizes), a.dim), cost=view_cost)
register("aten.split(Tensor self, int split_size, int dim=0) -> Tensor[]", shape=_split_sizes,
         impl=lambda a: torch.split(a.self, a.split_size, a.dim), cost=view_cost)
register("aten.chunk(Tensor self, int chunks, int dim=0) -> Tensor[]", shape=_split_sizes,
         impl=lambda a: torch.chunk(a.self, a.chunks, a.dim), cost=view_cost)
register("aten.unbind(Tensor self, int dim=0) -> Tensor[]", shape=_split_sizes,
         impl=lambda a: torch.unbind(a.self, a.dim), cost=view_cost)


# ---------------------------------------------------------------------------- slice / select / narrow
def slice_length(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    if isinstance(start, int) and start < 0:
        start = start + size
    if isinstance(end, int) and end < 0:
        end = end + size
    if isinstance(end, int) and (end >= BIG or (isinstance(size, int) and end > size)):
        end = size
    if isinstance(start, int) and isinstance(size, int):
        start = max(0, min(start, size))
    if isinstance(end, int) and isinstance(start, int) and end < start:
        return 0
    return floordiv(end - start + step - 1, step)


def _slice(a):
    t = need_tensor(a.self)
    if a.step <= 0:
        raise ShapeError(f"slice step must be positive, got {a.step}")
    d = norm_dim(a.dim, t.rank)
    n = slice_length(t.shape[d], a.start, a.end, a.step)
    return t.with_shape(t.shape[:d] + (n,) + t.shape[d + 1:])


def _select(a):
    t = need_tensor(a.self)
    d = norm_dim(a.dim, t.rank)
    return t.with_shape(t.shape[:d] + t.shape[d + 1:])


def _narrow(a):
    t = need_tensor(a.self)
    d = norm_dim(a.dim, t.rank)
    return t.with_shape(t.shape[:d] + (a.length,) + t.shape[d + 1:])


register("aten.slice(Tensor self, int dim=0, Dim? start=none, Dim? end=none, int step=1) -> Tensor", shape=_slice,
         impl=lambda a: torch.ops.aten.slice(a.self, a.dim, a.start, a.end, a.step), cost=view_cost)
register("aten.select(Tensor self, int dim, Dim index) -> Tensor", shape=_select,
         impl=lambda a: a.self.select(a.dim, a.index), cost=view_cost)
register("aten.narrow(Tensor self, int dim, Dim start, Dim length) -> Tensor", shape=_narrow,
         impl=lambda a: a.self.narrow(a.dim, a.start, a.length), cost=view_cost)


def _repeat(a):
    t = need_tensor(a.self)
    reps = tuple(a.repeats)
    if len(reps) < t.rank:
        raise ShapeError(f"repeat: {list(reps)} has fewer dims than {t}")
    shape = (1,) * (len(reps) - t.rank) + t.shape
    return t.with_shape(tuple(d * r for d, r in zip(shape, reps)))


def _same_tensor(a):
    return need_tensor(a.self)


register("aten.repeat(Tensor self, Dim[] repeats) -> Tensor", shape=_repeat, impl=lambda a: a.self.repeat(a.repeats),
         cost=memory_cost)
register("aten.flip(Tensor self, int[] dims) -> Tensor", shape=_same_tensor, impl=lambda a: a.self.flip(a.dims),
         cost=memory_cost)
register("aten.roll(Tensor self, int[] shifts, int[] dims=[]) -> Tensor", shape=_same_tensor,
         impl=lambda a: torch.roll(a.self, a.shifts, a.dims), cost=memory_cost)
register("aten.tril(Tensor self, int diagonal=0) -> Tensor", shape=_same_tensor,
         impl=lambda a: torch.tril(a.self, a.diagonal), cost=elementwise_cost)
register("aten.triu(Tensor self, int diagonal=0) -> Tensor", shape=_same_tensor,
         impl=lambda a: torch.triu(a.self, a.diagonal), cost=elementwise_cost)


# ---------------------------------------------------------------------------- creation
def _scalar_dtype(v):
    return bool_ if isinstance(v, bool) else i64 if isinstance(v, int) else f32


def _arange(a):
    if a.step == 0:
        raise ShapeError("arange step must be nonzero")
    n = floordiv(a.end - a.start + a.step - 1, a.step) if isinstance(a.step, int) and a.step > 0 else None
    if n is None:
        n = floordiv(a.start - a.end - a.step - 1, -a.step)
    if isinstance(n, int):
        n = max(n, 0)
    return TensorType(a.dtype, (n,))


def _full(a):
    dt = a.dtype or _scalar_dtype(a.get("fill_value", 0.0))
    return TensorType(dt, tuple(a.size))


def _like(a):
    t = need_tensor(a.self)
    return t if a.dtype is None else t.with_dtype(a.dtype)


def _new(a):
    t = need_tensor(a.self)
    return TensorType(a.dtype or t.dtype, tuple(a.size))


def _zero_cost(a, r):
    return memory_cost({}, r)


register("aten.arange(Dim end, Dim start=0, Dim step=1, dtype dtype=i64) -> Tensor", shape=_arange,
         impl=lambda a: torch.arange(a.start, a.end, a.step, dtype=a.dtype), cost=_zero_cost)
register("aten.full(Dim[] size, Scalar fill_value, dtype? dtype=none) -> Tensor", shape=_full,
         impl=lambda a: torch.full(a.size, a.fill_value, dtype=_full(_meta(a)).dtype.torch), cost=_zero_cost)
for _n, _fill in (("zeros", 0), ("ones", 1), ("empty", 0)):
    register(f"aten.{_n}(Dim[] size, dtype dtype=f32) -> Tensor", shape=_full,
             impl=lambda a, v=_fill: torch.full(a.size, v, dtype=a.dtype), cost=_zero_cost)
    register(f"aten.{_n}_like(Tensor self, dtype? dtype=none) -> Tensor", shape=_like,
             impl=lambda a, v=_fill: torch.full_like(a.self, v, dtype=a.dtype), cost=_zero_cost)
    register(f"aten.new_{_n}(Tensor self, Dim[] size, dtype? dtype=none) -> Tensor", shape=_new,
             impl=lambda a, v=_fill: torch.full(a.size, v, dtype=a.dtype or a.self.dtype), cost=_zero_cost)
register("aten.full_like(Tensor self, Scalar fill_value, dtype? dtype=none) -> Tensor", shape=_like,
         impl=lambda a: torch.full_like(a.self, a.fill_value, dtype=a.dtype), cost=_zero_cost)


def _meta(a):
    """Args of a creation op with torch dtypes mapped back, for reusing its shape rule."""
    from dsv41c.ir.schema import Args
    from dsv41c.ir.types import dtype_from_torch

    out = Args(a)
    if isinstance(out.get("dtype"), torch.dtype):
        out["dtype"] = dtype_from_torch(out["dtype"])
    return out


def _broadcast_to(a):
    t = need_tensor(a.self)
    if broadcast(t.shape, tuple(a.size)) != tuple(a.size):
        raise ShapeError(f"broadcast_to: {t} does not broadcast to {list(a.size)}")
    return t.with_shape(a.size)


register("aten.broadcast_to(Tensor self, Dim[] size) -> Tensor", shape=_broadcast_to,
         impl=lambda a: torch.broadcast_to(a.self, a.size), cost=view_cost)
__all__ = ["infer_view_shape", "slice_length", "numel"]
