"""The FP8 / FP4 / UE8M0 number codecs the kernels share, as @triton.jit helpers (the formats of `dsv41c/formats.py`).

Encoders (bit arithmetic on the float32 pattern, not a hardware cast, so every target and the interpreter, whose
float casts truncate, give the same bytes): `e4m3_encode` (saturate at 448, round to nearest even; subnormals by a
2^23 magic-number add), `e2m1_encode` (the seven ties-to-even thresholds), `round_bf16`, `round_e4m3_f32`; the
power-of-two scale helpers `pow2_ceil_exp` / `pow2_ceil_f32` (ceil(log2 y) off the exponent field plus
"mantissa != 0", the exact frexp rule of formats.pow2_ceil_exponent), `pow2_float`, `pow2_inv_f32`; the group
quantizers `quant_fp4_e4m3_pairs` / `quant_fp4_ue8m0_pairs` (FP4 on (even, odd) channel halves, which is exactly
the nibble pairing: packing is `even | odd << 4`), `quant_fp8_ue8m0_rows`, and the in-register dynamic fake quant
`fake_quant_e4m3_pow2`. Every division that decides a rounding uses `div_rn` (IEEE): the approximate `/` of the
GPU backends can move a value that lies exactly on an E2M1 / E4M3 tie.

Decoders: `e4m3_decode` (any int code, exact) and `e4m3_to_f32` (uint8 codes; the native cvt where the target has
FP8 units), `ue8m0_to_float` / `e8m0_to_f32` (2^(e-127); byte 0 through the subnormal constant, 255 -> NaN in
the latter), `e2m1_decode` / `e2m1_decode_x2` / `e2m1_to_f32`, `fp4_tile_to_f32` (a packed MXFP4 tile), and
`expand_cols` / `bcast_groups` (per-block scales to per element). The packed bf16x2 decoders of the FP8 GEMMs are
in bf16x2.py.

Known gaps: E4M3 NaN (0x7F / 0xFF) decodes as ±480 and UE8M0 NaN (255) is only produced by `e8m0_to_f32`; inputs
are finite by construction and scale floors keep every exponent >= -126. The kv_quant-born and the GEMM-born
decoders of the same format (`e4m3_decode` / `e4m3_to_f32`, `ue8m0_to_float` / `e8m0_to_f32`) give the same values
on finite codes and are kept apart because their callers' argument types differ.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e4m3_encode(x):
    """float32 -> E4M3 (fn) code in int32 0..255: saturate at 448, round to nearest even."""
    u = x.to(tl.int32, bitcast=True)
    sign = (u >> 31) & 1
    a = tl.minimum(tl.abs(x), 448.0)
    au = a.to(tl.int32, bitcast=True)
    r = au - (120 << 23)  # rebias 127 -> 7; valid for a >= 2^-6
    code_n = (r + 0x7FFFF + ((r >> 20) & 1)) >> 20
    t = a * 512.0  # subnormal grid 2^-9, exact
    code_s = ((t + 8388608.0) - 8388608.0).to(tl.int32)  # RNE to integer (t < 8)
    code = tl.where(a < 0.015625, code_s, code_n)
    return code | (sign << 7)


@triton.jit
def e4m3_decode(code):
    """E4M3 (fn) code (any int type) -> float32 (exact)."""
    c = code.to(tl.int32) & 0xFF
    s = (c >> 7) & 1
    e = (c >> 3) & 15
    m = c & 7
    normal = ((s << 31) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    sub = tl.where(s == 1, -sub, sub)
    return tl.where(e == 0, sub, normal)


@triton.jit
def round_bf16(x):
    """float32 -> nearest-even bfloat16 value, kept in float32 (the interpreter's bf16 cast truncates;
    this is exact everywhere). Finite inputs only."""
    u = x.to(tl.int32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & -65536
    return u.to(tl.float32, bitcast=True)


@triton.jit
def pow2_ceil_exp(y):
    """ceil(log2 y) for normal float32 y > 0, exact (int32)."""
    u = y.to(tl.int32, bitcast=True)
    e = ((u >> 23) & 0xFF) - 127
    return e + ((u & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def pow2_float(e):
    """2^e as float32 for int32 e in [-126, 127] (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_to_float(b):
    """UE8M0 byte (1..254) -> 2^(b-127) float32."""
    return (b.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_encode(v):
    """Scaled float32 (|v| <= 6 after clamp) -> E2M1 code int32 0..15, ties to even code."""
    a = tl.minimum(tl.abs(v), 6.0)
    c = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) \
        + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    return c | ((v < 0).to(tl.int32) << 3)


@triton.jit
def e2m1_decode_x2(code):
    """E2M1 code -> 2*value as int32 in [-12, 12] (E2M1 values times two are integers)."""
    c = code.to(tl.int32)
    m = c & 7
    e = m >> 1
    f = m & 1
    big = (2 + f) << tl.maximum(e - 1, 0)
    v = tl.where(m < 2, m, big)
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def e2m1_decode(code):
    """E2M1 code -> float32 value (exact)."""
    return e2m1_decode_x2(code).to(tl.float32) * 0.5


@triton.jit
def bcast_groups(s, R: tl.constexpr, G: tl.constexpr, GS: tl.constexpr):
    """[R, G] -> [R, G*GS], each value repeated GS times (channel order preserved)."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], (R, G, GS)), (R, G * GS))


@triton.jit
def quant_fp4_e4m3_pairs(E, O, R: tl.constexpr, HALF: tl.constexpr):
    """Even/odd channel halves [R, HALF] fp32 -> (packed bytes [R, HALF] int32, E4M3 scale codes
    [R, HALF//8] int32): one scale per 16 channels = 8 pairs (numerics.quant_fp4_e4m3)."""
    a = tl.maximum(tl.abs(E), tl.abs(O))
    amax = tl.max(tl.reshape(a, (R, HALF // 8, 8)), axis=2)
    amax = tl.maximum(amax, 0.01171875)  # 6 * 2^-9
    s_code = e4m3_encode(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)))
    s = bcast_groups(e4m3_decode(s_code), R, HALF // 8, 8)
    ce = e2m1_encode(tl.math.div_rn(E, s))
    co = e2m1_encode(tl.math.div_rn(O, s))
    return ce | (co << 4), s_code


@triton.jit
def quant_fp4_ue8m0_pairs(E, O, R: tl.constexpr, HALF: tl.constexpr):
    """Even/odd channel halves [R, HALF] fp32 -> (packed bytes [R, HALF] int32, UE8M0 bytes
    [R, HALF//16] int32): one power-of-two scale per 32 channels (numerics.quant_fp4_ue8m0)."""
    a = tl.maximum(tl.abs(E), tl.abs(O))
    amax = tl.max(tl.reshape(a, (R, HALF // 16, 16)), axis=2)
    amax = tl.maximum(amax, 1.1754943508222875e-38 * 6.0)  # 6 * 2^-126
    e = pow2_ceil_exp(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)))
    s = bcast_groups(pow2_float(e), R, HALF // 16, 16)
    ce = e2m1_encode(tl.math.div_rn(E, s))
    co = e2m1_encode(tl.math.div_rn(O, s))
    return ce | (co << 4), e + 127


@triton.jit
def quant_fp8_ue8m0_rows(x, R: tl.constexpr, C: tl.constexpr):
    """[R, C] fp32 -> (E4M3 codes [R, C] int32, UE8M0 bytes [R, C//32] int32)
    (numerics.quant_fp8_ue8m0, amax floor 1e-4)."""
    amax = tl.max(tl.reshape(tl.abs(x), (R, C // 32, 32)), axis=2)
    amax = tl.maximum(amax, 1e-4)
    e = pow2_ceil_exp(tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)))
    s = bcast_groups(pow2_float(e), R, C // 32, 32)
    return e4m3_encode(tl.math.div_rn(x, s)), e + 127


@triton.jit
def e4m3_to_f32(b, NATIVE: tl.constexpr):
    """E4M3 (fn) codes (uint8 tensor) -> float32. NaN (0x7F/0xFF) decodes as 480 (not produced)."""
    if NATIVE:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        bi = b.to(tl.int32)
        mag = bi & 0x7F
        # normal: exponent e4 + 120 (rebias 7 -> 127), mantissa bits to the top of fp32's
        v = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
        v = tl.where(mag < 8, mag.to(tl.float32) * 0.001953125, v)  # subnormal: m · 2^-9
        return tl.where((bi & 0x80) != 0, -v, v)


@triton.jit
def e8m0_to_f32(e):
    """UE8M0 bytes -> 2^(e-127) float32 (byte 0 -> 2^-127 subnormal, 255 -> NaN)."""
    ei = e.to(tl.int32)
    v = (ei << 23).to(tl.float32, bitcast=True)
    v = tl.where(ei == 0, 5.877471754111438e-39, v)
    return tl.where(ei == 255, float("nan"), v)


@triton.jit
def e2m1_to_f32(c):
    """E2M1 codes (int32 0..15, bit 3 = sign) -> float32 {0, .5, 1, 1.5, 2, 3, 4, 6}."""
    mag = c & 7
    v = ((mag << 22) + (126 << 23)).to(tl.float32, bitcast=True)  # 2^((mag>>1)-1)·(1 + (mag&1)/2)
    v = tl.where(mag < 2, mag.to(tl.float32) * 0.5, v)
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def expand_cols(s, R: tl.constexpr, C: tl.constexpr, REP: tl.constexpr):
    """[R, C] -> [R, C·REP], each column repeated REP times (per-block scales -> per element)."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], (R, C, REP)), (R, C * REP))


@triton.jit
def fp4_tile_to_f32(wp, sc, R: tl.constexpr, BK: tl.constexpr):
    """Packed E2M1 bytes [R, BK/2] (low nibble = even k) + UE8M0 bytes [R, BK/32] -> fp32 [R, BK]."""
    wi = wp.to(tl.int32)
    s = expand_cols(e8m0_to_f32(sc), R, BK // 32, 16)  # per packed byte
    lo = e2m1_to_f32(wi & 15) * s
    hi = e2m1_to_f32(wi >> 4) * s
    return tl.reshape(tl.join(lo, hi), (R, BK))


@triton.jit
def pow2_ceil_f32(r):
    """2^ceil(log2 r) for normal positive float32 r, exactly (exponent field + 'mantissa != 0')."""
    u = r.to(tl.int32, bitcast=True)
    e = ((u >> 23) & 0xFF) + ((u & 0x7FFFFF) != 0).to(tl.int32)
    return (e << 23).to(tl.float32, bitcast=True)


@triton.jit
def pow2_inv_f32(p):
    """1/p for a normal power of two p, exactly (no division: the GPU `/` is approximate)."""
    u = p.to(tl.int32, bitcast=True)
    return ((254 - ((u >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def round_e4m3_f32(v):
    """Round float32 v (|v| <= 448) to the nearest E4M3 value, ties to even, returned as float32."""
    a = tl.abs(v)
    u = a.to(tl.int32, bitcast=True)
    e = tl.maximum(((u >> 23) & 0xFF), 121)  # E4M3 subnormals share the 2^-6 binade's step
    ulp = ((e - 3) << 23).to(tl.float32, bitcast=True)  # 2^(exp-3): 3 mantissa bits
    inv = ((254 - (e - 3)) << 23).to(tl.float32, bitcast=True)
    q = (a * inv + 8388608.0) - 8388608.0  # RNE to an integer (a·inv < 16 is exact)
    r = q * ulp
    return tl.where(v < 0, -r, r)


@triton.jit
def fake_quant_e4m3_pow2(x, R: tl.constexpr, C: tl.constexpr):
    """Per-32-column dynamic FP8 fake quant of a float32 tile [R, C] (numerics.fake_quant_fp8_ue8m0)."""
    xb = tl.reshape(x, (R, C // 32, 32))
    amax = tl.maximum(tl.max(tl.abs(xb), axis=2), 1e-4)
    s = pow2_ceil_f32(tl.div_rn(amax, 448.0))
    q = round_e4m3_f32(tl.minimum(tl.maximum(xb * pow2_inv_f32(s)[:, :, None], -448.0), 448.0))
    return tl.reshape(q * s[:, :, None], (R, C))
