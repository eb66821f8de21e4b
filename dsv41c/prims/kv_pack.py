"""Packed KV formats: quantize to codes + scales (`kv_pack`) and back (`kv_unpack`), bit for bit
the fake quantizers of `prims/quant.py` split in two.

Formats (spec §3.2-3.4, §3.12; the layouts the Triton kernels read, codegen/triton/kv_quant.py):
- `fp4_e4m3` (compressed KV): x [..., C] -> packed E2M1 codes uint8 [..., C/2] (low nibble = even
  channel, bit 3 of a nibble = sign) and one E4M3 scale per 16 channels, float8_e4m3fn [..., C/16];
- `fp4_ue8m0` (indexer keys and queries): the same codes and one UE8M0 scale per 32 channels,
  float8_e8m0fnu [..., C/32] (byte = exponent + 127);
- `fp8_ue8m0` (window KV): E4M3 codes float8_e4m3fn [..., C] and one UE8M0 scale per 32 channels.

Why not `formats.quant_*`: they compute in float32, and the fake quantizers run in float64 for
float64 inputs (the noise-floor mode). Here the scale and the rounding are exactly those of
`prims/quant.py` (same work dtype, same clamps, the same ties-to-even thresholds, the sign of a
negative value that rounds to zero kept), so `kv_unpack(*kv_pack(x, f), f, x.dtype)` equals the
fake quantizer of format f on x bit for bit, in every dtype: fake quantization IS pack-then-unpack.
For float32 inputs the codes and scales are those of `formats.quant_fp4_e4m3` / `quant_fp4_ue8m0` /
`quant_fp8_ue8m0` (tested), i.e. what the kernels' references produce.
An all-zero row of codes and scales unpacks to zeros (E4M3 scale 0, or UE8M0 byte 0 = 2^-127
times code 0), so a zero-filled packed buffer reads as the zero-filled float buffer it replaces.
Known gaps: none known.
"""
from __future__ import annotations

import torch

from dsv41c.formats import E2M1_MAX, E4M3_MAX, device_constant
from dsv41c.prims.quant import _E2M1_MAG, _E2M1_STEPS, _blocks, pow2_ceil, round_e4m3

FORMATS = {"fp4_e4m3": 16, "fp4_ue8m0": 32, "fp8_ue8m0": 32}  # format -> channels per scale


def block_of(fmt: str) -> int:
    if fmt not in FORMATS:
        raise ValueError(f"unknown packed KV format '{fmt}' (known: {', '.join(FORMATS)})")
    return FORMATS[fmt]


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """v (|v| <= 6) -> E2M1 codes 0..15 (ties to the even code; sign bit from v < 0, as round_e2m1)."""
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.long)
    for thr, tie_up in _E2M1_STEPS:
        code += (a >= thr if tie_up else a > thr).long()
    return code + 8 * (v < 0).long()


def _e2m1_values(codes: torch.Tensor, dtype) -> torch.Tensor:
    mag = device_constant(_E2M1_MAG, dtype, codes.device)[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def _pow2_byte(s: torch.Tensor) -> torch.Tensor:
    """A power of two s (float) -> its UE8M0 byte (exponent + 127) as float8_e8m0fnu."""
    _, e = torch.frexp(s)
    return (e - 1 + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def _pow2_value(b: torch.Tensor, dtype) -> torch.Tensor:
    e = b.view(torch.uint8).to(torch.int32) - 127
    return torch.ldexp(torch.ones(e.shape, dtype=dtype, device=b.device), e)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    p = packed.view(torch.uint8).long()
    return torch.stack([p & 15, p >> 4], dim=-1).flatten(-2)


def kv_pack(x: torch.Tensor, fmt: str):
    """x [..., C] -> (codes, scales) of format `fmt` (module docstring)."""
    block = block_of(fmt)
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True)
    if fmt == "fp8_ue8m0":
        s = pow2_ceil(amax.clamp(min=1e-4) / E4M3_MAX)
        q = round_e4m3((xb / s).clamp(-E4M3_MAX, E4M3_MAX))
        return q.flatten(-2).to(torch.float8_e4m3fn), _pow2_byte(s.squeeze(-1))
    if fmt == "fp4_e4m3":
        s = round_e4m3((amax.clamp(min=E2M1_MAX * 2.0**-9) / E2M1_MAX).clamp(max=E4M3_MAX))
        scales = s.squeeze(-1).to(torch.float8_e4m3fn)
    else:
        s = pow2_ceil(amax.clamp(min=E2M1_MAX * 2.0**-126) / E2M1_MAX)
        scales = _pow2_byte(s.squeeze(-1))
    codes = _e2m1_codes((xb / s).clamp(-E2M1_MAX, E2M1_MAX))
    return _pack_nibbles(codes.flatten(-2)), scales


def kv_unpack(codes: torch.Tensor, scales: torch.Tensor, fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """(codes, scales) of format `fmt` -> values [..., C] in `dtype` (module docstring)."""
    block = block_of(fmt)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if fmt == "fp8_ue8m0":
        q = codes.view(torch.float8_e4m3fn).to(work)
        s = _pow2_value(scales, work)
    else:
        q = _e2m1_values(_unpack_nibbles(codes), work)
        s = scales.view(torch.float8_e4m3fn).to(work) if fmt == "fp4_e4m3" else _pow2_value(scales, work)
    q = q.unflatten(-1, (q.shape[-1] // block, block))
    return (q * s.unsqueeze(-1)).flatten(-2).to(dtype)


__all__ = ["FORMATS", "block_of", "kv_pack", "kv_unpack"]
