"""Decode MoE gate/up on the tensor cores: each slot's FP4 GEMV as an MMA with block-diagonal activations.

What: the same numbers as `moe_decode.moe_decode_gate_up_kernel` (h'[slot] = SwiGLU(x_t·w1[e]ᵀ, x_t·w3[e]ᵀ)
× routing weight, rounded to INTER, stored prescaled for the down kernel), with the w1/w3 row sums
computed by `tl.dot` instead of fp32 FMAs. Where it is used: `moe_decode.moe_experts_decode` with
tiles["gate_up"]["mma"] (the default on CUDA sm90+, see `moe_decode.decode_tiles`).

Why: the FMA path (moe_decode.fp4_gemv) spends ~4.6 SASS instructions per weight element — 3 integer ops
to decode each E2M1 code into an fp32 plus its FMA — and is issue-bound at ~2.1 TB/s, half the HBM rate.
Here a 32-bit word of 8 codes becomes 4 fp16x2 operand registers in 15 integer ops (~1.9 per element) and
the multiply-adds go to the tensor cores, whose 16×8 tile has room for the per-32 block scales:

Algorithm, per program (slot, BN rows of w1[e] and w3[e], one of KSPLIT ranges of K):
- The activation of a K step of BK = 8·32 is B [BK, 8] fp16, block-diagonal: column n holds x' of the
  step's block n (zero elsewhere), rows in the weight decoder's k order (fp4_unpack.k_order(BK, 2)).
  The prep kernel (`moe_decode_mma_prep_kernel`) writes it once per token: x' = x·2^c per 32-block with
  c = 141 - (exponent field of the block amax), so the amax lies in [2^14, 2^15) (fp16's top binade),
  and f = 2^(14-c). Sizes: K·8 fp16 per token (80 KB at hidden 5120).
- A [BN, BK] is the weight tile decoded without its scale: code (s, m3) -> the fp16 with bits
  (m3 << 9) | (s << 15), exactly value·2^-14 (e1e0 = 0 gives the fp16 subnormal m·2^-15). For a word w,
  nibble P of both 16-bit halves is ((w << (12-4P)) & 0x80008000) | ((w << (9-4P)) & 0x0E000E00): one
  fp16x2 register of the operand in the k order of `fp4_unpack.fp4_words_to_bf16` (which keeps the
  decoded tile in registers in the wgmma/mma operand layout: no shared-memory round trip).
- P = A·B [BN, 8] (fp32 accumulation) is, per column n, Σ_{k in block n} x'·value·2^-14 =
  2^(c_n-14)·Σ x·value: the per-(row, block) partial. It is scaled by f_n (exact, back to Σ x·value)
  and by the row's UE8M0 2^(e-127) (`moe_decode.e8m0_f32`) into an fp32 [BN, 8] accumulator; after the
  K loop the 8 columns are summed (then the split-K combine and the SwiGLU store of moe_decode).

Exactness: every product x'·(value·2^-14) is exact in fp32 and the tensor cores add in fp32, so the only
differences from the FMA path are the order of the fp32 sums and x' itself: a bf16 (or E4M3 fake-quant)
element is exact in fp16 when it is at least 2^-29 of its block's amax (fp16's normal range below 2^15),
smaller ones are rounded to fp16's subnormal grid (absolute error ≤ 2^-40 of the amax, far below the
fp32 sum's own rounding). The E2M1 subnormal 0.5 must survive as an fp16 subnormal operand: the tensor
cores keep fp16 subnormals (the gpu test checks it at real widths).

Known gaps: the B tile is 7/8 zeros (4 KB per step read from L2 beside 2·BN·128 bytes of weights); the
fp16 x' needs the prep to write 8× the activation bytes (K·16 bytes per token); sm80 would take the same
code through mma.sync (not measured); the AMD targets are not built for it (the FMA path is their
variant); PDL: the weight loads are not issued before the grid dependency wait (Triton's pipeliner owns
their placement), unlike moe_decode's FMA path.
"""
from __future__ import annotations

