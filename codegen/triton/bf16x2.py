"""E4M3 codes -> bf16x2 operand registers by bit assembly, for the FP8 GEMMs' weight tiles (DECODE_W 1 and the pair
decoder of the warp-split GEMM).

Bit algebra: for a byte c = s·128 + e4·8 + m (E4M3 fn: sign, 4 exponent bits bias 7, 3 mantissa bits), the bf16
with bits (s << 15) | (e4 << 7) | (m << 4) = (s << 15) | ((c & 0x7F) << 4) is exactly value(c)·2^-120: for e4 >= 1
it is the bf16 normal 2^(e4-127)·(1 + m/8) = 2^(e4-7)·(1 + m/8)·2^-120; for e4 = 0 the bf16 subnormal
(m << 4)·2^-133 = m·2^-129 = (m·2^-9)·2^-120, the E4M3 subnormal; ±0 stay ±0 (the NaN codes 0x7F/0xFF give
±480·2^-120, as the bit-arithmetic `codecs.e4m3_to_f32` does). On a word w:
  P = 0 (bytes 0, 2): ((w << 8) & 0x80008000) | ((w << 4) & 0x07F007F0)
  P = 1 (bytes 1, 3): (w & 0x80008000) | ((w >> 4) & 0x07F007F0)
(`e4m3_bf16x2_bits`; the PTX form is prmt (byte 2h+P to the low byte of half h, its sign replicated into the high
byte) then (<< 4) & 0x87F087F0: 3 instructions for either P). The block scale 2^(e-127) then is 2^(e-7) on these
values, a bf16 normal for e <= 134 (field e + 120); beyond, it is split into the exact powers of two
f1 = 2^(min(e,134) - 7) and f2 = 2^(max(e,134) - 134) (value·f1 <= 448·2^7 is exact, ·f2 is the true product, inf
where the float32 reference overflows; e = 255 makes f2 NaN like `e8m0_to_f32`). Products are bf16 values (<= 4
significant bits) and exact for e >= 7; below that the smallest ones are rounded to nearest even bf16 (as a cast of
the fp32 product to bf16 does). The bf16 fma has no flush-to-zero form, so subnormal inputs and results survive.
Interpreter / ROCm: the same bit assembly, each half multiplied in float32 and rounded once to bf16 by integer
arithmetic (identical results).

Register layout (`e4m3_words_to_bf16`): the wgmma/mma left operand gives lane q (lane id mod 4) the logical columns
{2q, 2q+1} + 8j of each 16-wide k step. With W = BK/4 words per row, memory word m = q·W/4 + s holds, for byte P of
half h, original k = 4m + 2h + P, placed at logical column P·BK/2 + 2(4s + q) + h: each bf16x2 register is one
(2c, 2c+1) pair, a thread's words are contiguous (16-byte loads), and at BK = 128 they are one 32-column scale
block (the activation's columns are permuted to match: fp8_tiles.k_order_w). Triton 3.6 keeps the reshape/permute
register-only on sm90 (no shared-memory round trip for the decoded tile).

`e4m3_pairs_to_bf16` is the same algebra on 4 codes a register in natural k order (so x is not permuted), one
fma.rn.bf16x2 a pair; `E4M3_PAIRS_ONE` / `E4M3_PAIRS_TWO` are its PTX (one or two scale factors).
Its PTX path is exact (the `gpu` tests: all 256 codes × 24 scales, real widths vs float64).
"""
from __future__ import annotations

import triton
import triton.language as tl

from dsv41c.codegen.triton.codecs import expand_cols


@triton.jit
def e4m3_bf16x2_bits(w, P: tl.constexpr):
    """uint32 words -> uint32 whose 16-bit halves are the bf16 bits of byte P (0/1) of each half, value·2^-120."""
    if P == 0:
        return ((w << 8) & 0x80008000) | ((w << 4) & 0x07F007F0)
    else:
        return (w & 0x80008000) | ((w >> 4) & 0x07F007F0)


@triton.jit
def ue8m0_pow2_factors(e, B: tl.constexpr):
    """UE8M0 exponents (int32 0..255) -> uint32 (f1 | f1 << 16, f2 | f2 << 16): bf16x2 pairs of the exact
    powers of two with f1·f2 = 2^(e-127)·2^B, for decoded bit patterns worth value·2^-B. With the cap
    c = 254 - B (the largest e for which 2^(e-127+B) is still a bf16): f1 = 2^(min(e,c)-127+B) (biased
    field min(e,c) + B) and f2 = 2^(max(e,c)-c) (field max(e,c) + B - 127); e = 255 (NaN in UE8M0) makes
    f2 a NaN. B = 120 for E4M3 (ue8m0_e4m3_factors), 126 for E2M1 (fp4_unpack.ue8m0_bf16x2_factors)."""
    b1 = (tl.minimum(e, 254 - B) + B) << 7
    b2 = tl.where(e == 255, 0x7FC0, (tl.maximum(e, 254 - B) + B - 127) << 7)
    return (b1 | (b1 << 16)).to(tl.uint32), (b2 | (b2 << 16)).to(tl.uint32)


