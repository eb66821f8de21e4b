"""FP8 decode GEMM with the K split across the warps of one program (no split-K round trip through memory).

What: y[M, N] = x[M, K] · dequant(W)ᵀ for decode shapes (M <= 16 tokens), W E4M3 [N, K] with one UE8M0 scale per
32×32 block, fp32 accumulation; GATED: the shared expert's gate/up pair, y = silu(min(x·W1ᵀ, L))·clamp(x·W3ᵀ, ±L),
on a stacked tile (a program's RB weight rows are RB/2 rows of W1 then the same RB/2 rows of W3, W3 addressed
from W's pointer by its byte distance, as `fp8_gemm`'s GATED 2).

Why: at 8 tokens `fp8_gemm`'s decode tile splits K over 7-8 programs per output tile (wq_a 20) and folds the partials
with a last-arriver epilogue (arrival.py). Nsight Compute of the shared w1/w3 GEMM at 8 tokens
(`tuning/ncu_fp8_warp_split_w13_M8_source.txt`) puts ~20 % of its warps' samples in that epilogue: the partial stores, the
release fence (ERRBAR / CCTL.IVALL), the atomic ticket's round trip that every thread waits for at a barrier, and
the last program's re-read of the partials; in a grid of one wave it is on the critical path of every program.

Algorithm: one program per RB weight rows (RB = 16: one mma.sync M tile). Its S warps each take one contiguous
slice of K (K / S elements): the weight tile of a k step is [S, RB, BK] (slice s at k = s·K/S + i·BK), decoded
to bf16 with `fp8_gemm`'s DECODE_W 0 numerics (E4M3 value × the block scale, exact), on CUDA by default two codes a
register in inline PTX (PAIRS: prmt / shl / and and one bf16x2 multiply, two where a scale byte exceeds 134: TWO
below; the same bits), else per element
(E4M3 -> fp32 × scale -> bf16), and multiplied by
x's matching [S, BK, BM] tile in ONE batched `tl.dot` whose batch dimension Triton spreads over the warps (a rank-3
dot gives every warp its own batch entries: warpsPerCTA [S, 1, 1]); so each warp runs an independent k loop over
its slice, pipelined through cp.async stages like the 2-D tile. The S partial products are then summed over the
batch axis, a cross-warp reduction through shared memory inside the program: no partial leaves the SM, no fence,
no atomic, no second pass. Deterministic (fixed reduction tree); the sum's association differs from fp8_gemm's
split order, so the two paths agree to fp32 rounding, not bit for bit.

SPF: the next k step's UE8M0 bytes are loaded one iteration ahead (as fp8_gemm's `_mma_k_loop`). Nsight Compute of
the shared w1/w3 GEMM at 8 tokens without it (tuning/ncu_fp8_warp_split_w13_M8_no_spf_source.csv): each of a
warp's 10 k steps issues an LDG.E.U16 for the scale bytes (1-2 bytes a thread: below cp.async's 4, so Triton's
pipeline leaves them out) and waits for it, then round-trips it through shared memory into the decode's layout
behind a barrier: that barrier (13 % of samples), the STS (9 %) and the LDG (6 %) were the three hottest
instructions. With SPF and 256-wide k tiles the barrier is 2 %, 29 % of the
samples issue, and the largest wait (11 %) is the prologue's first scale load; the kernel time barely moved for
shared w1/w3 (12.4 -> 12.2-12.3 µs) and fell for shared w2 (8.4 -> 7.7-8.1) and wo_b (16.4 -> 16.0-16.1).

TWO: the byte-pair decoder scales a code pair by one bf16x2 factor 2^(e-7), exact for UE8M0 bytes
e <= 134 (`fp8_gemm`'s bit algebra); a second factor makes every byte exact, which no real checkpoint needs (their
bytes are about 110-125). The launcher checks each scale tensor once on the host (`scales_above_134`, cached by tensor
and version) and drops the second factor where it can: sm90 SASS (Triton 3.6) of shared w1/w3's k step 663 -> 518
instructions (wo_b 585 -> 482), and L2-cold at 8 tokens (tuning/tune_fp8_warp_split_two2.json, twice, interleaved)
shared w1/w3 12.55 / 12.58 -> 10.92 / 10.89 µs, shared w2 7.89 / 7.87 -> 7.17 / 7.19 (with EARLY), wq_a 6.80 / 6.81
-> 6.55 / 6.19, wo_b 16.00 / 15.96 -> 14.76 / 14.89. The bits do not change. EARLY turns the bytes into that
factor where they are loaded, so the factor rather than the byte moves into the decode's layout: fewer instructions on the gated tile
(518 -> 488) yet slower there; faster on shared w2 only (EARLY_LINEARS).

Constraints: K % BK == 0 and BK % 32 == 0 (whole k tiles, and each 32-wide scale block sits inside one k tile); S a
power of two. The launcher checks and names the violation. Where the K / BK tiles do not split evenly over the S
warps (RAGGED), each warp takes ceil(tiles / S) steps and a step past its slice is masked (it adds +0); where they
do, the code is the same as without the option (sm90 SASS compared).

PDL (benchmarks/step_chain.py): in a decode step the kernel is PDL-launched behind the
kernel that produces x (shared w2 behind the gated w1/w3, wq_a behind the norm). What it then adds to the step,
L2-cold (results/step_chain.json, twice, interleaved): shared w2 at 8 tokens 6.5-6.8 µs serialized ->
**5.2** with PDL (alone 7.2-7.4), within its 5.65 µs budget; wq_a at 8 tokens 5.8-5.9 -> 4.2-4.6.

Tried (measured slower, not kept):
- an 8-row tile (the weights as the dot's N operand, x its M: twice the programs, to even out 2 vs 3 programs an
  SM): 27-65 % slower on all four linears, shared w1/w3 17.7-19.7 µs against 12.3-12.5
  (tuning/tune_fp8_warp_split_rows8.json).
- a per-program check of the scale rows in the kernel instead of TWO's host check (two copies of the k loop, as
  `fp8_gemm` does): 1.5-1.7x slower than either loop alone on shared w1/w3 and wo_b, 1.04-1.2x on shared w2 and
  wq_a (tuning/tune_fp8_warp_split_two.json).
- ragged and other tiles on shared w2: none beat `tiles_for`'s (tuning/tune_fp8_warp_split_ragged.json).
- an L2 bulk prefetch of the program's weight rows before the grid wait: 1 KB a row shared w2 6.0-6.1, wq_a 4.6-4.7
  µs against 5.2 and 4.2-4.6 with PDL; whole rows 5.9-6.3 / 5.7-5.9 (results/step_chain.json).
- x loaded through the L1 (cp.async.ca at 8 / 4 bytes a thread): 0-62 % slower
  (tuning/tune_fp8_warp_split_xe.json).

Known gaps: the x tile is loaded per slice (S·BK·BM·2 bytes a step, from the L2), so x's shared-memory stages are as
large as the weights' at BM 8 (through the L1 was slower: Tried); one program per 16 rows gives 288 programs for
shared w1/w3 and 320 for w2 (2.2 and 2.4 an SM on 132 SMs), so SMs hold 2 or 3 programs (no balancing across them). Decode shapes only
(M <= 16); CUDA and the interpreter. No ROCm variant: Triton 3.9 lowers the rank-3 dot to FMA loops on gfx942 / gfx950 (compiled
offline, `benchmarks/results/aot_warp_split.json`), so ROCm keeps fp8_gemm's decode tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.utils.weak import WeakIdKeyDictionary

from dsv41c.codegen.templates import KernelTemplate, aot_spec, register
from dsv41c.codegen.triton.bf16x2 import E4M3_PAIRS_ONE, E4M3_PAIRS_TWO, e4m3_one_factor, e4m3_pair_factors
from dsv41c.codegen.triton.codecs import e4m3_to_f32, e8m0_to_f32
from dsv41c.codegen.triton.fp8_reference import fp8_gemm_reference, fp8_gemm_swiglu_reference
from dsv41c.codegen.triton.fp8_splitk import swiglu
from dsv41c.codegen.triton.fp8_tiles import _byte_distance, _check_w
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c.codegen.triton.targets import (as_u8, dot_f32_for, mma_sync_decode_for, native_fp8_for, ptx_for,
                                           target_traits)
from dsv41c.codegen.triton.widths import PUBLISHED, dense_linears, gated_linears

WARP_SPLIT_DECODE = True  # fp8_gemm's default decode path for 2..WARP_SPLIT_MAX_M tokens where `default_for` agrees
# the byte-pair decoder (inline PTX) where the device takes it: the per-element decoder's bits, and level or faster on
# all four measured linears (tuning/tune_fp8_warp_split_pairs.json, H200, 8 tokens, L2-cold, twice, interleaved:
# shared w1/w3 12.42-12.48 µs against 12.56-12.80, shared w2 8.33-8.38 against 8.37-8.41, wq_a 6.80-7.08 against
# 7.25-7.29, wo_b 16.47-16.51 against 17.32-17.36)
PAIRS_DEFAULT = True
# the k loop's scale prefetch (SPF), with `tiles_for`'s tiles: level or faster on all four
# (tuning/tune_fp8_warp_split_spf.json, H200, 8 tokens, L2-cold, twice, interleaved against the loop without it): shared w2
# 7.82 / 8.06 µs against 8.41 / 8.34, wo_b (BK 256) 16.03 / 16.07 against 16.37 / 16.40, shared w1/w3 (BK 256)
# 12.24 / 12.34 against 12.37 / 12.42, wq_a 6.90 / 6.91 against 6.90 / 6.90 (at BK 128, 3 stages: w1/w3 12.56 /
# 12.51, wo_b 16.52 / 16.41)
SPF_DEFAULT = True
# the linears whose byte-pair decoder makes its one scale factor where the bytes are loaded (EARLY): measured, not
# counted (tuning/tune_fp8_warp_split_two2.json, H200, 8 tokens, L2-cold, twice, interleaved): shared w2 7.17 / 7.19
# µs early against 7.50 / 7.38 in the loop; shared w1/w3 the other way, 11.49 / 11.58 against 10.92 / 10.89, though
# its sm90 k step is 488 instructions early against 518 (Triton 3.6); wo_b 15.46 / 15.40 against 14.76 / 14.89;
# wq_a level (6.49 / 6.64 against 6.55 / 6.19)
EARLY_LINEARS = ("shared_w2",)
# measured at 8 tokens (BM 8: the same kernel from 2 to 8 tokens); 9-16 tokens double x's tile: not measured
WARP_SPLIT_MAX_M = 8
# the linears it was measured on (and beat fp8_gemm's decode tile on); the others keep fp8_gemm's path until timed
MEASURED_LINEARS = ("shared_w13", "shared_w2", "wq_a", "wo_b")


@triton.jit
def _per_k(v, S: tl.constexpr, RB: tl.constexpr, BK: tl.constexpr):
    """[S, RB, BK/32] per-block values -> [S, RB, BK], each repeated over its 32 k (fp8_gemm.expand_cols, one rank up)."""
    return tl.reshape(tl.broadcast_to(v[:, :, :, None], (S, RB, BK // 32, 32)), (S, RB, BK))


@triton.jit
def _scale_in(sb, ONE: tl.constexpr):
    """The UE8M0 bytes as loaded, or (ONE: every byte <= 134) already as the byte-pair decoder's one factor 2^(e-7),
    the bf16 with exponent field e + 120: converted where they are loaded, so that what moves into the decode's
    layout is the factor itself (no unpacking or clamping in the k loop)."""
    if ONE:
        return e4m3_one_factor(sb)
    else:
        return sb


@triton.jit
def _tile_ok(t0, i, NT: tl.constexpr, S: tl.constexpr, RAGGED: tl.constexpr):
    """[S, 1, 1]: whether step i of each slice (first tile t0) is a k tile of the matrix; all true unless RAGGED
    (then a constant-true mask costs nothing: Triton folds it)."""
    if RAGGED:
        return (t0 + i < NT)[:, None, None]
    else:
        return tl.full((S, 1, 1), 1, tl.int1)


@triton.jit
def _k_loop(x_ptr, w_ptr, ws_ptr, w_rows, s_rows, rw_ok, rm, m_ok, K: tl.constexpr, BM: tl.constexpr,
            RB: tl.constexpr, S: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, NATIVE_FP8: tl.constexpr,
            DOT_F32: tl.constexpr, PAIRS: tl.constexpr, SPF: tl.constexpr, TWO: tl.constexpr, EARLY: tl.constexpr):
    """Every warp's k loop over its slice: [S, RB, BM] fp32 partial products. TWO and EARLY: the kernel's."""
    NT: tl.constexpr = K // BK  # k tiles in all
    NI: tl.constexpr = (NT + S - 1) // S  # k steps a warp (RAGGED: the last slices have fewer, masked)
    RAGGED: tl.constexpr = NT % S != 0
    kk = tl.arange(0, BK)
    kb = tl.arange(0, BK // 32)
    acc = tl.zeros((S, RB, BM), dtype=tl.float32)
    DT: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
    EARLY_ONE: tl.constexpr = PAIRS and not TWO and EARLY  # the one factor made where the bytes are loaded
    t0 = tl.arange(0, S) * NI  # [S] each slice's first k tile
    sl = tl.arange(0, S) * (NI * BK)  # [S] and first k
    s_ptrs = ws_ptr + s_rows[None, :, None] + ((sl // 32)[:, None] + kb[None, :])[:, None, :]  # [S, RB, BK/32]: step 0
    if SPF:  # the first k step's scale bytes, before the loop
        sb_nxt = _scale_in(tl.load(s_ptrs, mask=rw_ok[None, :, None] & _tile_ok(t0, 0, NT, S, RAGGED), other=127),
                           EARLY_ONE)
    for i in tl.range(0, NI, num_stages=STAGES):
        k = sl[:, None] + i * BK + kk[None, :]  # [S, BK]
        # RAGGED: a step past its slice's tiles loads nothing (weights 0, x 0): it adds +0 to the partial sums
        t_ok = _tile_ok(t0, i, NT, S, RAGGED)  # [S, 1, 1]
        wb = tl.load(w_ptr + w_rows[None, :, None] + k[:, None, :], mask=rw_ok[None, :, None] & t_ok, other=0)
        if SPF:  # the next step's bytes now, this step's from the last iteration (no wait on global memory; the
            # move into the decode layout through shared memory, STS / barrier / LDS, stays)
            sb = sb_nxt
            sb_nxt = _scale_in(tl.load(s_ptrs + (i + 1) * (BK // 32),
                                       mask=rw_ok[None, :, None] & (i + 1 < NI) & _tile_ok(t0, i + 1, NT, S, RAGGED),
                                       other=127), EARLY_ONE)
        else:
            sb = _scale_in(tl.load(s_ptrs + i * (BK // 32), mask=rw_ok[None, :, None] & t_ok, other=127), EARLY_ONE)
        xt = tl.load(x_ptr + rm[None, None, :].to(tl.int64) * K + k[:, :, None], mask=m_ok[None, None, :] & t_ok,
                     other=0.0)  # [S, BK, BM]
        if PAIRS:  # byte pairs by inline PTX, the scale as one (TWO: two) bf16x2 factors, exact up to byte 134
            # (TWO: every byte): 4 (5) instructions a pair
            if TWO:
                b1, b2 = e4m3_pair_factors(sb)
                wt = tl.inline_asm_elementwise(E4M3_PAIRS_TWO, "=r,=r,r,r,r,r,r",
                                               [wb, _per_k(b1, S, RB, BK), _per_k(b2, S, RB, BK)],
                                               dtype=tl.bfloat16, is_pure=True, pack=4)
            else:
                b1 = sb if EARLY_ONE else e4m3_one_factor(sb)
                wt = tl.inline_asm_elementwise(E4M3_PAIRS_ONE, "=r,=r,r,r,r", [wb, _per_k(b1, S, RB, BK)],
                                               dtype=tl.bfloat16, is_pure=True, pack=4)
            wt = wt.to(DT)  # fp32 x (DOT_F32): an exact fp32 dot
        else:  # exact: an E4M3 value times a power of two
            wt = (e4m3_to_f32(wb, NATIVE_FP8) * _per_k(e8m0_to_f32(sb), S, RB, BK)).to(DT)
        acc += tl.dot(wt, xt.to(DT), input_precision="ieee" if DOT_F32 else None)
    return acc


@triton.jit
def fp8_warp_split_kernel(x_ptr, w_ptr, ws_ptr, y_ptr, M, limit, w3_off, s3_off,
                          N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, RB: tl.constexpr, S: tl.constexpr,
                          BK: tl.constexpr, STAGES: tl.constexpr, GATED: tl.constexpr, NATIVE_FP8: tl.constexpr,
                          DOT_F32: tl.constexpr, PDL: tl.constexpr, PAIRS: tl.constexpr = False,
                          SPF: tl.constexpr = False, TWO: tl.constexpr = True, EARLY: tl.constexpr = False):
    """One program: RB weight rows (GATED: RB/2 of W1 then the same of W3) × all M tokens, K split over S warps.
    PAIRS only: TWO applies the second bf16x2 scale factor (exact for every UE8M0 byte; without it the caller vouches
    that no byte exceeds 134); EARLY (without TWO) turns the bytes into the factor where they are loaded, before they
    move into the decode's layout (faster on shared w2, slower on the others: EARLY_LINEARS)."""
    tl.static_assert(K % BK == 0 and BK % 32 == 0, "K must be whole BK tiles, BK % 32 == 0")
    RBO: tl.constexpr = RB // (1 + GATED)  # output columns of a program
    KS: tl.constexpr = (K + 31) // 32  # scale bytes a scale row
    pid = tl.program_id(0)
    rr = tl.arange(0, RB)
    rw = pid * RBO + rr % RBO  # weight row (of W1 or, where up, of W3)
    up = (rr >= RBO) & (GATED != 0)
    rw_ok = rw < N
    w_rows = rw.to(tl.int64) * K + up.to(tl.int64) * w3_off  # [RB] byte offsets of the rows
    s_rows = (rw // 32).to(tl.int64) * KS + up.to(tl.int64) * s3_off
    rm = tl.arange(0, BM)
    m_ok = rm < M
    grid_wait(PDL)
    grid_release(PDL)
    acc = _k_loop(x_ptr, w_ptr, ws_ptr, w_rows, s_rows, rw_ok, rm, m_ok, K, BM, RB, S, BK, STAGES, NATIVE_FP8,
                  DOT_F32, PAIRS, SPF, TWO, EARLY)
    rn = pid * RBO + tl.arange(0, RBO)
    omask = m_ok[:, None] & (rn < N)[None, :]
    out = tl.sum(acc, axis=0)  # the cross-warp sum: [RB, BM]
    if GATED:
        g, u = tl.split(tl.permute(tl.reshape(out, (2, RBO, BM)), (1, 2, 0)))
        out = swiglu(g, u, limit)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], tl.trans(out).to(y_ptr.dtype.element_ty), mask=omask)


