"""Latent shared-KV attention with sinks: projections, window, sparse/dense kernels, output (spec §3.2).

Per layer, x = attn_norm(collapse(H)):
    q_res = q_norm(wq_a · x);  q = wq_b · q_res -> [T, H, D], RoPE on the last d channels
    kv    = kv_norm(wkv · x) -> [T, D], RoPE (same table), then FP8 fake quant (window KV)
K = V = kv (one 512-d latent per token shared by all heads). Keys of a query at p: its
window (positions p-W+1..p, HF sliding-window mask) plus, on layers with a compressed
branch, the compressed entries its index source selected. ONE softmax over those keys and
a per-head sink logit (the sink only enlarges the denominator), scale D^-0.5 on the full
D-dim dot product. The output's rope channels are rotated back by the QUERY position
(V carried key-position RoPE), then the grouped output LoRA: heads split in `o_groups`
groups, group g projected by rows g·r..(g+1)·r of wo_a (block diagonal), flattened, wo_b.

Two attention kernels, one result:
- `dense_attention(q, keys, bias, sink)`: keys for every query, an additive 0/-inf mask
  (the HF formulation; used by `forward_full`);
- `sparse_attention(q, pool, idx, sink)`: each query gathers its keys from a row pool by
  index (-1 = empty slot); used by the serving form (window rows + compressed rows).
Precision as HF eager: q·k in the model dtype, mask + sink + softmax in fp32 (float64 in
the float64 mode), probabilities cast back to the model dtype for P·V.
Known gaps: batch size 1 (no batch axis).
"""
from __future__ import annotations

import torch

from dsv41c.prims.norms import acc_dtype, rms_norm
from dsv41c.prims.quant import fq_window_kv
from dsv41c.prims.rope import apply_rope


def attn_q(x, wq_a, q_norm_w, wq_b, n_heads: int, cos, sin, eps: float):
    """-> (q [T, H, D] rotated, q_res [T, q_lora] — also the indexer's query input)."""
    q_res = rms_norm(x @ wq_a.T, q_norm_w, eps)
    q = (q_res @ wq_b.T).unflatten(-1, (n_heads, -1))
    return apply_rope(q, cos, sin), q_res


def attn_kv(x, wkv, kv_norm_w, cos, sin, eps: float, kv_quant: bool):
    """-> window KV rows [T, D]: normed, rotated at the token positions, FP8 fake-quantized."""
    return fq_window_kv(apply_rope(rms_norm(x @ wkv.T, kv_norm_w, eps), cos, sin), kv_quant)


def _softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """scores [T, H, K] (acc dtype, -inf masked) -> probabilities [T, H, K]; sink column dropped."""
    T, H, _ = scores.shape
    logits = torch.cat([scores, sink.to(scores.dtype).view(1, H, 1).expand(T, H, 1)], dim=-1)
    logits = logits - logits.amax(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1)[..., :-1]


def dense_attention(q: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor, sink: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """q [T, H, D], keys [N, D] (K = V), bias [T, N] 0/-inf, sink [H] -> [T, H, D]."""
    acc = acc_dtype(q.dtype)
    s = torch.einsum("thd,nd->thn", q, keys) * scale
    p = _softmax_with_sink(s.to(acc) + bias.to(acc)[:, None, :], sink)
    return torch.einsum("thn,nd->thd", p.to(keys.dtype), keys)


def sparse_attention(q: torch.Tensor, pool: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [T, H, D], pool [N, D] (K = V rows), idx [T, K] row ids (-1 = empty), sink [H] -> [T, H, D]."""
    acc = acc_dtype(q.dtype)
    kv = pool[idx.clamp(min=0)]  # [T, K, D]
    s = torch.einsum("thd,tkd->thk", q, kv) * scale
    s = s.to(acc).masked_fill((idx < 0)[:, None, :], float("-inf"))
    p = _softmax_with_sink(s, sink)
    return torch.einsum("thk,tkd->thd", p.to(kv.dtype), kv)


def window_bias(positions: torch.Tensor, window: int, dtype: torch.dtype) -> torch.Tensor:
    """Dense [T, T] sliding-window causal bias for a sequence at `positions`: key k visible to
    query p iff p - window < k <= p (HF `create_sliding_window_causal_mask`)."""
    d = positions[:, None] - positions[None, :]
    ok = (d >= 0) & (d < window)
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill(~ok, float("-inf"))


def window_indices(positions: torch.Tensor, first_pool_pos: int, window: int) -> torch.Tensor:
    """[T, W] pool rows of the window of each query: row of position p-W+1+i (-1 before 0).

    The pool holds consecutive positions starting at `first_pool_pos`.
    """
    pos = positions[:, None] - (window - 1) + torch.arange(window, device=positions.device)[None, :]
    return torch.where(pos >= 0, pos - first_pool_pos, torch.full_like(pos, -1))


def attn_out(o: torch.Tensor, cos, sin, wo_a: torch.Tensor, wo_b: torch.Tensor, o_groups: int) -> torch.Tensor:
    """o [T, H, D] -> [T, hidden]: inverse RoPE at the query positions, grouped wo_a, wo_b."""
    o = apply_rope(o, cos, sin, inverse=True)
    T = o.shape[0]
    og = o.reshape(T, o_groups, -1)                       # [T, G, H/G·D]
    w = wo_a.view(o_groups, -1, og.shape[-1])              # [G, r, H/G·D]
    y = torch.einsum("tgi,gri->tgr", og, w).reshape(T, -1)  # [T, G·r]
    return y @ wo_b.T
