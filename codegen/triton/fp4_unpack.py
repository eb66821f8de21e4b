"""MXFP4 (E2M1 + UE8M0/32) weight tiles -> bf16 tensor-core operands, cheaply, for the grouped expert GEMMs.

What: a packed weight row holds byte j = (code of k=2j) | (code of k=2j+1) << 4, one UE8M0
byte e per 32 k (value 2^(e-127)); code c = s·8 + m3 with m3 = e1 e0 m. The decoders return the
tile [R, BK] as bf16 (every E2M1 value times a power of two is a bf16 value, so decoding is
exact), with its columns in a decoder-specific k ORDER: the dot only needs the weight and
activation columns to agree, so the activations are permuted to match (`k_order`,
`permute_k`; once per call on the host for x, in registers before the store for h) instead of
the weights being shuffled in the k loop.

Decoders (`DECODE`):
  0 "join": `fp8_gemm.fp4_tile_to_f32` (fp32 bit assembly per element, compares/selects for
    the subnormal code and the sign, an fp32 multiply by the scale, then an fp32->bf16 cvt),
    low/high nibbles interleaved with tl.join; natural k order.
  1 "nibbles": per byte, the bf16 bit patterns of both nibbles are placed into one 32-bit word
    (low nibble in bits 0..15, high in 16..31; see "bit algebra") and scaled by bf16x2
    multiplies; the low nibbles form the first BK/2 logical columns and the high nibbles the
    last BK/2, so nothing is interleaved by k (the operand registers re-pair them: PRMTs).
  2 "words": on 32-bit words of 4 packed bytes, one mask/shift pair places one nibble of EACH
    16-bit half, so the 32-bit result, scaled by bf16x2 multiplies, already is a bf16x2 register
    of the tensor-core operand (two logical columns); 4 such per word give its 8 values. On sm90
    (triton 3.6) that is 8 LOP3 + 2 SHF (integer pipe), 5 IMAD.SHL + 8 HMUL2 (FMA pipe) per word.

Bit algebra: the bf16 with bits (m3 << 6) | (s << 15) is exactly value(c) · 2^-126: for e1e0 > 0
it is the normal 2^(e1e0 - 127)·(1 + m/2), for e1e0 = 0 the subnormal m · 2^-7 · 2^-126 = 0.5m ·
2^-126. The scale is then 2^(e-127) · 2^126 = 2^(e-1), which is not a bf16 for e > 128, so it is
applied as two exact power-of-two factors f1 = 2^(min(e,128)-1), f2 = 2^(max(e,128)-128)
(value·f1 ≤ 12 is a normal or zero; ·f2 is the true product, overflowing to inf exactly where
the float32 reference does; e = 255 gives f2 = NaN like `e8m0_to_f32`). Real checkpoints have
e ≈ 110..125 (f2 = 1), but the second multiply keeps every e exact at one HMUL2 per two values.
On CUDA both are inline-PTX `fma.rn.bf16x2` (x·f + -0.0; bf16 fma has no flush-to-zero form, so
the 0.5·2^-126 subnormal input survives) on explicit 32-bit registers. Elsewhere (interpreter,
ROCm) each half is multiplied in float32 after moving its bits; the products are bf16 values, so
cutting them back to 16 bits is exact.
For a 32-bit word w (bytes b0..b3 little endian), nibble P of each 16-bit half
(bits 4P..4P+3 and 16+4P..16+4P+3) becomes ((w << (12-4P)) & 0x80008000) | ((w << (6-4P)) & 0x01C001C0)
(a negative shift is a logical right shift): byte 2h + P//2, nibble P%2 of word m is original
k = 8m + 4h + P of the block.

Register layout: the left wgmma/mma operand gives lane q = (lane id mod 4) the logical columns
{2q, 2q+1} + 8s; the k orders below also map a thread's words (bytes) to CONTIGUOUS memory, so
the loads are 16-byte vectors and a thread's BK=128 slice shares one scale byte:
  DECODE 2, W = BK/8 words per row: memory word m = q·W/4 + s holds logical word column c = 4s + q;
    logical column P·BK/4 + 2c + h  <-  original k = 8m + 4h + P.
  DECODE 1, memory byte m = q·BK/8 + 2s + b: logical column n·BK/2 + 8s + 2q + b  <-  k = 2m + n.
Whether Triton keeps these reshapes/permutes register-only is a property of its layout engine
(linear layouts): triton 3.6 and 3.9 do for sm90 (no convert_layout on the decoded tile, LDS.128
weight loads); check with `benchmarks/tune_moe_prefill.py --sass`.

Known gaps: DECODE 1/2 need BK a multiple of 64 (each quarter/half of the tile must be a whole
number of 16-wide MMA k-steps, and the lane mapping needs 4 | W); the activation permutation is
one extra pass over x per gate/up call (h is stored already permuted); the second scale multiply
could be skipped where no scale exceeds 128 (a per-program check), ~12% of the gate/up loop.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.triton.bf16x2 import bf16x2_halves, bits_f32, ue8m0_pow2_factors
from dsv41c.codegen.triton.codecs import expand_cols, fp4_tile_to_f32
from dsv41c.codegen.triton.fp8_tiles import pair_order, permute_blocks

DECODERS = {0: "join", 1: "nibbles", 2: "words"}


# ============================================================================ host side: k orders


def k_order(BK: int, decode: int) -> torch.Tensor:
    """perm [BK] (int64): logical column j of a BK block of the decoded tile is original column perm[j]."""
    if decode == 0:
        return torch.arange(BK)
    if BK % 64:
        raise ValueError(f"decoder {decode} needs BK % 64 == 0, got {BK}")
    a = torch.arange(BK)
    if decode == 1:
        # original k = 2m + n, m = q·BK/8 + 2s + b  ->  logical n·BK/2 + 8s + 2q + b
        return pair_order(BK)
    if decode == 2:
        # original k = 8m + 4h + P = 8(q·W/4 + s) + 4h + 2u + t, P = 2u + t  ->  logical P·BK/4 + 2(4s + q) + h
        return a.view(4, BK // 32, 2, 2, 2).permute(3, 4, 1, 0, 2).reshape(BK)
    raise ValueError(f"unknown FP4 decoder {decode}")


def permute_k(x: torch.Tensor, BK: int, decode: int) -> torch.Tensor:
    """x [..., K] -> the same values with each BK block of columns in `decode`'s k order (contiguous copy)."""
    if decode == 0:
        return x.contiguous()
    return permute_blocks(x, BK, ("e2m1", decode), lambda: k_order(BK, decode))