def tiles_for(N: int, K: int, gated: bool = False):
    """(S, RB, BK, stages) for a decode linear, or None where K does not split into the measured tiles.

    H200, 8 tokens, L2-cold graph replay, each interleaved with fp8_gemm's default decode tile
    (tuning/tune_fp8_warp_split_tiles.json; S 2-16 warps, RB 16 / 32, BK 32-256, 2-4 stages):
    4 warps of 128-wide k tiles at 3 stages were the best or level with it where 4 slices of whole 128 tiles
    divide K (shared w1/w3 12.4-12.7 µs against 12.9-13.3, wo_b 16.8-16.9 against 17.4-17.7), with 256-wide tiles
    where the grid has fewer programs than SMs (wq_a's 80: 7.2 µs against 8.9-9.1; 128 wide 7.8-8.5); 2 warps of
    128 where only 256 divides K (shared w2: 8.6-8.7 µs against 9.1-9.6). 8 and 16 warps, 32- and 64-wide tiles,
    and 32 rows a warp were slower everywhere. With the scale prefetch (SPF_DEFAULT): 256-wide tiles
    wherever 4 slices of them divide K (shared w1/w3 and wo_b too: 12.24-12.34 and 16.03-16.07 µs against 12.51-12.56
    and 16.41-16.52 at 128; tuning/tune_fp8_warp_split_spf.json). The rule reads K only (N and gated are kept for
    callers and for a rule that needs them)."""
    if K % 1024 == 0:
        return 4, 16, 256, 3
    if K % 512 == 0:
        return 4, 16, 128, 3
    if K % 256 == 0:
        return 2, 16, 128, 3
    return None


