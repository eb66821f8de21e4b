"""The FP8 linears' pure-PyTorch references (the oracles of fp8_gemm.py, fp8_gemv.py and fp8_warp_split.py): fp32
math on the dequantized weights of `dsv41c/formats.py`."""
from __future__ import annotations

import torch

from dsv41c import formats


def act_quant_fp8_reference(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-32 FP8 fake quantization (E4M3, pow2 scale, amax floor 1e-4), x's dtype."""
    return formats.fake_quant_fp8_ue8m0(x, 32)


def fp8_gemm_reference(x, w, w_scale, act_quant: bool = False, out_dtype=None):
    """x [M, K] · dequant(W [N, K], scale [N/32, K/32])ᵀ in fp32 -> out_dtype (default x's)."""
    xa = act_quant_fp8_reference(x) if act_quant else x
    y = xa.float() @ formats.dequant_fp8_weight(w, w_scale).T
    return y.to(out_dtype or x.dtype)


def fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, limit: float, act_quant: bool = False, out_dtype=None):
    """h = silu(min(x·W1ᵀ, limit)) · clamp(x·W3ᵀ, ±limit), fp32 math -> out_dtype (default x's)."""
    xa = (act_quant_fp8_reference(x) if act_quant else x).float()
    g = (xa @ formats.dequant_fp8_weight(w1, s1).T).clamp(max=limit)
    u = (xa @ formats.dequant_fp8_weight(w3, s3).T).clamp(-limit, limit)
    return (torch.nn.functional.silu(g) * u).to(out_dtype or x.dtype)