@triton.jit
def ue8m0_e4m3_factors(e):
    """The scale factors of E4M3 bit patterns worth value·2^-120: f1 = 2^(min(e,134)-7), f2 = 2^(max(e,134)-134)."""
    return ue8m0_pow2_factors(e, 120)


@triton.jit
def bits_f32(bits):
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16_bits_rn(v):
    """float32 -> its bf16 bits (in the low 16 of a uint32), round to nearest even, subnormals kept."""
    u = v.to(tl.uint32, bitcast=True)
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@triton.jit
def scale_bf16x2_rn(v, f1, f2, TWO: tl.constexpr):
    """uint32 pairs of bf16 bits × the bf16x2 pair f1 (and × f2 if TWO), as float32 per half through bit moves
    (interpreter, ROCm: the interpreter keeps bf16 as raw uint16, its bf16 `*` multiplies the bits): v·f1·f2 is
    exact in float32 (a 4-significant-bit value times powers of two, >= 2^-136), then rounded once to nearest
    even bf16, which is what the PTX path's two roundings give (the first is exact whenever f2 != 1)."""
    if TWO:
        lo = bits_f32(v << 16) * bits_f32(f1 << 16) * bits_f32(f2 << 16)
        hi = bits_f32(v & 0xFFFF0000) * bits_f32(f1 & 0xFFFF0000) * bits_f32(f2 & 0xFFFF0000)
    else:
        lo = bits_f32(v << 16) * bits_f32(f1 << 16)
        hi = bits_f32(v & 0xFFFF0000) * bits_f32(f1 & 0xFFFF0000)
    return (_f32_to_bf16_bits_rn(hi) << 16) | _f32_to_bf16_bits_rn(lo)


def _e4m3_asm(sel: str, two: bool) -> tl.constexpr:
    """The PTX of `e4m3_bf16x2_scaled`: prmt with selector `sel` (byte P of each half + its sign copy),
    shl 4, mask, then one or two fma.rn.bf16x2 by the scale factors ($2, $3)."""
    head = ("{ .reg .b32 p, z; mov.b32 z, 0x80008000; prmt.b32 p, $1, $1, %s; shl.b32 p, p, 4; "
            "and.b32 p, p, 0x87F087F0; " % sel)
    tail = ("fma.rn.bf16x2 p, p, $2, z; fma.rn.bf16x2 $0, p, $3, z; }" if two else "fma.rn.bf16x2 $0, p, $2, z; }")
    return tl.constexpr(head + tail)


_E4M3_ASM_P0_ONE, _E4M3_ASM_P0_TWO = _e4m3_asm("0xA280", False), _e4m3_asm("0xA280", True)


_E4M3_ASM_P1_ONE, _E4M3_ASM_P1_TWO = _e4m3_asm("0xB391", False), _e4m3_asm("0xB391", True)