def early_for(N: int, K: int, gated: bool = False) -> bool:
    """Whether the byte-pair decoder's one factor is made where the scale bytes load (EARLY_LINEARS)."""
    return _measured(N, K, gated) in EARLY_LINEARS


def _measured(N: int, K: int, gated: bool) -> str | None:
    """The name of the MEASURED_LINEARS linear of this shape, or None."""
    table = gated_linears() if gated else dense_linears()
    return next((n for n in MEASURED_LINEARS if table.get(n) == (N, K)), None)


def default_for(device, M: int, N: int, K: int, gated: bool = False) -> bool:
    """Whether fp8_gemm's decode (2..8 tokens) takes this kernel: WARP_SPLIT_DECODE on the chip it was measured on
    (CUDA sm90: `mma_sync_decode_for`) for the linears it was measured on (MEASURED_LINEARS: wq_b, wkv, the indexer's
    wq_b, the MTP projection and engram wkv keep fp8_gemm's tile until they are timed)."""
    return (WARP_SPLIT_DECODE and 2 <= M <= WARP_SPLIT_MAX_M and _measured(N, K, gated) is not None
            and tiles_for(N, K, gated) is not None and mma_sync_decode_for(device))


def check_tiles(K: int, tiles: tuple, name: str) -> tuple:
    """(S, RB, BK, stages), validated against K; a ValueError names what does not fit."""
    S, RB, BK, ns = tiles
    if S < 1 or S & (S - 1) or RB < 16 or RB & (RB - 1) or BK < 32 or BK & (BK - 1) or ns < 1:
        raise ValueError(f"{name}: warp-split tiles (S={S}, RB={RB}, BK={BK}, stages={ns}) need powers of two, "
                         "RB >= 16, BK >= 32 and at least one stage")
    if K % BK:
        raise ValueError(f"{name}: K={K} is not whole {BK}-wide k tiles (BK)")
    return S, RB, BK, ns


