"""Domain ops of the KV path: fake quantization, sparse attention, compressor, indexer.

Each op is a `torch.library.custom_op` in namespace `dsv41` whose eager body calls the
reference primitive of the same name (`_prims.py`), plus a fake (meta) implementation
that gives torch.export the output shapes, so export keeps the op whole and the IR sees
one `dsv41.*` op instead of the ATen chain.

Serving-state conventions that keep ONE exported graph valid for every context length:
- "no compressed entries yet" (N = 0) needs no Python branch: index scores are [T, 0],
  candidate masks [T, 0], and `select_topk` returns all -1 (nothing selected), which
  `sparse_attention` masks exactly like an absent compressed branch;
- the compressor's partial group lives in a fixed-size buffer of `ratio - 1` rows whose
  first `pos % ratio` rows are valid (the rest are zero), so no state dim is ever 0 or 1
  by necessity; the number of entries a step emits is data-dependent, declared with
  `new_dynamic_size()` (ratio 1 emits exactly one entry per token).

Known gaps: the ops copy rather than update caches in place (a runtime with arenas would
append); no autograd.
"""
from __future__ import annotations

from typing import Optional

import torch

from dsv41c.ops import _prims as P

# ---------------------------------------------------------------------------- fake quantization


@torch.library.custom_op("dsv41::fq_window_kv", mutates_args=())
def fq_window_kv(x: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 with one UE8M0 scale per 32 channels (window KV), quantize-dequantize."""
    return P.fq_window_kv(x, True)


@torch.library.custom_op("dsv41::fq_compressed_kv", mutates_args=())
def fq_compressed_kv(x: torch.Tensor) -> torch.Tensor:
    """FP4 E2M1 with one E4M3 scale per 16 channels (compressed KV)."""
    return P.fq_compressed_kv(x, True)


@torch.library.custom_op("dsv41::fq_indexer", mutates_args=())
def fq_indexer(x: torch.Tensor) -> torch.Tensor:
    """FP4 E2M1 with one UE8M0 scale per 32 channels (indexer keys and queries)."""
    return P.fq_indexer(x, True)


for _op in (fq_window_kv, fq_compressed_kv, fq_indexer):
    _op.register_fake(lambda x: torch.empty_like(x))


# ---------------------------------------------------------------------------- attention


@torch.library.custom_op("dsv41::sparse_attention", mutates_args=())
def sparse_attention(q: torch.Tensor, pool: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [T, H, D], pool [M, D] (K = V rows), idx [T, K] rows (-1 = empty), sink [H] -> [T, H, D]."""
    return P.sparse_attention(q, pool, idx, sink, scale)


@sparse_attention.register_fake
def _(q, pool, idx, sink, scale):
    return torch.empty_like(q)


# ---------------------------------------------------------------------------- compressor


@torch.library.custom_op("dsv41::compressor_step", mutates_args=())
def compressor_step(x: torch.Tensor, pos: torch.Tensor, wkv: torch.Tensor, wgate: Optional[torch.Tensor],
                    norm_w: torch.Tensor, buf_kv: torch.Tensor, buf_gate: torch.Tensor, ratio: int,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, D] at positions pos.. -> (pre-RoPE latents [n, C] of the groups completed, new
    buf_kv, new buf_gate): buffers [ratio-1, C] (acc dtype), first pos % ratio rows valid."""
    b = int(pos) % ratio if ratio > 1 else 0
    lat, bk, bg = P.compressor_step(x, wkv, wgate, norm_w, ratio, eps, buf_kv[:b], buf_gate[:b])
    out_kv, out_gate = torch.zeros_like(buf_kv), torch.zeros_like(buf_gate)
    out_kv[:bk.shape[0]] = bk  # zero the stale rows: the state is a function of the tokens only
    out_gate[:bg.shape[0]] = bg
    return lat, out_kv, out_gate


@compressor_step.register_fake
def _(x, pos, wkv, wgate, norm_w, buf_kv, buf_gate, ratio, eps):
    n = x.shape[0] if ratio == 1 else torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n, wkv.shape[0]), torch.empty_like(buf_kv), torch.empty_like(buf_gate)


# ---------------------------------------------------------------------------- indexer


@torch.library.custom_op("dsv41::index_scores", mutates_args=())
def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                 ratio: int) -> torch.Tensor:
    """I [T, N] (w's dtype), -inf where entry t is not yet visible to the query's position."""
    return P.index_scores(q, w, keys, positions, ratio)


@index_scores.register_fake
def _(q, w, keys, positions, ratio):
    return w.new_empty(q.shape[0], keys.shape[0])


@torch.library.custom_op("dsv41::candidate_blocks", mutates_args=())
def candidate_blocks(scores: torch.Tensor, positions: torch.Tensor, ratio: int, topk_blocks: int,
                     block_size: int) -> torch.Tensor:
    """Level-1 candidate mask [T, N] (bool): entries of each query's kept blocks."""
    return P.candidate_blocks(scores, positions, ratio, topk_blocks, block_size)


@candidate_blocks.register_fake
def _(scores, positions, ratio, topk_blocks, block_size):
    return torch.empty(scores.shape, dtype=torch.bool, device=scores.device)


@torch.library.custom_op("dsv41::select_topk", mutates_args=())
def select_topk(scores: torch.Tensor, k: int, candidates: Optional[torch.Tensor]) -> torch.Tensor:
    """Stable top-k entry ids [T, k] (ties toward the lower index), -1 where none."""
    return P.select_topk(scores, k, candidates)


@select_topk.register_fake
def _(scores, k, candidates):
    return torch.empty(scores.shape[0], k, dtype=torch.int64, device=scores.device)
