"""Rotary position embedding: the `main` and `compress` (YaRN) tables, interleaved pairs.

Spec §3.0.2, §3.2:
- `main` (ratio-0 layers and the DSpark stages): inv_freq_i = rope_theta^(-2i/d), i < d/2,
  d = qk_rope_head_dim, no scaling.
- `compress` (every layer with a compressed branch, for its window branch too; compressed
  entries; indexer queries and keys): base compress_rope_theta and YaRN as in the V3/V4
  reference `precompute_freqs_cis`, applied whenever original_max_position_embeddings > 0:
      corr(r) = d·ln(orig / (2π r)) / (2 ln base)
      low = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), d - 1)
      ramp_i = clamp((i - low) / (high - low), 0, 1)        (high += 0.001 if equal)
      inv_freq_i ← inv_freq_i / factor · ramp_i + inv_freq_i · (1 - ramp_i)
  i.e. i ≤ low unchanged, i ≥ high divided by `factor`, linear in between. The published
  config gives low = 15, high = 25. No mscale / attention factor (HF: attention_factor 1.0).
- Rotation: channel pairs (2i, 2i+1) of the trailing d channels are complex numbers
  rotated by pos·inv_freq_i (`view_as_complex` convention, NOT rotate-half); leading
  channels pass through. `inverse=True` rotates by the negative angle (attention output).

HF reading taken: the newest HF `_compute_yarn_parameters` uses `factor` from the config
(only falling back to max_position_embeddings / original when `factor` is missing) and
`original_max_position_embeddings` for the correction range, which is the formula above.
(Older HF versions replaced `factor` by max_position_embeddings / original whenever
`original_max_position_embeddings` was present; for the published config both give 16, for
the small presets they would not. We follow the spec.)
Numerics follow HF: inv_freq is computed in the compute dtype (float32, or float64 in the
float64 mode), angle = position · inv_freq, cos/sin in that dtype; the rotation itself runs
in the compute dtype and returns the input's dtype. In bfloat16 mode HF rounds cos/sin to
bfloat16 before rotating; `rope_cos_sin(..., round_to=torch.bfloat16)` does the same.

Known gaps: none for the text model (the vision tower's 2D RoPE is not here).
"""
from __future__ import annotations

import math

import torch


def yarn_correction_range(dim: int, base: float, original_max_pos: int, beta_fast: float,
                          beta_slow: float) -> tuple[int, int]:
    """(low, high) channel-pair indices of the YaRN ramp (floor / ceil, clamped to [0, dim-1])."""

    def corr(rot: float) -> float:
        return dim * math.log(original_max_pos / (rot * 2 * math.pi)) / (2 * math.log(base))

    return max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)


def inv_freq_main(cfg, dtype=torch.float32) -> torch.Tensor:
    """[d/2] plain RoPE frequencies with base rope_theta."""
    d = cfg.qk_rope_head_dim
    return 1.0 / (float(cfg.rope_theta) ** (torch.arange(0, d, 2, dtype=dtype) / d))


def inv_freq_compress(cfg, dtype=torch.float32) -> torch.Tensor:
    """[d/2] YaRN frequencies with base compress_rope_theta (spec §3.0.2)."""
    d = cfg.qk_rope_head_dim
    base = float(cfg.compress_rope_theta)
    rs = cfg.rope_scaling
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=dtype) / d)
    extrapolation = 1.0 / pos_freqs
    if rs is None or rs.original_max_position_embeddings <= 0:
        return extrapolation
    interpolation = 1.0 / (float(rs.factor) * pos_freqs)
    low, high = yarn_correction_range(d, base, rs.original_max_position_embeddings, rs.beta_fast, rs.beta_slow)
    if low == high:
        high += 0.001  # as HF / the reference: avoid a zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # weight of the unscaled frequency
    return interpolation * (1 - keep) + extrapolation * keep


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, round_to: torch.dtype | None = None):
    """cos, sin [T, d/2] for integer positions [T] (in inv_freq's dtype, optionally rounded)."""
    ang = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    cos, sin = ang.cos(), ang.sin()
    if round_to is not None and round_to != cos.dtype:
        cos, sin = cos.to(round_to).to(cos.dtype), sin.to(round_to).to(sin.dtype)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing 2·cos.shape[-1] channels of x in interleaved pairs.

    x: [T, C] or [T, H, C]; cos/sin: [T, d/2]. The arithmetic runs in cos's dtype (the
    compute dtype); the result has x's dtype.
    """
    if inverse:
        sin = -sin
    rd = cos.shape[-1] * 2
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    nope, rope = x[..., :-rd], x[..., -rd:]
    even, odd = rope[..., 0::2].to(cos.dtype), rope[..., 1::2].to(cos.dtype)
    rot = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([nope, rot.to(x.dtype)], dim=-1)
