"""MXFP4 GEMV on the tensor cores with the weights decoded in registers (no shared memory): the MMA core of
`moe_decode` (its `core` 1; `fp4_gemv` there is core 0, CUDA-core FMAs).

Why: the FMA core spends ~4.6 SASS instructions per weight element (3 to decode an E2M1 code into an fp32,
one FFMA, the rest per block), so at one token the routed experts are issue-bound near the bytes floor
(moe_decode's docstring). A tensor-core GEMV through Triton's `tl.dot` was slower (Tried below): the decoded
tile took a shared-memory round trip into the operand layout and the chain cp.async -> LDS -> decode -> MMA was
slower. Here every thread loads its own weight words straight into the registers that `mma.sync` reads (inline
PTX), so nothing sits between HBM and the MMA but the decode, which is 11 integer instructions per 8 codes.

Thread-level layout (every tensor is [NT] = one element per thread, t = 32·warp + lane; 1-D tensors keep
Triton's default blocked layout, one element a thread, since no tl.load/tl.store on GPU touches them in the
loop): a warp owns 16 weight rows (lane g = lane // 4 owns rows g and g + 8) and a step is 4 MXFP4 blocks
(128 k): lane c = lane % 4 loads block c of the step of both its rows, 16 bytes each (one `ld.v4`). The mma is
m16n8k16 (f16 × f16 -> f32): per mma a lane supplies 4 f16x2 registers of A (rows g, g + 8; 4 k-slots each),
so a 16-byte word group of a block feeds 8 mmas. The per-block UE8M0 scale cannot enter the MMA (it varies
along k within one mma's 16 k-slots: 4 lanes, 4 blocks), so B is block-diagonal: column n of B holds x' at the
k-slots of lane c = n only (B's lane (g, c) holds column g: x' where g == c, zeros elsewhere, read from a zero
pad), and D[row, n] is the partial sum of block n, scaled per (row, block) after the 8 mmas of the step.
Columns 4..7 stay zero (lanes c = 2, 3 scale zeros). Two independent mma chains per step (even / odd mmas).

E2M1 -> f16 (`e2m1_pairs_f16x2`): the f16 with sign at bit 15 and the code's e1 e0 m at bits 11..9 is exactly
value·2^-14 (e = 0, m = 1: the f16 subnormal 2^-15 = 0.5·2^-14). Per 32-bit word of 8 codes n0..n7: move each
even code's sign 3 bits up (xe), each odd code's r bits 3 down (xo), then one shift and one mask per pair:
(n0, n4), (n2, n6), (n1, n5), (n3, n7) as (low, high) halves — 11 instructions (SHF / LOP3) per 8 codes.
x' is stored in the matching order: within each 8 consecutive k, positions [0, 4, 2, 6, 1, 5, 3, 7]
(position of k-offset s = bit reversal of s's 3 bits), as f16 scaled per block to amax in [2^14, 2^15):
x' = x·2^(141 - a) (a = the block amax's exponent field), f = 2^(a - 127) = 2^14·2^-(141 - a), so
Σ x'·(value·2^-14)·f = Σ x·value. bf16 and f16 inputs, and their E4M3 fake quant, are exact in f16 down to
2^-28 of the block's amax (below, f16 subnormals round, each such element by at most 2^-39 of the amax). An
infinite activation makes its block's f infinite, and the zero columns' lanes then add 0·inf = NaN where the
reference may give ±inf.

Numerics: the products are exact in the MMA; its fp32 accumulation order and rounding are the tensor core's,
so sums differ from the FMA core's in the last bits (not bit-identical to the reference; the tests bound the
error). NaN scales (e = 255) give NaN rows like the reference.

Interpreter (EMU): the loads are tl.loads and the mma is computed from the same registers by reshaping the
[NT] tensors to [warps, 8, 4] (the fragment's (g, c)) — the same data movement, fp32 sums in another order.

Known gaps: CUDA sm80+ only (mma.sync); K must be a multiple of 128·SUB (whole steps) and BN of 16 (rows past N
are clamped and dropped); half of each MMA's columns are zeros (T = 1 per slot; the tensor cores have the room); x' of
fp32 activations would round (the launcher keeps them on core 0).

Tried (measured slower, not kept):
- the gate/up GEMV through Triton's `tl.dot` (E2M1 decoded to f16 operands, x block-diagonal as here, the decoded
  tile through shared memory into the operand layout): gate/up 40.7 µs against the FMA core's 37.7 at one token, the
  routed step 58.9-74.3 against 54.3-55.7 over K splits, stages and BN; 345 against 336 at eight tokens
  (tuning/tune_moe_decode_mma.json, tuning/ncu_decode_mma.txt).
"""
from __future__ import annotations

