"""The packed KV path's domain ops as ONNX functions (kv-quant on): kv_pack, kv_unpack, compressor_fused,
index_scores_int8 and the fake quantizers; part of the op table of `export_onnx_dsv41.py`.

The packed state travels as raw bytes (UINT8): opset 21's Slice, Concat, Gather and ScatterND take no
FLOAT8E4M3FN tensors, so E4M3 codes and scales, E8M0 scales and packed E2M1 pairs are all bytes, and
the encodings are spelled in arithmetic, as `prims/kv_pack.py` computes them:
- decoding: 256-entry lookup tables (E4M3, E8M0 = 2^(b-127), E2M1 pairs low nibble first), exact;
- powers of two: `pow2_ceil(t)` = 2^ceil(log2 t) from Log, then corrected by comparing exact powers
  (Pow(2, integer) is exact), so it equals the reference's frexp form; `round_e4m3` rounds to the E4M3
  step of the value's binade (subnormals share 2^-6's) with Round, which ties to even as torch.round;
- E2M1 codes: the count of ties-to-even thresholds passed (`>=` where a tie rounds up, `>` where it
  rounds down) plus 8 for a negative value; E4M3 bytes from the value's binade and mantissa.
compressor_fused is compressor_step's body, the compress RoPE at the entries' positions, the indexer
key's wk -> RMSNorm, the two packs and the four cache appends, in the order of `ops/compressor_fused.py`.
index_scores_int8 equals index_scores on the same operands bit for bit (`prims/indexer_int8.py`), so
its body is index_scores'; a fake quantizer (`fq_*`, left when lower-kv-fp4 is switched off) is its
format's pack then unpack, which is what the eager op is, bit for bit.
On the same inputs kv_pack and kv_unpack give the eager ops' bytes and values exactly
(tests/test_export_onnx.py). Known gap: onnxruntime's float32 arithmetic upstream differs from
torch's in the last bits, and a value within that of a rounding boundary takes the neighbouring code;
the tiny model amplifies such flips (logits rel-L2 about 3e-2 against the eager reference with kv-quant
on, 2e-6 with it off).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from onnx import TensorProto as TP

from dsv41c.frontend.export_onnx_aten import floor_div
from dsv41c.frontend.export_onnx_dsv41 import FUNCS as DSV41_FUNCS
from dsv41c.frontend.export_onnx_dsv41 import _rms_norm, append_rows, compressor_step, e4m3_lut, index_scores, lut

LN2 = math.log(2.0)
_E2M1_MAG = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
_BLOCK = {"fp4_e4m3": 16, "fp4_ue8m0": 32, "fp8_ue8m0": 32}


def e8m0_lut(n):
    lut = np.ldexp(1.0, np.arange(256) - 127)
    lut[255] = np.nan
    return n.const(lut.astype(np.float32), TP.FLOAT)


def _split_last(n, x, block):
    """[..., C] -> [..., C/block, block] (sizes spelled out: a -1 cannot size an empty tensor)."""
    last = n.op("Div", n.op("Shape", x, start=-1), n.i64(block))
    return n.op("Reshape", x, n.op("Concat", n.op("Shape", x, end=-1), last, n.i64(block), axis=0))


def _merge_last(n, x):
    """[..., a, b] -> [..., a·b]."""
    last = n.op("Mul", n.op("Shape", x, start=-2, end=-1), n.op("Shape", x, start=-1))
    return n.op("Reshape", x, n.op("Concat", n.op("Shape", x, end=-2), last, axis=0))


def _pow2(n, e, t):
    return n.op("Pow", n.scalar(2.0, t), e)


def floor_log2(n, a, t):
    """floor(log2 a) for a > 0 (as a float of t), exact."""
    f = n.op("Floor", n.op("Div", n.op("Log", a), n.scalar(LN2, t)))
    one = n.scalar(1.0, t)
    f = n.op("Where", n.op("Greater", _pow2(n, f, t), a), n.op("Sub", f, one), f)
    return n.op("Where", n.op("LessOrEqual", _pow2(n, n.op("Add", f, one), t), a), n.op("Add", f, one), f)


def pow2_ceil(n, x, t):
    """(2^ceil(log2 x), ceil(log2 x)) for x > 0, exact."""
    e = n.op("Ceil", n.op("Div", n.op("Log", x), n.scalar(LN2, t)))
    one = n.scalar(1.0, t)
    e = n.op("Where", n.op("GreaterOrEqual", _pow2(n, n.op("Sub", e, one), t), x), n.op("Sub", e, one), e)
    e = n.op("Where", n.op("Less", _pow2(n, e, t), x), n.op("Add", e, one), e)
    return _pow2(n, e, t), e


def round_e4m3(n, v, t):
    a = n.op("Abs", v)
    zero = n.op("Equal", a, n.scalar(0.0, t))
    fl = floor_log2(n, n.op("Where", zero, n.scalar(1.0, t), a), t)
    fl = n.op("Max", n.op("Where", zero, n.scalar(-6.0, t), fl), n.scalar(-6.0, t))
    step = _pow2(n, n.op("Sub", fl, n.scalar(3.0, t)), t)
    return n.op("Mul", n.op("Round", n.op("Div", v, step)), step)


def e4m3_byte(n, q, t):
    """An E4M3 value q (exactly representable) -> its byte (UINT8)."""
    a = n.op("Abs", q)
    sub = n.op("Less", a, n.scalar(2.0**-6, t))
    fl = floor_log2(n, n.op("Where", sub, n.scalar(1.0, t), a), t)
    mant = n.op("Sub", n.op("Mul", n.op("Div", a, _pow2(n, fl, t)), n.scalar(8.0, t)), n.scalar(8.0, t))
    normal = n.op("Add", n.op("Mul", n.op("Add", fl, n.scalar(7.0, t)), n.scalar(8.0, t)), mant)
    mag = n.op("Where", sub, n.op("Mul", a, n.scalar(512.0, t)), normal)
    negative = n.op("Less", n.op("Reciprocal", q), n.scalar(0.0, t))  # true for -0.0 too: its byte is 0x80
    sign = n.op("Mul", n.cast(negative, t, TP.BOOL), n.scalar(128.0, t))
    return n.cast(n.op("Add", mag, sign), TP.UINT8, t)


def e2m1_codes(n, v, t):
    a = n.op("Abs", v)
    code = n.op("Mul", n.cast(n.op("Less", v, n.scalar(0.0, t)), t, TP.BOOL), n.scalar(8.0, t))
    for thr, tie_up in _E2M1_STEPS:
        hit = n.op("GreaterOrEqual" if tie_up else "Greater", a, n.scalar(thr, t))
        code = n.op("Add", code, n.cast(hit, t, TP.BOOL))
    return code


def kv_pack_nodes(n, x, tx, fmt):
    """x [..., C] -> (codes, scales) bytes of fmt (prims/kv_pack.kv_pack)."""
    block = _BLOCK[fmt]
    t = TP.DOUBLE if tx == TP.DOUBLE else TP.FLOAT
    xb = _split_last(n, n.cast(x, t, tx), block)
    amax = n.op("ReduceMax", n.op("Abs", xb), n.i64(-1), keepdims=1)

    def clamp(v, lo, hi):
        return n.op("Min", n.op("Max", v, n.scalar(lo, t)), n.scalar(hi, t))

    def exp_byte(e):
        return n.cast(n.op("Add", n.op("Squeeze", e, n.i64(-1)), n.scalar(127.0, t)), TP.UINT8, t)

    if fmt == "fp8_ue8m0":
        s, e = pow2_ceil(n, n.op("Div", n.op("Max", amax, n.scalar(1e-4, t)), n.scalar(448.0, t)), t)
        q = round_e4m3(n, clamp(n.op("Div", xb, s), -448.0, 448.0), t)
        return e4m3_byte(n, _merge_last(n, q), t), exp_byte(e)
    if fmt == "fp4_e4m3":
        s = round_e4m3(n, n.op("Min", n.op("Div", n.op("Max", amax, n.scalar(6.0 * 2.0**-9, t)), n.scalar(6.0, t)),
                                 n.scalar(448.0, t)), t)
        scales = e4m3_byte(n, n.op("Squeeze", s, n.i64(-1)), t)
    else:
        s, e = pow2_ceil(n, n.op("Div", n.op("Max", amax, n.scalar(6.0 * 2.0**-126, t)), n.scalar(6.0, t)), t)
        scales = exp_byte(e)
    codes = _merge_last(n, e2m1_codes(n, clamp(n.op("Div", xb, s), -6.0, 6.0), t))
    pairs = _split_last(n, codes, 2)
    packed = n.op("Add", n.slice(pairs, -1, 0, 1), n.op("Mul", n.slice(pairs, -1, 1, 2), n.scalar(16.0, t)))
    return n.cast(n.op("Squeeze", packed, n.i64(-1)), TP.UINT8, t), scales


def kv_unpack_nodes(n, codes, scales, fmt, out_t):
    from dsv41c.formats import E2M1_LUT

    block = _BLOCK[fmt]
    t = TP.DOUBLE if out_t == TP.DOUBLE else TP.FLOAT
    if fmt == "fp8_ue8m0":
        q = lut(n, e4m3_lut(n), codes, t)
    else:
        pair = n.const([[E2M1_LUT[b & 15], E2M1_LUT[b >> 4]] for b in range(256)], TP.FLOAT)
        q = _merge_last(n, lut(n, pair, codes, t))
    s = lut(n, e4m3_lut(n) if fmt == "fp4_e4m3" else e8m0_lut(n), scales, t)
    v = n.op("Mul", _split_last(n, q, block), n.op("Unsqueeze", s, n.i64(-1)))
    return n.cast(_merge_last(n, v), out_t, t)


def kv_pack(F):
    return list(kv_pack_nodes(F.n, "x", F.dtypes["x"], F.attrs["fmt"]))


def kv_unpack(F):
    return [kv_unpack_nodes(F.n, "codes", "scales", F.attrs["fmt"], F.out_dtypes[0])]


def fake_quant(fmt):
    """fq_window_kv / fq_compressed_kv / fq_indexer: kv_unpack(kv_pack(x)), the eager ops' identity."""
    def body(F):
        c, s = kv_pack_nodes(F.n, "x", F.dtypes["x"], fmt)
        return [kv_unpack_nodes(F.n, c, s, fmt, F.dtypes["x"])]
    body.__name__ = f"fake_quant_{fmt}"
    return body