def unpermute_k(x: torch.Tensor, BK: int, decode: int) -> torch.Tensor:
    """Inverse of `permute_k`."""
    if decode == 0:
        return x.contiguous()
    return permute_blocks(x, BK, ("e2m1_inverse", decode), lambda: torch.argsort(k_order(BK, decode)))


# ============================================================================ jit: bit algebra


@triton.jit
def _shift(w, S: tl.constexpr):
    """w << S for S >= 0, logical w >> -S otherwise (w unsigned)."""
    if S >= 0:
        return w << S
    else:
        return w >> (-S)


@triton.jit
def e2m1_bf16x2_bits(w, P: tl.constexpr):
    """uint32 words -> uint32 whose 16-bit halves are the bf16 bits of nibble P (0..3) of each half, value·2^-126."""
    return (_shift(w, 12 - 4 * P) & 0x80008000) | (_shift(w, 6 - 4 * P) & 0x01C001C0)


@triton.jit
def ue8m0_bf16x2_factors(e):
    """UE8M0 exponents -> the bf16x2 factor pairs of E2M1 bit patterns worth value·2^-126:
    f1 = 2^(min(e,128) - 1), f2 = 2^(max(e,128) - 128) (fp8_gemm.ue8m0_pow2_factors with B = 126)."""
    return ue8m0_pow2_factors(e, 126)


@triton.jit
def scale_bf16x2(v, f1, f2, PTX: tl.constexpr):
    """uint32 pairs of bf16 bits × the bf16x2 pair f1, then × f2 (powers of two: exact, inf on overflow).

    PTX: two fma.rn.bf16x2 (x·f + -0.0; the bf16 fma has no flush-to-zero form, so the 0.5·2^-126
    subnormal input survives), on explicit 32-bit registers, so the pairing does not depend on the
    register order Triton picks for a tensor (Triton's own bf16 `*` is a scalar mul.bf16 per element).
    Otherwise each half in float32 through bit moves (the interpreter keeps bf16 as raw uint16: its bf16
    `*` multiplies the bits and its bf16<->fp32 casts flush subnormals); the products are bf16 values,
    so cutting them back to 16 bits is exact."""
    if PTX:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, z; mov.b32 z, 0x80008000; fma.rn.bf16x2 t, $1, $2, z; fma.rn.bf16x2 $0, t, $3, z; }",
            "=r,r,r,r", [v, f1, f2], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        lo = bits_f32(v << 16) * bits_f32(f1 << 16) * bits_f32(f2 << 16)
        hi = bits_f32(v & 0xFFFF0000) * bits_f32(f1 & 0xFFFF0000) * bits_f32(f2 & 0xFFFF0000)
        return (hi.to(tl.uint32, bitcast=True) & 0xFFFF0000) | (lo.to(tl.uint32, bitcast=True) >> 16)


