"""The domain op `dsv41::index_scores_int8`: index scores by exact integer dots of FP4 data.

Its eager body is `prims.indexer_int8.index_scores_int8` (equal to `index_scores` on the same operands,
bit for bit; fallback counts to `count_fallbacks()` sinks); the fake implementation gives torch.export
and the IR the output shape [T, N] in w's dtype. block_q / block_t are the kernel's query block and key
tile, which the counts follow.
Known gaps: none known.
"""
from __future__ import annotations

import torch

from dsv41c.prims.indexer_int8 import index_scores_int8 as _scores


@torch.library.custom_op("dsv41::index_scores_int8", mutates_args=())
def index_scores_int8(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, ratio: int,
                      block_q: int, block_t: int) -> torch.Tensor:
    """I [T, N] (w's dtype), -inf where entry t is not yet visible; the float path's scores, exact dots."""
    return _scores(q, w, keys, positions, ratio, block_q, block_t)


@index_scores_int8.register_fake
def _(q, w, keys, positions, ratio, block_q, block_t):
    return w.new_empty(q.shape[0], keys.shape[0])
