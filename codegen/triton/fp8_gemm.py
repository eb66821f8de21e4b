"""Block-scaled FP8 GEMM for the dense linears (tensor cores), its decode-shape routing, and the act_quant pass.

One file: the GEMM kernel, its k loop with the two weight decoders, the launcher that picks the decode path (the
GEMV in fp8_gemv.py, the warp-split tile in fp8_warp_split.py, or this kernel) and the variants the AOT build
takes change together; the tile plan, split-K fold and references are already their own modules (fp8_tiles.py,
fp8_splitk.py, fp8_reference.py).

What (spec §3.13, §4): y[M, N] = x[M, K] · W[N, K]ᵀ with W stored as FP8 E4M3 codes and one
UE8M0 (power-of-two) scale per 32×32 block (`scale [ceil(N/32), ceil(K/32)]`), fp32
accumulation, output in x's dtype (or `out_dtype`). Variants:
- `fp8_gemm`: plain linear (wq_a, wq_b, wkv, wo_b, shared-expert w2, indexer wq_b, engram wkv...).
- `fp8_gemm_swiglu`: the shared expert's gate/up pair in one kernel: g = x·w1ᵀ, u = x·w3ᵀ,
  h = silu(min(g, limit)) · clamp(u, ±limit) (spec §3.5), so x is read once and h written once.
- `act_quant_fp8`: the `activation_scheme: dynamic` reading: x is quantized per 32 along K to
  E4M3 with a power-of-two scale s = 2^ceil(log2(max(amax, 1e-4)/448)) and dequantized again
  (exactly numerics.fake_quant_fp8_ue8m0). `act_quant=False` (the default) is the exact
  bf16-activation reference path.

Algorithm: "swap AB": the weight tile [BN, BK] is the dot's LEFT operand, so it is decoded in
registers (E4M3 bits -> fp32, times the block scale, -> bf16; exact, because an E4M3 value
times a power of two is a bf16 value) and can feed wgmma straight from registers, while the
activation tile xᵀ [BK, BM] comes through shared memory; decode shapes (M = 1..16 tokens) then
use wgmma's small N instead of padding M to 64. The accumulator is [BN, BM] fp32 and is
transposed once for a coalesced store. Tiles are grouped along M (GROUP_M) for L2 reuse of W.
Dynamic activation quantization is a separate elementwise pass (`act_quant_fp8`) producing the
dequantized activation in x's dtype, which is bit-identical to what an FP8×FP8 tensor-core
product with the two scales multiplied in would compute before accumulation; the GEMM is then
the same bf16 kernel.

The decode helpers (`e4m3_to_f32`: bit arithmetic, or the native cvt where the target has FP8 units;
`e8m0_to_f32`, `fake_quant_e4m3_pow2`) are codecs.py's. Interpreter notes: its float casts to bf16/fp8
truncate and its bf16 tl.dot multiplies raw bits, so under TRITON_INTERPRET the launchers set
DOT_F32 (operands upcast to fp32 before tl.dot) and every rounding step is integer arithmetic.

Decode shapes: one token (M = 1) runs `fp8_gemv_kernel` on the CUDA cores (no tensor-core
padding to 16 rows; the block scale multiplies the activation, not each weight element: 3.5 SASS
instructions per weight element vs 6.3 in the MMA loop). 2-8 tokens on sm90 for the linears it was measured on
(shared w1/w3, shared w2, wq_a, wo_b) run fp8_warp_split.py instead: one program per 16 weight rows with K split
over its warps and summed in shared memory, no split-K partials (3-20 % faster at 8 tokens, tuning/tune_fp8_warp_split_tiles.json). M <= 16
otherwise runs the tensor-core kernel with the per-element decoder DECODE_W 0, except the largest linear (engram wkv, from
DECODE_W_MIN_WEIGHTS elements), where the word decoder DECODE_W 1 (below) is faster on the H200;
`_gemm(decode_w=)` forces either. On sm90 the DECODE_W 0 tile has 2 warps and 32 weight rows, so that Triton
emits mma.sync rather than wgmma (`_decode_tile`: faster at 8 tokens on the H200); DECODE_W 1's, and every tile
on other targets, keeps 4 warps. Decode grids on sm90+ (split-K folded into the launch) are
launched with programmatic dependent launch (pdl.py): the weight tile's address math overlaps the previous kernel, x and every
store wait for it; the one-token gemv also loads its split's first weight tile before the wait (EARLY_W, GEMV_EARLY_W:
0.1-0.6 µs less of a decode step behind its predecessor, benchmarks/step_chain.py). The tensor-core k loop loads the next k tile's UE8M0 bytes one iteration ahead (`_mma_k_loop`'s
SPF: Triton's cp.async pipeline leaves these 2-byte loads out), except in the gated decode tile, where it measured
slower (`_spf`, SCALE_PREFETCH).

Weight decoders of the tensor-core kernel (`DECODE_W`):
  0: E4M3 bytes -> fp32 per element (`e4m3_to_f32`), × the expanded fp32 block scale, -> bf16; natural
     k order. Prefill, the interpreter/ROCm default, and any K that BK does not tile.
  1: the tile is loaded as 32-bit words (4 codes, bytes b0..b3 little endian = k 4m..4m+3); for each
     byte position P in {0, 1} one shift/mask pair turns byte 2h+P of BOTH 16-bit halves h into bf16
     bits, so the 32-bit result already is a bf16x2 operand register; it is scaled by `fma.rn.bf16x2`
     (inline PTX) and used by the dot without a cast. The columns come out in k_order_w(BK), so the
     ACTIVATION columns are permuted to match (`permute_k_w`, once per call on the host), not the weights.

Bit algebra (DECODE_W 1): for a byte c = s·128 + e4·8 + m (E4M3 fn: sign, 4 exponent bits bias 7, 3
mantissa bits), the bf16 with bits (s << 15) | (e4 << 7) | (m << 4) = (s << 15) | ((c & 0x7F) << 4) is
exactly value(c)·2^-120: for e4 >= 1 it is the bf16 normal 2^(e4-127)·(1 + m/8) = 2^(e4-7)·(1 + m/8)·2^-120;
for e4 = 0 the bf16 subnormal (m << 4)·2^-133 = m·2^-129 = (m·2^-9)·2^-120, the E4M3 subnormal; ±0 stay
±0 (the NaN codes 0x7F/0xFF give ±480·2^-120, as the bit-arithmetic `e4m3_to_f32` does). On a word w:
  P = 0 (bytes 0, 2): ((w << 8) & 0x80008000) | ((w << 4) & 0x07F007F0)
  P = 1 (bytes 1, 3): (w & 0x80008000) | ((w >> 4) & 0x07F007F0)
(`e4m3_bf16x2_bits`; the PTX form is prmt (byte 2h+P to the low byte of half h, its sign replicated into
the high byte) then (<< 4) & 0x87F087F0: 3 instructions for either P). The block scale 2^(e-127) then is
2^(e-7) on these values, a bf16 normal for e <= 134 (field e + 120); beyond, it is split into the exact
powers of two f1 = 2^(min(e,134) - 7) and f2 = 2^(max(e,134) - 134) (value·f1 <= 448·2^7 is exact, ·f2
is the true product, inf where the float32 reference overflows; e = 255 makes f2 NaN like `e8m0_to_f32`).
Products are bf16 values (<= 4 significant bits) and exact for e >= 7; below that the smallest ones are
rounded to nearest even bf16 (as the DECODE_W 0 cast to bf16 does). The bf16 fma has no flush-to-zero
form, so subnormal inputs and results survive. Real checkpoints have e around 110..125, so each program
checks its own scale rows once (`_any_scale_above`) and runs a loop with only the f1 multiply unless
some e > 134 (two copies of the k loop, `TWO`). Interpreter / ROCm: the same bit assembly, each half
multiplied in float32 and rounded once to bf16 by integer arithmetic (identical results).

Register layout (DECODE_W 1): the wgmma/mma left operand gives lane q (lane id mod 4) the logical columns
{2q, 2q+1} + 8j of each 16-wide k step. With W = BK/4 words per row, memory word m = q·W/4 + s holds, for
byte P of half h, original k = 4m + 2h + P, placed at logical column P·BK/2 + 2(4s + q) + h: each bf16x2
register is one (2c, 2c+1) pair, a thread's words are contiguous (16-byte loads), and at BK = 128 they
are one 32-column scale block. Triton 3.6 keeps the reshape/permute register-only on sm90 (no shared-memory
round trip for the decoded tile; check with the SASS of `_gemm_variants("cuda:sm90", ...)`).

Split K: both decode paths (gemv and MMA) split K across programs so that the grid fills ONE wave of
the GPU's resident program slots (`_split_k`: DECODE_PROGRAMS_PER_SM × SMs, at least MIN_SPLIT_STEPS k
tiles a split); a split is a run of whole k tiles and need not divide K/BK (`split_bounds`). The last
program of each tile to arrive (`arrival.py`) adds the fp32 partials in split order and runs the
epilogue, inside the same launch (`FOLD`; the separate `splitk_reduce_kernel` remains and gives the
same bits).

Specialization keys: N, K (constexpr: the real linears of the published config, so the
ahead-of-time build knows every stride and vectorizes), mode (prefill / decode / gemv), BM, BN, BK,
GROUP_M, SPLIT_K, FOLD, NATIVE_FP8 (sm90/sm100/gfx950 have an FP8 cvt), GATED, DECODE_W (1: the caller
passes x with each BK block of columns in k_order_w(BK)), PTX (inline PTX allowed: CUDA), PDL, PIPE (gemv: the k loop's
pipeline stages).

Measured (H200, triton 3.6, `benchmarks/tune_fp8_decode.py` -> tuning/tune_fp8_decode_gemv.json,
CUDA-graph replay with the weights L2-warm): prefill 53–57% of the bf16 matmul rate (the E4M3 decode
+ scale multiply per weight element runs on the same SM as the MMA). One token, gemv path vs the
earlier MMA + reduce launch: wo_b 13.8 vs 20.2 µs (1.40× its bytes floor), wq_a 4.0 vs 7.3 µs
(2.56×), shared w2 4.9 vs 8.1 µs (1.75×), shared w1/w3 + SwiGLU 9.3 vs 15.6 µs (1.68×). Eight tokens
(MMA, folded): wo_b 21 µs (2.1×), wq_a 7.2 µs (4.6×), shared w2 8.4 µs (3.0×), shared w13 15.6 µs
(2.8×), engram wkv 73.5 µs (1.97×). With the L2 flushed before each replay (kernels_ffn.json):
wo_b one token 18.7 µs (1.89×), wq_a 6.2 µs, shared w13 15.0 µs; wo_b eight tokens 25.3 µs; engram wkv
at eight tokens, now with the word decoder, 63.5 µs (1.71×). The one-token gemv's k loop is not
pipelined (PIPE 1: Tried in fp8_gemv.py). Nsight Compute (tuning/ncu_decode_before.txt, L2 flushed) then showed the decode grids, at ~2 programs
per SM, filling 0.48-0.76 of one wave (wo_b one token: 320 programs, 2.4 of 16 warps per scheduler, DRAM
45 % busy, stalls on L1TEX scoreboards): sizing the split to fill one wave (tuning/tune_fp8_split.json, same
run, L2-cold) took wo_b one token 18.7 -> 15.7 µs (1.58×), shared w13 one token 15.2 -> 11.4 µs (2.05×),
wo_b eight tokens 25.3 -> 21.6 µs (2.15×), shared w13 eight tokens 19.8 -> 18.4 µs; a grid past the
528 resident slots is slower again (wo_b one token, 640 programs: 19.4 µs). Summing each thread's 16 consecutive products of a row before
the accumulator (SEG 16, the default since) halves the registers, 122 -> 63, so 8 programs fit an SM
instead of 4: L2-cold wo_b 15.9 -> 14.2 µs, shared w13 11.5 -> 10.3 µs (tuning/tune_fp8_gemv_seg.json). An
earlier static check had seen no saving (152 -> 165 registers): its ad-hoc compile gave the pointers no
16-byte alignment hint, so every weight byte was its own LDG.U8 and the sum crossed lanes; the JIT and
the ahead-of-time build (aot_compat.make_ast_source) both pass that hint, check SASS the same way.

Tried (measured slower, not kept; the one-token gemv's own list is in fp8_gemv.py):
- an FP8 × FP8 tensor-core path for act_quant (x quantized to E4M3 in its own launch, one E4M3 × E4M3 dot per
  32-column block, mma.sync or wgmma m64n16k32): no faster than fake quant + the bf16 kernel at 8 tokens, shared
  w13 18.6 vs 16.2 µs, shared w2 12.5 vs 12.4, wo_b 26.1 vs 21.3, wq_a 11.3 vs 10.9, engram wkv 84.4 vs 56.6
  (tuning/tune_fp8_w8a8.json); likely its 4 short dependent MMA-then-FMA chains a k step (not profiled).
- x's columns gathered in the kernel's own x load instead of DECODE_W 1's permutation launch: engram wkv 106 vs
  63 µs, wo_b 32.6 µs at 8 tokens (tuning/tune_fp8_xgather.json).
- the byte-pair decoder (bf16x2.e4m3_pairs_to_bf16) as a tensor-core tile decoder, natural k order: the same bits,
  slower on every linear at 8 tokens, L2-cold shared w1/w3 15.7 vs 13.1 µs, shared w2 11.9-12.0 vs 9.2-9.3, wo_b
  21.0 vs 17.5, wq_a 9.7-9.8 vs 9.3 (its k loop ~20 % shorter in SASS: not bound by the decode's count).
- an L2 bulk prefetch of the weight rows before the k loop: slower (fp8_gemv.py's Tried has the figures).

Known gaps: no FP8×FP8 tensor-core path (wgmma e4m3 / MFMA fp8) — activations that are
dynamically quantized still multiply in bf16 (same products; Tried).
UE8M0 byte 0 (2^-127) decodes to 2^-127 only through the subnormal constant. At 2–16
tokens the DECODE_W 0 loop spends 6.3 SASS instructions per weight element (sm90, triton 3.6, BN 64,
BK 128, 4 warps); DECODE_W 1 brings the one-multiply loop to 4.3 (the decode itself ~2.1: prmt, shl,
and per pair, one HMUL2 per pair), the rest is per-k-step wgmma/descriptor/pipeline overhead that a
larger BN amortizes (BN 128: 3.6). Yet on the H200 (L2-cold graph replay, tuning/tune_fp8_prefetch.json)
DECODE_W 1 is slower on every decode linear but the largest: wo_b M=8 31.3 vs 25.2 µs, wq_a 18.3 vs
9.0 µs, while engram wkv (157 M weights) takes 63.4 vs 73.5 µs — it costs one host-side permutation
launch over x per call plus a scale scan before the loop, which only a long decode amortizes, so it
is the default from DECODE_W_MIN_WEIGHTS on (gathering x in the kernel was slower still: Tried); fusing the
permutation into the producer of x is what would let it pay everywhere.
Its PTX path is exact (the `gpu` tests: all 256 codes × 24 scales, real widths vs float64). The split-K arrival counters are shared module state (see arrival.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, aot_spec, register
from dsv41c.codegen.triton import fp8_warp_split as ws
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter
from dsv41c.codegen.triton.bf16x2 import e4m3_words_to_bf16
from dsv41c.codegen.triton.codecs import e4m3_to_f32, e8m0_to_f32, expand_cols, fake_quant_e4m3_pow2
from dsv41c.codegen.triton.fp8_reference import (act_quant_fp8_reference, fp8_gemm_reference,  # noqa: F401
                                                 fp8_gemm_swiglu_reference)
from dsv41c.codegen.triton.fp8_gemv import GEMV_BK, GEMV_MAX_M, GEMV_PIPE, GEMV_SEG, _gemv_tiles, fp8_gemv, fp8_gemv_kernel
from dsv41c.codegen.triton.fp8_splitk import fold_splits, splitk_reduce_kernel, split_bounds, swiglu
from dsv41c.codegen.triton.fp8_tiles import (DECODE_BK, DECODE_PROGRAMS_PER_SM, DECODE_W_CUDA, DECODE_W_MIN_WEIGHTS,
                                             FOLD_SPLIT_K, _byte_distance, _check_w, _decode_tile, _decode_w,
                                             _decoder_x, _spf, _split_k, _stack, _tiles)
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c.codegen.triton.targets import (as_u8, dot_f32_for, interpreting, mma_sync_decode_for, native_fp8_for,
                                           ptx_for, sm_count, target_traits)
from dsv41c.codegen.triton.widths import PUBLISHED, dense_linears, gated_linears


@triton.jit
def fp8_gemm_kernel(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, y_ptr, part_ptr, cnt_ptr, M, limit, w3_off, s3_off,
                    N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, GATED: tl.constexpr, NATIVE_FP8: tl.constexpr,
                    DOT_F32: tl.constexpr, FOLD: tl.constexpr, DECODE_W: tl.constexpr, PTX: tl.constexpr,
                    PDL: tl.constexpr = False, SPF: tl.constexpr = False):
    """y = x·Wᵀ (GATED: y = silu(min(x·W1ᵀ, limit))·clamp(x·W3ᵀ, ±limit)); W E4M3 with UE8M0/32×32.

    Decode grids on sm90+: PDL waits for the previous kernel (pdl.py) before x or any store.

    GATED 2 (the stacked gated tile): a program's BN weight rows are BN/2 rows of W1 then the same BN/2 rows of W3,
    one tile and one dot; W3's rows are addressed as w_ptr + w3_off (ws_ptr + s3_off for its scales: the byte
    distances between the tensors, so the tile is one pointer tensor whose rows stay 16-byte aligned and contiguous
    along k, which a per-row select between two base pointers is not: there Triton dropped the vectorized cp.async
    weight loads for 71 small LDGs a k step, sm90 SASS). w3_off is a multiple of 16 (the launcher checks).

    x [M, K] and y [M, N] are contiguous. SPLIT_K > 1: program_id(1) takes a run of whole BK tiles of the
    reduction (`split_bounds`) and writes fp32 partials part[split, M, N] (GATED: [split, M, 2N], g then u); with
    FOLD the last of the SPLIT_K programs of a tile (arrival counter cnt[pid]) sums them in split
    order and runs the epilogue, otherwise `splitk_reduce_kernel` does in a second launch.
    DECODE_W 1: the weight tile is decoded from 32-bit words by bf16x2 bit assembly (`e4m3_words_to_bf16`,
    inline PTX if PTX) and x's columns must come in k_order_w(BK) per BK block (K % BK == 0)."""
    tl.static_assert(DECODE_W != 1 or (K % BK == 0 and BK % 32 == 0), "DECODE_W 1 needs K % BK == 0, BK % 32 == 0")
    tl.static_assert(SPLIT_K == 1 or K % BK == 0, "SPLIT_K > 1 needs K % BK == 0 (splits are runs of whole k tiles)")
    tl.static_assert(GATED != 2 or DECODE_W != 1, "the stacked gated tile (GATED 2) has no word decoder (DECODE_W 1)")
    BNO: tl.constexpr = BN // (1 + (GATED == 2))  # output columns of a program (GATED 2: half its weight rows)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    num_n = (N + BNO - 1) // BNO
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % gsize
    pid_n = (pid % (GROUP_M * num_n)) // gsize

    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BNO + tl.arange(0, BNO)
    m_ok = rm < M
    n_ok = rn < N
    if GATED == 2:  # weight rows of the tile: w1's rows rn, then w3's (up) rows rn
        rr = tl.arange(0, BN)
        rw = pid_n * BNO + rr % BNO
        up = rr >= BNO
        rw_ok = rw < N
    else:  # the weight rows are the output columns (up: all False, unused)
        rw, up, rw_ok = rn, rn < 0, n_ok
    k_lo, k_hi = split_bounds(split, K, BK, SPLIT_K)
    grid_wait(PDL)
    grid_release(PDL)
    if DECODE_W:
        # e > 134 needs the second bf16x2 scale factor; real checkpoints never have one, so the
        # program checks its own scale rows once and runs the one-multiply loop when it can
        if _any_scale_above(ws_ptr, ws3_ptr, pid_n, k_lo, k_hi, N, K, BNO, GATED != 0, 134):
            acc, acc3 = _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rw, up, m_ok, rw_ok,
                                    k_lo, k_hi, N, K, BM, BN, BK, SPLIT_K, GATED, NATIVE_FP8, DOT_F32, DECODE_W, PTX,
                                    True, SPF)
        else:
            acc, acc3 = _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rw, up, m_ok, rw_ok,
                                    k_lo, k_hi, N, K, BM, BN, BK, SPLIT_K, GATED, NATIVE_FP8, DOT_F32, DECODE_W, PTX,
                                    False, SPF)
    else:
        acc, acc3 = _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rw, up, m_ok, rw_ok, k_lo,
                                k_hi, N, K, BM, BN, BK, SPLIT_K, GATED, NATIVE_FP8, DOT_F32, DECODE_W, PTX, True, SPF)
    if GATED == 2:  # [BN, BM] = w1 rows then w3 rows -> g, u [BNO, BM]
        acc, acc3 = tl.split(tl.permute(tl.reshape(acc, (2, BNO, BM)), (1, 2, 0)))
    omask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:
        W2 = N * (1 + (GATED != 0))
        base = part_ptr + (split * M + rm.to(tl.int64))[:, None] * W2 + rn[None, :]
        tl.store(base, tl.trans(acc), mask=omask)
        if GATED:
            tl.store(base + N, tl.trans(acc3), mask=omask)
        if FOLD:
            if arrive_last(cnt_ptr + pid, SPLIT_K):
                fold_splits(part_ptr, y_ptr, rm, rn, M, limit, N, SPLIT_K, GATED != 0)
                reset_counter(cnt_ptr + pid)
    else:
        if GATED:
            acc = swiglu(acc, acc3, limit)
        tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], tl.trans(acc).to(y_ptr.dtype.element_ty),
                 mask=omask)


