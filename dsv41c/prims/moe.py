"""Mixture of experts: sqrtsoftplus router with dual bias, clamped SwiGLU experts (spec §3.5).

Router (fp32, float64 in the float64 mode):
    logits = x · W_gateᵀ / gate_temp;  s = sqrt(softplus(logits))
    idx = top-k of (s + b), b = `bias` (text tokens) or `bias_vl` (image-span tokens)
    w = s[idx] (UNbiased);  w = w / (Σw + 1e-20) if norm_topk_prob and k > 1;  w *= 1.5
`softplus` is torch's (log1p(exp(x)) below 20, x above), which neither overflows nor
loses the small values; its sqrt is 0 only where softplus underflows (x < ~-104 in fp32),
and the +1e-20 floor keeps the renormalization finite then (SGLang #34459).
Top-k ties break toward the lower expert index (spec §7.1; HF uses torch.topk).
Expert (routed and shared): g = w1·x, u = w3·x (fp32), u = clamp(u, ±limit),
g = min(g, limit), y = w2( (silu(g) · u · weight).to(dtype) ) — the routing weight
multiplies the activation BEFORE w2. Output = Σ routed (fp32) + shared expert (weight 1).

`moe_forward` is one function of tensors (stacked expert weights) so that it can be
wrapped as one custom op. The eager loop visits only experts that received tokens.
Known gaps: image-span routing (`bias_vl`) is wired through `image_mask` but no caller
produces image tokens yet (the vision path is not implemented).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv41c.prims.norms import acc_dtype
from dsv41c.prims.topk import stable_topk


def sqrtsoftplus(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x).sqrt()


def route(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int, *, route_scale: float,
          gate_temp: float = 1.0, norm_topk_prob: bool = True, bias_vl: torch.Tensor | None = None,
          image_mask: torch.Tensor | None = None):
    """x [T, D] -> (weights [T, k] acc dtype, expert ids [T, k] int64)."""
    acc = acc_dtype(x.dtype)
    s = sqrtsoftplus((x.to(acc) @ gate_w.to(acc).T) / gate_temp)
    b = bias.to(acc)
    if image_mask is not None and bias_vl is not None:
        b = torch.where(image_mask[:, None], bias_vl.to(acc)[None, :], b[None, :])
    idx = stable_topk(s + b, top_k, drop_neg_inf=False)
    w = s.gather(-1, idx)
    if norm_topk_prob and top_k > 1:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * route_scale, idx


def swiglu_expert(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, limit: float,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """Clamped SwiGLU expert; `weight` [T, 1] scales the activation before w2. Returns x's dtype."""
    acc = acc_dtype(x.dtype)
    g = (x @ w1.T).to(acc)
    u = (x @ w3.T).to(acc)
    if limit > 0:
        u = u.clamp(-limit, limit)
        g = g.clamp(max=limit)
    y = F.silu(g) * u
    if weight is not None:
        y = weight.to(acc) * y
    return y.to(x.dtype) @ w2.T


def moe_forward(x: torch.Tensor, gate_w: torch.Tensor, gate_bias: torch.Tensor, w1: torch.Tensor,
                w2: torch.Tensor, w3: torch.Tensor, sw1: torch.Tensor, sw2: torch.Tensor, sw3: torch.Tensor, *,
                top_k: int, route_scale: float, swiglu_limit: float, gate_temp: float = 1.0,
                norm_topk_prob: bool = True, bias_vl: torch.Tensor | None = None,
                image_mask: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D]; w1/w3 [E, I, D], w2 [E, D, I] stacked routed experts; sw* the shared expert."""
    acc = acc_dtype(x.dtype)
    weights, idx = route(x, gate_w, gate_bias, top_k, route_scale=route_scale, gate_temp=gate_temp,
                         norm_topk_prob=norm_topk_prob, bias_vl=bias_vl, image_mask=image_mask)
    y = torch.zeros(x.shape, dtype=acc, device=x.device)
    for e in torch.unique(idx).tolist():
        tok, slot = torch.where(idx == e)
        y.index_add_(0, tok, swiglu_expert(x[tok], w1[e], w2[e], w3[e], swiglu_limit,
                                           weights[tok, slot, None]).to(acc))
    y = y + swiglu_expert(x, sw1, sw2, sw3, swiglu_limit).to(acc)
    return y.to(x.dtype)