_SCALES_SEEN = WeakIdKeyDictionary()  # scale tensor -> (its version when checked, any byte > 134)


def _version(t):
    """t's in-place write counter; None for an inference tensor, which has none (its in-place writes go unseen)."""
    return None if t.is_inference() else t._version


def scales_above_134(s) -> bool:
    """Whether a UE8M0 byte of s exceeds 134 (the byte-pair decoder then needs its second factor). Checked once per
    tensor and version (weights do not change between decode steps; an in-place write bumps _version and re-checks).
    The check reads s and waits for the answer, so a first call inside a CUDA-graph capture (no host sync allowed
    there) gets no answer: `_two_key` then takes both factors. Known gap: keyed by the tensor object, so a caller that
    passes a fresh view of its scales on every call pays the check (a host sync) every eager call and gets both
    factors in every capture; today's callers (benchmarks, tests, `moe._shared_expert`) pass the same tensors."""
    above = _cached(s)
    if above is None:
        above = bool((as_u8(s) > 134).any())
        _SCALES_SEEN[s] = (_version(s), above)
    return above


def _cached(t) -> bool | None:
    """`scales_above_134`'s answer for t if it is cached for t's current version, else None."""
    seen = _SCALES_SEEN.get(t)
    return seen[1] if seen is not None and seen[0] == _version(t) else None


