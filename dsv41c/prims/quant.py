"""KV-path fake quantization (QAT semantics) in the caller's precision.

The three quantizers of the KV path (spec §3.2–3.4), each one function of a tensor:
- `fq_window_kv`     FP8 E4M3, one power-of-two (UE8M0) scale per 32 channels,
                     s = 2^ceil(log2(max(amax, 1e-4) / 448))            (window KV)
- `fq_compressed_kv` FP4 E2M1, one E4M3 scale per 16 channels,
                     s = e4m3(max(amax, 6·2^-9) / 6)                      (compressed KV)
- `fq_indexer`       FP4 E2M1, one power-of-two scale per 32 channels,
                     s = 2^ceil(log2(max(amax, 6·2^-126) / 6))           (indexer keys + queries)
Each returns quantize-then-dequantize in x's dtype, or x unchanged when `enabled` is
False (the `--kv-quant off` numerics-debugging switch, spec §7.3).

Why not call `numerics.fake_quant_*` directly: those compute in float32, and the float64
mode must run everything in float64 (it measures the float32 noise floor). The formulas
here are the same; the arithmetic runs in float32 for float32/bfloat16 inputs (as HF and
numerics do) and in float64 for float64 inputs. Rounding onto the E4M3 and E2M1 grids is
done with exact power-of-two steps and round-half-to-even, so for float32 inputs the
results are bit-identical to `numerics` (tested). The scale uses a true division
(amax / 448), as the spec states; HF multiplies by the rounded reciprocal, which can
differ only when amax / 448 is within one ulp of a power of two.
Known gaps: none known.
"""
from __future__ import annotations

import torch

from dsv41c.formats import E2M1_MAX, E4M3_MAX, device_constant

# E2M1 magnitudes by code, and the ties-to-even thresholds between consecutive codes:
# (threshold, tie rounds up?) — 0.25↓ 0.75↑ 1.25↓ 1.75↑ 2.5↓ 3.5↑ 5↓.
_E2M1_MAG = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"fake quantization: last dim {x.shape[-1]} is not a multiple of the block {block}")
    return x.to(_work_dtype(x)).unflatten(-1, (x.shape[-1] // block, block))


def pow2_ceil(t: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(t)) for t > 0, exact (frexp), in t's dtype."""
    m, e = torch.frexp(t)
    e = torch.where(m == 0.5, e - 1, e)  # t = 0.5·2^e is itself a power of two
    return torch.ldexp(torch.ones_like(t), e)


def round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round v (|v| ≤ 448) to the nearest E4M3 value, ties to even, staying in v's dtype."""
    _, e = torch.frexp(v.abs())
    # binade exponent floor(log2|v|) = e-1; subnormals (< 2^-6) share the 2^-6 binade's step.
    step = torch.ldexp(torch.ones_like(v), (e - 1).clamp(min=-6) - 3)
    return torch.round(v / step) * step


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round v (|v| ≤ 6) to the nearest E2M1 value, ties to even code."""
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.long)
    for thr, tie_up in _E2M1_STEPS:
        code += (a >= thr if tie_up else a > thr).long()
    mag = device_constant(_E2M1_MAG, v.dtype, v.device)[code]
    return torch.where(v < 0, -mag, mag)


def fq_window_kv(x: torch.Tensor, enabled: bool = True, block: int = 32) -> torch.Tensor:
    if not enabled:
        return x
    xb = _blocks(x, block)
    s = pow2_ceil(xb.abs().amax(-1, keepdim=True).clamp(min=1e-4) / E4M3_MAX)
    q = round_e4m3((xb / s).clamp(-E4M3_MAX, E4M3_MAX))
    return (q * s).flatten(-2).to(x.dtype)


def fq_compressed_kv(x: torch.Tensor, enabled: bool = True, block: int = 16) -> torch.Tensor:
    if not enabled:
        return x
    xb = _blocks(x, block)
    s = round_e4m3((xb.abs().amax(-1, keepdim=True).clamp(min=E2M1_MAX * 2.0**-9) / E2M1_MAX).clamp(max=E4M3_MAX))
    q = round_e2m1((xb / s).clamp(-E2M1_MAX, E2M1_MAX))
    return (q * s).flatten(-2).to(x.dtype)


def fq_indexer(x: torch.Tensor, enabled: bool = True, block: int = 32) -> torch.Tensor:
    if not enabled:
        return x
    xb = _blocks(x, block)
    s = pow2_ceil(xb.abs().amax(-1, keepdim=True).clamp(min=E2M1_MAX * 2.0**-126) / E2M1_MAX)
    q = round_e2m1((xb / s).clamp(-E2M1_MAX, E2M1_MAX))
    return (q * s).flatten(-2).to(x.dtype)