@triton.jit
def e4m3_bf16x2_scaled(w, f1, f2, P: tl.constexpr, PTX: tl.constexpr, TWO: tl.constexpr):
    """uint32 words -> uint32 bf16x2: byte P of each 16-bit half, decoded and × f1 (× f2 if TWO), exact.

    PTX: prmt/shl/and, then fma.rn.bf16x2 (x·f + -0.0; the bf16 fma has no flush-to-zero form, so bf16
    subnormal inputs and results survive) on explicit 32-bit registers (Triton's own bf16 `*` is a scalar
    mul per element and its layout decides the pairing)."""
    # prmt puts byte 2h + P in the low byte of half h and its sign replicated (0x00 / 0xFF) in the high byte
    # (selector nibbles: output byte i <- source byte, +8 = replicate its sign); << 4 moves the code's bits
    # 0..6 to bf16 bits 4..10 and a sign copy to bit 15; the mask keeps exactly those (the bit algebra of
    # `e4m3_bf16x2_bits`, one instruction fewer for P = 0)
    if PTX:
        if TWO:
            asm2: tl.constexpr = _E4M3_ASM_P0_TWO if P == 0 else _E4M3_ASM_P1_TWO
            return tl.inline_asm_elementwise(asm2, "=r,r,r,r", [w, f1, f2], dtype=tl.uint32, is_pure=True, pack=1)
        else:
            asm1: tl.constexpr = _E4M3_ASM_P0_ONE if P == 0 else _E4M3_ASM_P1_ONE
            return tl.inline_asm_elementwise(asm1, "=r,r,r", [w, f1], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return scale_bf16x2_rn(e4m3_bf16x2_bits(w, P), f1, f2, TWO)


@triton.jit
def bf16x2_halves(v, F32: tl.constexpr):
    """uint32 [...] -> [..., 2] (bits 0..15, bits 16..31) as bf16, or as float32 by moving the bits (F32)."""
    if F32:
        return tl.join(bits_f32(v << 16), bits_f32(v & 0xFFFF0000))
    else:
        return tl.join(v.to(tl.uint16).to(tl.bfloat16, bitcast=True),
                       (v >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True))


@triton.jit
def e4m3_words_to_bf16(ww, sc, R: tl.constexpr, BK: tl.constexpr, PTX: tl.constexpr, F32: tl.constexpr,
                       TWO: tl.constexpr):
    """uint32 words [R, BK/4] (memory order, 4 E4M3 codes each) + UE8M0 bytes [R, BK/32] -> [R, BK] in
    k_order_w(BK): bf16 (float32 if F32, the interpreter's exact tl.dot path; values are bf16 values).
    TWO: apply the second scale factor (exact for every byte; without it only bytes <= 134 are)."""
    f1, f2 = ue8m0_e4m3_factors(sc.to(tl.int32))
    f1 = expand_cols(f1, R, BK // 32, 8)  # one scale per 8 words (32 k)
    f2 = expand_cols(f2, R, BK // 32, 8)
    t = tl.join(bf16x2_halves(e4m3_bf16x2_scaled(ww, f1, f2, 0, PTX, TWO), F32),
                bf16x2_halves(e4m3_bf16x2_scaled(ww, f1, f2, 1, PTX, TWO), F32))  # [R, m, h, P]
    t = tl.reshape(t, (R, 4, BK // 16, 2, 2))  # m = q·W/4 + s
    return tl.reshape(tl.permute(t, (0, 4, 2, 1, 3)), (R, BK))  # (P, s, q, h)


def _e4m3_pairs_asm(two: bool) -> tl.constexpr:
    """The PTX of `e4m3_pairs_to_bf16` for 4 codes in one register ($2): code pairs (0, 1) and (2, 3), each moved to
    the two 16-bit halves with its sign copied into the high byte (prmt), shifted and masked into bf16 bits worth
    value·2^-120 (the bit algebra of `e4m3_bf16x2_bits`), then scaled by one (or two) fma.rn.bf16x2 by the same
    elements' factors ($3, $4; $5, $6)."""
    f1, f2 = ("$3", "$4"), ("$5", "$6")
    body = ""
    for half, sel in enumerate(("0x9180", "0xB3A2")):  # output bytes: code, its sign copy, next code, its sign copy
        body += (f"prmt.b32 p, $2, $2, {sel}; shl.b32 p, p, 4; and.b32 p, p, 0x87F087F0; "
                 + (f"fma.rn.bf16x2 p, p, {f1[half]}, z; fma.rn.bf16x2 ${half}, p, {f2[half]}, z; " if two
                    else f"fma.rn.bf16x2 ${half}, p, {f1[half]}, z; "))
    return tl.constexpr("{ .reg .b32 p, z; mov.b32 z, 0x80008000; " + body + "}")


E4M3_PAIRS_ONE, E4M3_PAIRS_TWO = _e4m3_pairs_asm(False), _e4m3_pairs_asm(True)


@triton.jit
def e4m3_one_factor(e):
    """UE8M0 bytes e <= 134 -> 2^(e-7), the bf16 with exponent field e + 120: `E4M3_PAIRS_ONE`'s whole scale (wrong
    for larger bytes, which need `e4m3_pair_factors`)."""
    return ((e.to(tl.int32) + 120) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e4m3_pair_factors(e):
    """UE8M0 bytes -> the bf16 scale factors of `_E4M3_PAIRS_*`'s bit patterns (worth value·2^-120):
    2^(min(e,134)-7) and 2^(max(e,134)-134) (NaN for e = 255), one per byte, not yet expanded per element."""
    ei = e.to(tl.int32)
    b1 = e4m3_one_factor(tl.minimum(ei, 134))
    b2 = tl.where(ei == 255, 0x7FC0, (tl.maximum(ei, 134) - 7) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return b1, b2


@triton.jit
def e4m3_pairs_to_bf16(codes, e, R: tl.constexpr, BK: tl.constexpr, TWO: tl.constexpr):
    """E4M3 codes [R, BK] (uint8, natural k order) + UE8M0 bytes [R, BK/32] -> the bf16 tile [R, BK]: DECODE_W 0's
    bits (value·2^(e-127) rounded to bf16), by inline PTX (CUDA only) on code pairs: prmt, shl, and, then one
    fma.rn.bf16x2 by 2^(min(e,134)-7) (TWO: and one by 2^(max(e,134)-134), for bytes above 134) — 4 instructions
    a pair against the per-element decoder's 6 (e4m3 cvt, two f16 -> f32, two multiplies, a bf16x2 pack). The asm
    is elementwise (pack 4: the 4 consecutive elements of a thread share a register), so the tile keeps its
    natural k order and x is not permuted (unlike DECODE_W 1's words)."""
    b1, b2 = e4m3_pair_factors(e)
    b1 = expand_cols(b1, R, BK // 32, 32)
    if TWO:
        b2 = expand_cols(b2, R, BK // 32, 32)
        out = tl.inline_asm_elementwise(E4M3_PAIRS_TWO, "=r,=r,r,r,r,r,r", [codes, b1, b2], dtype=tl.bfloat16,
                                        is_pure=True, pack=4)
    else:
        out = tl.inline_asm_elementwise(E4M3_PAIRS_ONE, "=r,=r,r,r,r", [codes, b1], dtype=tl.bfloat16,
                                        is_pure=True, pack=4)
    return out
