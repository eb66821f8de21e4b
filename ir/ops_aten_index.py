"""Core ATen ops, part 3: gathers, scatters, advanced indexing, embedding, sorting, top-k.

`aten.index` / `aten.index_put` take their index tensors as a variadic operand list plus
`positions` (which dims they index; default 0..n-1), since ATen's `Tensor?[]` mixes
tensors and `None`s, and the IR keeps attributes and operands apart. Index tensors
broadcast together; when the indexed dims are adjacent the broadcast shape replaces them
in place, otherwise it goes first (torch's rule).

Known gaps: boolean-mask indexing (a data-dependent size) is rejected; `nonzero` returns
a data-dependent first dim, so its declared type names a fresh symbol that the interpreter
binds when it runs.
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch

from dsv41c.ir.registry import Cost, ShapeError, register
from dsv41c.ir.shape_rules import (broadcast, memory_cost, need_tensor, norm_dim, norm_dims,
                                   reduction_cost)
from dsv41c.ir.symbolic import ANY
from dsv41c.ir.types import TensorType, i64


def _need_int(t, what):
    if t.dtype.category != "int":
        raise ShapeError(f"{what} must be an integer tensor, got {t}")
    return t


def _index_select(a):
    t, idx = need_tensor(a.self), _need_int(need_tensor(a.index), "index_select index")
    if idx.rank > 1:
        raise ShapeError(f"index_select: index must be 0-d or 1-d, got {idx}")
    d = norm_dim(a.dim, t.rank)
    n = idx.shape[0] if idx.rank else 1
    return t.with_shape(t.shape[:d] + (n,) + t.shape[d + 1:])


def _gather(a):
    t, idx = need_tensor(a.self), _need_int(need_tensor(a.index), "gather index")
    norm_dim(a.dim, t.rank)
    if idx.rank != t.rank:
        raise ShapeError(f"gather: index {idx} must have the rank of {t}")
    return t.with_shape(idx.shape)


def _scatter(a):
    t, idx = need_tensor(a.self), _need_int(need_tensor(a.index), "scatter index")
    norm_dim(a.dim, t.rank)
    if idx.rank != t.rank:
        raise ShapeError(f"scatter: index {idx} must have the rank of {t}")
    return t


def _scatter_impl(a):
    if a.reduce is not None:
        return torch.scatter(a.self, a.dim, a.index, a.src, reduce=a.reduce)
    return torch.scatter(a.self, a.dim, a.index, a.src)


def _index_add(a):
    t = need_tensor(a.self)
    d = norm_dim(a.dim, t.rank)
    src = need_tensor(a.source)
    if src.rank != t.rank:
        raise ShapeError(f"index_add: source {src} must have the rank of {t} (dim {d})")
    return t


register("aten.index_select(Tensor self, int dim, Tensor index) -> Tensor", shape=_index_select,
         impl=lambda a: torch.index_select(a.self, a.dim, a.index), cost=memory_cost)
register("aten.gather(Tensor self, int dim, Tensor index) -> Tensor", shape=_gather,
         impl=lambda a: torch.gather(a.self, a.dim, a.index), cost=memory_cost)
register("aten.scatter(Tensor self, int dim, Tensor index, Tensor|Scalar src, str? reduce=none) -> Tensor",
         shape=_scatter, impl=_scatter_impl, cost=memory_cost)
register("aten.scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", shape=_scatter,
         impl=lambda a: torch.scatter_add(a.self, a.dim, a.index, a.src), cost=memory_cost)
register("aten.scatter_reduce(Tensor self, int dim, Tensor index, Tensor src, str reduce, bool include_self=true) "
         "-> Tensor", shape=_scatter,
         impl=lambda a: torch.scatter_reduce(a.self, a.dim, a.index, a.src, a.reduce, include_self=a.include_self),
         cost=memory_cost)
register("aten.index_add(Tensor self, int dim, Tensor index, Tensor source, Scalar alpha=1) -> Tensor",
         shape=_index_add, impl=lambda a: torch.index_add(a.self, a.dim, a.index, a.source, alpha=a.alpha),
         cost=memory_cost)


# ---------------------------------------------------------------------------- advanced indexing
def _positions(a, t):
    pos = tuple(range(len(a.indices))) if a.positions is None else norm_dims(a.positions, t.rank)
    if len(pos) != len(a.indices):
        raise ShapeError(f"{len(a.indices)} index tensors but positions {list(pos)}")
    if len(pos) > t.rank:
        raise ShapeError(f"too many indices for {t}")
    return pos


def _index(a):
    t = need_tensor(a.self)
    idx = [need_tensor(i) for i in a.indices]
    for i in idx:
        if i.dtype.category != "int":
            raise ShapeError(f"index: boolean/float index {i} is not supported (use integer indices)")
    pos = _positions(a, t)
    b = broadcast(*(i.shape for i in idx))
    if not pos:
        return t
    first = min(pos)
    if sorted(pos) == list(range(first, first + len(pos))):  # adjacent: the broadcast shape goes in place
        after = tuple(d for k, d in enumerate(t.shape) if k > first and k not in pos)
        return t.with_shape(t.shape[:first] + b + after)
    return t.with_shape(b + tuple(d for k, d in enumerate(t.shape) if k not in pos))


def _full_indices(a, rank):
    full = [None] * rank
    pos = range(len(a.indices)) if a.positions is None else [p % max(rank, 1) for p in a.positions]
    for p, i in zip(pos, a.indices):
        full[p] = i
    while full and full[-1] is None:
        full.pop()
    return full


def _index_put(a):
    t = need_tensor(a.self)
    sub = _index(type(a)(self=t, indices=a.indices, positions=a.positions))
    if broadcast(need_tensor(a.values).shape, sub.shape) != sub.shape:
        raise ShapeError(f"index_put: values {a.values} do not broadcast to the indexed {sub}")
    return t


register("aten.index(Tensor self, Tensor[] indices, int[]? positions=none) -> Tensor", shape=_index,
         impl=lambda a: torch.ops.aten.index(a.self, _full_indices(a, a.self.dim())), cost=memory_cost)
register("aten.index_put(Tensor self, Tensor[] indices, Tensor values, bool accumulate=false, "
         "int[]? positions=none) -> Tensor", shape=_index_put,
         impl=lambda a: torch.ops.aten.index_put(a.self, _full_indices(a, a.self.dim()), a.values, a.accumulate),
         cost=memory_cost)


def _embedding(a):
    w, idx = need_tensor(a.weight), _need_int(need_tensor(a.indices), "embedding indices")
    if w.rank != 2:
        raise ShapeError(f"embedding: weight must be 2-d, got {w}")
    return w.with_shape(idx.shape + (w.shape[1],))


register("aten.embedding(Tensor weight, Tensor indices, int padding_idx=-1) -> Tensor", shape=_embedding,
         impl=lambda a: torch.nn.functional.embedding(a.indices, a.weight), cost=memory_cost)


def _one_hot(a):
    t = _need_int(need_tensor(a.self), "one_hot input")
    if a.num_classes < 0:
        raise ShapeError("one_hot needs num_classes >= 0 (the inferred count is data-dependent)")
    return TensorType(i64, t.shape + (a.num_classes,))


register("aten.one_hot(Tensor self, int num_classes) -> Tensor", shape=_one_hot,
         impl=lambda a: torch.nn.functional.one_hot(a.self, a.num_classes), cost=memory_cost)


def _nonzero(a):
    t = need_tensor(a.self)
    return TensorType(i64, (ANY, t.rank))


register("aten.nonzero(Tensor self) -> Tensor", shape=_nonzero, impl=lambda a: torch.nonzero(a.self),
         cost=reduction_cost)


# ---------------------------------------------------------------------------- sort / top-k
def _topk(a):
    t = need_tensor(a.self)
    d = norm_dim(a.dim, t.rank)
    if isinstance(a.k, int) and isinstance(t.shape[d] if t.rank else 1, int) and a.k > (t.shape[d] if t.rank else 1):
        raise ShapeError(f"topk: k={a.k} exceeds the dim's size {t.shape[d]}")
    shape = t.shape[:d] + (a.k,) + t.shape[d + 1:] if t.rank else ()
    return t.with_shape(shape), TensorType(i64, shape)


def _sort(a):
    t = need_tensor(a.self)
    norm_dim(a.dim, t.rank)
    return t, TensorType(i64, t.shape)


def _sort_cost(a, results):
    t = a.self
    n = t.shape[norm_dim(a.dim, t.rank)] if t.rank else 1
    return Cost(t.numel * _log2(n), memory_cost(a, results).bytes)


def _log2(n):
    return max(1, int(n).bit_length()) if isinstance(n, int) else 16


register("aten.topk(Tensor self, Dim k, int dim=-1, bool largest=true, bool sorted=true) -> (Tensor, Tensor)",
         shape=_topk, impl=lambda a: tuple(torch.topk(a.self, a.k, a.dim, a.largest, a.sorted)), cost=_sort_cost)
register("aten.sort(Tensor self, int dim=-1, bool descending=false, bool stable=false) -> (Tensor, Tensor)",
         shape=_sort, impl=lambda a: tuple(torch.sort(a.self, dim=a.dim, descending=a.descending, stable=a.stable)),
         cost=_sort_cost)
register("aten.argsort(Tensor self, int dim=-1, bool descending=false, bool stable=false) -> Tensor",
         shape=lambda a: _sort(a)[1],
         impl=lambda a: torch.argsort(a.self, dim=a.dim, descending=a.descending, stable=a.stable), cost=_sort_cost)
