"""Engram: hashed n-gram memory gated into the residual streams (spec §3.9/3.10).

Applied at the engram layers (1 and 14 in the published config) to the streams H BEFORE
the layer's attention mHC site:
    rows  = engram_row_ids(tokens)                [T, (max_n-1)·n_heads]  (engram_hash.py)
    e     = concat(table[rows])                   [T, (max_n-1)·n_heads·head_dim]
    kv    = wkv(e) -> key [hc, D] (one per stream), value [D] (shared)
    dot_k = Σ_d H_k·(q_weight_k·k_weight_k)·key_k · rsqrt(mean H_k² + eps)
            · rsqrt(mean key_k² + eps) · D^-0.5           (per token and stream, over D)
    gate  = sigmoid(sign(dot) · sqrt(max(|dot|, 1e-6)));  0 where the token is masked
    H_k  += gate_k · value                                  (fp32, result in H's dtype)
`table` is the dequantized table (the checkpoint's per-row, per-32-column E8M0 scales
already applied by the checkpoint reader, spec §6.7).

Serving: the hash of a position needs the max_n-1 previous tokens, so the caller keeps
that many ids of history and `chunk_row_ids` hashes history+chunk and keeps the chunk's
rows; with fewer history tokens than max_n-1 the sequence start is inside the window and
the missing look-back is padding, exactly as in a full forward.

HF reading: the token map is the identity (no tokenizer here; compressed id = token id,
pad id = engram_pad_token_id); DEAD tokens would be image-span tokens (none yet).
Known gaps: the tokenizer-derived compressed vocabulary; image spans.
"""
from __future__ import annotations

import torch

from dsv41c.prims.engram_hash import engram_row_ids
from dsv41c.prims.norms import acc_dtype


def chunk_row_ids(cfg, layer_pos: int, history: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """Row ids [T, n_cols] of `chunk` given up to max_n-1 previous token ids `history`."""
    ids = torch.cat([history.to(torch.int64), chunk.to(torch.int64)])
    return engram_row_ids(ids, cfg, layer_pos)[history.shape[0]:]


def engram_apply(H: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, wkv: torch.Tensor,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """H [T, hc, D], rows [T, n_cols] -> H with the gated n-gram value added to every stream."""
    T, hc, D = H.shape
    acc = acc_dtype(H.dtype)
    e = table[rows].flatten(-2).to(wkv.dtype)
    kv = e @ wkv.T
    key = kv[:, :hc * D].to(acc).unflatten(-1, (hc, D))
    value = kv[:, hc * D:].to(acc)
    weight = q_weight.to(acc) * k_weight.to(acc)
    h = H.to(acc)
    rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (h * weight * key).sum(-1) * rstd * D**-0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
    if token_mask is not None:
        gate = gate.masked_fill(~token_mask[:, None], 0.0)
    return (h + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(H.dtype)