def _rope(n, x, tx, cos, sin, tc):
    """prims.rope.apply_rope on x [m, C]: the trailing 2·d/2 channels rotated in interleaved pairs."""
    rd = n.op("Mul", n.dim(cos, -1), n.i64(2))
    nope = n.slice(x, -1, 0, n.op("Neg", rd))
    rope = n.slice(x, -1, n.op("Neg", rd), None)
    even = n.cast(n.op("Slice", rope, n.i64(0), n.i64(2**62), n.i64(-1), n.i64(2)), tc, tx)
    odd = n.cast(n.op("Slice", rope, n.i64(1), n.i64(2**62), n.i64(-1), n.i64(2)), tc, tx)
    a = n.op("Sub", n.op("Mul", even, cos), n.op("Mul", odd, sin))
    b = n.op("Add", n.op("Mul", even, sin), n.op("Mul", odd, cos))
    rot = n.op("Concat", n.op("Unsqueeze", a, n.i64(-1)), n.op("Unsqueeze", b, n.i64(-1)), axis=-1)
    return n.op("Concat", nope, n.cast(_merge_last(n, rot), tx, tc), axis=-1)


def compressor_fused(F):

    n, ratio, eps, tx = F.n, int(F.attrs["ratio"]), float(F.attrs["eps"]), F.dtypes["x"]
    lat, bk, bg = compressor_step(F)
    pos = n.op("Reshape", "pos", n.i64(1))
    at = pos if ratio == 1 else floor_div(n, pos, n.i64(ratio), TP.INT64)
    entries = n.op("Range", n.const(0, TP.INT64), n.squeeze0(n.dim(lat, 0)), n.const(1, TP.INT64))
    positions = n.op("Mul", n.op("Add", at, entries), n.i64(ratio))
    tc = F.dtypes["inv_c"]
    ang = n.op("Mul", n.op("Unsqueeze", n.cast(positions, tc, TP.INT64), n.i64(1)), n.op("Unsqueeze", "inv_c", n.i64(0)))
    cos, sin = n.op("Cos", ang), n.op("Sin", ang)
    k = n.op("MatMul", lat, n.op("Transpose", F.cast("wk", tx), perm=[1, 0]))
    k = _rms_norm(n, k, tx, "k_norm_w", F.dtypes["k_norm_w"], eps, F.acc("x"))
    kc, ks = kv_pack_nodes(n, _rope(n, k, tx, cos, sin, tc), tx, "fp4_ue8m0")
    cc, cs = kv_pack_nodes(n, _rope(n, lat, tx, cos, sin, tc), tx, "fp4_e4m3")
    return [append_rows(n, "kv_codes", cc, at), append_rows(n, "kv_scales", cs, at),
            append_rows(n, "key_codes", kc, at), append_rows(n, "key_scales", ks, at), bk, bg]


def index_scores_int8(F):

    return index_scores(F)


# every domain op's function: the unpacked ops' (export_onnx_dsv41.py) and the packed KV path's
FUNCS = {
    **DSV41_FUNCS,
    "dsv41.kv_pack": (kv_pack, None),
    "dsv41.kv_unpack": (kv_unpack, None),
    "dsv41.compressor_fused": (compressor_fused, None),
    "dsv41.index_scores_int8": (index_scores_int8, None),
    "dsv41.fq_window_kv": (fake_quant("fp8_ue8m0"), None),
    "dsv41.fq_compressed_kv": (fake_quant("fp4_e4m3"), None),
    "dsv41.fq_indexer": (fake_quant("fp4_ue8m0"), None),
}
