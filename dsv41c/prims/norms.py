"""RMSNorm, weighted and unweighted (spec §3.1).

weighted:   y = w ⊙ (x_acc · rsqrt(mean(x_acc²) + eps)).to(x.dtype)
unweighted: y = x · rsqrt(mean(x_acc²) + eps).to(x.dtype)          (mHC input norm)

`acc` is float32 (HF: `x.to(torch.float32)`), or float64 in the float64 mode. eps is
`rms_norm_eps` (1e-20 in the published config) for every norm, including the unweighted
one (HF builds `DeepseekV41UnweightedRMSNorm(eps=config.rms_norm_eps)`).
Known gaps: none.
"""
from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The 'float32 or better' dtype the reference's fp32 parts run in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xa = x.to(acc_dtype(x.dtype))
    y = xa * torch.rsqrt(xa.square().mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def rms_norm_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    xa = x.to(acc_dtype(x.dtype))
    return x * torch.rsqrt(xa.square().mean(-1, keepdim=True) + eps).to(x.dtype)
