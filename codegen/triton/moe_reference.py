"""The MoE FFN's pure-PyTorch references (the oracles of moe.py, moe_decode.py and moe_router.py's callers): fp32
math on the dequantized MXFP4 experts and FP8 shared expert of `dsv41c/formats.py`."""
from __future__ import annotations

import torch

from dsv41c import formats
from dsv41c.codegen.triton.fp8_reference import act_quant_fp8_reference, fp8_gemm_reference, fp8_gemm_swiglu_reference
from dsv41c.codegen.triton.moe_router import router_reference


def moe_experts_reference(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit: float, act_quant: bool = False,
                          inter_dtype=None, partial_dtype=None, compute_dtype=torch.float32):
    """Σ_j expert_{idx[t,j]}(x[t]) · w[t,j] over routed slots -> [T, D] in compute_dtype.

    Stacked MXFP4 weights: w1/w3 int8 [E, I, D/2] + E8M0 [E, I, D/32]; w2 [E, D, I/2] + [E, D, I/32].
    """
    inter_dtype = inter_dtype or x.dtype
    partial_dtype = partial_dtype or x.dtype
    cd = compute_dtype
    xa = act_quant_fp8_reference(x) if act_quant else x
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=cd, device=x.device)
    for e in torch.unique(topk_idx).tolist():
        tok, j = torch.where(topk_idx == e)
        xe = xa[tok].to(cd)
        g = (xe @ formats.dequant_fp4_weight(w1[e], s1[e]).to(cd).T).clamp(max=limit)
        u = (xe @ formats.dequant_fp4_weight(w3[e], s3[e]).to(cd).T).clamp(-limit, limit)
        h = (torch.nn.functional.silu(g) * u * topk_w[tok, j, None].to(cd)).to(inter_dtype)
        if act_quant:
            h = act_quant_fp8_reference(h)
        out = (h.to(cd) @ formats.dequant_fp4_weight(w2[e], s2[e]).to(cd).T).to(partial_dtype)
        y.index_add_(0, tok, out.to(cd))
    return y


def shared_expert_reference(x, sw1, ss1, sw3, ss3, sw2, ss2, limit: float, act_quant: bool = False):
    h = fp8_gemm_swiglu_reference(x, sw1, ss1, sw3, ss3, limit, act_quant)
    return fp8_gemm_reference(h, sw2, ss2, act_quant)


def moe_forward_reference(x, gate_w, bias, w1, s1, w3, s3, w2, s2, shared, *, top_k: int, route_scale: float,
                          limit: float, gate_temp: float = 1.0, bias_vl=None, image_mask=None,
                          act_quant: bool = False):
    """The whole FFN: route, routed experts, shared expert (`shared` = (w1, s1, w3, s3, w2, s2) FP8)."""
    tw, ti = router_reference(x, gate_w, bias, top_k, route_scale, gate_temp, bias_vl, image_mask)
    y = moe_experts_reference(x, ti, tw, w1, s1, w3, s3, w2, s2, limit, act_quant)
    if shared is not None:
        y = y + shared_expert_reference(x, *shared, limit, act_quant).float()
    return y.to(x.dtype)


def moe_combine_reference(partials, top_k: int, shared=None, out_dtype=torch.float32):
    y = partials.float().unflatten(0, (-1, top_k)).sum(1)
    if shared is not None:
        y = y + shared.float()
    return y.to(out_dtype)