def _two_key(two, s, s3) -> bool:
    """The kernel's TWO for the launcher's `two` (None: the host check)."""
    if two is not None:
        return two
    mats = [t for t in (s, s3) if t is not None]
    if any(t.is_cuda and _cached(t) is None for t in mats) and torch.cuda.is_current_stream_capturing():
        return True  # unchecked inside a capture: both factors, exact for every byte
    return any(scales_above_134(t) for t in mats)


def fp8_gemm_warp_split(x, w, s, w3=None, s3=None, limit: float = 0.0, out_dtype=None, tiles=None, pdl=None,
                        name: str = "fp8_gemm_warp_split", pairs: bool | None = None, spf: bool | None = None,
                        two: bool | None = None, early: bool | None = None):
    """x [..., K] (M <= 16 tokens) · dequant(W)ᵀ -> [..., N]; with w3/s3: silu(min(x·W1ᵀ, L))·clamp(x·W3ᵀ, ±L).
    tiles = (S warps / K slices, RB weight rows a program, BK, stages); None: `tiles_for`. pdl: None = on where the
    device has programmatic dependent launch. pairs: the byte-pair decoder (inline PTX, CUDA only; the per-element
    decoder's bits); None = PAIRS_DEFAULT where inline PTX compiles (`fp8_gemm.ptx_for`), else the per-element one.
    spf: the scale bytes loaded a k step ahead (None: SPF_DEFAULT; the same bits either way). two: the byte-pair
    decoder's second scale factor, needed only for UE8M0 bytes above 134 (the same bits either way); None = where
    `scales_above_134` finds one (on the host, once per scale tensor); True / False force it (False with a byte above
    134 gives wrong products: for tuning). early: the kernel's EARLY (None: `early_for`).
    fp8_gemm / fp8_gemm_swiglu call it for decode shapes (`default_for`)."""
    K = x.shape[-1]
    _check_w(w, s, K, name)
    gated = w3 is not None
    if gated:
        _check_w(w3, s3, K, name)
        if w3.shape != w.shape:
            raise ValueError(f"{name}: w1 {tuple(w.shape)} and w3 {tuple(w3.shape)} differ")
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], w.shape[0]
    if M > 16:
        raise ValueError(f"{name}: decode shapes only (M <= 16 tokens), got M={M}")
    tiles = tiles or tiles_for(N, K, gated)
    if tiles is None:
        raise ValueError(f"{name}: no warp-split tile for K={K} (needs K % 256 == 0, or explicit tiles)")
    S, RB, BK, ns = check_tiles(K, tiles, name)
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    wu, su = as_u8(w), as_u8(s)
    w3_off = s3_off = 0
    if gated:
        w3_off = _byte_distance(as_u8(w3), wu, 16, name)
        s3_off = _byte_distance(as_u8(s3), su, 1, name)
    if pairs is None:
        pairs = PAIRS_DEFAULT and ptx_for(x.device)
    elif pairs and not ptx_for(x.device):
        raise ValueError(f"{name}: pairs=True is inline PTX: a CUDA device outside the interpreter (got {x.device})")
    BM = max(8, triton.next_power_of_2(M))
    if two is not None and not isinstance(two, bool):
        raise ValueError(f"{name}: two={two!r}: expected None (checked on the host), True or False")
    # TWO and EARLY matter to the byte-pair decoder only (no host check, no extra compiled copies without it)
    two = _two_key(two, s, s3) if pairs else True
    early = (early_for(N, K, gated) if early is None else bool(early)) and pairs and not two
    RBO = RB // (2 if gated else 1)
    pdl = pdl_for(x.device) and (pdl is None or bool(pdl))
    fp8_warp_split_kernel[(triton.cdiv(N, RBO),)](
        x2, wu, su, y, M, float(limit), w3_off, s3_off, N=N, K=K, BM=BM, RB=RB, S=S, BK=BK, STAGES=ns,
        GATED=int(gated), NATIVE_FP8=native_fp8_for(x.device), DOT_F32=dot_f32_for(x2), PDL=pdl,
        PAIRS=bool(pairs), SPF=SPF_DEFAULT if spf is None else bool(spf), TWO=two, EARLY=early,
        num_warps=S, num_stages=ns, **launch_kw(pdl))
    return y.reshape(*x.shape[:-1], N)


