"""Manifold hyper-connections (mHC), single-pass (spec §3.8).

The residual stream is `hc` parallel copies H [T, hc, D]. Each site (attention, FFN) of a
layer has fn [(2+hc)·hc, hc·D], base [(2+hc)·hc], scale [3], all fp32:
    f    = unweighted_rmsnorm(flatten(H)) (fp32, one statistic per token over hc·D)
    m    = f · fnᵀ
    pre  = sigmoid(m[:hc]·scale0 + base[:hc]) + hc_eps
    post = 2·sigmoid(m[hc:2hc]·scale1 + base[hc:2hc])
    comb = Sinkhorn(softmax_row(m[2hc:]·scale2 + base[2hc:] viewed [hc, hc]) + hc_eps)
Sinkhorn: one column normalization, then (iters-1) × {row, column}, each `x / (sum + eps)`.
Collapse: x = Σ_k pre_k H_k. Expand: H'_k = post_k · y + Σ_j comb[j, k] · H_j.

SINGLE-PASS ORDER (the subtle part): a site's `pre` collapses the input of the NEXT site.
Layer L's attention collapses with the FFN-site `pre` of layer L-1 (one-hot stream 0 for
layer 0), its FFN with the `pre` of its own attention site, and the final output with the
last FFN site's `pre`. `post` and `comb` act at their own site. The caller threads `pre`.

HF reading: all mHC math in fp32 (float64 in the float64 mode); collapse and expand return
the stream dtype. Known gaps: none.
"""
from __future__ import annotations

import torch

from dsv41c.prims.norms import acc_dtype, rms_norm_unweighted


def sinkhorn(comb_logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[..., hc, hc] logits -> approximately doubly stochastic matrix (rows: softmax first)."""
    # In place: the same arithmetic as `comb = comb / (comb.sum(...) + eps)`, fewer allocations.
    comb = torch.softmax(comb_logits, dim=-1).add_(eps)
    comb.div_(comb.sum(dim=-2, keepdim=True).add_(eps))
    for _ in range(iters - 1):
        comb.div_(comb.sum(dim=-1, keepdim=True).add_(eps))
        comb.div_(comb.sum(dim=-2, keepdim=True).add_(eps))
    return comb


def hc_mixes(H: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *, iters: int,
             hc_eps: float, norm_eps: float):
    """H [T, hc, D] -> (pre [T, hc], post [T, hc], comb [T, hc, hc]) in the accumulation dtype."""
    hc = H.shape[-2]
    acc = acc_dtype(H.dtype)
    f = rms_norm_unweighted(H.flatten(-2).to(acc), norm_eps)
    m = f @ fn.to(acc).T
    scale, base = scale.to(acc), base.to(acc)
    pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    return pre, post, sinkhorn(logits, iters, hc_eps)


def hc_collapse(H: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Σ_k pre_k H_k: [T, hc, D] × [T, hc] -> [T, D] in H's dtype."""
    return (pre.unsqueeze(-1) * H.to(pre.dtype)).sum(dim=-2).to(H.dtype)


def hc_expand(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """H'_k = post_k · y + Σ_j comb[j, k] H_j -> [T, hc, D] in H's dtype."""
    acc = post.dtype
    mixed = torch.einsum("tjk,tjd->tkd", comb, H.to(acc))
    return (post.unsqueeze(-1) * y.to(acc).unsqueeze(-2) + mixed).to(H.dtype)