import triton
import triton.language as tl

from dsv41c.codegen.triton.arrival import wait_inputs

PAIR_MASK = tl.constexpr(-1912566272)  # 0x8E008E00: f16 sign (bit 15) and e1 e0 m (bits 11..9) of both halves
XE_SIGN = tl.constexpr(0x40404040)  # where xe takes each even code's sign (3 bits above it)
XE_KEEP = tl.constexpr(-1077952577)  # ~0x40404040
XO_SIGN = tl.constexpr(-2139062144)  # 0x80808080: where xo keeps each odd code's own sign
XO_KEEP = tl.constexpr(2139062143)  # ~0x80808080
POISON = tl.constexpr(0x7FFFFFFF)  # EMU's misaligned load: NaN as f16 pairs and as UE8M0 scales, ±6 as E2M1 codes

_MMA = tl.constexpr("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, "
        "{$10, $11, $12, $13};")


def x_order(s: int) -> int:
    """Position of k-offset s (0..7) within its group of 8 in x' (the bit reversal of s's 3 bits)."""
    return ((s & 1) << 2) | (s & 2) | ((s >> 2) & 1)


@triton.jit
def e2m1_pairs_f16x2(w):
    """8 E2M1 codes of int32 word w (code i at bits 4i..4i+3) -> 4 f16x2 words, each half value·2^-14:
    (n0, n4), (n2, n6), (n1, n5), (n3, n7) as (low, high)."""
    xe = (w & XE_KEEP) | ((w << 3) & XE_SIGN)  # even codes: sign 3 bits above r (the f16 gap)
    xo = (w & XO_SIGN) | ((w >> 3) & XO_KEEP)  # odd codes: r 3 bits below the sign
    return (xe << 9) & PAIR_MASK, (xe << 1) & PAIR_MASK, (xo << 8) & PAIR_MASK, xo & PAIR_MASK