# ============================================================================ ahead-of-time variants


def _variants(target: str, gated: bool, widths=PUBLISHED) -> list:
    """One decode variant per MEASURED_LINEARS linear (the ones `default_for` sends here), on CUDA targets (mma.sync:
    a rank-3 dot is never wgmma). None on ROCm (`_NO_ROCM`: the matrix shows the gap and why)."""
    tr = target_traits(target)
    if tr is None or tr["kind"] != "cuda":
        return []
    out = []
    for name, (N, K) in (gated_linears(widths) if gated else dense_linears(widths)).items():
        t = tiles_for(N, K, gated)
        if t is None or name not in MEASURED_LINEARS:
            continue
        S, RB, BK, ns = t
        types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*u8", "y_ptr": "*bf16", "M": "i32", "limit": "fp32",
                 "w3_off": "i64", "s3_off": "i64"}
        # two variants: both scale factors (exact for every UE8M0 byte) and one (`_one`: only for checkpoints whose
        # bytes are all <= 134, every real one; whoever launches the binaries picks by `scales_above_134`. The runtime
        # does not load these binaries yet: it launches through Triton's JIT, where the launcher picks)
        for two, suffix in ((True, ""), (False, "_one")):
            ce = {"N": N, "K": K, "BM": 8, "RB": RB, "S": S, "BK": BK, "STAGES": ns, "GATED": int(gated),
                  "NATIVE_FP8": tr["native_fp8"], "DOT_F32": False, "PDL": False, "PAIRS": PAIRS_DEFAULT,
                  "SPF": SPF_DEFAULT, "TWO": two, "EARLY": name in EARLY_LINEARS and not two}
            out.append(aot_spec(fp8_warp_split_kernel, f"{name}_decode{suffix}", types, ce, S, ns,
                                {"linear": name, "mode": "decode", "act": "bf16", **ce}, matrix="mma.sync",
                                divisible={"w3_off": 16} if gated else None))
    return out


