"""The one-token FP8 linear on the CUDA cores: `fp8_gemv_kernel` and its launcher.

What: y[1, N] = x[1, K] · W[N, K]ᵀ (or the shared expert's SwiGLU pair) with W in E4M3 codes and one UE8M0 scale
per 32×32 block, for the decode step's one token (fp8_gemm.py's `_gemm` routes M <= GEMV_MAX_M here).

Algorithm: no tensor-core padding to 16 rows; the weight tile is read as [BN/32 row groups, 32, BK] so that one
UE8M0 scale per (row group, 32 columns) multiplies the activation, not each weight element (w·(x·s) equals
(w·s)·x exactly in fp32: s is a power of two): 3.5 SASS instructions per weight element against 6.3 in the
tensor-core loop. Each thread sums its 16 consecutive products of a row before the accumulator (GEMV_SEG), which
halves the registers (122 -> 63, sm90 SASS, Triton 3.6) so that 8 programs fit an SM instead of 4. K is split so
the grid fills one wave of the resident program slots (fp8_tiles._split_k); the last split to arrive sums the
partials in split order and runs the epilogue (fp8_splitk.fold_splits), one launch for the whole linear. Under PDL
the split's first weight tile is loaded before the grid-dependency wait (EARLY_W).

Measured (H200, triton 3.6, CUDA-graph replay, L2-cold): wo_b 14.2 µs (1.43× its bytes floor), shared w1/w3 +
SwiGLU 10.3 µs, shared w2 7.1 µs, wq_a 6.0 µs (tuning/tune_fp8_gemv_seg.json).

Tried (measured slower, not kept):
- a software-pipelined k loop (PIPE 2-4 cp.async stages): wo_b 18.5 -> 28.6 µs, shared w13 14.9 -> 21.1 µs
  L2-cold (+1.5 SASS instructions a weight element for the staging; tuning/tune_fp8_decode.json).
- E4M3 decoded from 32-bit words by integer arithmetic, x as int64 words of four bf16, two k steps prefetched by
  hand (4.9 instructions an element, no shared memory): wo_b 16.0, shared w13 11.8, shared w2 8.5, wq_a 6.7 µs
  against 15.6 / 11.4 / 7.1 / 6.1 (tuning/tune_fp8_gemv_words.json).
- a register prefetch of the next k tile, BK 64 or 128, 3-4 programs an SM, with or without a register cap: every
  prefetching variant 18-81 % slower; the cap alone (maxnreg 128 at BK 128) equal for wo_b, 2.5-5 % slower for the
  others (tuning/tune_fp8_rpf.json).
- an L2 bulk prefetch of each program's weight rows (l2_prefetch.py): wo_b 18.6 -> 20.2 µs (64 KB a program) /
  22.2 µs (the whole split), shared w13 15.0 -> 18.4 µs (tuning/tune_fp8_prefetch.json): the programs' own loads already
  keep HBM busy.

Known gaps: needs K % BK == 0 and BN % 32 == 0 (checked); on a GPU the fp32 sum order of SEG 16 differs from one
accumulator per element (last-bit differences).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter
from dsv41c.codegen.triton.codecs import e4m3_to_f32, e8m0_to_f32
from dsv41c.codegen.triton.fp8_splitk import fold_splits, split_bounds, swiglu
from dsv41c.codegen.triton.fp8_tiles import DECODE_PROGRAMS_PER_SM, _split_k
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c.codegen.triton.targets import N_SMS_HINT, interpreting, native_fp8_for, sm_count


@triton.jit
def fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, y_ptr, part_ptr, cnt_ptr, limit,
                    N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                    GATED: tl.constexpr, NATIVE_FP8: tl.constexpr, PDL: tl.constexpr = False,
                    PIPE: tl.constexpr = 1, SEG: tl.constexpr = 0,
                    EARLY_W: tl.constexpr = False):
    """One token (M = 1): y = x·Wᵀ on the CUDA cores, no tensor-core padding to 16 rows.

    EARLY_W: the split's first k tile of weight bytes and scale bytes (static data) is loaded before the grid
    dependency wait, and the loop runs from the second tile; under PDL those loads overlap the predecessor.

    PDL: the grid dependency wait (pdl.py) comes before x or any store.

    The weight tile is read as [BN/32 row groups, 32, BK] so that one UE8M0 scale per (row group,
    32 columns) multiplies the ACTIVATION (BN/32 · BK products per step) instead of every weight
    element: w·(x·s) equals (w·s)·x exactly in fp32 (s is a power of two). Per weight element that
    leaves the E4M3 -> fp32 cvt and one FMA; the fp32 partial products stay elementwise in
    registers ([BN, BK] accumulator) and are reduced along K once, after the loop. PIPE >= 2 asks
    Triton to pipeline the k loop's loads (cp.async, PIPE stages). K is split over
    program_id(1); the last arriving split (cnt[pid_n]) sums the partials in split order and runs
    the epilogue (`fold_splits`), so one launch does the whole linear. Needs K % BK == 0 and
    BN % 32 == 0 (checked by the launcher).

    SEG (0, or a power of two up to 16 that divides BK; the launcher checks): 0 keeps one fp32 accumulator
    per tile element; SEG n sums each run of n consecutive products of a row first (inside one thread: Triton gives a thread 16 contiguous
    weight bytes, one 16-byte load, when the pointers carry their 16-byte alignment hint) into a
    [RG, 32, BK/n] accumulator, which halves the registers at n = 16 (GEMV_SEG). The fp32 sum order
    differs between the two (last-bit differences)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    RG: tl.constexpr = BN // 32
    KS: tl.constexpr = K // 32
    k_lo, k_hi = split_bounds(split, K, BK, SPLIT_K)
    g = pid_n * RG + tl.arange(0, RG)  # 32-row groups (= scale rows)
    r = tl.arange(0, 32)
    rn3 = g[:, None, None] * 32 + r[None, :, None]  # [RG, 32, 1]
    n_ok3 = rn3 < N
    kk = tl.arange(0, BK)
    sk = tl.arange(0, BK // 32)
    w_rows = rn3.to(tl.int64) * K
    AK: tl.constexpr = BK // SEG if SEG else BK
    acc = tl.zeros((RG, 32, AK), dtype=tl.float32)
    acc3 = tl.zeros((RG, 32, AK), dtype=tl.float32)
    if EARLY_W:
        g_ok0 = g[:, None] < (N + 31) // 32
        s_off0 = g[:, None] * KS + k_lo // 32 + sk[None, :]
        sb0 = tl.load(ws_ptr + s_off0, mask=g_ok0, other=127)
        wb0 = tl.load(w_ptr + w_rows + k_lo + kk[None, None, :], mask=n_ok3, other=0)
        if GATED:
            sb30 = tl.load(ws3_ptr + s_off0, mask=g_ok0, other=127)
            wb30 = tl.load(w3_ptr + w_rows + k_lo + kk[None, None, :], mask=n_ok3, other=0)
    grid_wait(PDL)
    grid_release(PDL)
    if EARLY_W:  # the first tile, from the bytes loaded before the wait (the loop's arithmetic, in its order)
        x = tl.load(x_ptr + k_lo + kk).to(tl.float32)
        xs = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                        e8m0_to_f32(sb0)[:, :, None], (RG, 1, BK))
        acc = _add_products(acc, e4m3_to_f32(wb0, NATIVE_FP8) * xs, RG, AK, SEG)
        if GATED:
            xs3 = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                             e8m0_to_f32(sb30)[:, :, None], (RG, 1, BK))
            acc3 = _add_products(acc3, e4m3_to_f32(wb30, NATIVE_FP8) * xs3, RG, AK, SEG)
        k_lo += BK
    # PIPE >= 2 asks Triton to pipeline the k loop's loads (PIPE stages of cp.async into shared memory; it
    # pipelines loads that feed no tl.dot only when the loop asks). The default, 1, does not: measured faster
    # (GEMV_PIPE).
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=PIPE):
        x = tl.load(x_ptr + k0 + kk).to(tl.float32)
        s_off = g[:, None] * KS + k0 // 32 + sk[None, :]  # [RG, BK/32]
        g_ok = g[:, None] < (N + 31) // 32
        xs = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                        e8m0_to_f32(tl.load(ws_ptr + s_off, mask=g_ok, other=127))[:, :, None], (RG, 1, BK))
        w = e4m3_to_f32(tl.load(w_ptr + w_rows + k0 + kk[None, None, :], mask=n_ok3, other=0), NATIVE_FP8)
        acc = _add_products(acc, w * xs, RG, AK, SEG)
        if GATED:
            xs3 = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                             e8m0_to_f32(tl.load(ws3_ptr + s_off, mask=g_ok, other=127))[:, :, None], (RG, 1, BK))
            w3 = e4m3_to_f32(tl.load(w3_ptr + w_rows + k0 + kk[None, None, :], mask=n_ok3, other=0), NATIVE_FP8)
            acc3 = _add_products(acc3, w3 * xs3, RG, AK, SEG)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    y1 = tl.reshape(tl.sum(acc, axis=2), (BN,))
    if SPLIT_K == 1:
        if GATED:
            y1 = swiglu(y1, tl.reshape(tl.sum(acc3, axis=2), (BN,)), limit)
        tl.store(y_ptr + rn, y1.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        W2 = N * (1 + GATED)
        tl.store(part_ptr + split * W2 + rn, y1, mask=n_ok)
        if GATED:
            tl.store(part_ptr + split * W2 + N + rn, tl.reshape(tl.sum(acc3, axis=2), (BN,)), mask=n_ok)
        if arrive_last(cnt_ptr + pid_n, SPLIT_K):
            fold_splits(part_ptr, y_ptr, tl.arange(0, 1), rn, 1, limit, N, SPLIT_K, GATED)
            reset_counter(cnt_ptr + pid_n)


@triton.jit
def _add_products(acc, prod, RG: tl.constexpr, AK: tl.constexpr, SEG: tl.constexpr):
    """fp8_gemv_kernel's accumulate: prod [RG, 32, BK] into acc [RG, 32, AK], each run of SEG products summed
    first (inside a thread) when SEG, else elementwise (AK = BK)."""
    if SEG:
        out = acc + tl.sum(tl.reshape(prod, (RG, 32, AK, SEG)), axis=3)
    else:
        out = acc + prod
    return out

GEMV_MAX_M = 1  # tokens that take the CUDA-core path (fp8_gemv_kernel)

GEMV_BK = 128  # its k tile


# its first weight tile loaded before the PDL wait (the kernel's EARLY_W; PDL launches only). H200, L2-cold, behind
# a norm (benchmarks/step_chain.py, tuning/step_chain_early_w.json, twice, interleaved, the same bits): what the
# linear adds to the step, PDL -> PDL + EARLY_W: wq_a 3.89 / 4.01 -> 3.65 / 3.78 µs, wo_b 11.98 / 12.19 -> 11.75 /
# 11.81, shared w1/w3 8.39 / 8.21 -> 7.80 / 8.14; alone (no predecessor) wq_a 5.84 / 6.02 -> 6.32 / 6.40, the
# others level. A decode step always has the predecessor, so it is on.
GEMV_EARLY_W = True

GEMV_PIPE = 1  # its k loop's pipeline stages (the kernel's PIPE); 2-4 were slower on the H200 (tuning/tune_fp8_decode.json)


# Its accumulator: 0 = one fp32 per weight element of the [BN, BK] tile (122 registers a thread, sm90 SASS, Triton
# 3.6); n = each thread's n consecutive products of a row summed first, one fp32 per n elements (63 registers: 8
# programs an SM instead of 4, so twice the weight bytes in flight). H200, L2-cold graph replay, interleaved with
# the old default (tuning/tune_fp8_gemv_seg.json): wo_b 15.9 -> 14.2 µs, shared w13 11.5 -> 10.3, shared w2
# 7.3 -> 7.1, wq_a 6.1 -> 6.0 (no gain: 20 tiles × 20 splits, capped by MIN_SPLIT_STEPS).
GEMV_SEG = 16


def _gemv_tiles(N: int, K: int, gated: bool = False, sms: int = N_SMS_HINT):
    """(BN, BK, SPLIT_K, num_warps, num_stages) of the one-token CUDA-core path, or None if K does not tile.
    num_stages is the k loop's pipeline (the kernel's PIPE: 1 none, n >= 2 Triton's n-stage cp.async).
    The accumulators live in registers: with GEMV_SEG 16, one [BN, BK/16] fp32 accumulator per weight matrix
    (64×128 tiles, or 32×128 gated with two matrices) keeps a thread at 63 registers (sm90 SASS, Triton 3.6),
    8 programs an SM."""
    BN, BK = (32, 64) if interpreting() else ((32 if gated else 64), GEMV_BK)
    if K % BK:
        return None
    SK = 2 if interpreting() and K % (2 * BK) == 0 else _split_k(1, N, K, BN, BK, DECODE_PROGRAMS_PER_SM["gemv"], sms)
    return BN, BK, SK, 4, GEMV_PIPE


def fp8_gemv(x2, y, wu, su, w3u, s3u, gated: bool, limit: float, name: str, tiles=None, pdl=None, early_w=None):
    """y [1, N] = the linear of x2 [1, K] (bytes wu / su, and w3u / s3u if gated), launched on x2's device. tiles:
    (BN, BK, SPLIT_K, num_warps, num_stages[, SEG]) instead of `_gemv_tiles`' (sweeps); pdl: None = where the device
    has it; early_w: None = GEMV_EARLY_W under PDL."""
    N, K = y.shape[1], x2.shape[1]
    BN, BK, SK, nw, ns, *seg = tiles or _gemv_tiles(N, K, gated, sm_count(x2.device)) or (0, 0, 0, 0, 0)
    if len(seg) > 1:
        raise ValueError(f"{name}: gemv tiles are (BN, BK, SPLIT_K, num_warps, num_stages[, SEG]), got {tiles}")
    seg = seg[0] if seg else GEMV_SEG
    if not BK or K % BK or not 1 <= SK <= K // BK or BN % 32:
        raise ValueError(f"{name}: gemv path needs K={K} divisible by BK={BK}, 1 <= SPLIT_K={SK} <= K/BK and "
                         f"BN={BN} % 32 == 0")
    if seg and (seg & (seg - 1) or BK % seg or seg > 16):
        raise ValueError(f"{name}: gemv SEG={seg} must be a power of two <= 16 that divides BK={BK}")
    part = torch.empty((SK, 1, (2 if gated else 1) * N), dtype=torch.float32, device=x2.device) if SK > 1 else y
    grid = (triton.cdiv(N, BN), SK)
    cnt = counters(x2.device, grid[0]) if SK > 1 else y  # no counters touched without a split
    pdl = pdl_for(x2.device) and (pdl is None or bool(pdl))  # never where the device has no PDL
    fp8_gemv_kernel[grid](x2, wu, su, w3u, s3u, y, part, cnt, float(limit),
                          N=N, K=K, BN=BN, BK=BK, SPLIT_K=SK, GATED=gated,
                          NATIVE_FP8=native_fp8_for(x2.device), PDL=pdl, PIPE=ns, SEG=seg,
                          EARLY_W=(GEMV_EARLY_W and pdl) if early_w is None else bool(early_w),
                          num_warps=nw, num_stages=ns, **launch_kw(pdl))
    return y