@triton.jit
def _f16_halves(v):
    """f16x2 int32 -> (low, high) as fp32."""
    lo = (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = ((v >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _frag4(r0, r1, NW: tl.constexpr):
    """Two f16x2 registers per lane -> [NW, 8 (g), 4 (c), 4 (k-slot)] fp32 (r0's halves, then r1's)."""
    a, b = _f16_halves(r0)
    c, d = _f16_halves(r1)
    v = tl.join(tl.join(a, b), tl.join(c, d))  # [NT, 2, 2]
    return tl.reshape(v, (NW, 8, 4, 4))


@triton.jit
def _mma_emulated(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, NW: tl.constexpr):
    """mma.sync m16n8k16 (row.col, f16 -> f32) on per-lane registers, written as the fragment's data movement:
    D[g, n] = C + Σ_{c, slot} A[g, (c, slot)]·B[(c, slot), n], B's column n from lane (n, c)."""
    ag = _frag4(a0, a2, NW)  # rows g: k-slots (2c, 2c+1) then (2c+8, 2c+9)
    ag8 = _frag4(a1, a3, NW)  # rows g + 8
    bb = _frag4(b0, b1, NW)  # [NW, 8 (n = the lane's g), 4 (c), 4]
    d_g = tl.sum(tl.sum(ag[:, :, None, :, :] * bb[:, None, :, :, :], axis=4), axis=3)  # [NW, 8 (row), 8 (n)]
    d_g8 = tl.sum(tl.sum(ag8[:, :, None, :, :] * bb[:, None, :, :, :], axis=4), axis=3)
    NT: tl.constexpr = NW * 32
    e0, e1 = tl.split(tl.reshape(d_g, (NW, 8, 4, 2)))  # lane (g, c): columns 2c, 2c + 1
    e2, e3 = tl.split(tl.reshape(d_g8, (NW, 8, 4, 2)))
    return (c0 + tl.reshape(e0, (NT,)), c1 + tl.reshape(e1, (NT,)), c2 + tl.reshape(e2, (NT,)),
            c3 + tl.reshape(e3, (NT,)))


@triton.jit
def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, NW: tl.constexpr, EMU: tl.constexpr):
    """D = A·B + C, one m16n8k16 mma per warp (f16x2 A / B registers as int32, fp32 C / D); EMU: `_mma_emulated`."""
    if EMU:
        return _mma_emulated(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, NW)
    else:
        return tl.inline_asm_elementwise(_MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
                                         [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
                                         dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True,
                                         pack=1)


@triton.jit
def load4(p, EMU: tl.constexpr, NC: tl.constexpr):
    """4 consecutive int32 words at p (16-byte aligned); NC: the read-only (non-coherent) path, for weights. The
    other loads (x', f, the zero pad: written by the previous kernel) are not `is_pure`, so that the compiler keeps
    them after the grid dependency wait / counter spin. EMU: an address the GPU's vector load would fault on
    (misaligned) reads POISON instead, so that the interpreter's tests fail where the GPU would."""
    if EMU:
        ok = p.to(tl.int64, bitcast=True) % 16 == 0
        return (tl.load(p, mask=ok, other=POISON), tl.load(p + 1, mask=ok, other=POISON),
                tl.load(p + 2, mask=ok, other=POISON), tl.load(p + 3, mask=ok, other=POISON))
    elif NC:
        return tl.inline_asm_elementwise("ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];",
                                         "=r,=r,=r,=r,l", [p], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                         is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise("ld.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [p],
                                         dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)


@triton.jit
def load1(p, EMU: tl.constexpr, NC: tl.constexpr):
    """One 32-bit word at p (4-byte aligned), as int32 (NC and purity as `load4`)."""
    if EMU:
        return tl.load(p, mask=p.to(tl.int64, bitcast=True) % 4 == 0, other=POISON)
    elif NC:
        return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32, is_pure=True,
                                         pack=1)
    else:
        return tl.inline_asm_elementwise("ld.global.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32, is_pure=False,
                                         pack=1)


@triton.jit
def store_prescaled_f16(v, xp_ptr, f_ptr, blk0, NBLK: tl.constexpr, RB: tl.constexpr):
    """Blocks blk0..blk0+RB of one activation row, v [RB, 32] fp32 in natural order -> x' (f16, x_order within
    each 8) and f = 2^(a - 127) per block (a: the exponent field of the block's amax; e = 0 blocks: 2^-127)."""
    amax = tl.max(tl.abs(v), axis=1)
    a = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    c = 141 - a  # amax·2^c in [2^14, 2^15); c in [-113, 141]: 2^c in two exact factors
    c1 = c >> 1
    p1 = ((c1 + 127) << 23).to(tl.float32, bitcast=True)
    p2 = ((c - c1 + 127) << 23).to(tl.float32, bitcast=True)
    blk = blk0 + tl.arange(0, RB)
    i = tl.arange(0, 32)
    s = i % 8
    pos = (i - s) + ((s & 1) << 2) + (s & 2) + ((s >> 2) & 1)  # x_order
    ok = blk < NBLK
    tl.store(xp_ptr + blk[:, None] * 32 + pos[None, :], (v * p1[:, None] * p2[:, None]).to(tl.float16),
             mask=ok[:, None])
    tl.store(f_ptr + blk, tl.maximum(a << 23, 0x00400000).to(tl.float32, bitcast=True), mask=ok)


@triton.jit
def _load_step(wp0, wp1, sp0, sp1, st, SUB: tl.constexpr, EMU: tl.constexpr):
    """A lane's loads of step st: per group u of 4 blocks, its weight words (rows g, g + 8: block c of the group)
    and the group's scale words (4 bytes a row), flat: 10 entries a group (4 + 4 words, 2 scale words)."""
    t = ()
    for u in tl.static_range(SUB):
        o = (st * SUB + u) * 16
        t = t + load4(wp0 + o, EMU, True) + load4(wp1 + o, EMU, True)
        t = t + (load1(sp0 + st * SUB + u, EMU, True), load1(sp1 + st * SUB + u, EMU, True))
    return t


@triton.jit
def _e8m0(e):
    b = tl.maximum(e << 23, 0x00400000)
    return tl.where(e == 255, float("nan"), b.to(tl.float32, bitcast=True))


@triton.jit
def _step(acc0, acc1, W, st, diag, xw, z_ptr, fp0, sh, zero, SUB: tl.constexpr, NW: tl.constexpr,
          EMU: tl.constexpr):
    """One step of a lane (SUB groups of 4 blocks, W from `_load_step`): per group 8 mmas in two chains, then each
    (row, block) partial · f · 2^(e-127) into the row accumulators."""
    for u in tl.static_range(SUB):
        grp = st * SUB + u
        bp = tl.where(diag, xw + grp * 64, z_ptr)  # block c of the group: x' on the diagonal lanes, else zeros
        fp = fp0 + grp * 4
        xa = zero
        xb = zero
        xc = zero
        xd = zero
        ya = zero
        yb = zero
        yc = zero
        yd = zero
        for q in tl.static_range(4):
            b = load4(bp + 4 * q, EMU, False)
            p0, p1, p2, p3 = e2m1_pairs_f16x2(W[10 * u + q])
            r0, r1, r2, r3 = e2m1_pairs_f16x2(W[10 * u + 4 + q])
            xa, xb, xc, xd = mma_f16(p0, r0, p1, r1, b[0], b[1], xa, xb, xc, xd, NW, EMU)
            ya, yb, yc, yd = mma_f16(p2, r2, p3, r3, b[2], b[3], ya, yb, yc, yd, NW, EMU)
        if EMU:
            f0 = tl.load(fp)
            f1 = tl.load(fp + 1)
        else:
            f0 = load1(fp.to(tl.pointer_type(tl.int32)), EMU, False).to(tl.float32, bitcast=True)
            f1 = load1((fp + 1).to(tl.pointer_type(tl.int32)), EMU, False).to(tl.float32, bitcast=True)
        e0 = W[10 * u + 8] >> sh
        e1 = W[10 * u + 9] >> sh
        acc0 += ((xa + ya) * f0) * _e8m0(e0 & 0xFF) + ((xb + yb) * f1) * _e8m0((e0 >> 8) & 0xFF)
        acc1 += ((xc + yc) * f0) * _e8m0(e1 & 0xFF) + ((xd + yd) * f1) * _e8m0((e1 >> 8) & 0xFF)
    return acc0, acc1


@triton.jit
def fp4_mma_gemv(wa_ptr, sa_ptr, wb_ptr, sb_ptr, x_ptr, f_ptr, z_ptr, row0, K: tl.constexpr, N: tl.constexpr,
                 BN: tl.constexpr, TWO: tl.constexpr, NW: tl.constexpr, EMU: tl.constexpr, st0=0,
                 NSTP: tl.constexpr = 0, PDL: tl.constexpr = False, ready_ptr=None, READY: tl.constexpr = 0,
                 RELEASE: tl.constexpr = True, SUB: tl.constexpr = 1):
    """Row sums [BN] (row = row0 + i) of x·dequant(W)ᵀ for W = a (and b when TWO), like moe_decode.fp4_gemv.

    wa/wb: int32 words of packed E2M1 [N, K/8]; sa/sb: UE8M0 bytes [N, K/32] (as a uint8 pointer); x_ptr: x' as
    int32 words (f16 pairs, `store_prescaled_f16`), f_ptr: its block factors; z_ptr: 16 zero words (the
    block-diagonal B's other lanes). Warps: NW = BN/16 (·2 when TWO: the first half on a, the second on b).
    NSTP > 0: steps st0..st0+NSTP only (a K split), else all K/128. PDL / READY / RELEASE as fp4_gemv: the first
    two steps' weights are loaded before the wait, x' after it."""
    tl.static_assert(K % (128 * SUB) == 0, "fp4_mma_gemv: K must be a multiple of 128·SUB (whole steps)")
    tl.static_assert(BN % 16 == 0 and NW == (BN // 16) * (1 + TWO), "fp4_mma_gemv: NW must be BN/16 per matrix")
    NT: tl.constexpr = NW * 32
    KB: tl.constexpr = K // 32
    NST: tl.constexpr = NSTP if NSTP > 0 else K // (128 * SUB)
    WPM: tl.constexpr = BN // 16
    t = tl.arange(0, NT)
    lane = t % 32
    warp = t // 32
    g = lane // 4
    c = lane % 4
    r0 = tl.minimum(row0 + (warp % WPM) * 16 + g, N - 1).to(tl.int64)  # rows past N read row N-1, dropped later
    r1 = tl.minimum(row0 + (warp % WPM) * 16 + g + 8, N - 1).to(tl.int64)
    if TWO:
        on_b = warp >= WPM
        wbase = tl.where(on_b, wb_ptr, wa_ptr)
        sbase = tl.where(on_b, sb_ptr, sa_ptr)
    else:
        wbase = wa_ptr + t * 0
        sbase = sa_ptr + t * 0
    g0 = st0 * SUB  # the first group of 4 blocks
    wp0 = wbase + r0 * (K // 8) + (g0 * 4 + c) * 4  # group j: + 16·j words
    wp1 = wbase + r1 * (K // 8) + (g0 * 4 + c) * 4
    s32 = sbase.to(tl.pointer_type(tl.int32))
    sp0 = s32 + (r0 * KB + g0 * 4) // 4  # a group's 4 scale bytes as one word (K % 128 == 0: aligned)
    sp1 = s32 + (r1 * KB + g0 * 4) // 4
    sh = (c % 2) * 16  # lane c scales columns 2c, 2c + 1: the word's bytes 2(c % 2), 2(c % 2) + 1
    xw = x_ptr + (g0 * 4 + c) * 16  # block c of group j: + 64·j words (f16 pairs, 16 a block)
    fp0 = f_ptr + g0 * 4 + 2 * (c % 2)
    zero = tl.zeros((NT,), dtype=tl.float32)
    acc0 = zero
    acc1 = zero
    diag = g == c
    wa = _load_step(wp0, wp1, sp0, sp1, 0, SUB, EMU)
    wb = _load_step(wp0, wp1, sp0, sp1, tl.minimum(1, NST - 1), SUB, EMU)
    wait_inputs(ready_ptr, READY, PDL, RELEASE)
    # two buffers, each refilled two steps ahead right after its step (refills past the end reload the last step)
    for s in range(0, NST - 1, 2):
        acc0, acc1 = _step(acc0, acc1, wa, s, diag, xw, z_ptr, fp0, sh, zero, SUB, NW, EMU)
        wa = _load_step(wp0, wp1, sp0, sp1, tl.minimum(s + 2, NST - 1), SUB, EMU)
        acc0, acc1 = _step(acc0, acc1, wb, s + 1, diag, xw, z_ptr, fp0, sh, zero, SUB, NW, EMU)
        wb = _load_step(wp0, wp1, sp0, sp1, tl.minimum(s + 3, NST - 1), SUB, EMU)
    if NST % 2 == 1:
        acc0, acc1 = _step(acc0, acc1, wa, NST - 1, diag, xw, z_ptr, fp0, sh, zero, SUB, NW, EMU)
    # rows: warp w's g and g + 8 (sum over the 4 lanes c) -> [NW·16] in order w·16 + h·8 + g
    s0 = tl.sum(tl.reshape(acc0, (NW, 8, 4)), axis=2)
    s1 = tl.sum(tl.reshape(acc1, (NW, 8, 4)), axis=2)
    rows = tl.reshape(tl.permute(tl.join(s0, s1), (0, 2, 1)), (NW * 16,))
    if TWO:
        ra, rb = tl.split(tl.permute(tl.reshape(rows, (2, BN)), (1, 0)))
        return ra, rb
    else:
        return rows, rows
