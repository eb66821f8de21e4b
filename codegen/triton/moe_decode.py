"""Routed MoE experts at decode (T·top_k <= MAX_SLOTS): FP4 GEMVs straight from the router's ids, no dispatch.

One file: the prep, gate/up and down kernels share one prescaled x' / h' layout, one counter protocol and the FMA
core (`fp4_gemv`; the MMA core is fp4_mma_gemv.py), so they change together; the tile plan (`decode_tiles`) is a
second idea that could stand in its own module.

What (spec §3.5, §3.13, §7.1; the numbers of `moe.moe_experts` + `moe.moe_combine`): for slot (t, j)
with expert e = topk_idx[t, j] and weight w = topk_w[t, j]: g = min(x_t·w1[e]ᵀ, L),
u = clamp(x_t·w3[e]ᵀ, ±L), h = silu(g)·u·w rounded to `inter_dtype` (then the per-32 FP8 fake quant
when `act_quant`, which also fake-quantizes x before w1/w3), y_{t,j} = h·w2[e]ᵀ rounded to
`partial_dtype`, y_t = Σ_j y_{t,j} in slot order in fp32 (+ the shared expert's output) -> `out_dtype`.
Weights are MXFP4: E2M1 codes packed two per byte (low nibble = even k), one UE8M0 byte per 32 k.

Algorithm (three launches; no sort, no host sync, CUDA-graph capturable):
1. `moe_decode_prep_kernel`, grid (token, blocks/BKB): x -> x' = x·2^c (fp32) and f = 2^(126-c) per
   32-block, c = clamp(227 - amax exponent field, 0, 227), stored nibble-major (k = 32b + 8q + s at
   s·K/8 + 4b + q: nibble s of packed word 4b + q meets it) for core 0; for core 1 x' in f16, scaled to an
   amax in [2^14, 2^15), in fp4_mma_gemv's pair order (`store_prescaled_f16`), plus its zero pad; zeroes the down kernel's counters (and
   the gate/up split's, when ksplit > 1, and the handoff's per-slot ones).
2. `moe_decode_gate_up_kernel`, T·k·I/BN programs (grid (T·k, I/BN), numbered slot-major, below):
   e = topk_idx[slot]; streams BN rows of w1[e] and w3[e] as int32 words against x' (`fp4_gemv`), then
   the clamped SwiGLU × routing weight, the inter_dtype rounding, the optional h fake quant (BN is a
   multiple of 32: whole h blocks per program) and the prep's prescale/order, into h' [T·k, I] and its
   f. Option `ksplit` (KSPLIT; core 0: 5 where it divides K's chunks, else 1; core 1: planned per slot count
   in `decode_tiles`, 5 at one token and 1 at eight for the backbone router; the interpreter 1): KSPLIT
   times the programs (grid (T·k, I/BN, KSPLIT)), each one of KSPLIT equal ranges of K's chunks, g / u
   partials to a [T·k, KSPLIT, 2, I] workspace, the last of the KSPLIT programs of a tile (an acq_rel counter zeroed by
   the prep) adds them in range order and finishes the tile (deterministic; the fp32 sum order changes).
   Programs are numbered (slot, tile, K part) slot-major from the linear block index, so that slot 0's tiles
   and K parts dispatch first (in practice: CUDA does not promise the order, only the speed depends on it);
   with the per-slot handoff (`tiles["fine"]`, the default where PDL is on) each finished tile counts itself
   in done[slot].
3. `moe_decode_down_kernel`, grid (token, D/BN, SPLIT): w2[e_j] against h'_j for the program's slots
   (with the handoff: each slot's h' read only once done[slot] holds all of its gate/up tiles, so the down
   GEMVs of the first slots overlap the gate/up's last programs instead of waiting for the whole grid;
   H200, T = 1 rotating graph: 55.0 -> 53.3-53.9 µs, tuning/tune_moe_decode_fine.json);
   each slot's row sums are rounded to partial_dtype. SPLIT = 1: the program adds its k slots in
   order, adds the shared expert, stores. SPLIT > 1 (the default, SPLIT = k: 6× the programs at
   T = 1): the rounded partials go to a [T·k, D] workspace, and the last of the SPLIT programs of a
   tile (an acq_rel counter) adds all k in slot order. Deterministic either way: no float atomics.
Two GEMV cores (tiles["core"]): 1, the default on CUDA sm80+ where the inputs allow it, is `fp4_mma_gemv.py`
(mma.sync on weights decoded in registers, 11 integer instructions per 8 codes, x' / h' in f16: 2.7 static sm90
SASS instructions per weight element against 4.6, results/moe_decode_sass*.json; H200, real routing, L2-cold:
T = 1 53.15 -> 47.6 µs (2.00x -> 1.79x the bytes floor), T = 8 344 -> 279 µs (1.73x -> 1.40x):
tuning/kernels_ffn_moe_decode_core0.json -> kernels_ffn.json; its tiles in `decode_tiles`); 0 is `fp4_gemv` below (CUDA-core
FMAs, exact fp32 sums), the interpreter's default and the fallback elsewhere (ROCm, fp32 activations, scale
tensors not 4-byte aligned). Core 1's sums are the tensor cores' (not bit-identical to core 0 or the reference:
in that table rel err 1.2e-4 at both T, against 1.5e-5 (T = 1) and 1.1e-4 (T = 8) for core 0).

`fp4_gemv`: a chunk of a program's tile is P = BN·BKB (row, block) pairs, p = BKB·row + (5·block mod
BKB), each a 16-byte vector of 4 packed words: every tensor in the loop is [P, 4] (weights, x', the
decoded products) or [P] (scale bytes, f, the accumulator), and the reduction over the 4 words is along
the fastest dim. Triton's coalescing then gives all of them one blocked layout (4 words per thread,
consecutive p on consecutive lanes, then warps, then registers: BKB lanes across the blocks of a row,
P/threads rows per thread) whatever its tie-break between dims of equal contiguity — that tie-break
differs between Triton 3.6 (lowest dim first) and 3.9 (highest first), and the first version of this
file ([R, R0, BKB, 4] tiles, x' as [1, R0, BKB, 4]) got a layout conversion through shared memory for
every x' load under 3.6 (22 per loop, 36 barriers). x' is loaded per p like the weights; the p of one
thread all have the same block (threads % BKB == 0), so its loads for its several rows are one address
and LLVM keeps one load. The permuted block order keeps the scale-byte load from being vectorized
across blocks (another layout). Weights are prefetched two chunks ahead by hand (Triton does not
pipeline loads that feed no tl.dot); the lanes are reduced once per GEMV ([P] -> [BN, BKB] -> [BN]).

FP4 decode, per weight element: nibble s (sign, m3) of word w becomes the fp32 with bits
(m3 << 22) | (sign << 31), exactly value·2^-126 (the E2M1 0.5 is the fp32 subnormal 2^-127):
((w << (28 - 4s)) >> 6) & 0x81C00000 with an arithmetic shift (sign to bit 31, then m3 to bits 22..24):
3 integer instructions (IMAD.SHL or SGXT, SHF.R.S32, LOP3), then one FFMA with x'. The scale is
not applied per element: per (row, block) the sum S = Σ x'·(value·2^-126) = 2^(c-126)·Σ x·value is
multiplied by f (back to Σ x·value, exact) and by 2^(e-127) (`e8m0_f32`: e = 0 is the subnormal
2^-127, 255 NaN) into the accumulator. A per-element ·2^(e-1) would be one more instruction per
element and is not an fp32 for e >= 129. x' puts every block's amax in [2^100, 2^101), so the
products of elements down to 2^-100 of it are normal fp32 and the fp32 sums are the only
roundings; the PTX has no .ftz (the subnormal input must survive; checked by the tests).
sm90 SASS of the default AOT variants, the same under Triton 3.6 and 3.9: main loop 4.61 instructions
per weight element (2.9 decode, 1.06 FFMA/FMUL, the rest the per-block scale, the 4-word sum, loads
and addresses), no shared memory (no STS / LDS / BAR) in it, 104 / 126 registers (gate/up / down), no
local memory; 16-byte weight and x' loads (8 x' loads per thread per chunk for all its rows). The
TTGIR loop still shows 6 / 4 `convert_layout`s: the [P] accumulator between the 1D blocked layout and
the slice of the [P, 4] layout, the same thread mapping, which lower to no code. (Before the rework,
under 3.6: 4.93 / 5.07 instructions per element, 132 / 197 registers, 18 STS, 36-68 LDS and 36 BAR
per loop iteration.) 4.61 instructions per element is an issue bound close to the bytes bound: at
1 instruction / clock / scheduler (132 SMs × 4 × 1.98 GHz) it is ~29 us for T = 1's 212 M weight
elements against the bytes floor of ~27 us.

Rounding: every rounding to bf16 is integer round-to-nearest-even (`round_to`), so the interpreter
(whose casts to bf16 truncate) and the GPU give the same bits; fp16 uses the cast (RNE in both).

Specialization keys: router (E, TOPK: backbone 384/6, DSpark 128/3); K, N (hidden 5120, inter 2304,
constexpr); BN, BKB (powers of two), num_warps; SPLIT; KSPLIT (gate/up); ACT_QUANT / H_QUANT; INTER /
PARTIAL / OUT rounding (0 fp32, 1 bf16, 2 fp16); HAS_SHARED; NCNT / NGCNT (down / gate/up counters
zeroed by the prep); PDL (programmatic dependent launch, off in the ahead-of-time variants).

Known gaps: three launches (prep, gate/up, down; overlapped by PDL on sm90+, serialized elsewhere) and
the split path's workspace round trip; the
per-block scale factoring over/underflows where Σ_block x·value leaves fp32's range (|x| near 2^120)
while the reference's per-product x·(value·scale) would not (and the reverse: where the reference's
dequantized weight overflows, e = 254 with |value| >= 2, the kernel's product can still be finite);
expert ids are not range-checked (that needs a host sync; an id outside [0, E) reads out of bounds);
two tokens with the same expert read its weights twice (L2 catches most at T <= 8) and decode them
twice: the decode is integer-issue bound near HBM speed (~4.6 instructions per 0.5 byte), so at
T = 8 (48 slots, ~32 unique experts) the issue time (~234 us at 4.61 per element) exceeds the bytes
floor (~140 us) by 1.7x whatever the tiles; sharing one decode between the tokens of an expert needs
the expert -> slots map (a dispatch) this path avoids. At T = 1 the gate/up's 432 programs do not
divide evenly over 132 SMs (4 on some, 3.27 on average: ~24 us issue-bound on the busiest SMs; BN
cannot go below 32, a program owns whole h blocks). `ksplit` cuts that granularity (ksplit 2: 864
programs, at most 7 half-size ones per SM = 3.5 full programs instead of 4; 4: 1728, 14 quarters = 3.5;
5: 2160, 17 fifths = 3.4) for a workspace round trip and one more partial prologue per program. The
H200 sweep (benchmarks/tune_moe_decode.py, tuning/tune_moe_decode.json) timed T = 1 at 62.3 µs without
it, 58.5 / 58.8 / 57.1 µs with 2 / 4 / 5 (T = 8 within 1.5%), so 5 is the default. Nsight Compute
(tuning/ncu_decode_*.txt, L2 flushed, T = 1): gate/up 37-38 µs at 56 % issue-busy with 3.7 of 4 resident warps
per scheduler (registers: 126, 4 programs per SM), its 2160 programs 4 full waves plus 48; down 23 µs at 35 %
DRAM, 0.91 waves of 8 programs per SM; prep 3 µs. Finer splits that end the partial wave were not faster
(Tried).
The per-element cost is near its floor for this scheme: the SASS per 256 weight elements of a thread
(gate/up loop) is 256 SHF + 233 IMAD(.SHL) + 259 LOP3 + 32 SGXT (the decode: 3 integer ops per
element; the shift pair cannot merge because the E2M1 sign-to-m3 distance, 3 bits, differs from
fp32's, 9, and a LOP3 has one immediate mask) + 232 FFMA + 40 FMUL. A `prmt.b32` byte lookup yields
one fp32 per instruction at best (a 4-byte result, the value needs two of its bytes) and its msb mode
gives 0x00/0xFF, not a sign bit, so it does not beat the 3-op decode for fp32 FMAs. Going below ~4.3
per element needs packed operands into the tensor cores (a GEMV as an MMA with the weights as A):
a first sm90 prototype (fp16 A decoded by the bit algebra of fp4_unpack's DECODE 2 without the scale,
block-diagonal x as B so that each 32-block's partial is its own output column, per-block scale on the
fp32 result) compiled to 3.44 SASS instructions per element under Triton 3.6, a third of it the
shared-memory conversion of the decoded tile into the wgmma operand layout (24 STS + 16 LDSM per 128
elements); with a k order matched to that layout, or int8 IMMA (a `prmt` lookup of 4 magnitudes per
instruction, positive and negative codes as two operands, x as fixed-point int8 pieces in B's spare
columns) the estimate is 1.3-2.2 per element. Built through Triton's `tl.dot`, it was slower (Tried); fp4_mma_gemv.py's
core 1 feeds mma.sync from registers instead.

Measured (all before the gate/up `ksplit` option; H200, torch 2.11 / Triton 3.6, one graph of 8 steps
over disjoint expert sets, so nothing is reused from L2; floor = unique experts' w1 + w3 + w2 bytes / 4.22 TB/s;
benchmarks/tuning/tune_moe_decode.json): after the layout rework T = 1 takes 63 us
(2.36x the 26.7 us floor; the static estimate was 40-50 us) and T = 8 takes 0.337 ms (2.39x);
the tile variants swept stay within 6% of the defaults, split 1 for the down GEMV is 1.5x slower
at T = 1. Before the rework (22 / 20 shared-memory conversions per loop under Triton 3.6): 0.127 ms
at T = 1, 0.778 ms at T = 8. With the real router's routing (benchmarks/kernels_ffn.py), T = 8
is 1.70x its floor (more unique experts) and T = 1 2.32x.

Programmatic dependent launch (pdl.py; on by default on sm90+, `tiles["pdl"]` overrides): the prep
waits for its predecessor and releases the gate/up kernel at once; the gate/up and down kernels read
their expert ids and first two weight chunks before their grid waits (the ids come from before the
prep: two and three launches back), x' / h' after. Same bits as serialized launches (the `gpu` test
replays a graph whose ids and x are rewritten by the kernels just before the chain). H200, rotating
graph (tuning/tune_moe_decode_pdl.json): T = 1 58.6 -> 54.5 µs (2.21x -> 2.05x), T = 8 348 ->
338 µs; with the real router's routing, L2-cold (kernels_ffn.json) T = 1 57.6 -> 53.9 µs (2.17x -> 2.03x).

Tried (measured slower, not kept):
- the gate/up as a tensor-core GEMV through `tl.dot` (fp16 operands in fp4_unpack's DECODE 2 k order, x as a
  block-diagonal fp16 B [256, 8], Triton's cp.async pipeline; 3.0 sm90 SASS instructions per element, 34 % fewer
  than core 0 counted by ncu): gate/up 40.7 µs against 37.7 (the cp.async -> LDS -> decode -> MMA chain at 4
  programs an SM), the step at T = 1 58.9-74.3 against 54.3-55.7, at T = 8 345 against 336
  (tuning/tune_moe_decode_mma.json, tuning/ncu_decode_mma.txt).
- finer gate/up splits that end the partial wave: ksplit 10 54.9 µs, 20 59.1, 4 56.5 against 5's 54.4 (rotating
  graph, tuning/tune_moe_decode_ksplit.json).
- an L2 bulk prefetch of each program's weight slab with PDL: T = 1 54.5 -> 75.9 µs
  (tuning/tune_moe_decode_prefetch.json).
- split 1 for the down GEMV: 1.5x slower at T = 1 (tuning/tune_moe_decode.json).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, aot_spec, register
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c.codegen.triton.arrival import arrive_last, signal_done, wait_inputs
from dsv41c.codegen.triton.fp4_mma_gemv import fp4_mma_gemv, store_prescaled_f16
from dsv41c.codegen.triton.codecs import fake_quant_e4m3_pow2
from dsv41c.codegen.triton.targets import interpreting, target_traits
from dsv41c.codegen.triton.targets import sm_count
from dsv41c.codegen.triton.moe_reference import moe_combine_reference, moe_experts_reference
from dsv41c.codegen.triton.moe_router import ROUTERS, routers  # noqa: F401 (ROUTERS re-exported)
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for

MAX_SLOTS = 64  # T·top_k at or below which moe_experts_decode is the path to take
SIGN_M3 = tl.constexpr(-2118123520)  # 0x81C00000 as int32: the sign bit and the E2M1 m3 field at bits 22..24
ROUND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # rounding-mode constexpr per dtype


# ============================================================================ jit helpers


@triton.jit
def e8m0_f32(e):
    """UE8M0 bytes -> 2^(e-127) fp32: e = 0 -> the subnormal 2^-127 (max with its bits), 255 -> NaN."""
    b = tl.maximum(e.to(tl.int32) << 23, 0x00400000)
    return tl.where(e == 255, float("nan"), b.to(tl.float32, bitcast=True))


@triton.jit
def zero_ints(ptr, N: tl.constexpr, N_P: tl.constexpr):
    """ptr[0..N) = 0 (N_P: the next power of two; nothing for N = 0)."""
    if N > 0:
        i = tl.arange(0, N_P)
        tl.store(ptr + i, tl.zeros_like(i), mask=i < N)


@triton.jit
def round_to(v, MODE: tl.constexpr):
    """fp32 v rounded to fp32 (MODE 0), bf16 (1, integer round-to-nearest-even) or fp16 (2), as fp32."""
    if MODE == 1:
        u = v.to(tl.int32, bitcast=True)
        r = (u + (0x7FFF + ((u >> 16) & 1))) & -65536  # -65536 = 0xFFFF0000
        return tl.where(v != v, v, r.to(tl.float32, bitcast=True))
    elif MODE == 2:
        return v.to(tl.float16).to(tl.float32)
    else:
        return v


@triton.jit
def store_prescaled(v, vp_ptr, f_ptr, blk0, NBLK: tl.constexpr, RB: tl.constexpr, QUANT: tl.constexpr,
                    FMT: tl.constexpr = 0):
    """Blocks blk0..blk0+RB of one activation row, v [RB, 32] fp32 in natural order -> v' and f.

    FMT 1: the MMA core's f16 x' (`fp4_mma_gemv.store_prescaled_f16`, after the fake quant). FMT 0:
    QUANT: the per-32 FP8 fake quant first. Per block, with a = the exponent field of its amax:
    v' = v·2^c, c = clamp(227 - a, 0, 227) (amax' in [2^100, 2^101), or c = 0 where amax >= 2^101),
    f = 2^(126-c), so that Σ v'·(value·2^-126) · f = Σ v·value. v' is stored "nibble-major":
    k = 32b + 8q + s goes to s·(NBLK·4) + 4b + q, so that nibble s of packed word 4b+q meets it."""
    if QUANT:
        v = fake_quant_e4m3_pow2(v, RB, 32)
    if FMT == 1:
        store_prescaled_f16(v, vp_ptr, f_ptr, blk0, NBLK, RB)
        return
    amax = tl.max(tl.abs(v), axis=1)
    a = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    c = tl.minimum(tl.maximum(227 - a, 0), 227)
    c1 = c // 2
    p1 = ((c1 + 127) << 23).to(tl.float32, bitcast=True)  # 2^c in two exact factors (2^c > fp32 max)
    p2 = ((c - c1 + 127) << 23).to(tl.float32, bitcast=True)
    blk = blk0 + tl.arange(0, RB)
    i = tl.arange(0, 32)
    ok = blk < NBLK
    dst = (i % 8)[None, :] * (NBLK * 4) + blk[:, None] * 4 + (i // 8)[None, :]
    tl.store(vp_ptr + dst, v * p1[:, None] * p2[:, None], mask=ok[:, None])
    tl.store(f_ptr + blk, ((253 - c) << 23).to(tl.float32, bitcast=True), mask=ok)


@triton.jit
def fp4_load_chunk(wa_ptr, sa_ptr, wb_ptr, sb_ptr, w_row, s_row, r_ok, kb, K: tl.constexpr, TWO: tl.constexpr,
                   MASKED: tl.constexpr):
    """The packed words [P, 4] and scale bytes [P] of the tile's (row, block) pairs p (row offsets w_row / s_row,
    blocks kb; both matrices when TWO, else b = a). MASKED: rows or blocks of the tile are out of range."""
    woff = (w_row + kb * 4)[:, None] + tl.arange(0, 4)[None, :]
    soff = s_row + kb
    if MASKED:
        m1 = r_ok & (kb < K // 32)
        m2 = m1[:, None]
        wo, so = 0, 127
    else:
        m1, m2, wo, so = None, None, None, None
    wa = tl.load(wa_ptr + woff, mask=m2, other=wo)
    sa = tl.load(sa_ptr + soff, mask=m1, other=so)
    if TWO:
        return wa, sa, tl.load(wb_ptr + woff, mask=m2, other=wo), tl.load(sb_ptr + soff, mask=m1, other=so)
    else:
        return wa, sa, wa, sa


@triton.jit
def fp4_fma_chunk(acc_a, acc_b, wa, sa, wb, sb, xa_ptr, fa_ptr, xb_ptr, fb_ptr, kb, K: tl.constexpr,
                  TWO: tl.constexpr, SAME_X: tl.constexpr, MASKED: tl.constexpr):
    """acc [P] += Σ_{k in block kb[p]} x·dequant(W)[row p, k] (and the second matrix when TWO).

    x (xa_ptr: x'_a in nibble-major order; fa_ptr: its block factors) is loaded as [P, 4], the weight
    tile's own shape and contiguity, so that Triton gives it the weight tile's layout (a [B, 4] load, or
    any other shape, gets another layout and a shared-memory shuffle per chunk); the p of one thread
    all have the same block, so its loads of x for its several rows are the same address (one load)."""
    KW: tl.constexpr = K // 8
    xoff = (kb * 4)[:, None] + tl.arange(0, 4)[None, :]
    if MASKED:
        k_ok = kb < K // 32
        xm = k_ok[:, None]
        xo = 0.0
    else:
        k_ok, xm, xo = None, None, None
    # nibble s of a word -> its E2M1 value × 2^-126 as fp32 bits: shift it to the top (sign on bit 31),
    # arithmetic-shift m3 down to bits 22..24, mask (3 integer ops); then one FMA with x'
    x = tl.load(xa_ptr + xoff, mask=xm, other=xo)
    ta = (((wa << 28) >> 6) & SIGN_M3).to(tl.float32, bitcast=True) * x
    if TWO:
        if not SAME_X:
            x = tl.load(xb_ptr + xoff, mask=xm, other=xo)
        tb = (((wb << 28) >> 6) & SIGN_M3).to(tl.float32, bitcast=True) * x
    for s in tl.static_range(1, 8):
        x = tl.load(xa_ptr + s * KW + xoff, mask=xm, other=xo)
        ta += (((wa << (28 - 4 * s)) >> 6) & SIGN_M3).to(tl.float32, bitcast=True) * x
        if TWO:
            if not SAME_X:
                x = tl.load(xb_ptr + s * KW + xoff, mask=xm, other=xo)
            tb += (((wb << (28 - 4 * s)) >> 6) & SIGN_M3).to(tl.float32, bitcast=True) * x
    # per (row, block): back to true scale (·f, exact), then ·2^(e-127) into the accumulator
    acc_a += (tl.sum(ta, axis=1) * tl.load(fa_ptr + kb, mask=k_ok, other=xo)) * e8m0_f32(sa)
    if TWO:
        acc_b += (tl.sum(tb, axis=1) * tl.load(fb_ptr + kb, mask=k_ok, other=xo)) * e8m0_f32(sb)
    return acc_a, acc_b


@triton.jit
def fp4_gemv(wa_ptr, sa_ptr, wb_ptr, sb_ptr, xa_ptr, fa_ptr, xb_ptr, fb_ptr, row0, K: tl.constexpr, N: tl.constexpr,
             BN: tl.constexpr, BKB: tl.constexpr, TWO: tl.constexpr, SAME_X: tl.constexpr, ch0=0,
             NCHP: tl.constexpr = 0, PDL: tl.constexpr = False, ready_ptr=None, READY: tl.constexpr = 0,
             RELEASE: tl.constexpr = True):
    """Row sums [BN] (row = row0 + i) of x·dequant(W)ᵀ over all K, for W = a (and b when TWO).

    NCHP > 0: only the NCHP chunks of BKB blocks from chunk ch0 on (a K split; the caller keeps them
    inside K's chunks), else all of K. PDL: the first two weight chunks are loaded before the grid
    dependency wait (pdl.py: weights are static), x after it. READY > 0: instead of that wait, spin
    until the counter at ready_ptr reaches READY (`wait_count`: x's producer counts its finished tiles).
    RELEASE: release the dependent grid after that wait (a caller with more waits to come releases itself).

    The tile is P = BN·BKB (row, block) pairs, p = BKB·row + lane-order(block), each a [4]-word vector
    (16 bytes, one 32-block): every tensor in the loop is [P, 4] or [P], so Triton's coalescing gives
    them all one blocked layout (4 words per thread, consecutive p on consecutive lanes, then warps, then
    registers) whatever its tie-breaking between dims (it differs between Triton 3.6 and 3.9), and the
    loop has no layout conversion. The weights are prefetched two chunks ahead by hand (Triton does not
    pipeline loads that feed no tl.dot)."""
    P: tl.constexpr = BN * BKB
    KB: tl.constexpr = K // 32
    NCH: tl.constexpr = NCHP if NCHP > 0 else (KB + BKB - 1) // BKB
    kb0 = ch0 * BKB
    MASKED: tl.constexpr = (N % BN != 0) or (KB % BKB != 0)
    p = tl.arange(0, P)
    rows = row0 + p // BKB
    r_ok = rows < N
    w_row = rows * (K // 8)
    s_row = rows * KB
    acc_a = tl.zeros((P,), dtype=tl.float32)
    acc_b = tl.zeros((P,), dtype=tl.float32)
    # The lanes take the blocks of a chunk in the order i -> 5i mod BKB. Any order gives the same sums;
    # a non-contiguous one keeps Triton from vectorizing the scale-byte load across blocks, so that load
    # takes the accumulator's layout instead of one that needs a shared-memory shuffle every chunk.
    lanes = kb0 + ((p % BKB) * 5) % BKB
    # Two chunk buffers, A (even chunks) and B (odd), each refilled two chunks ahead right after its FMAs:
    # ptxas sinks loads towards their first use, so a prefetch one chunk ahead would leave the HBM
    # latency exposed, and a rotating three-buffer loop would cost register moves. Refills past the
    # end reload the last chunk (cache hits) instead of masking every load.
    aw, asc, bw, bsc = fp4_load_chunk(wa_ptr, sa_ptr, wb_ptr, sb_ptr, w_row, s_row, r_ok, lanes, K, TWO, MASKED)
    aw1, asc1, bw1, bsc1 = fp4_load_chunk(wa_ptr, sa_ptr, wb_ptr, sb_ptr, w_row, s_row, r_ok,
                                          tl.minimum(1, NCH - 1) * BKB + lanes, K, TWO, MASKED)
    wait_inputs(ready_ptr, READY, PDL, RELEASE)
    for c in range(0, NCH - 1, 2):
        acc_a, acc_b = fp4_fma_chunk(acc_a, acc_b, aw, asc, bw, bsc, xa_ptr, fa_ptr, xb_ptr, fb_ptr, c * BKB + lanes, K,
                                     TWO, SAME_X, MASKED)
        aw, asc, bw, bsc = fp4_load_chunk(wa_ptr, sa_ptr, wb_ptr, sb_ptr, w_row, s_row, r_ok,
                                          tl.minimum(c + 2, NCH - 1) * BKB + lanes, K, TWO, MASKED)
        acc_a, acc_b = fp4_fma_chunk(acc_a, acc_b, aw1, asc1, bw1, bsc1, xa_ptr, fa_ptr, xb_ptr, fb_ptr,
                                     (c + 1) * BKB + lanes, K, TWO, SAME_X, MASKED)
        aw1, asc1, bw1, bsc1 = fp4_load_chunk(wa_ptr, sa_ptr, wb_ptr, sb_ptr, w_row, s_row, r_ok,
                                              tl.minimum(c + 3, NCH - 1) * BKB + lanes, K, TWO, MASKED)
    if NCH % 2 == 1:
        acc_a, acc_b = fp4_fma_chunk(acc_a, acc_b, aw, asc, bw, bsc, xa_ptr, fa_ptr, xb_ptr, fb_ptr,
                                     (NCH - 1) * BKB + lanes, K, TWO, SAME_X, MASKED)
    return tl.sum(tl.reshape(acc_a, (BN, BKB)), axis=1), tl.sum(tl.reshape(acc_b, (BN, BKB)), axis=1)


# ============================================================================ kernels


@triton.jit
def moe_decode_prep_kernel(x_ptr, xp_ptr, f_ptr, cnt_ptr, K: tl.constexpr, BKB: tl.constexpr,
                           ACT_QUANT: tl.constexpr, NCNT: tl.constexpr, NCNT_P: tl.constexpr,
                           NGCNT: tl.constexpr = 0, NGCNT_P: tl.constexpr = 1, PDL: tl.constexpr = False,
                           NDCNT: tl.constexpr = 0, NDCNT_P: tl.constexpr = 1, FMT: tl.constexpr = 0):
    """x [T, K] -> x' fp32 [T, K] and f [T, K/32] (`store_prescaled`); zeroes the token's NCNT down counters
    (cnt[t·NCNT..]), its NGCNT gate/up split counters (cnt[T·NCNT + t·NGCNT..], after all down ones) and its
    NDCNT per-slot tile counters of the gate/up -> down handoff (cnt[T·(NCNT + NGCNT) + t·NDCNT..]).
    FMT 1 (the MMA core): x' in f16 (`store_prescaled_f16`), and program (0, 0) zeroes the 16 words after all
    counters (cnt[T·(NCNT + NGCNT + NDCNT)..] rounded up to 16 bytes: the block-diagonal B's zero pad). PDL: waits for its predecessor first (x is its output), then releases the gate/up kernel."""
    grid_wait(PDL)
    grid_release(PDL)
    t = tl.program_id(0).to(tl.int64)
    blk0 = tl.program_id(1) * BKB
    blk = blk0 + tl.arange(0, BKB)
    v = tl.load(x_ptr + t * K + blk[:, None] * 32 + tl.arange(0, 32)[None, :], mask=(blk < K // 32)[:, None],
                other=0.0)
    store_prescaled(v.to(tl.float32), xp_ptr + t * K, f_ptr + t * (K // 32), blk0, K // 32, BKB, ACT_QUANT, FMT)
    if tl.program_id(1) == 0:  # the token's counters, in the three regions of cnt
        n_tok = tl.num_programs(0)
        zero_ints(cnt_ptr + t * NCNT, NCNT, NCNT_P)
        zero_ints(cnt_ptr + n_tok * NCNT + t * NGCNT, NGCNT, NGCNT_P)
        zero_ints(cnt_ptr + n_tok * (NCNT + NGCNT) + t * NDCNT, NDCNT, NDCNT_P)
        if FMT == 1:
            if t == 0:  # at the counters' end rounded up to 16 bytes (its v4 loads)
                zero_ints(cnt_ptr + (n_tok * (NCNT + NGCNT + NDCNT) + 3) // 4 * 4, 16, 16)


@triton.jit
def moe_decode_gate_up_kernel(xp_ptr, xf_ptr, idx_ptr, rw_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, hp_ptr, hf_ptr, limit,
                              ws_ptr, cnt_ptr, K: tl.constexpr, N: tl.constexpr, TOPK: tl.constexpr,
                              BN: tl.constexpr, BKB: tl.constexpr, INTER: tl.constexpr, H_QUANT: tl.constexpr,
                              KSPLIT: tl.constexpr = 1, PDL: tl.constexpr = False, done_ptr=None,
                              DONE: tl.constexpr = False, z_ptr=None, CORE: tl.constexpr = 0,
                              EMU: tl.constexpr = False, SUB: tl.constexpr = 1):
    """h'[slot, rows] for BN rows of expert topk_idx[slot]: SwiGLU of the w1/w3 GEMVs, stored like x'.

    Programs are numbered slot-major from their linear block index (slot slowest, then tile, then K part), so
    that, as the GPU dispatches blocks in about linear order (CUDA does not promise it; only the speed depends
    on it), the slots' h' complete one after another. DONE: each finished tile adds 1 to
    done[slot] (`signal_done`; zeroed by the prep), which the down kernel waits on per slot instead of
    on this whole grid (moe_decode_down_kernel's FINE).

    PDL: the expert id (written before the prep kernel, two launches back) and the first weight chunks
    are read before the grid dependency wait, x' (the prep's output) after it (pdl.py's contract).

    KSPLIT > 1 (grid axis 2): program (slot, n, z) (numbered as above, not by grid axis) runs the z-th of
    KSPLIT equal ranges of K's chunks
    (KSPLIT divides them: checked by the launcher), writes its g / u row sums to ws [T·k, KSPLIT, 2, N],
    and the last of the KSPLIT programs of (slot, n) to arrive (an acq_rel counter cnt[slot·N/BN + n],
    zeroed by the prep) adds them in z order and finishes the tile. Smaller programs, KSPLIT× as many:
    a finer last wave over the SMs (T = 1: 432 -> 432·KSPLIT programs); the g / u sums change order.

    CORE 1: `fp4_mma_gemv` (tensor cores; x' in f16, z_ptr its zero pad, num_warps = BN/8; EMU: the interpreter's
    form; SUB groups of 4 blocks a step), the K split in whole steps; h' stored in the same f16 format for the down kernel's MMA core."""
    # linear launch order (axis 0 fastest) -> (slot, tile, K part), slot slowest
    n_t = tl.num_programs(1)
    lin = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + n_t * tl.program_id(2))
    slot = (lin // (n_t * KSPLIT)).to(tl.int64)
    pid_n = (lin // KSPLIT) % n_t
    z = lin % KSPLIT
    e = tl.load(idx_ptr + slot).to(tl.int64)
    tok = slot // TOPK
    wo = e * N * (K // 8)
    so = e * N * (K // 32)
    xa = xp_ptr + tok * K
    fa = xf_ptr + tok * (K // 32)
    if KSPLIT == 1:
        if CORE == 1:
            g, u = fp4_mma_gemv(w1_ptr + wo, s1_ptr + so, w3_ptr + wo, s3_ptr + so,
                                xa.to(tl.pointer_type(tl.int32)), fa, z_ptr, pid_n * BN, K, N, BN, True,
                                BN // 8, EMU, 0, 0, PDL, SUB=SUB)
        else:
            g, u = fp4_gemv(w1_ptr + wo, s1_ptr + so, w3_ptr + wo, s3_ptr + so, xa, fa, xa, fa, pid_n * BN, K, N, BN,
                            BKB, True, True, 0, 0, PDL)
    else:
        if CORE == 1:
            NSTP: tl.constexpr = K // (128 * SUB) // KSPLIT
            gp, up = fp4_mma_gemv(w1_ptr + wo, s1_ptr + so, w3_ptr + wo, s3_ptr + so,
                                  xa.to(tl.pointer_type(tl.int32)), fa, z_ptr, pid_n * BN, K, N, BN,
                                  True, BN // 8, EMU, z * NSTP, NSTP, PDL, SUB=SUB)
        else:
            NCHP: tl.constexpr = (K // 32 + BKB - 1) // BKB // KSPLIT
            gp, up = fp4_gemv(w1_ptr + wo, s1_ptr + so, w3_ptr + wo, s3_ptr + so, xa, fa, xa, fa, pid_n * BN, K, N,
                              BN, BKB, True, True, z * NCHP, NCHP, PDL)
        rows = pid_n * BN + tl.arange(0, BN)
        wsp = ws_ptr + (slot * KSPLIT + z) * (2 * N) + rows
        tl.store(wsp, gp, mask=rows < N)
        tl.store(wsp + N, up, mask=rows < N)
        last = arrive_last(cnt_ptr + slot * n_t + pid_n, KSPLIT)  # counters zeroed by the prep
        if last:
            g = tl.zeros((BN,), dtype=tl.float32)
            u = tl.zeros((BN,), dtype=tl.float32)
            for z in range(KSPLIT):
                src = ws_ptr + (slot * KSPLIT + z) * (2 * N) + rows
                g += tl.load(src, mask=rows < N, other=0.0, cache_modifier=".cg")
                u += tl.load(src + N, mask=rows < N, other=0.0, cache_modifier=".cg")
            swiglu_store(g, u, limit, rw_ptr, hp_ptr, hf_ptr, slot, pid_n, N, BN, INTER, H_QUANT, CORE)
            if DONE:
                signal_done(done_ptr + slot)
    if KSPLIT == 1:
        swiglu_store(g, u, limit, rw_ptr, hp_ptr, hf_ptr, slot, pid_n, N, BN, INTER, H_QUANT, CORE)
        if DONE:
            signal_done(done_ptr + slot)


@triton.jit
def swiglu_store(g, u, limit, rw_ptr, hp_ptr, hf_ptr, slot, pid_n, N: tl.constexpr, BN: tl.constexpr,
                 INTER: tl.constexpr, H_QUANT: tl.constexpr, FMT: tl.constexpr = 0):
    """The gate/up tile's finish: clamped SwiGLU × routing weight, rounded to INTER, stored like x'
    (`store_prescaled`)."""
    g = tl.minimum(g, limit, propagate_nan=tl.PropagateNan.ALL)
    u = tl.minimum(tl.maximum(u, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                   propagate_nan=tl.PropagateNan.ALL)
    h = round_to(g / (1.0 + tl.exp(-g)) * u * tl.load(rw_ptr + slot), INTER)
    store_prescaled(tl.reshape(h, (BN // 32, 32)), hp_ptr + slot * N, hf_ptr + slot * (N // 32), pid_n * (BN // 32),
                    N // 32, BN // 32, H_QUANT, FMT)


@triton.jit
def moe_decode_down_kernel(hp_ptr, hf_ptr, idx_ptr, w2_ptr, s2_ptr, shared_ptr, y_ptr, ws_ptr, cnt_ptr,
                           K: tl.constexpr, N: tl.constexpr, TOPK: tl.constexpr, BN: tl.constexpr,
                           BKB: tl.constexpr, SPLIT: tl.constexpr,
                           PARTIAL: tl.constexpr, OUT: tl.constexpr, HAS_SHARED: tl.constexpr,
                           PDL: tl.constexpr = False, done_ptr=None, FINE: tl.constexpr = 0, z_ptr=None,
                           CORE: tl.constexpr = 0, EMU: tl.constexpr = False, SUB: tl.constexpr = 1):
    """y[t, rows] = Σ_j round(h'_{t,j}·w2[e_j]ᵀ) in slot order (+ shared[t, rows]), fp32 sums -> y's dtype.

    PDL: the expert ids (three launches back) and the first w2 chunks are read before the grid
    dependency wait, h' (the gate/up kernel's output) after it. FINE = the gate/up's tiles per slot
    (> 0 with its DONE): per slot, wait until done[slot] counts them all instead of waiting for the
    whole gate/up grid, so that the down GEMVs of the first slots run beside the gate/up's last ones.
    pdl.py's contract still holds: everything else this kernel reads or writes was produced or
    released before the gate/up kernel passed its own grid wait (all of its programs have, or this
    grid would not have been launched), and this program releases its dependents only after its waits.

    SPLIT = 1: the program runs the k slots itself. SPLIT > 1: program (t, n, p) runs slots
    p·k/SPLIT.., writes their rounded partials to ws [T·k, N], and the last of the SPLIT programs of
    (t, n) to arrive (a counter, zeroed by the prep kernel) adds all k in slot order.

    CORE 1: `fp4_mma_gemv` on h' in f16 (z_ptr: its zero pad; num_warps = BN/16; SUB groups of 4 blocks a step)."""
    t = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    SPP: tl.constexpr = TOPK // SPLIT
    rows = pid_n * BN + tl.arange(0, BN)
    r_ok = rows < N
    y = tl.zeros((BN,), dtype=tl.float32)
    for jj in range(SPP):
        slot = t * TOPK + tl.program_id(2) * SPP + jj
        e = tl.load(idx_ptr + slot).to(tl.int64)
        xa = hp_ptr + slot * K
        fa = hf_ptr + slot * (K // 32)
        # with the per-slot waits, a program of several slots releases its dependents after the last one
        if CORE == 1:
            part, _ = fp4_mma_gemv(w2_ptr + e * N * (K // 8), s2_ptr + e * N * (K // 32), w2_ptr, s2_ptr,
                                   xa.to(tl.pointer_type(tl.int32)), fa, z_ptr, pid_n * BN, K, N, BN,
                                   False, BN // 16, EMU, 0, 0, PDL, done_ptr + slot, FINE, FINE == 0 or SPP == 1,
                                   SUB)
        else:
            part, _ = fp4_gemv(w2_ptr + e * N * (K // 8), s2_ptr + e * N * (K // 32), w2_ptr, s2_ptr, xa, fa, xa,
                               fa, pid_n * BN, K, N, BN, BKB, False, True, 0, 0, PDL, done_ptr + slot, FINE,
                               FINE == 0 or SPP == 1)
        if SPLIT == 1:
            y += round_to(part, PARTIAL)
        else:
            tl.store(ws_ptr + slot * N + rows, round_to(part, PARTIAL), mask=r_ok)
    if FINE > 0 and SPP > 1:
        grid_release(PDL)
    if FINE == 0 or SPP == 0:
        grid_wait(PDL)  # fp4_gemv waited already, unless the program had no slot (top_k 0): no store before it
    last = True
    if SPLIT > 1:
        last = arrive_last(cnt_ptr + t * tl.num_programs(1) + pid_n, SPLIT)  # counters zeroed by the prep
        if last:
            for j in range(TOPK):
                y += tl.load(ws_ptr + (t * TOPK + j) * N + rows, mask=r_ok, other=0.0, cache_modifier=".cg")
    if last:
        if HAS_SHARED:
            y += tl.load(shared_ptr + t * N + rows, mask=r_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + t * N + rows, round_to(y, OUT).to(y_ptr.dtype.element_ty), mask=r_ok)


# ============================================================================ reference


def moe_experts_decode_reference(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit: float, act_quant: bool = False,
                                 inter_dtype=None, partial_dtype=None, shared=None, out_dtype=torch.float32,
                                 compute_dtype=torch.float32, tiles=None):
    """moe_experts_reference per slot (its partial, rounded to partial_dtype), then moe_combine_reference.

    The slot partials are summed in slot order like `moe.moe_combine`; `tiles` is ignored."""
    k = topk_idx.shape[1]
    parts = [moe_experts_reference(x, topk_idx[:, j:j + 1], topk_w[:, j:j + 1], w1, s1, w3, s3, w2, s2, limit,
                                   act_quant, inter_dtype, partial_dtype, compute_dtype) for j in range(k)]
    part = torch.stack(parts, 1).flatten(0, 1)  # [T·k, D], slot t·k + j
    return moe_combine_reference(part, k, shared, out_dtype)


# ============================================================================ launcher


def _fit(KB: int, BKB: int) -> int:
    """The largest power of two <= BKB dividing KB (no masked chunk); BKB itself if none above 4 does."""
    b = BKB
    while b > 4 and KB % b:
        b //= 2
    return b if KB % b == 0 else BKB


MMA_MIN_STEPS = 8  # core 1's gate/up K split keeps at least this many 128-wide steps a program (prologue, epilogue)


def decode_tiles(D: int = PUBLISHED.hidden_size, I: int = PUBLISHED.moe_intermediate_size, top_k: int = 6, interp=None, core=None, tokens: int = 1,
                 n_sm: int = 132, device=None) -> dict:
    """Launch parameters: prep BKB; core; gate_up {BN, BKB, num_warps, ksplit[, sub]}; down {BN, BKB, num_warps,
    split[, sub]}.

    core (default: 1 on a CUDA sm80+ device where hidden and inter are multiples of 128, else 0): 1 is
    fp4_mma_gemv (tensor cores). Its tiles (H200, tuning/tune_moe_decode_core*.json, rotating graph): gate/up
    BN 32 (4 warps), steps of one group of 4 blocks (sub 1: 48.6-49.0 µs at T = 1 in the final run; sub 2 / 4 at
    K split 5 55 / 51, sub 2 at K split 2 50.9), the K split the smallest divisor of hidden's steps that gives
    about 16 programs per SM for `tokens`·top_k slots while keeping at least MMA_MIN_STEPS steps a program (T = 1:
    5, the measured best, 10 with 4 steps was slower; T = 8: 1: 283-296 µs against 307-334 with 5); down BN 32
    (2 warps), steps of 2 groups (sub 2: T = 1 54.2 -> 49.6 µs; sub 3 50.0), split = k. Only the backbone
    router (top-6) was timed. interp: the interpreter's tiles (core 0), whatever `core` says. Core 0 (fp4_gemv,
    CUDA-core FMAs):

    sm90: gate/up BN = 32 (a program owns whole h blocks), BKB = 8 (8 lanes across the blocks of a
    row), 4 warps: 2 rows per thread per matrix, 104 registers, 4 programs per SM fit, so T = 1's 432
    programs are one wave with ~13 warps per SM. The first H200 run (before the layout rework) had
    2 warps ahead (0.127 vs 0.182 ms): there every chunk synchronized the warps through shared memory;
    without that, 2 warps means 4 rows per thread, 168 registers and ~6.5 warps per SM at T = 1 (under
    two per scheduler) for 2% fewer instructions, so 4 stays the default and the sweep keeps 2 as the
    control. down: BN = 32, BKB = 8, 2 warps (4 rows per thread, 126 registers), split = k (one slot
    per program: 960 programs at T = 1 instead of 160, 8 per SM) — the measured best. The same tiles
    for 1..MAX_SLOTS slots. gate_up "ksplit" (see moe_decode_gate_up_kernel): 5 where it divides the
    K chunks (the H200 sweep's best at T = 1), else 1.
    interp (default: TRITON_INTERPRET) picks fewer, larger programs for the interpreter."""
    if interpreting() if interp is None else interp:
        return {"prep": 8, "gate_up": {"BN": 32, "BKB": _fit(D // 32, 8), "num_warps": 4},
                "down": {"BN": 32, "BKB": _fit(I // 32, 4), "num_warps": 4, "split": top_k}}
    bkb = _fit(D // 32, 8)
    if core is None:
        core = 1 if _mma_device(device) and D % 128 == 0 and I % 128 == 0 else 0
    if core == 1:
        steps = D // 128
        want = -(-n_sm * 16 // max(1, tokens * top_k * (I // 32)))
        ok = [d for d in range(1, steps + 1) if steps % d == 0 and steps // d >= min(MMA_MIN_STEPS, steps)]
        ks = min([d for d in ok if d >= want] or [max(ok)])
        return {"prep": 32, "core": 1, "gate_up": {"BN": 32, "BKB": bkb, "num_warps": 4, "ksplit": ks, "sub": 1},
                "down": {"BN": 32, "BKB": _fit(I // 32, 8), "num_warps": 2, "split": top_k,
                         "sub": 2 if I % 256 == 0 else 1}}
    # K split in 5 (H200 sweep, tuning/tune_moe_decode.json: T = 1 62.3 -> 57.1 µs; T = 8 neutral) where it divides
    ks = 5 if (D // 32 // bkb) % 5 == 0 else 1
    return {"prep": 32, "gate_up": {"BN": 32, "BKB": bkb, "num_warps": 4, "ksplit": ks},
            "down": {"BN": 32, "BKB": _fit(I // 32, 8), "num_warps": 2, "split": top_k}}


def _mma_device(device=None) -> bool:
    """`device` (default: the current CUDA device) runs core 1 (mma.sync): CUDA sm80+, not the interpreter."""
    if interpreting() or torch.version.hip is not None or not torch.cuda.is_available():
        return False
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _core_problems(device, x_dtype, inter_dtype, D, I, gu, dn, ksplit) -> list:
    """Why core 1 (fp4_mma_gemv) cannot run these inputs and tiles ([] if it can): it needs CUDA sm80+ or the
    interpreter, f16-exact activations (bf16 / f16 x and inter_dtype), hidden and inter multiples of 128·sub, a
    K split of whole steps, and BN multiples of 16 (its warps: gate/up BN/8, down BN/16)."""
    why = []
    if not interpreting() and (device.type != "cuda" or torch.version.hip is not None
                               or torch.cuda.get_device_capability(device) < (8, 0)):
        why.append("a CUDA sm80+ device (mma.sync)")
    if x_dtype not in (torch.bfloat16, torch.float16) or inter_dtype not in (torch.bfloat16, torch.float16):
        why.append(f"bf16/f16 activations (x {x_dtype}, inter_dtype {inter_dtype}: f16 x' would round them)")
    su, sd = gu.get("sub", 1), dn.get("sub", 1)
    if su not in (1, 2, 3, 4) or sd not in (1, 2, 3, 4):
        why.append(f"sub (groups of 4 blocks a step) 1 to 4 (gate/up {su}, down {sd})")
    elif D % (128 * su) or I % (128 * sd):
        why.append(f"hidden {D} a multiple of 128·{su} (gate/up sub) and inter {I} of 128·{sd} (down sub)")
    elif (D // (128 * su)) % ksplit:
        why.append(f"a gate/up ksplit ({ksplit}) dividing hidden's {D // (128 * su)} steps of 128·{su}")
    if gu["BN"] % 16 or dn["BN"] % 16:
        why.append(f"BN multiples of 16 (gate/up {gu['BN']}, down {dn['BN']})")
    return why


@functools.lru_cache(maxsize=256)
def _default_tiles(D, I, k, T, device, x_dtype, inter_dtype, interp) -> dict:
    """decode_tiles for T tokens on `device`, falling back to core 0 where core 1 cannot run these inputs. Cached:
    the launcher's host time counts where decode steps are not replayed from a graph (the caller must not
    modify the dict)."""
    tt = decode_tiles(D, I, k, interp=interp, tokens=T, n_sm=sm_count(device), device=device)
    if tt.get("core", 0) == 1 and _core_problems(device, x_dtype, inter_dtype, D, I, tt["gate_up"], tt["down"],
                                                 tt["gate_up"]["ksplit"]):
        tt = decode_tiles(D, I, k, interp=interp, core=0)
    return tt


def _check_tiles(what, t, top_k=None):
    if t["BKB"] & (t["BKB"] - 1) or t["BN"] & (t["BN"] - 1):
        raise ValueError(f"moe_experts_decode: {what} tiles {t}: BN and BKB must be powers of two")
    if top_k is not None and top_k % t["split"]:
        raise ValueError(f"moe_experts_decode: {what} split {t['split']} does not divide top_k {top_k}")


def _check_mxfp4(w, s, E, N, K, name):
    if w.dim() != 3 or tuple(w.shape) != (E, N, K // 2) or tuple(s.shape) != (E, N, K // 32):
        raise ValueError(f"moe_experts_decode: {name} weight {tuple(w.shape)} / scale {tuple(s.shape)} are not "
                         f"[{E}, {N}, {K // 2}] / [{E}, {N}, {K // 32}] packed MXFP4")
    if w.element_size() != 1 or s.element_size() != 1:
        raise ValueError(f"moe_experts_decode: {name} weight {w.dtype} / scale {s.dtype} are not bytes")


def _as_words(w, name):
    """Packed FP4 bytes [E, N, K/2] -> int32 words [E, N, K/8], same memory (little endian: nibble i of
    word q is element 8q + i of the row)."""
    w = w.contiguous().view(torch.uint8)
    if w.data_ptr() % 16:
        raise ValueError(f"moe_experts_decode: {name} is not 16-byte aligned")
    return w.view(torch.int32)


def _u8(s):
    s = s.contiguous()
    return s if s.dtype == torch.uint8 else s.view(torch.uint8)


def moe_experts_decode(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit: float, act_quant: bool = False,
                       inter_dtype=None, partial_dtype=None, shared=None, out_dtype=torch.float32,
                       compute_dtype=torch.float32, tiles=None, shared_stream=None):
    """Routed experts and the combine for a few tokens: -> y [T, D] in out_dtype.

    A drop-in for `moe.moe_experts` (same arguments; out_dtype fp32, shared None) and for
    `moe_combine(moe_down(moe_gate_up(...)), k, shared, x.dtype)` in `moe.moe_forward` (shared [T, D],
    out_dtype=x.dtype). Correct for any T·k; the fast path for T·k <= MAX_SLOTS. No host sync.
    `tiles`: a `decode_tiles` dict (tuning); its optional "pdl" key forces programmatic dependent launch
    on or off (default: `pdl.pdl_for(x.device)`). `shared_stream`: the stream that computes `shared`; the
    current stream waits for it just before the down kernel (moe.moe_forward's overlap)."""
    if compute_dtype != torch.float32:
        raise ValueError("moe_experts_decode: the kernels accumulate in float32 only")
    if x.dim() != 2:
        raise ValueError(f"moe_experts_decode: x must be [T, D], got {tuple(x.shape)}")
    T, D = x.shape
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T or tuple(topk_w.shape) != tuple(topk_idx.shape):
        raise ValueError(f"moe_experts_decode: topk_idx {tuple(topk_idx.shape)} / topk_w {tuple(topk_w.shape)} "
                         f"are not [{T}, k]")
    if topk_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"moe_experts_decode: topk_idx must be int32/int64, got {topk_idx.dtype}")
    if w1.dim() != 3:
        raise ValueError(f"moe_experts_decode: w1 must be [E, I, D/2], got {tuple(w1.shape)}")
    E, I = w1.shape[0], w1.shape[1]
    if D % 32 or I % 32:
        raise ValueError(f"moe_experts_decode: hidden {D} and inter {I} must be multiples of 32 (MXFP4 blocks)")
    _check_mxfp4(w1, s1, E, I, D, "w1")
    _check_mxfp4(w3, s3, E, I, D, "w3")
    _check_mxfp4(w2, s2, E, D, I, "w2")
    inter_dtype = inter_dtype or x.dtype
    partial_dtype = partial_dtype or x.dtype
    for what, dt in (("inter_dtype", inter_dtype), ("partial_dtype", partial_dtype), ("out_dtype", out_dtype)):
        if dt not in ROUND:
            raise ValueError(f"moe_experts_decode: {what} {dt} is not float32/bfloat16/float16")
    if shared is not None and tuple(shared.shape) != (T, D):
        raise ValueError(f"moe_experts_decode: shared {tuple(shared.shape)} is not [{T}, {D}]")
    k = topk_idx.shape[1]
    y = torch.empty(T, D, dtype=out_dtype, device=x.device)
    if T == 0:
        return y
    s1, s3, s2 = _u8(s1), _u8(s3), _u8(s2)
    tt = tiles or _default_tiles(D, I, k, T, x.device, x.dtype, inter_dtype, interpreting())
    if tiles is None and tt.get("core", 0) == 1 and any(sc.data_ptr() % 4 for sc in (s1, s3, s2)):
        tt = decode_tiles(D, I, k, core=0)  # core 1 reads a group's 4 scale bytes as one word
    gu, dn = tt["gate_up"], tt["down"]
    _check_tiles("gate/up", gu)
    _check_tiles("down", dn, k)
    if gu["BN"] % 32:
        raise ValueError(f"moe_experts_decode: gate/up BN={gu['BN']} is not a multiple of 32 (whole h blocks)")
    ksplit = gu.get("ksplit", 1)
    if ksplit < 1:
        raise ValueError(f"moe_experts_decode: gate/up ksplit={ksplit} is not a positive count")
    core = int(tt.get("core", 0))
    if core not in (0, 1):
        raise ValueError(f"moe_experts_decode: tiles core={core} is not 0 (FMA) or 1 (MMA)")
    why = _core_problems(x.device, x.dtype, inter_dtype, D, I, gu, dn, ksplit) if core == 1 and tiles else []
    if why:
        raise ValueError("moe_experts_decode: core 1 (the MMA GEMV) needs " + "; ".join(why))
    gu_chunks = triton.cdiv(D // 32, gu["BKB"])
    if core == 0 and gu_chunks % ksplit:
        raise ValueError(f"moe_experts_decode: gate/up ksplit={ksplit} does not divide the {gu_chunks} "
                         f"chunks of BKB={gu['BKB']} blocks of hidden {D}")
    dev = x.device
    idx = topk_idx.to(torch.int32).contiguous()
    rw = topk_w.to(torch.float32).contiguous()
    n_tiles = triton.cdiv(D, dn["BN"])
    split = dn["split"]
    ncnt = n_tiles if split > 1 else 0
    gu_tiles = triton.cdiv(I, gu["BN"])
    ngcnt = k * gu_tiles if ksplit > 1 else 0
    emu = interpreting()
    # core 1: x' / h' in f16 (fp4_mma_gemv), and 16 zero words after the counters (its zero pad)
    act_t = torch.float16 if core == 1 else torch.float32
    xp = torch.empty(T, D, dtype=act_t, device=dev)
    xf = torch.empty(T, D // 32, dtype=torch.float32, device=dev)
    pdl = pdl_for(dev) and (tt.get("pdl") is None or bool(tt["pdl"]))  # never where the device has no PDL
    # the per-slot handoff from the gate/up to the down kernel: by default where PDL lets them overlap
    fine = (pdl if tt.get("fine") is None else bool(tt["fine"])) and k > 0
    ndcnt = k if fine else 0
    n_counters = T * (ncnt + ngcnt + ndcnt)
    z_at = (n_counters + 3) // 4 * 4  # the zero pad's 16-byte aligned offset (core 1)
    cnt = torch.empty(max(n_counters, 1) if core == 0 else z_at + 16, dtype=torch.int32, device=dev)
    zpad = cnt[z_at:] if core == 1 else cnt
    if core == 1:
        for name, sc in (("s1", s1), ("s3", s3), ("s2", s2)):  # core 1 reads a step's 4 scale bytes as one word
            if sc.data_ptr() % 4:
                raise ValueError(f"moe_experts_decode: core 1 needs {name} 4-byte aligned (it is at "
                                 f"{sc.data_ptr():#x})")
    if core == 1 and zpad.data_ptr() % 16:
        raise RuntimeError(f"moe_experts_decode: the zero pad at {zpad.data_ptr():#x} is not 16-byte aligned")
    done = cnt[T * (ncnt + ngcnt):] if fine else cnt
    moe_decode_prep_kernel[(T, triton.cdiv(D // 32, tt["prep"]))](
        x.contiguous(), xp, xf, cnt, K=D, BKB=tt["prep"], ACT_QUANT=act_quant, NCNT=ncnt,
        NCNT_P=triton.next_power_of_2(max(ncnt, 1)), NGCNT=ngcnt, NGCNT_P=triton.next_power_of_2(max(ngcnt, 1)),
        PDL=pdl, NDCNT=ndcnt, NDCNT_P=triton.next_power_of_2(max(ndcnt, 1)), FMT=core, num_warps=4,
        **launch_kw(pdl))
    hp = torch.empty(T * k, I, dtype=act_t, device=dev)
    hf = torch.empty(T * k, I // 32, dtype=torch.float32, device=dev)
    gws = torch.empty(T * k * ksplit * 2, I, dtype=torch.float32, device=dev) if ksplit > 1 else hp
    moe_decode_gate_up_kernel[(T * k, gu_tiles, ksplit)](
        xp, xf, idx, rw, _as_words(w1, "w1"), s1, _as_words(w3, "w3"), s3, hp, hf, float(limit),
        gws, cnt[T * ncnt:], K=D, N=I, TOPK=k, BN=gu["BN"], BKB=gu["BKB"], INTER=ROUND[inter_dtype],
        H_QUANT=act_quant, KSPLIT=ksplit, PDL=pdl, done_ptr=done, DONE=fine, z_ptr=zpad, CORE=core, EMU=emu,
        SUB=gu.get("sub", 1) if core == 1 else 1,
        num_warps=gu["BN"] // 8 if core == 1 else gu["num_warps"], num_stages=1, **launch_kw(pdl))
    if shared_stream is not None:
        torch.cuda.current_stream(dev).wait_stream(shared_stream)
    sh = shared.contiguous() if shared is not None else y
    ws = torch.empty(T * k, D, dtype=torch.float32, device=dev) if split > 1 else y
    moe_decode_down_kernel[(T, n_tiles, split)](
        hp, hf, idx, _as_words(w2, "w2"), s2, sh, y, ws, cnt, K=I, N=D, TOPK=k, BN=dn["BN"],
        BKB=dn["BKB"], SPLIT=split, PARTIAL=ROUND[partial_dtype], OUT=ROUND[out_dtype],
        HAS_SHARED=shared is not None, PDL=pdl, done_ptr=done, FINE=gu_tiles if fine else 0, z_ptr=zpad, CORE=core,
        EMU=emu, SUB=dn.get("sub", 1) if core == 1 else 1,
        num_warps=dn["BN"] // 16 if core == 1 else dn["num_warps"], num_stages=1, **launch_kw(pdl))
    return y


# ============================================================================ ahead-of-time variants


def _aot_tiles(tr, core=0) -> dict:
    return decode_tiles(interp=False, core=core)


def _prep_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    t = _aot_tiles(tr)
    ncnt = triton.cdiv(widths.hidden_size, t["down"]["BN"])
    out = []
    for core in _cores(tr):
        for aq in (False, True):
            ce = {"K": widths.hidden_size, "BKB": t["prep"], "ACT_QUANT": aq, "NCNT": ncnt,
                  "NCNT_P": triton.next_power_of_2(ncnt), "NGCNT": 0, "NGCNT_P": 1, "PDL": False, "NDCNT": 0,
                  "NDCNT_P": 1, "FMT": core}
            out.append(aot_spec(moe_decode_prep_kernel, ("aq" if aq else "plain") + ("_f16" if core else ""),
                                {"x_ptr": "*bf16", "xp_ptr": "*fp16" if core else "*fp32", "f_ptr": "*fp32",
                                 "cnt_ptr": "*i32"}, ce, 4, 1, {"act": "bf16", **ce}))
    return out


def _cores(tr) -> tuple:
    """GEMV cores with ahead-of-time variants on a target: 0 (FMA) everywhere, 1 (mma.sync) on CUDA sm80+.

    A core-1 variant's launch contract beyond its signature (what `moe_experts_decode` does): xp / hp are f16 in
    fp4_mma_gemv's order (the core-1 prep variants write them), z_ptr points at 16 zero int32 words at a 16-byte
    aligned offset (the prep zeroes cnt[round_up(T·NCNT, 4)..+16) for the down counters it is built with), the
    scale tensors are 4-byte aligned, and num_warps is BN/8 (gate/up) or BN/16 (down)."""
    return (0, 1) if tr["kind"] == "cuda" and tr["arch"] >= 80 else (0,)


def _gate_up_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    out = []
    for core in _cores(tr):
        g = _aot_tiles(tr, core)["gate_up"]
        act = "*fp16" if core else "*fp32"
        types = {"xp_ptr": act, "xf_ptr": "*fp32", "idx_ptr": "*i32", "rw_ptr": "*fp32", "w1_ptr": "*i32",
                 "s1_ptr": "*u8", "w3_ptr": "*i32", "s3_ptr": "*u8", "hp_ptr": act, "hf_ptr": "*fp32",
                 "limit": "fp32", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "done_ptr": "*i32", "z_ptr": "*i32"}
        for name, (E, k) in routers(widths).items():
            for hq in (False, True):
                ce = {"K": widths.hidden_size, "N": widths.moe_intermediate_size, "TOPK": k, "BN": g["BN"], "BKB": g["BKB"],
                      # KSPLIT 1 ahead of time: a K split needs a prep variant that also zeroes this router's
                      # k·I/BN gate/up counters per token (NGCNT), and the prep variants are not keyed by router yet.
                      "INTER": ROUND[torch.bfloat16], "H_QUANT": hq, "KSPLIT": 1, "PDL": False, "DONE": False,
                      "CORE": core, "EMU": False, "SUB": g.get("sub", 1) if core else 1}
                out.append(aot_spec(moe_decode_gate_up_kernel,
                                    f"{name}_k{k}" + ("_aq" if hq else "") + ("_mma" if core else ""), types, ce,
                                    g["BN"] // 8 if core else g["num_warps"], 1, {"router": name, "E": E, **ce}))
    return out


def _down_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    out = []
    for core in _cores(tr):
        d = _aot_tiles(tr, core)["down"]
        for name, (E, k) in routers(widths).items():
            # "experts": moe_experts' fp32 sum; "forward": moe_forward's bf16 output with the shared expert
            for mode, out_t, has_sh in (("experts", "*fp32", False), ("forward", "*bf16", True)):
                types = {"hp_ptr": "*fp16" if core else "*fp32", "hf_ptr": "*fp32", "idx_ptr": "*i32",
                         "w2_ptr": "*i32", "s2_ptr": "*u8", "shared_ptr": "*bf16", "y_ptr": out_t, "ws_ptr": "*fp32",
                         "cnt_ptr": "*i32", "done_ptr": "*i32", "z_ptr": "*i32"}
                ce = {"K": widths.moe_intermediate_size, "N": widths.hidden_size, "TOPK": k, "BN": d["BN"], "BKB": d["BKB"],
                      "SPLIT": k, "PARTIAL": ROUND[torch.bfloat16],
                      "OUT": ROUND[torch.float32 if out_t == "*fp32" else torch.bfloat16], "HAS_SHARED": has_sh,
                      "PDL": False, "FINE": 0, "CORE": core, "EMU": False, "SUB": d.get("sub", 1) if core else 1}
                out.append(aot_spec(moe_decode_down_kernel, f"{name}_k{k}_{mode}" + ("_mma" if core else ""), types,
                                    ce, d["BN"] // 16 if core else d["num_warps"], 1,
                                    {"router": name, "E": E, "mode": mode, **ce}))
    return out


register(KernelTemplate(
    name="moe_decode_prep", module=__name__,
    summary="decode MoE: x (optionally FP8 fake-quantized) -> per-32 prescaled fp32 in nibble-major order",
    keys=("act", "K", "BKB", "ACT_QUANT", "NCNT", "NCNT_P", "NGCNT", "NGCNT_P", "PDL", "NDCNT", "NDCNT_P", "FMT"),
    reference=moe_experts_decode_reference,
    launch=moe_experts_decode, specializations=_prep_variants))
register(KernelTemplate(
    name="moe_decode_gate_up_fp4", module=__name__,
    summary="decode MoE: per-slot MXFP4 w1/w3 GEMVs (no dispatch) + clamped SwiGLU × routing weight",
    keys=("router", "E", "K", "N", "TOPK", "BN", "BKB", "INTER", "H_QUANT", "KSPLIT", "PDL", "DONE", "CORE", "EMU", "SUB"),
    reference=moe_experts_decode_reference, launch=moe_experts_decode, specializations=_gate_up_variants))
register(KernelTemplate(
    name="moe_decode_down_fp4", module=__name__,
    summary="decode MoE: per-token MXFP4 w2 GEMVs over the k slots, rounded partials summed in slot order",
    keys=("router", "E", "mode", "K", "N", "TOPK", "BN", "BKB", "SPLIT", "PARTIAL", "OUT", "HAS_SHARED", "PDL",
          "FINE", "CORE", "EMU", "SUB"),
    reference=moe_experts_decode_reference, launch=moe_experts_decode, specializations=_down_variants))