@triton.jit
def bf16_to_f32(a):
    """bf16 -> float32 by moving the bits (the interpreter's bf16 cvt flushes subnormals)."""
    return bits_f32(a.to(tl.uint16, bitcast=True).to(tl.uint32) << 16)


@triton.jit
def _words_nibble(w, P: tl.constexpr, f1, f2, PTX: tl.constexpr):
    """[R, W] uint32 words -> [R, W, 2] bf16: nibble P of the low / high half of each word, scaled."""
    return bf16x2_halves(scale_bf16x2(e2m1_bf16x2_bits(w, P), f1, f2, PTX), False)


@triton.jit
def fp4_words_to_bf16(ww, sc, R: tl.constexpr, BK: tl.constexpr, PTX: tl.constexpr):
    """uint32 words [R, BK/8] (memory order) + UE8M0 bytes [R, BK/32] -> bf16 [R, BK] in k_order(BK, 2)."""
    f1, f2 = ue8m0_bf16x2_factors(sc.to(tl.int32))
    f1 = expand_cols(f1, R, BK // 32, 4)  # one scale per 4 words (32 k)
    f2 = expand_cols(f2, R, BK // 32, 4)
    t = tl.join(tl.join(_words_nibble(ww, 0, f1, f2, PTX), _words_nibble(ww, 1, f1, f2, PTX)),
                tl.join(_words_nibble(ww, 2, f1, f2, PTX), _words_nibble(ww, 3, f1, f2, PTX)))  # [R, m, h, t, u]
    t = tl.reshape(t, (R, 4, BK // 32, 2, 2, 2))  # m = q·W/4 + s, nibble P = 2u + t
    return tl.reshape(tl.permute(t, (0, 5, 4, 2, 1, 3)), (R, BK))  # (u, t, s, q, h)


@triton.jit
def fp4_bytes_nibbles_to_bf16(wp, sc, R: tl.constexpr, BK: tl.constexpr, PTX: tl.constexpr):
    """Packed bytes [R, BK/2] (memory order) + UE8M0 bytes [R, BK/32] -> bf16 [R, BK] in k_order(BK, 1)."""
    f1, f2 = ue8m0_bf16x2_factors(sc.to(tl.int32))
    f1 = expand_cols(f1, R, BK // 32, 16)  # one scale per 16 bytes (32 k)
    f2 = expand_cols(f2, R, BK // 32, 16)
    b = wp.to(tl.uint32)
    # low nibble -> bits 0..15, high nibble -> bits 16..31
    v = ((b << 12) & 0x8000) | ((b << 6) & 0x01C0) | ((b << 24) & 0x80000000) | ((b << 18) & 0x01C00000)
    t = tl.reshape(bf16x2_halves(scale_bf16x2(v, f1, f2, PTX), False), (R, 4, BK // 16, 2, 2))  # m = q·BK/8 + 2s + b
    return tl.reshape(tl.permute(t, (0, 4, 2, 1, 3)), (R, BK))  # (n, s, q, b)


@triton.jit
def fp4_tile(wp, sc, R: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, PTX: tl.constexpr, F32: tl.constexpr):
    """Loaded packed tile (bytes [R, BK/2]; uint32 words [R, BK/8] for DECODE 2) + UE8M0 bytes [R, BK/32]
    -> [R, BK] in k_order(BK, DECODE), bf16 (float32 if F32: the exact tl.dot path).

    PTX: the target takes inline PTX (CUDA, not the interpreter) for the bf16x2 multiplies."""
    if DECODE == 0:
        wf = fp4_tile_to_f32(wp, sc, R, BK)
        if F32:
            return wf
        else:
            return wf.to(tl.bfloat16)
    else:
        if DECODE == 2:
            wt = fp4_words_to_bf16(wp, sc, R, BK, PTX)
        else:
            wt = fp4_bytes_nibbles_to_bf16(wp, sc, R, BK, PTX)
        if F32:
            return bf16_to_f32(wt)
        else:
            return wt


@triton.jit
def permute_cols_tile(h, R: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr):
    """[R, C] tile in natural column order -> each BK block of columns in k_order(BK, DECODE) (C % BK == 0)."""
    if DECODE == 2:
        t = tl.reshape(h, (R, C // BK, 4, BK // 32, 2, 2, 2))
        return tl.reshape(tl.permute(t, (0, 1, 5, 6, 3, 2, 4)), (R, C))
    elif DECODE == 1:
        t = tl.reshape(h, (R, C // BK, 4, BK // 16, 2, 2))
        return tl.reshape(tl.permute(t, (0, 1, 5, 3, 2, 4)), (R, C))
    else:
        return h