@triton.jit
def _any_scale_above(ws_ptr, ws3_ptr, pid_n, k_lo, k_hi, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                     GATED: tl.constexpr, LIMIT: tl.constexpr):
    """Whether any UE8M0 byte of this program's scale rows (W, and W3 if GATED) over its K split [k_lo, k_hi)
    (multiples of 32) exceeds LIMIT."""
    KS = (K + 31) // 32
    RB: tl.constexpr = (BN + 31) // 32 + 1  # scale rows a BN tile can touch (it need not start on a 32 row)
    RBP: tl.constexpr = triton.next_power_of_2(RB)
    rr = (pid_n * BN) // 32 + tl.arange(0, RBP)
    r_ok = (rr < (pid_n * BN + BN + 31) // 32) & (rr < (N + 31) // 32)
    mx = tl.zeros((RBP, 32), dtype=tl.int32)
    for c0 in range(k_lo // 32, k_hi // 32, 32):
        cc = c0 + tl.arange(0, 32)
        ok = r_ok[:, None] & (cc < k_hi // 32)[None, :]
        offs = rr[:, None] * KS + cc[None, :]
        mx = tl.maximum(mx, tl.load(ws_ptr + offs, mask=ok, other=0).to(tl.int32))
        if GATED:
            mx = tl.maximum(mx, tl.load(ws3_ptr + offs, mask=ok, other=0).to(tl.int32))
    return tl.max(tl.max(mx, axis=1), axis=0) > LIMIT


@triton.jit
def _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rn, up, m_ok, n_ok, k_lo, k_hi,
                N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                SPLIT_K: tl.constexpr, GATED: tl.constexpr, NATIVE_FP8: tl.constexpr, DOT_F32: tl.constexpr,
                DECODE_W: tl.constexpr, PTX: tl.constexpr, TWO: tl.constexpr, SPF: tl.constexpr = False):
    """fp8_gemm_kernel's k loop over this program's split [k_lo, k_hi): (acc, acc3) [BN, BM] fp32 = W-tile · x-tileᵀ.
    rn [BN]: the tile's weight rows; GATED 2 (stacked): row i is row rn[i] of W3 (at w_ptr + w3_off, scales at
    ws_ptr + s3_off) where up[i], else of W, one tile and one dot (acc3 unused). TWO (DECODE_W 1): apply the
    second scale factor (needed only where a UE8M0 byte exceeds 134).

    SPF: the UE8M0 scale bytes of the next k tile are loaded one iteration ahead (registers carried by the loop).
    Triton's pipeline takes the weight and x tiles through cp.async stages, but not the scale loads (2 bytes a
    thread: below cp.async's 4), so without SPF each k step issues its scale load and waits a whole global round
    trip for it before the decode (sm90 SASS: LDG.E.U16 at the top of the loop, consumed in the same
    iteration; Nsight Compute: long-scoreboard waits are 30-35 % of the 8-token kernels' cycles between a warp's
    instructions, the largest share)."""
    KS = (K + 31) // 32
    w_rows = rn.to(tl.int64)[:, None] * K
    s_rows = (rn // 32)[:, None] * KS
    if GATED == 2:  # one pointer tile over both matrices: W3's rows by their byte distance from W. The offset
        # is the 0/1 row flag times w3_off: a select between two pointers, or between w3_off and 0, lost the rows'
        # 16-byte contiguity in Triton's analysis (71 small LDGs a k step, sm90 SASS); the product kept it. The other
        # tiles' offsets and address expressions are unchanged (their sm90 k loops are the same as before the stacked
        # tile under Triton 3.6 and 3.9)
        w_rows = w_rows + (up.to(tl.int64) * w3_off)[:, None]
        s_rows = s_rows + (up.to(tl.int64) * s3_off)[:, None]
    x_rows = rm.to(tl.int64)[:, None] * K
    KW: tl.constexpr = K // 4
    w_words = w_ptr.to(tl.pointer_type(tl.uint32)) + rn.to(tl.int64)[:, None] * KW
    w3_words = w3_ptr.to(tl.pointer_type(tl.uint32)) + rn.to(tl.int64)[:, None] * KW
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    acc3 = tl.zeros((BN, BM), dtype=tl.float32)
    if SPF:  # the first k tile's scales, before the loop
        rs0 = k_lo // 32 + tl.arange(0, BK // 32)
        sm0 = n_ok[:, None] & (rs0[None, :] * 32 < k_hi)
        s_nxt = tl.load(ws_ptr + s_rows + rs0[None, :], mask=sm0, other=127)
        if GATED == 1:
            s3_nxt = tl.load(ws3_ptr + s_rows + rs0[None, :], mask=sm0, other=127)
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        if K % BK == 0:
            xm = m_ok[:, None]
            wm = n_ok[:, None]
        else:
            xm = m_ok[:, None] & (rk[None, :] < K)
            wm = n_ok[:, None] & (rk[None, :] < K)
        xt = tl.load(x_ptr + x_rows + rk[None, :], mask=xm, other=0.0)
        if DOT_F32:
            xt = xt.to(tl.float32)
        else:
            xt = xt.to(tl.bfloat16)
        # one scale byte per (row, 32 columns), expanded in registers (not one load per element)
        rs = k0 // 32 + tl.arange(0, BK // 32)
        if SPF:
            rsn = rs + BK // 32
            smn = n_ok[:, None] & (rsn[None, :] * 32 < k_hi)  # blocks that start inside the split: none after the last tile
            s_cur = s_nxt
            s_nxt = tl.load(ws_ptr + s_rows + rsn[None, :], mask=smn, other=127)
            if GATED == 1:
                s3_cur = s3_nxt
                s3_nxt = tl.load(ws3_ptr + s_rows + rsn[None, :], mask=smn, other=127)
        else:
            sm = n_ok[:, None] & (rs[None, :] < KS)
            s_cur = tl.load(ws_ptr + s_rows + rs[None, :], mask=sm, other=127)
            if GATED == 1:
                s3_cur = tl.load(ws3_ptr + s_rows + rs[None, :], mask=sm, other=127)
        if DECODE_W:
            # the decoded tile already is bf16 (fp32 under DOT_F32) with bf16 values: no cast before the dot
            rw = (k0 // 4 + tl.arange(0, BK // 4))[None, :]
            wt = e4m3_words_to_bf16(tl.load(w_words + rw, mask=n_ok[:, None], other=0), s_cur, BN, BK, PTX, DOT_F32,
                                    TWO)
            if DOT_F32:
                acc += tl.dot(wt, tl.trans(xt), input_precision="ieee")
            else:
                acc += tl.dot(wt, tl.trans(xt))
            if GATED == 1:
                wt3 = e4m3_words_to_bf16(tl.load(w3_words + rw, mask=n_ok[:, None], other=0), s3_cur, BN, BK, PTX,
                                         DOT_F32, TWO)
                if DOT_F32:
                    acc3 += tl.dot(wt3, tl.trans(xt), input_precision="ieee")
                else:
                    acc3 += tl.dot(wt3, tl.trans(xt))
        else:
            sc = expand_cols(e8m0_to_f32(s_cur), BN, BK // 32, 32)
            wt = e4m3_to_f32(tl.load(w_ptr + w_rows + rk[None, :], mask=wm, other=0), NATIVE_FP8) * sc
            if DOT_F32:
                acc += tl.dot(wt, tl.trans(xt), input_precision="ieee")
            else:
                acc += tl.dot(wt.to(tl.bfloat16), tl.trans(xt))
            if GATED == 1:
                sc3 = expand_cols(e8m0_to_f32(s3_cur), BN, BK // 32, 32)
                wt3 = e4m3_to_f32(tl.load(w3_ptr + w_rows + rk[None, :], mask=wm, other=0), NATIVE_FP8) * sc3
                if DOT_F32:
                    acc3 += tl.dot(wt3, tl.trans(xt), input_precision="ieee")
                else:
                    acc3 += tl.dot(wt3.to(tl.bfloat16), tl.trans(xt))
    return acc, acc3


@triton.jit
def act_quant_fp8_kernel(x_ptr, y_ptr, M, K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """y = dequant(quant_e4m3_pow2_per32(x)) for a [BR, BK] tile of contiguous x [M, K] (K % 32 == 0)."""
    rm = tl.program_id(0) * BR + tl.arange(0, BR)
    rk = tl.program_id(1) * BK + tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    offs = rm[:, None].to(tl.int64) * K + rk[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = fake_quant_e4m3_pow2(x, BR, BK)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# ============================================================================ launchers


def act_quant_fp8(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 32:
        raise ValueError(f"act_quant_fp8: K={x.shape[-1]} is not a multiple of 32")
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    M, K = x2.shape
    BR, BK = (16, 128) if not interpreting() else (8, 64)
    if M:
        act_quant_fp8_kernel[(triton.cdiv(M, BR), triton.cdiv(K, BK))](x2, y, M, K=K, BR=BR, BK=BK)
    return y.reshape(x.shape)


def _gemm(x, w, s, w3, s3, limit, act_quant, out_dtype, name, tiles=None, path=None, fold=None, decode_w=None,
          pdl=None, spf=None, stack=None, early_w=None):
    """Shared launcher. path: "gemv" (one token on the CUDA cores: fp8_gemv.py), "mma" (tensor cores), "warp_split"
    (decode, the K split over one program's warps: fp8_warp_split.py), or None (gemv for M <= GEMV_MAX_M when K
    tiles; warp_split where `fp8_warp_split.default_for` says so and none of the mma options below is given; else
    mma). fold: split-K epilogue inside the GEMM launch (last-arriver) instead of a second launch; default on. tiles
    overrides the path's tile tuple (sweeps): mma (BM, BN, BK, GROUP_M, SPLIT_K, num_warps, num_stages), gemv (BN,
    BK, SPLIT_K, num_warps, num_stages[, SEG]; SEG defaults to GEMV_SEG). decode_w: the mma path's weight decoder,
    0 or 1 (DECODE_W; 1 permutes x's columns to k_order_w(BK) here, once per call); None: `_decode_w`'s default.
    pdl: programmatic dependent launch (pdl.py); None: on for decode shapes on sm90+ CUDA devices. spf: the mma
    path's scale prefetch (`_mma_k_loop`); None: `_spf`'s default. stack (gated, mma path, per-element decoder): the
    stacked tile (GATED 2: a program's weight rows are BN/2 rows of w1 then the same BN/2 rows of w3, one dot, and
    the tiles and splits of a plain linear of 2N rows) instead of the paired one (BN rows of each, two dots);
    None: `_stack`'s default. early_w: the gemv path's EARLY_W (its first weight tile loaded before the PDL wait);
    None: GEMV_EARLY_W where the launch is PDL."""
    K = x.shape[-1]
    _check_w(w, s, K, name)
    if w3 is not None:
        _check_w(w3, s3, K, name)
        if w3.shape != w.shape:
            raise ValueError(f"{name}: w1 {tuple(w.shape)} and w3 {tuple(w3.shape)} differ")
    if act_quant:
        x = act_quant_fp8(x)
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], w.shape[0]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    gated = w3 is not None
    wu, su = as_u8(w), as_u8(s)
    w3u, s3u = (as_u8(w3), as_u8(s3)) if gated else (wu, su)
    mma_args = {k: v for k, v in (("tiles", tiles), ("fold", fold), ("decode_w", decode_w), ("spf", spf),
                                  ("stack", stack)) if v is not None}
    if path is None and M > GEMV_MAX_M and not mma_args and ws.default_for(x.device, M, N, K, gated):
        path = "warp_split"
    if path == "warp_split":
        if mma_args:
            raise ValueError(f"{name}: the warp-split path takes none of the mma path's options ({sorted(mma_args)})")
        return ws.fp8_gemm_warp_split(x2, w, s, w3, s3, limit, out_dtype or x.dtype, pdl=pdl,
                                      name=name).reshape(*x.shape[:-1], N)
    if path is None:
        path = "gemv" if M <= GEMV_MAX_M and _gemv_tiles(N, K, gated) is not None else "mma"
    if path == "gemv":
        if M != 1:
            raise ValueError(f"{name}: the gemv path takes one token, got M={M}")
        if fold is False or decode_w:
            raise ValueError(f"{name}: the gemv path always folds its split-K and has no weight decoder choice "
                             f"(fold={fold}, decode_w={decode_w})")
        fp8_gemv(x2, y, wu, su, w3u, s3u, gated, limit, name, tiles=tiles, pdl=pdl, early_w=early_w)
        return y.reshape(*x.shape[:-1], N)
    fold = FOLD_SPLIT_K if fold is None else fold
    words = _decode_w(decode_w, M, N, K, DECODE_BK, x.device) == 1
    mma_sync = mma_sync_decode_for(x.device)
    stacked = _stack(stack, gated, M, words, mma_sync, name)
    # the stacked tile plans over its 2N weight rows (one weight stream, one accumulator)
    BM, BN, BK, GM, SK, nw, ns = tiles or _tiles(M, 2 * N if stacked else N, K, gated, sm_count(x.device), words,
                                                  mma_sync, stacked)
    if SK > 1 and (K % BK or SK > K // BK):
        raise ValueError(f"{name}: SPLIT_K={SK} needs K={K} divisible by BK={BK} and at most K/BK splits: each "
                         "split is a run of whole k tiles")
    if stacked and BN % 2:
        raise ValueError(f"{name}: the stacked gated tile needs an even BN, got {BN}")
    dw = _decode_w(decode_w, M, N, K, BK, x.device)
    x2 = _decoder_x(x2, dw, BK)
    part = y if SK == 1 else torch.empty((SK, M, (2 if gated else 1) * N), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN // 2 if stacked else BN), SK)
    cnt = counters(x.device, grid[0]) if fold and SK > 1 else y  # prefill grids never touch (or grow) them
    # PDL on decode grids (M <= 16) only: prefill tiles are long anyway, and a separate reduce launch would have to
    # honour PDL's contract too
    dec = M <= 16 and (fold or SK == 1)
    pdl = pdl_for(x.device) and dec and (pdl is None or bool(pdl))  # never where the device has no PDL
    w3_off, s3_off = (_byte_distance(w3u, wu, 16, name), _byte_distance(s3u, su, 1, name)) if stacked else (0, 0)
    fp8_gemm_kernel[grid](x2, wu, su, w3u, s3u, y, part, cnt, M,
                          float(limit), w3_off, s3_off, N=N, K=K, BM=BM, BN=BN, BK=BK, GROUP_M=GM,
                          SPLIT_K=SK, GATED=2 if stacked else int(gated), NATIVE_FP8=native_fp8_for(x.device),
                          DOT_F32=dot_f32_for(x2), FOLD=fold and SK > 1, DECODE_W=dw, PTX=ptx_for(x.device), PDL=pdl,
                          SPF=_spf(spf, M <= 16, gated and not stacked), num_warps=nw, num_stages=ns,
                          **launch_kw(pdl))
    if SK > 1 and not fold:
        RB = 256 if interpreting() else 1024
        splitk_reduce_kernel[(M, triton.cdiv(N, RB))](part, y, M, float(limit), N=N, SPLIT_K=SK, GATED=gated,
                                                      BLOCK=RB, num_warps=4)
    return y.reshape(*x.shape[:-1], N)


def fp8_gemm(x, w, w_scale, act_quant: bool = False, out_dtype=None):
    """x [..., K] (bf16/fp32) · dequant(W)ᵀ -> [..., N]; W E4M3 [N, K], scale E8M0 [N/32, K/32]."""
    return _gemm(x, w, w_scale, None, None, 0.0, act_quant, out_dtype, "fp8_gemm")


def fp8_gemm_call(x, w, w_scale, *, mode: str, BN: int = 0, BK: int = 0, SPLIT_K: int = 1, num_warps: int = 4,
                  num_stages: int = 1, BM: int = 0, GROUP_M: int = 1, FOLD: bool = False, DECODE_W: int = 0,
                  SPF=None, GATED: int = 0, PIPE: int = 1, SEG: int = GEMV_SEG, **_):
    """A plan's `kernel.call @fp8_gemm`: x · dequant(W)ᵀ in x's dtype, launched as the call's variant says: mode
    `gemv` (one token, CUDA cores: BN, BK, SPLIT_K, PIPE, SEG) or `decode` / `prefill` (tensor cores: BM, BN, BK,
    GROUP_M, SPLIT_K, FOLD, DECODE_W, SPF), num_warps / num_stages, no programmatic dependent launch (the
    variants are built without it). Without the keys (a call from an older plan) `_gemm` chooses as for any
    caller. Still the launcher's: the split-K partials of an unfolded split and the arrival counters of a folded
    one (torch's allocator and arrival.py's pool, not plan values), and the native-FP8 / inline-PTX flags, read
    from the device the tensors are on."""
    if not BN:
        return _gemm(x, w, w_scale, None, None, 0.0, False, None, "fp8_gemm")
    if mode == "gemv":
        return _gemm(x, w, w_scale, None, None, 0.0, False, None, "fp8_gemm", path="gemv",
                     tiles=(BN, BK, SPLIT_K, num_warps, PIPE, SEG), pdl=False, early_w=False)
    if GATED:
        raise ValueError(f"fp8_gemm: a plain linear's call has GATED={GATED}")
    return _gemm(x, w, w_scale, None, None, 0.0, False, None, "fp8_gemm", path="mma",
                 tiles=(BM, BN, BK, GROUP_M, SPLIT_K, num_warps, num_stages), fold=bool(FOLD),
                 decode_w=int(DECODE_W), pdl=False, spf=SPF, stack=False)


def fp8_gemm_swiglu(x, w1, s1, w3, s3, limit: float, act_quant: bool = False, out_dtype=None):
    """Shared-expert gate/up: silu(min(x·W1ᵀ, limit)) · clamp(x·W3ᵀ, ±limit) -> [..., N]."""
    return _gemm(x, w1, s1, w3, s3, limit, act_quant, out_dtype, "fp8_gemm_swiglu")


# ============================================================================ ahead-of-time variants


def _gemm_types(act: str):
    return {"x_ptr": act, "w_ptr": "*u8", "ws_ptr": "*u8", "w3_ptr": "*u8", "ws3_ptr": "*u8", "y_ptr": act,
            "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "limit": "fp32",
            "w3_off": "i64", "s3_off": "i64"}


def _gemm_variants(target: str, gated: bool, widths=PUBLISHED) -> list:
    """Per linear: `decode` (M <= 16, tensor cores, split-K folded into the launch), `gemv` (one
    token, CUDA cores, split-K folded) and `prefill` variants."""
    tr = target_traits(target)
    if tr is None:
        return []
    shapes = gated_linears(widths) if gated else dense_linears(widths)
    out = []
    for name, (N, K) in shapes.items():
        for mode in ("decode", "prefill"):
            # DECODE_W 1 (the decode mode on CUDA for the largest linears): the caller permutes x to k_order_w(BK)
            dw = DECODE_W_CUDA if (mode == "decode" and tr["kind"] == "cuda" and K % DECODE_BK == 0
                                   and N * K >= DECODE_W_MIN_WEIGHTS) else 0
            stacked = False
            if mode == "decode":
                mma_sync = tr["kind"] == "cuda" and tr["arch"] == 90
                stacked = _stack(None, gated, 1, dw == 1, mma_sync)
                BN, nw, kind = _decode_tile(gated, dw == 1, mma_sync, stacked)
                BM, BK, GM, ns = 16, DECODE_BK, 1, (4 if tr["big_tiles"] else 2)
                SK = _split_k(1, 2 * N if stacked else N, K, BN, BK, DECODE_PROGRAMS_PER_SM[kind])
            elif tr["big_tiles"]:
                BM, BN, BK, GM, SK, nw, ns = 128, 128, 64, 8, 1, 8, 3
            else:  # sm80 / gfx1100: smaller shared memory / register budget
                BM, BN, BK, GM, SK, nw, ns = 64, 128, 64, 8, 1, 4, 2
            if gated and mode == "prefill":
                BN = 64  # two accumulators
            ce = {"N": N, "K": K, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": GM, "SPLIT_K": SK,
                  "GATED": 2 if stacked else int(gated), "NATIVE_FP8": tr["native_fp8"], "DOT_F32": False,
                  "FOLD": SK > 1, "DECODE_W": dw, "PTX": tr["kind"] == "cuda", "PDL": False,
                  "SPF": _spf(None, mode == "decode", gated and not stacked)}
            keys = {"linear": name, "mode": mode, "act": "bf16", **ce}
            # fewer than 4 warps: mma.sync on purpose on Hopper (`_decode_tile`)
            mx = "mma.sync" if tr["kind"] == "cuda" and nw < 4 else None
            # the stacked tile's W3 offset: the runtime passes a multiple of 16 (as `_byte_distance` checks)
            out.append(aot_spec(fp8_gemm_kernel, f"{name}_{mode}", _gemm_types("*bf16"), ce, nw, ns, keys, matrix=mx,
                                divisible={"w3_off": 16} if stacked else None))
        if K % GEMV_BK == 0:
            BN = 32 if gated else 64
            SK = _split_k(1, N, K, BN, GEMV_BK, DECODE_PROGRAMS_PER_SM["gemv"])
            ce = {"N": N, "K": K, "BN": BN, "BK": GEMV_BK, "SPLIT_K": SK, "GATED": gated,
                  "NATIVE_FP8": tr["native_fp8"], "PDL": False, "PIPE": GEMV_PIPE, "SEG": GEMV_SEG,
                  "EARLY_W": False}
            types = {k: v for k, v in _gemm_types("*bf16").items() if k not in ("M", "w3_off", "s3_off")}
            out.append(aot_spec(fp8_gemv_kernel, f"{name}_gemv", types, ce, 4, GEMV_PIPE,
                                {"linear": name, "mode": "gemv", "act": "bf16", **ce}))
    return out


def _act_quant_variants(target: str, widths=PUBLISHED) -> list:
    if target_traits(target) is None:
        return []
    out = []
    for K in sorted({k for _, k in dense_linears(widths).values()} | {widths.moe_intermediate_size}):
        ce = {"K": K, "BR": 16, "BK": 128}
        out.append(aot_spec(act_quant_fp8_kernel, f"k{K}", {"x_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32"}, ce, 4, 1,
                            {"act": "bf16", **ce}))
    return out


register(KernelTemplate(
    name="fp8_gemm", module=__name__,
    summary="x · dequant(E4M3 W, UE8M0 32×32)ᵀ, fp32 accumulate (dense linears)",
    keys=("linear", "N", "K", "mode", "act", "BM", "BN", "BK", "GROUP_M", "SPLIT_K", "NATIVE_FP8", "GATED",
          "DOT_F32", "FOLD", "DECODE_W", "PTX", "PDL", "PIPE", "SEG", "SPF", "EARLY_W"),
    reference=fp8_gemm_reference, launch=fp8_gemm,
    specializations=lambda t, widths=PUBLISHED: _gemm_variants(t, False, widths)))
register(KernelTemplate(
    name="fp8_gemm_swiglu", module=__name__,
    summary="shared expert gate/up: silu(min(x·W1ᵀ, L))·clamp(x·W3ᵀ, ±L), FP8 weights",
    keys=("linear", "N", "K", "mode", "act", "BM", "BN", "BK", "GROUP_M", "SPLIT_K", "NATIVE_FP8", "GATED",
          "DOT_F32", "FOLD", "DECODE_W", "PTX", "PDL", "PIPE", "SEG", "SPF", "EARLY_W"),
    reference=fp8_gemm_swiglu_reference, launch=fp8_gemm_swiglu,
    specializations=lambda t, widths=PUBLISHED: _gemm_variants(t, True, widths)))
register(KernelTemplate(
    name="act_quant_fp8", module=__name__,
    summary="dynamic per-32 E4M3 fake quant of activations (pow2 scales)",
    keys=("act", "K", "BR", "BK"), reference=act_quant_fp8_reference, launch=act_quant_fp8,
    specializations=_act_quant_variants))