import triton
import triton.language as tl

from dsv41c.codegen.triton.arrival import arrive_last
from dsv41c.codegen.triton.fp4_unpack import _shift
from dsv41c.codegen.triton.fp8_gemm import fake_quant_e4m3_pow2
from dsv41c.codegen.triton.moe_decode import e8m0_f32, swiglu_store
from dsv41c.codegen.triton.pdl import grid_release, grid_wait

STEP = 256  # K per MMA step: 8 blocks of 32, one per column of B
COLS = STEP // 32
BK = tl.constexpr(STEP)  # the same, for the jit functions
NCOL = tl.constexpr(COLS)


def check_tiles(gu: dict, K: int, N: int) -> None:
    """Raise ValueError naming the problem where moe_decode_gate_up_mma_kernel cannot take these tiles/widths."""
    BN, ks = gu["BN"], gu.get("ksplit", 1)
    if K % STEP:
        raise ValueError(f"moe_experts_decode (mma): hidden {K} is not a multiple of the MMA step {STEP}")
    if BN < 16 or BN & (BN - 1) or N % BN:
        raise ValueError(f"moe_experts_decode (mma): gate/up BN={BN} must be a power of two >= 16 dividing inter {N}")
    if ks < 1 or (K // STEP) % ks:
        raise ValueError(f"moe_experts_decode (mma): ksplit={ks} does not divide the {K // STEP} steps of {STEP}")


# ============================================================================ jit helpers


@triton.jit
def e2m1_f16x2_bits(w, P: tl.constexpr):
    """uint32 words -> uint32 whose 16-bit halves are the fp16 bits of nibble P (0..3) of each half: value·2^-14."""
    return (_shift(w, 12 - 4 * P) & 0x80008000) | (_shift(w, 9 - 4 * P) & 0x0E000E00)


@triton.jit
def f16x2_halves(v):
    """uint32 [...] -> fp16 [..., 2] (bits 0..15, bits 16..31)."""
    return tl.join(v.to(tl.uint16).to(tl.float16, bitcast=True), (v >> 16).to(tl.uint16).to(tl.float16, bitcast=True))


@triton.jit
def fp4_words_to_f16_unscaled(ww, R: tl.constexpr, K: tl.constexpr):
    """uint32 words [R, K/8] (memory order) -> fp16 [R, K] = E2M1 value·2^-14, in fp4_unpack.k_order(K, 2)."""
    w = ww.to(tl.uint32, bitcast=True)
    t = tl.join(tl.join(f16x2_halves(e2m1_f16x2_bits(w, 0)), f16x2_halves(e2m1_f16x2_bits(w, 1))),
                tl.join(f16x2_halves(e2m1_f16x2_bits(w, 2)), f16x2_halves(e2m1_f16x2_bits(w, 3))))  # [R, m, h, t, u]
    t = tl.reshape(t, (R, 4, K // 32, 2, 2, 2))  # m = q·W/4 + s, nibble P = 2u + t
    return tl.reshape(tl.permute(t, (0, 5, 4, 2, 1, 3)), (R, K))  # (u, t, s, q, h)


@triton.jit
def logical_col(k, K: tl.constexpr):
    """Original column k (0..K-1) of a K step -> its logical column in k_order(K, 2) (the inverse map)."""
    P = k % 4
    h = (k // 4) % 2
    m = k // 8
    q = m // (K // 32)
    s = m % (K // 32)
    return P * (K // 4) + 2 * (4 * s + q) + h


# ============================================================================ kernels


@triton.jit
def moe_decode_mma_prep_kernel(x_ptr, xbd_ptr, f_ptr, cnt_ptr, K: tl.constexpr, ACT_QUANT: tl.constexpr,
                               NCNT: tl.constexpr, NCNT_P: tl.constexpr, NGCNT: tl.constexpr = 0,
                               NGCNT_P: tl.constexpr = 1, PDL: tl.constexpr = False, SUB: tl.constexpr = 256):
    """Program (t, step): x[t, step·BK ..] -> B [BK, 8] fp16 block-diagonal (module docstring) and f;
    zeroes the token's NCNT down counters and NGCNT gate/up split counters like moe_decode's prep."""
    grid_wait(PDL)
    grid_release(PDL)
    t = tl.program_id(0).to(tl.int64)
    step = tl.program_id(1)
    b = tl.arange(0, NCOL)
    i = tl.arange(0, 32)
    v = tl.load(x_ptr + t * K + step * BK + b[:, None] * 32 + i[None, :]).to(tl.float32)  # [8, 32] natural
    if ACT_QUANT:
        v = fake_quant_e4m3_pow2(v, NCOL, 32)
    a = (tl.max(tl.abs(v), axis=1).to(tl.int32, bitcast=True) >> 23) & 0xFF
    c = 141 - a  # amax·2^c in [2^14, 2^15); c in [-113, 141]
    c1 = c // 2
    p1 = ((c1 + 127) << 23).to(tl.float32, bitcast=True)  # 2^c in two exact factors (2^141 > fp32 max)
    p2 = ((c - c1 + 127) << 23).to(tl.float32, bitcast=True)
    vp = (v * p1[:, None] * p2[:, None]).to(tl.float16)
    col = tl.arange(0, NCOL)
    tile = tl.where(b[:, None, None] == col[None, None, :], vp[:, :, None], 0.0)  # [8 blocks, 32, 8 columns]
    k = b[:, None] * 32 + i[None, :]
    j = (k // SUB) * SUB + logical_col(k % SUB, SUB)  # each SUB-wide part of the step in its own k order
    tl.store(xbd_ptr + (t * (K // BK) + step) * (BK * NCOL) + j[:, :, None] * NCOL + col[None, None, :], tile)
    # f = 2^(14-c); 14 - c = a - 127 >= -127 (a = 0: the zero block, f = 0·... -> 0 bits, x' = 0 anyway)
    tl.store(f_ptr + t * (K // 32) + step * NCOL + b, (a << 23).to(tl.float32, bitcast=True))
    if NCNT > 0:
        if step == 0:
            n = tl.arange(0, NCNT_P)
            tl.store(cnt_ptr + t * NCNT + n, tl.zeros_like(n), mask=n < NCNT)
    if NGCNT > 0:
        if step == 0:
            n = tl.arange(0, NGCNT_P)
            tl.store(cnt_ptr + tl.num_programs(0) * NCNT + t * NGCNT + n, tl.zeros_like(n), mask=n < NGCNT)


@triton.jit
def mma_gemv_pair(w1_ptr, s1_ptr, w3_ptr, s3_ptr, xbd_ptr, f_ptr, rows, st0, NST: tl.constexpr,
                  K: tl.constexpr, BN: tl.constexpr, PRE: tl.constexpr = False, SUB: tl.constexpr = 256):
    """Row sums [BN] of x·dequant(w1)ᵀ and x·dequant(w3)ᵀ over steps st0..st0+NST of BK (weights at
    w*_ptr: the expert's rows, `rows` relative to them; x as its block-diagonal B and factors f)."""
    W: tl.constexpr = BK // 8
    woff = rows[:, None] * (K // 8) + tl.arange(0, SUB // 8)[None, :]
    soff = rows[:, None] * (K // 32) + tl.arange(0, NCOL)[None, :]
    boff = tl.arange(0, SUB)[:, None] * NCOL + tl.arange(0, NCOL)[None, :]
    acc_g = tl.zeros((BN, NCOL), dtype=tl.float32)
    acc_u = tl.zeros((BN, NCOL), dtype=tl.float32)
    c = tl.arange(0, NCOL)
    if PRE:
        sg, su, f = tl.load(s1_ptr + soff + st0 * NCOL), tl.load(s3_ptr + soff + st0 * NCOL), tl.load(f_ptr + st0 * NCOL + c)
    for st in range(st0, st0 + NST):
        if PRE:
            nx = st + 1 - (st + 1 == st0 + NST).to(tl.int32)
            sg_n, su_n, f_n = tl.load(s1_ptr + soff + nx * NCOL), tl.load(s3_ptr + soff + nx * NCOL), tl.load(f_ptr + nx * NCOL + c)
        else:
            sg, su, f = tl.load(s1_ptr + soff + st * NCOL), tl.load(s3_ptr + soff + st * NCOL), tl.load(f_ptr + st * NCOL + c)
        # SUB-wide dots, each scaled into the accumulator on its own: independent MMA chains of SUB/16
        # instead of one of BK/16 (a sum of the dots first would be folded back into one chain by Triton's
        # dot + add combine). (P·f)·s: both factors exact powers of two, in either order.
        for h in tl.static_range(BK // SUB):
            xb = tl.load(xbd_ptr + st * (BK * NCOL) + h * (SUB * NCOL) + boff)
            dg = tl.dot(fp4_words_to_f16_unscaled(tl.load(w1_ptr + woff + st * W + h * (SUB // 8)), BN, SUB), xb)
            du = tl.dot(fp4_words_to_f16_unscaled(tl.load(w3_ptr + woff + st * W + h * (SUB // 8)), BN, SUB), xb)
            acc_g += (dg * f[None, :]) * e8m0_f32(sg)
            acc_u += (du * f[None, :]) * e8m0_f32(su)
        if PRE:
            sg, su, f = sg_n, su_n, f_n
    return tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)


@triton.jit
def moe_decode_gate_up_mma_kernel(xbd_ptr, xf_ptr, idx_ptr, rw_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, hp_ptr, hf_ptr,
                                  limit, ws_ptr, cnt_ptr, K: tl.constexpr, N: tl.constexpr, TOPK: tl.constexpr,
                                  BN: tl.constexpr, INTER: tl.constexpr, H_QUANT: tl.constexpr,
                                  KSPLIT: tl.constexpr = 1, PDL: tl.constexpr = False, PRE: tl.constexpr = False,
                                  SUB: tl.constexpr = 256):
    """moe_decode_gate_up_kernel's contract (grid (slot, N/BN, KSPLIT), same workspace and counters), with
    x as the prep's block-diagonal fp16 B and the GEMVs on the tensor cores (`mma_gemv_pair`).
    N % BN == 0 and (K/BK) % KSPLIT == 0 (checked by the launcher): no masks in the loop."""
    slot = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    e = tl.load(idx_ptr + slot).to(tl.int64)
    tok = slot // TOPK
    rows = pid_n * BN + tl.arange(0, BN)
    NST: tl.constexpr = K // BK // KSPLIT
    wo = e * N * (K // 8)
    so = e * N * (K // 32)
    grid_wait(PDL)
    grid_release(PDL)
    g, u = mma_gemv_pair(w1_ptr + wo, s1_ptr + so, w3_ptr + wo, s3_ptr + so, xbd_ptr + tok * (K * NCOL),
                         xf_ptr + tok * (K // 32), rows, tl.program_id(2) * NST, NST, K, BN, PRE, SUB)
    if KSPLIT == 1:
        swiglu_store(g, u, limit, rw_ptr, hp_ptr, hf_ptr, slot, pid_n, N, BN, INTER, H_QUANT)
    else:
        wsp = ws_ptr + (slot * KSPLIT + tl.program_id(2)) * (2 * N) + rows
        tl.store(wsp, g)
        tl.store(wsp + N, u)
        last = arrive_last(cnt_ptr + slot * tl.num_programs(1) + pid_n, KSPLIT)  # counters zeroed by the prep
        if last:
            g = tl.zeros((BN,), dtype=tl.float32)
            u = tl.zeros((BN,), dtype=tl.float32)
            for z in range(KSPLIT):
                src = ws_ptr + (slot * KSPLIT + z) * (2 * N) + rows
                g += tl.load(src, cache_modifier=".cg")
                u += tl.load(src + N, cache_modifier=".cg")
            swiglu_store(g, u, limit, rw_ptr, hp_ptr, hf_ptr, slot, pid_n, N, BN, INTER, H_QUANT)
