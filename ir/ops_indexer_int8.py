"""The IR op `dsv41.index_scores_int8`: the indexer scores over FP4 data by exact integer dots.

    %s = dsv41.index_scores_int8(%q, %w, %keys, %positions) {ratio = 1, block_q = 1, block_t = 128}

Operands and result as `dsv41.index_scores` (q [T, h, d], w [T, h], keys [N, d], positions [T] ->
[T, N] in w's dtype), and the same numbers bit for bit (`dsv41c/prims/indexer_int8.py`: integer
products of the FP4 codes with the scales applied after, a per-row range proof, the float path's dot
wherever the proof does not hold). `lower-indexer-int8` puts it where the scores' operands are FP4
data; `block_q` / `block_t` are the indexer_score kernel's query block (1: one query's heads as the
MMA columns, 16: queries as rows) and key tile, which its fallback counts follow
(`prims.indexer_int8.count_fallbacks`). Cost: the integer MACs, 2·T·h·d·N, and the bytes moved.
Known gaps: the operands are the FP4 values, not their packed codes and exponents (see the pass).
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch
from dsv41c.ir.registry import Cost, ShapeError, register
from dsv41c.ir.shape_rules import memory_cost, need_tensor
from dsv41c.ir.types import TensorType


def _shape(a):
    q, w, k, p = need_tensor(a.q), need_tensor(a.w), need_tensor(a.keys), need_tensor(a.positions)
    if q.rank != 3 or w.rank != 2 or k.rank != 2 or p.rank != 1:
        raise ShapeError(f"index_scores_int8: q [T, h, d], w [T, h], keys [N, d], positions [T]; got {q}, {w}, {k}, {p}")
    if isinstance(q.shape[-1], int) and q.shape[-1] % 32:
        raise ShapeError(f"index_scores_int8: the head dim {q.shape[-1]} is not a multiple of the FP4 block 32")
    if a.block_q not in (1, 16) or a.block_t <= 0:
        raise ShapeError(f"index_scores_int8: block_q must be 1 or 16 and block_t positive, got {a.block_q}, "
                         f"{a.block_t}")
    return TensorType(w.dtype, (q.shape[0], k.shape[0]))


def _impl(a):
    import dsv41c.ops.indexer_int8  # noqa: F401  (registers torch.ops.dsv41.index_scores_int8)

    return torch.ops.dsv41.index_scores_int8(a.q, a.w, a.keys, a.positions, a.ratio, a.block_q, a.block_t)


register("dsv41.index_scores_int8(Tensor q, Tensor w, Tensor keys, Tensor positions, int ratio, int block_q=16, "
         "int block_t=128) -> Tensor", shape=_shape, impl=_impl,
         cost=lambda a, r: Cost(2 * a.q.numel * a.keys.shape[0], memory_cost(a, r).bytes))