# Triton 3.9 compiled offline (benchmarks/results/aot_warp_split.json): the rank-3 dot becomes FMA loops on gfx942 / gfx950 (no v_mfma) and WMMA on
# gfx1100; none was run. Decode on ROCm keeps fp8_gemm's tile.
_NO_ROCM = {t: "the batched dot lowers to FMA, not MFMA (gfx942/gfx950, Triton 3.9); WMMA on gfx1100 not run; "
               "fp8_gemm's decode tile serves ROCm" for t in ("rocm:gfx942", "rocm:gfx950", "rocm:gfx1100")}
_KEYS = ("linear", "N", "K", "mode", "act", "BM", "RB", "S", "BK", "STAGES", "GATED", "NATIVE_FP8", "DOT_F32", "PDL",
         "PAIRS", "SPF", "TWO", "EARLY")
register(KernelTemplate(
    name="fp8_gemm_warp_split", module=__name__,
    summary="decode x · dequant(E4M3 W)ᵀ, K split over the warps of a program (no split-K round trip)",
    keys=_KEYS, reference=fp8_gemm_reference, launch=fp8_gemm_warp_split,
    specializations=lambda t, widths=PUBLISHED: _variants(t, False, widths), missing_on=_NO_ROCM))
register(KernelTemplate(
    name="fp8_gemm_swiglu_warp_split", module=__name__,
    summary="decode shared-expert gate/up (stacked tile), K split over the warps of a program",
    keys=_KEYS, reference=fp8_gemm_swiglu_reference, launch=fp8_gemm_warp_split,
    specializations=lambda t, widths=PUBLISHED: _variants(t, True, widths), missing_on=_NO_ROCM))
