"""Indexer scoring: exact integer scores of FP4 queries against FP4 keys, and the candidate block max.

One file: the prefill (block-q) and decode (heads) kernels share the exact-integer decode, the block path and the
float32 reference whose order both reproduce bit for bit; the reference and the fallback counts they are tested
against must change with them.

What (spec §3.4, §7.1): `I[s,t] = Σ_h wq[s,h]·ReLU(q[s,h]·k[t])` with wq = w·d^-0.5 (w =
weights_proj(x)·H^-0.5, d = 128), queries [S, 32, 128] and keys [T, 128] in FP4 E2M1 with one
UE8M0 scale per 32 channels; -inf where t ≥ (p+1)//ratio (not yet visible) or, at Reindex layers,
outside the candidate mask. The candidate source also writes the max over blocks of 8 positions.

The float32 reference fixes one order: dequantize to fp32, dot each 32-channel block (exact: its
terms are multiples of one power of two and sum to < 2^24 of it), add the four block partials left
to right, ReLU, then add the heads' `wq·relu` one head at a time (h = 0..H-1), starting from +0.

Exact integer path (why the kernels' scores are bit-identical to that reference): E2M1 values
times 2 are integers in [-12, 12]. For each query-head row and each key row, the per-32-channel
exponents are aligned to the row's smallest exponent (over non-zero blocks) by shifting the integer
codes left; if every shifted code fits INT8 (|v|<<shift <= 127, checked per row) the dot is ONE
int8 x int8 -> int32 product sum A over all 128 channels, and the real dot is
A · 2^(eq_min-127) · 2^(ek_min-127) / 4, exactly. The same row bound makes the reference's
left-to-right block sum exact too: every partial sum is an integer multiple of
2^(eq_min+ek_min-256) no larger than Σ|q_int8||k_int8| <= 128·127·127 < 2^24. So both equal the
real dot, and the remaining fp32 steps (ReLU, wq·r, the per-head sum in order h = 0..H-1) are the
same operations in the same order. The decode kernel folds the powers of two out of that chain: it adds
wqf_h·ReLU(A) over h (wqf_h = wq_h·2^(eq_min-127)/4, exact) and multiplies the sum by 2^(ek_min-127) once per
key. Scaling by a power of two commutes with fp32 rounding while nothing leaves the normal range, so every
product, partial sum and the result are the reference's scaled by that power: the same bits (FMULs a thread a
tile 128 -> 33 in the key loop's sm90 SASS of the plain variant, 896 -> 796 instructions). Rows that fail the
INT8 check fall back to the block path, which computes each 32-channel block's integer dot (int8, unshifted)
times its two scales, exactly, and adds the four block partials left to right in fp32: the reference's order,
so it matches bit for bit whatever the exponent spread. A key row that fails sends its whole key tile down the block
path ("whole-tile fallback"); a query-head row that fails sends that head down it for the tile
("per-head fallback", counted once per (head, key tile, query block)). The launch wrapper reports
both counts (kernel-side atomics). fp fusion is disabled at launch: `acc + wq·r` must not contract
into an FMA.

FP4 decode, SIMD within a register (`_decode_rows`): packed rows are loaded as int32 words (8 codes
each); the eight nibble lanes of a word get their magnitudes x2 arithmetically (m + max(m-4, 0) +
2·[m = 7]), the even and odd nibbles spread to byte lanes, shift and sign apply four lanes at a
time, and the byte lanes become the int8 MMA operand without unpacking (~4 ops per code, about a
third of decoding code by code). The INT8 check takes the OR of a block's magnitudes instead of
their max: OR << sh <= 127 exactly when max << sh <= 127 (127 >> sh is 2^j - 1, and "every value
< 2^j" holds for the OR iff it holds for the max).

Two kernels, one contract:
- `_index_score_kernel` (prefill, block_q = 16): 16 queries are the int8 MMA rows, the key tile the
  columns; a loop over the 32 heads adds `wq·relu` in order. A per-head fallback is per 16-query
  block (the head falls back for the block if any of its 16 rows fails).
- `_index_score_heads_kernel` (decode, block_q = 1): one query's 32 heads are the MMA columns of
  K[BT,128]·Q^T[128,32] -> [BT, 32] (no padding of one query to 16 MMA rows). A program decodes
  and stages its query once, then walks key tiles pid, pid + P, ... (P programs per query: `heads_launch`);
  the ordered head sum runs in registers (`_sum_cols`: repeated halving with tl.split gathers each key's 32
  heads in one thread, then 32 adds in order h = 0..31).
  That key loop takes the integer path only. A tile that needs the block path (one of its key rows fails
  the INT8 check, or one of the query's heads does: per-head fallbacks are per query) sets its bit in a
  64-bit mask, and a second loop scores those tiles, every head on the block path (for the rows that pass,
  the block path and the integer path give the same bits: both are the exact dot). Why two loops: with the
  block path as a branch inside the key loop, that loop held both paths' values (253 registers and a
  40-byte spill under Triton 3.6 on sm90, 2,343 SASS instructions a tile counting the branch, candidate-source
  variant); without it the key loop is 910 instructions (896 for the plain variant; 796 with the fold above) and
  spills nothing when capped at 128 registers, so four programs fit an SM (the default launch). The launch must
  give every query at least cdiv(tiles, 64) programs (`heads_launch` does; an ahead-of-time launcher must too),
  or tiles past a program's 64th are never scored. Tiles past the visible ones are written -inf
  without decoding.

Specialization keys: H (32), CI (128), BQ (16, prefill kernel), BT (key tile), CB (candidate
block 8), USE_CAND, WRITE_BMAX, COUNT; launch: maxnreg (the decode kernel: 128). Variants: prefill (BQ 16,
BT 128, 4 warps) and decode (heads kernel, BT 128, 4 warps), each as Reindex (USE_CAND), candidate source
(WRITE_BMAX) and plain.
`index_scores` takes the heads kernel up to HEADS_KERNEL_MAX_S queries (it decodes the keys once
per query, so it is a decode kernel).

Measured (H200, torch 2.11 / triton 3.6, benchmarks/results/kernels_attention.json):
32 queries × 131,072 keys 0.257 ms (58-63× the eager reference; was 0.435 ms), 0 score
bits different from the float32 reference in every configuration swept, with both fallbacks
exercised. One query (the heads kernel), typical keys (no fallback), warm / L2-cold graph replay:
16.2 / 21.4 µs at one 8-warp program per SM, 14.8 / 16.6 µs at two 4-warp programs per SM; with one
adversarial query head every tile takes the block path: 22.6 / 25.2 µs. Then (each variant
twice, interleaved, µs warm / L2-cold graph replay; bit-identical to the reference, the same fallback counts):
the block path in its own loop (tuning/tune_indexer_score.json, one run): one query 14.7 / 16.5-16.7 -> 11.8 /
14.4 at the old launch; the adversarial head 22.6-22.7 / 25.2-25.4 -> 20.1-20.2 / 22.2-22.3; four queries
49.7-50.0 / 48.9-49.0 -> 32.6-32.9 / 35.3 (4 capped programs an SM). Then the scale fold and 4 capped programs an
SM for every query count (tuning/tune_indexer_score_fold.json, tuning/tune_indexer_score_prefetch.json, two later runs): one
query 8.8 / 11.4-11.6, four queries 28.3-28.6 / 30.0-30.3, the adversarial head 21.7-21.9 / 26.1-26.3 (see
HEADS_PROGRAMS_PER_SM). The table run's figures are in docs/KERNELS.md.

Tried (measured slower, not kept):
- a register prefetch of the next key tile's words (Triton's pipeliner stages only loads that feed a dot): 0.7 µs
  faster at 2 programs an SM, 0.2 slower at the 4 kept (tuning/tune_indexer_score_prefetch.json).
- 5 programs an SM at 96 registers, 6 at 80, 2 of 8 warps at 128 (128- or 256-key tiles): slower at one and four
  queries, one query 12.0-14.7 µs against 11.4 (tuning/tune_indexer_score_warps.json).

Known gaps: exactness needs exponents with eq_min+ek_min >= 107 (no fp32 underflow of the
products), and on the decode kernel's folded chain terms wqf_h·A and their sums that stay normal and finite
(a query scale byte above ~10 for |wq| ~ 2^-6; below ~230 for |wq| ~ 1: the folded sum does not shrink with the
key scale) -- the quantizer's scale floor keeps realistic data far inside; UE8M0 byte 0 is not
decoded. A query-head row that fails the INT8 check sends the heads kernel down the block path (4x
the MMAs) on every tile of that query. A program walks at most 64 key tiles (the mask's bits; the launch
raises the program count to keep it so). Query counts 2 and 3 take the four-query launch, unmeasured. The
scores [S, T] round-trip through memory between scoring and top-k.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.codecs import bcast_groups, pow2_float
from dsv41c.codegen.triton.targets import sm_count
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c import formats


# ============================================================================ kernels


@triton.jit
def _mag_lanes(w):
    """Packed E2M1 words (int32, 8 codes) -> 8 nibble lanes of 2·|value| (0..12), with no carry between
    lanes: magnitude code m -> m + max(m - 4, 0) + 2·[m == 7] = 0, 1, 2, 3, 4, 6, 8, 12."""
    M = w & 0x77777777
    b2 = (M >> 2) & 0x11111111
    t1 = M & 0x33333333 & (b2 * 3)
    is7 = b2 & (M >> 1) & M
    return M + t1 + (is7 << 1)


@triton.jit
def _neg_lanes(x, sbits):
    """Byte lanes of x (each < 128) negated where bit 0 of the lane in sbits is set, no carry between
    lanes: (0x80 - v) ^ 0x80 = -v (mod 256) for 0 <= v < 128 (0x80808080 written as an int32)."""
    S = sbits * 255
    neg = (-0x7F7F7F80 - x) ^ -0x7F7F7F80
    return (x & ~S) | (neg & S)


@triton.jit
def _bytes_of(x, R: tl.constexpr, NW: tl.constexpr):
    """int32 words [R, NW] -> their byte lanes as int8 [R, 4·NW], byte 0 first (the compiler keeps the
    four lanes of a word in one register: no unpacking reaches the MMA operand)."""
    b0 = (x << 24) >> 24
    b1 = (x << 16) >> 24
    b2 = (x << 8) >> 24
    b3 = x >> 24
    return tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (R, NW * 4)).to(tl.int8)


@triton.jit
def _or_combine(a, b):
    return a | b


@triton.jit
def _decode_rows(w, ex, R: tl.constexpr, NW: tl.constexpr, NB: tl.constexpr):
    """Packed E2M1 rows as int32 words w [R, NW] (byte i = channels 2i, 2i+1, low nibble even) + UE8M0
    bytes ex [R, NB] -> the even / odd channel codes x2 shifted left to the row's smallest non-zero-block
    exponent (int8 [R, 4·NW] each; meaningful where the row fits INT8), the row scale 2^(emin-127),
    and whether every shifted code fits INT8.

    SIMD within a register: magnitudes on the eight nibble lanes of a word, then the even and odd
    nibbles spread to byte lanes, shifted and sign-applied four at a time (~4 ops per code). The INT8
    check uses the OR of a block's magnitudes: OR << sh <= 127 iff max << sh <= 127, because
    127 >> sh is 2^j - 1 and "all values < 2^j" holds for the OR exactly when it holds for the max."""
    V = _mag_lanes(w)
    bor = tl.reduce(tl.reshape(V, (R, NB, NW // NB)), 2, _or_combine)
    bor = bor | (bor >> 16)
    bor = bor | (bor >> 8)
    bor = (bor | (bor >> 4)) & 15
    nz = bor > 0
    emin = tl.min(tl.where(nz, ex, 255), axis=1)
    emin = tl.where(emin == 255, 127, emin)
    sh = tl.minimum(tl.where(nz, ex - emin[:, None], 0), 8)
    ok = tl.max(bor << sh, axis=1) <= 127
    shw = bcast_groups(sh, R, NB, NW // NB)
    E = _neg_lanes((V & 0x0F0F0F0F) << shw, (w >> 3) & 0x01010101)
    O = _neg_lanes(((V >> 4) & 0x0F0F0F0F) << shw, (w >> 7) & 0x01010101)
    return _bytes_of(E, R, NW), _bytes_of(O, R, NW), pow2_float(emin - 127), ok


@triton.jit
def _codes_x2(w, R: tl.constexpr, NW: tl.constexpr):
    """Packed E2M1 words [R, NW] -> the even / odd channel codes x2, unshifted (int8 in [-12, 12])."""
    V = _mag_lanes(w)
    E = _neg_lanes(V & 0x0F0F0F0F, (w >> 3) & 0x01010101)
    O = _neg_lanes((V >> 4) & 0x0F0F0F0F, (w >> 7) & 0x01010101)
    return _bytes_of(E, R, NW), _bytes_of(O, R, NW)


@triton.jit
def _sum_cols(acc, x, N: tl.constexpr):
    """acc + x[:, 0] + x[:, 1] + ... + x[:, N-1], added left to right (x [R, N], N a power of two).
    Each halving (reshape, permute, tl.split) keeps the column order; the compiler gathers every
    row into one thread (one layout conversion), so the N adds are in-register, in order."""
    if N == 1:
        acc = acc + tl.sum(x, axis=1)
    else:
        R: tl.constexpr = x.shape[0]
        a, b = tl.split(tl.permute(tl.reshape(x, (R, 2, N // 2)), (0, 2, 1)))
        acc = _sum_cols(acc, a, N // 2)
        acc = _sum_cols(acc, b, N // 2)
    return acc


@triton.jit
def _index_score_kernel(q_ptr, qe_ptr, wq_ptr, k_ptr, ke_ptr, nvis_ptr, cand_ptr, s_ptr, bmax_ptr, cnt_ptr,
                        S, T, NBLK,
                        H: tl.constexpr, CI: tl.constexpr, BQ: tl.constexpr, BT: tl.constexpr, CB: tl.constexpr,
                        USE_CAND: tl.constexpr, WRITE_BMAX: tl.constexpr, COUNT: tl.constexpr):
    NW: tl.constexpr = CI // 8  # int32 words per packed row
    NB: tl.constexpr = CI // 32
    pid_t = tl.program_id(0)
    pid_q = tl.program_id(1)
    kw_ptr = k_ptr.to(tl.pointer_type(tl.int32))
    qw_ptr = q_ptr.to(tl.pointer_type(tl.int32))
    qs = pid_q * BQ + tl.arange(0, BQ)
    qmask = qs < S
    qs64 = qs.to(tl.int64)
    nvis = tl.load(nvis_ptr + qs, mask=qmask, other=0)
    t = pid_t * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    cw = tl.arange(0, NW)
    c = tl.arange(0, 4 * NW)  # byte (= channel pair) index
    nb = tl.arange(0, NB)
    if pid_t * BT < tl.max(nvis, axis=0):
        kb = tl.load(kw_ptr + t64[:, None] * NW + cw[None, :], mask=tmask[:, None], other=0)
        kex = tl.load(ke_ptr + t64[:, None] * NB + nb[None, :], mask=tmask[:, None], other=127).to(tl.int32)
        kEs, kOs, kscale, k_ok = _decode_rows(kb, kex, BT, NW, NB)
        tile_ok = tl.min(k_ok.to(tl.int32), axis=0) > 0
        kEs8 = tl.trans(kEs)
        kOs8 = tl.trans(kOs)
        acc = tl.zeros((BQ, BT), tl.float32)
        for h in range(H):
            qrow = qs64 * H + h
            qb = tl.load(qw_ptr + qrow[:, None] * NW + cw[None, :], mask=qmask[:, None], other=0)
            qex = tl.load(qe_ptr + qrow[:, None] * NB + nb[None, :], mask=qmask[:, None], other=127).to(tl.int32)
            qEs, qOs, qscale, q_ok = _decode_rows(qb, qex, BQ, NW, NB)
            head_ok = tl.min((q_ok | (qs >= S)).to(tl.int32), axis=0) > 0
            if tile_ok & head_ok:
                ia = tl.dot(qEs, kEs8, out_dtype=tl.int32)
                ia = tl.dot(qOs, kOs8, ia, out_dtype=tl.int32)
                d = ((ia.to(tl.float32) * qscale[:, None]) * kscale[None, :]) * 0.25
            else:
                # the reference's order: exact per-32-channel partials, added left to right
                kE, kO = _codes_x2(kb, BT, NW)
                qE, qO = _codes_x2(qb, BQ, NW)
                kE8 = tl.trans(kE)
                kO8 = tl.trans(kO)
                d = tl.zeros((BQ, BT), tl.float32)
                for b in tl.static_range(NB):
                    inb = ((c // 16) == b)[None, :]
                    pb = tl.dot(tl.where(inb, qE, 0), kE8, out_dtype=tl.int32)
                    pb = tl.dot(tl.where(inb, qO, 0), kO8, pb, out_dtype=tl.int32)
                    qsb = pow2_float(tl.load(qe_ptr + qrow * NB + b, mask=qmask, other=127).to(tl.int32) - 127)
                    ksb = pow2_float(tl.load(ke_ptr + t64 * NB + b, mask=tmask, other=127).to(tl.int32) - 127)
                    d = d + ((pb.to(tl.float32) * qsb[:, None]) * ksb[None, :]) * 0.25
                if COUNT:
                    if tile_ok:
                        tl.atomic_add(cnt_ptr, 1)
            r = tl.maximum(d, 0.0)
            wqh = tl.load(wq_ptr + qs64 * H + h, mask=qmask, other=0.0)
            acc = acc + wqh[:, None] * r
        if COUNT:
            if tile_ok == 0:
                tl.atomic_add(cnt_ptr + 1, 1)
        vis = (t[None, :] < nvis[:, None]) & tmask[None, :] & qmask[:, None]
        if USE_CAND:
            cf = tl.load(cand_ptr + qs64[:, None] * NBLK + (t // CB)[None, :], mask=vis, other=0)
            vis = vis & (cf != 0)
        score = tl.where(vis, acc, float("-inf"))
    else:
        score = tl.full((BQ, BT), float("-inf"), tl.float32)
    tl.store(s_ptr + qs64[:, None] * T + t64[None, :], score, mask=qmask[:, None] & tmask[None, :])
    if WRITE_BMAX:
        bmx = tl.max(tl.reshape(score, (BQ, BT // CB, CB)), axis=2)
        bj = pid_t * (BT // CB) + tl.arange(0, BT // CB)
        tl.store(bmax_ptr + qs64[:, None] * NBLK + bj[None, :], bmx, mask=qmask[:, None] & (bj < NBLK)[None, :])


@triton.jit
def _index_score_heads_kernel(q_ptr, qe_ptr, wq_ptr, k_ptr, ke_ptr, nvis_ptr, cand_ptr, s_ptr, bmax_ptr, cnt_ptr,
                              S, T, NBLK,
                              H: tl.constexpr, CI: tl.constexpr, BT: tl.constexpr, CB: tl.constexpr,
                              USE_CAND: tl.constexpr, WRITE_BMAX: tl.constexpr, COUNT: tl.constexpr,
                              PDL: tl.constexpr = False, EARLY_Q: tl.constexpr = False):
    NW: tl.constexpr = CI // 8  # int32 words per packed row
    # PDL (pdl.py): wq and nvis are the previous kernel's (the step's prep); EARLY_Q: the query's codes and scales
    # are at least two launches old (the indexer step: their producer ran before the prep kernel), so the
    # program loads and decodes them before its wait, overlapping the prep launch
    if not EARLY_Q:
        grid_wait(PDL)
    NB: tl.constexpr = CI // 32
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    s = tl.program_id(1)
    kw_ptr = k_ptr.to(tl.pointer_type(tl.int32))
    hh = tl.arange(0, H)
    cw = tl.arange(0, NW)
    c = tl.arange(0, 4 * NW)  # byte (= channel pair) index
    nb = tl.arange(0, NB)
    # the query: decoded, aligned and staged as the MMA's B operand once per program
    qrow = s.to(tl.int64) * H + hh
    qb = tl.load(q_ptr.to(tl.pointer_type(tl.int32)) + qrow[:, None] * NW + cw[None, :])
    qex = tl.load(qe_ptr + qrow[:, None] * NB + nb[None, :]).to(tl.int32)
    qEs, qOs, qscale, q_ok = _decode_rows(qb, qex, H, NW, NB)
    qE8 = tl.trans(qEs)  # [CI/2, H]
    qO8 = tl.trans(qOs)
    n_bad = tl.sum((q_ok == 0).to(tl.int32), axis=0)
    if EARLY_Q:
        grid_wait(PDL)
    grid_release(PDL)
    wqh = tl.load(wq_ptr + qrow)
    wqf = (wqh * qscale) * 0.25  # exact: powers of two
    nv = tl.load(nvis_ptr + s)
    n_vis = tl.cdiv(nv, BT)
    # visible key tiles, strided over the programs (plain loads: Triton's pipeliner stages only loads that feed a
    # dot, and a register prefetch of the next tile was no faster at the default launch, `heads_launch`). The fast path
    # only: a tile that needs the block path (a key row fails the INT8 check, or a query head does) sets its
    # bit in `redo` (bit i = the program's i-th tile) and is scored by the second loop
    redo = tl.zeros((), tl.int64)
    i = 0
    for tile in tl.range(pid, n_vis, nprog):
        t = tile * BT + tl.arange(0, BT)
        kb, kex = _load_tile(kw_ptr, ke_ptr, tile, T, BT, NW, NB)
        kEs, kOs, kscale, k_ok = _decode_rows(kb, kex, BT, NW, NB)
        tile_ok = tl.min(k_ok.to(tl.int32), axis=0) > 0
        if tile_ok & (n_bad == 0):
            ia = tl.dot(kEs, qE8, out_dtype=tl.int32)  # [BT, H]: the keys are the MMA rows
            ia = tl.dot(kOs, qO8, ia, out_dtype=tl.int32)
            # Σ_h wq_h·ReLU(ia·qscale_h·kscale/4) as kscale·Σ_h wqf_h·ReLU(ia): the same bits (module docstring)
            acc = _sum_cols(tl.zeros((BT,), tl.float32), wqf[None, :] * tl.maximum(ia, 0).to(tl.float32), H)
            _store_tile(acc * kscale, cand_ptr, s_ptr, bmax_ptr, s, t, nv, tile, NBLK, T, BT, CB, USE_CAND, WRITE_BMAX)
        else:
            redo = redo | (tl.full((), 1, tl.int64) << i)
            if COUNT:
                if tile_ok:
                    tl.atomic_add(cnt_ptr, n_bad)
                else:
                    tl.atomic_add(cnt_ptr + 1, 1)
        i += 1
    # the block path: the reference's order, exact per-32-channel partials added left to right
    i = 0
    for tile in range(pid, n_vis if redo != 0 else 0, nprog):
        if ((redo >> i) & 1) != 0:
            t = tile * BT + tl.arange(0, BT)
            tmask = t < T
            t64 = t.to(tl.int64)
            kb, _ = _load_tile(kw_ptr, ke_ptr, tile, T, BT, NW, NB)
            kE, kO = _codes_x2(kb, BT, NW)
            qE, qO = _codes_x2(qb, H, NW)
            db = tl.zeros((BT, H), tl.float32)
            for b in tl.static_range(NB):
                inb = ((c // 16) == b)[:, None]
                pb = tl.dot(kE, tl.where(inb, tl.trans(qE), 0), out_dtype=tl.int32)
                pb = tl.dot(kO, tl.where(inb, tl.trans(qO), 0), pb, out_dtype=tl.int32)
                qsb = pow2_float(tl.load(qe_ptr + qrow * NB + b).to(tl.int32) - 127)
                ksb = pow2_float(tl.load(ke_ptr + t64 * NB + b, mask=tmask, other=127).to(tl.int32) - 127)
                db = db + ((pb.to(tl.float32) * qsb[None, :]) * ksb[:, None]) * 0.25
            acc = _sum_cols(tl.zeros((BT,), tl.float32), wqh[None, :] * tl.maximum(db, 0.0), H)
            _store_tile(acc, cand_ptr, s_ptr, bmax_ptr, s, t, nv, tile, NBLK, T, BT, CB, USE_CAND, WRITE_BMAX)
        i += 1
    # tiles past the visible ones: -inf
    for tile in range(pid, tl.cdiv(T, BT), nprog):
        if tile >= n_vis:
            t64 = (tile * BT + tl.arange(0, BT)).to(tl.int64)
            _store_scores(tl.full((BT,), float("-inf"), tl.float32), s_ptr, bmax_ptr, s, t64, t64 < T, tile, NBLK,
                          T, BT, CB, WRITE_BMAX)


@triton.jit
def _load_tile(kw_ptr, ke_ptr, tile, T, BT: tl.constexpr, NW: tl.constexpr, NB: tl.constexpr):
    """Key tile `tile`'s packed words [BT, NW] and scale bytes [BT, NB] (int32)."""
    t64 = (tile * BT + tl.arange(0, BT)).to(tl.int64)
    m = t64 < T
    kb = tl.load(kw_ptr + t64[:, None] * NW + tl.arange(0, NW)[None, :], mask=m[:, None], other=0)
    kex = tl.load(ke_ptr + t64[:, None] * NB + tl.arange(0, NB)[None, :], mask=m[:, None], other=127)
    return kb, kex.to(tl.int32)


@triton.jit
def _store_tile(acc, cand_ptr, s_ptr, bmax_ptr, s, t, nv, tile, NBLK, T, BT: tl.constexpr, CB: tl.constexpr,
                USE_CAND: tl.constexpr, WRITE_BMAX: tl.constexpr):
    """A key tile's scores acc [BT] stored with their block max, -inf where not visible or (USE_CAND) outside the
    candidate blocks."""
    tmask = t < T
    vis = (t < nv) & tmask
    if USE_CAND:
        cf = tl.load(cand_ptr + s.to(tl.int64) * NBLK + t // CB, mask=vis, other=0)
        vis = vis & (cf != 0)
    _store_scores(tl.where(vis, acc, float("-inf")), s_ptr, bmax_ptr, s, t.to(tl.int64), tmask, tile, NBLK, T, BT, CB,
                  WRITE_BMAX)


@triton.jit
def _store_scores(score, s_ptr, bmax_ptr, s, t64, tmask, tile, NBLK, T, BT: tl.constexpr, CB: tl.constexpr,
                  WRITE_BMAX: tl.constexpr):
    s64 = s.to(tl.int64)
    tl.store(s_ptr + s64 * T + t64, score, mask=tmask)
    if WRITE_BMAX:
        bmx = tl.max(tl.reshape(score, (BT // CB, CB)), axis=1)
        bj = tile * (BT // CB) + tl.arange(0, BT // CB)
        tl.store(bmax_ptr + s64 * NBLK + bj, bmx, mask=bj < NBLK)


# ============================================================================ host


def visible_counts(qpos: torch.Tensor, ratio: int, T: int) -> torch.Tensor:
    """Number of visible compressed entries per query: t < (p+1)//ratio."""
    return torch.clamp((qpos.long() + 1) // ratio, max=T).to(torch.int32)


# Queries up to this count take the heads kernel (block_q 1; it decodes the keys once per query);
# the H200 sweep in benchmarks/kernels_attention.py times both kernels at 1 and 32 queries.
HEADS_KERNEL_MAX_S = 4
# The heads kernel's launch: 4 warps, HEADS_PROGRAMS_PER_SM programs per SM over all queries, each capped at
# HEADS_MAXNREG registers (uncapped, Triton 3.6 gives the kernel 253 a thread on sm90: two CTAs an SM; at 128 the
# key loop spills nothing and the block-path loop spills 312 bytes). H200, 131,072 keys, L2-cold graph replay,
# each variant twice, interleaved, µs (tuning/tune_indexer_score_fold.json, tuning/tune_indexer_score_prefetch.json:
# two runs on the final kernel): one query 11.6 / 11.4-11.5 at 4 capped programs an SM, against
# 13.0-13.5 / 13.3 at 2 uncapped and 12.8-13.0 / 13.0 at 3 capped; four queries 30.1-30.3 / 30.0 against
# 36.4-36.7 / 36.4-36.5 and 32.2-32.3 / 32.1. The adversarial query (a head that fails the INT8 check: every
# tile on the block path, where the cap spills) is slower capped: 26.1-26.3 against 21.8-22.3 µs. An earlier run,
# before the scale fold (tuning/tune_indexer_score.json), had 2 uncapped ahead at one query (14.4 against 15.0-15.2). Other counts and caps: the module's Tried.
HEADS_WARPS = 4
HEADS_PROGRAMS_PER_SM = 4
HEADS_MAXNREG = 128
HEADS_MAX_TILES = 64  # key tiles a program walks at most: the block path's tile bits are one int64


def heads_launch(S: int, n_tiles: int, sms: int, programs=None, maxnreg=None) -> tuple:
    """(programs per query, register cap or None) of the heads kernel for S queries over n_tiles key tiles:
    HEADS_PROGRAMS_PER_SM per SM over all queries and HEADS_MAXNREG unless given (maxnreg 0: no cap), at least
    n_tiles / HEADS_MAX_TILES programs, at most one per tile."""
    P = programs or max(1, HEADS_PROGRAMS_PER_SM * sms // S)
    P = max(min(n_tiles, P), triton.cdiv(n_tiles, HEADS_MAX_TILES))
    cap = HEADS_MAXNREG if maxnreg is None else maxnreg
    return P, (cap or None)


def _word_aligned(codes: torch.Tensor) -> torch.Tensor:
    """Packed codes as the kernels read them: contiguous rows loaded as int32 words (4-byte aligned)."""
    codes = codes.contiguous()
    return codes if codes.data_ptr() % 4 == 0 else codes.clone()


def score_block_q(S: int, block_q: int | None) -> int:
    """The query block the scoring runs with: 1 = heads kernel (decode), 16 = queries-as-rows kernel."""
    if block_q is None:
        return 1 if S <= HEADS_KERNEL_MAX_S else 16
    if block_q not in (1, 16):
        raise ValueError(f"index_scores: block_q must be 1 (heads kernel) or 16, got {block_q}")
    return block_q


def index_scores(q_codes, q_exps, wq, k_codes, k_exps, nvis, *, cand_mask=None, cand_block=8, block_max=False,
                 block_q=None, block_t=128, programs=None, num_warps=None, num_stages=None, counters=None,
                 maxnreg=None, pdl: bool = False, early_q: bool = False):
    """Scores [S, T] (and block max [S, ceil(T/cand_block)] if asked). q_codes [S, H, CI/2] uint8,
    q_exps [S, H, CI/32] uint8, wq [S, H] fp32 (already times d^-0.5), k_codes [T, CI/2],
    k_exps [T, CI/32], nvis [S] int32, cand_mask [S, ceil(T/cand_block)] uint8 or None.
    block_q: 1 (heads kernel), 16 (queries-as-rows kernel) or None (by S: `score_block_q`).
    programs, maxnreg: heads kernel only, programs per query and register cap (0: none; None: `heads_launch`'s
    defaults).
    counters: int32 [2] accumulating (per-head fallbacks, whole-tile fallbacks) or None.
    pdl (heads kernel only; the caller checks `pdl_for`): launched with programmatic dependent launch; early_q: the
    query codes / scales were written at least two launches back, so they are loaded before the grid wait (only a
    caller that launches a kernel in between may say so: `indexer.indexer_topk`, behind its prep kernel)."""
    S, H, IH = q_codes.shape
    CI = IH * 2
    T = k_codes.shape[0]
    dev = q_codes.device
    NBLK = triton.cdiv(T, cand_block)
    scores = torch.empty((S, T), dtype=torch.float32, device=dev)
    bmax = torch.empty((S, NBLK), dtype=torch.float32, device=dev) if block_max else scores
    if S == 0 or T == 0:
        return scores, (bmax if block_max else None)
    nvis = nvis if nvis.dtype == torch.int32 and nvis.is_contiguous() else nvis.to(torch.int32).contiguous()
    wq = wq if wq.dtype == torch.float32 and wq.is_contiguous() else wq.float().contiguous()
    args = (_word_aligned(q_codes), q_exps.contiguous(), wq, _word_aligned(k_codes), k_exps.contiguous(), nvis,
            cand_mask.contiguous() if cand_mask is not None else nvis, scores, bmax,
            counters if counters is not None else nvis, S, T, NBLK)
    flags = dict(H=H, CI=CI, BT=block_t, CB=cand_block, USE_CAND=cand_mask is not None, WRITE_BMAX=block_max,
                 COUNT=counters is not None, enable_fp_fusion=False)
    if score_block_q(S, block_q) == 1:
        P, cap = heads_launch(S, triton.cdiv(T, block_t), sm_count(dev), programs, maxnreg)
        _index_score_heads_kernel[(P, S)](*args, num_warps=num_warps or HEADS_WARPS, num_stages=num_stages or 2,
                                          **({"maxnreg": cap} if cap else {}), **flags, PDL=pdl,
                                          EARLY_Q=bool(pdl and early_q), **launch_kw(pdl))
    else:  # Triton's default 3 stages, as measured on the H200
        _index_score_kernel[(triton.cdiv(T, block_t), triton.cdiv(S, 16))](*args, BQ=16, num_warps=num_warps or 4,
                                                                          num_stages=num_stages or 3, **flags)
    return scores, (bmax if block_max else None)


def int8_rows_ok(codes: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """The kernels' per-row INT8 check, in torch: codes [..., CI/2] packed, exps [..., CI/32]."""
    v = (formats.e2m1_decode(formats.unpack_fp4(codes)) * 2).to(torch.int32)
    bm = v.abs().unflatten(-1, (-1, 32)).amax(-1)
    e = exps.to(torch.int32)
    nz = bm > 0
    emin = torch.where(nz, e, 255).amin(-1, keepdim=True)
    emin = torch.where(emin == 255, 127, emin)
    sh = torch.where(nz, e - emin, 0).clamp(max=8)
    return (bm << sh).amax(-1) <= 127


def expected_fallbacks(q_codes, q_exps, k_codes, k_exps, nvis, block_q=None, block_t=128) -> dict:
    """Fallback counts the scoring kernels must report for these inputs (their tiling rules: a
    per-head fallback counts once per (head, key tile, block of block_q queries))."""
    S, H = q_codes.shape[:2]
    T = k_codes.shape[0]
    block_q = score_block_q(S, block_q)
    q_ok = int8_rows_ok(q_codes, q_exps)  # [S, H]
    k_ok = int8_rows_ok(k_codes, k_exps)  # [T]
    head_tiles = tiles = 0
    for qb in range(0, S, block_q):
        hv = int(nvis[qb:qb + block_q].max())
        heads_bad = int((~q_ok[qb:qb + block_q]).any(0).sum())
        for t0 in range(0, T, block_t):
            if t0 >= hv:
                continue
            if bool(k_ok[t0:t0 + block_t].all()):
                head_tiles += heads_bad
            else:
                tiles += 1
    return {"fallback_heads": int((~q_ok).sum()), "fallback_head_tiles": head_tiles, "fallback_tiles": tiles}


# ----------------------------------------------------------------------------- reference


def index_scores_ref(q_codes, q_exps, wq, k_codes, k_exps, nvis, *, cand_mask=None, cand_block=8, key_chunk=16384):
    """The float32 reference scores (see the module docstring for the pinned order)."""
    S, H, IH = q_codes.shape
    CI = IH * 2
    T = k_codes.shape[0]
    q = formats.dequant_fp4_ue8m0(q_codes, q_exps, 32).unflatten(-1, (CI // 32, 32))  # [S,H,NB,32]
    out = torch.empty((S, T), dtype=torch.float32, device=q_codes.device)
    wq = wq.float()
    for t0 in range(0, T, key_chunk):
        k = formats.dequant_fp4_ue8m0(k_codes[t0:t0 + key_chunk], k_exps[t0:t0 + key_chunk], 32)
        k = k.unflatten(-1, (CI // 32, 32))  # [t,NB,32]
        blk = torch.einsum("shbc,tbc->bsht", q, k)  # exact per-block partials
        d = blk[0]
        for b in range(1, blk.shape[0]):
            d = d + blk[b]
        r = torch.relu(d)
        acc = torch.zeros((S, r.shape[-1]), dtype=torch.float32, device=q.device)
        for h in range(H):
            acc = acc + wq[:, h, None] * r[:, h]
        out[:, t0:t0 + key_chunk] = acc
    t = torch.arange(T, device=out.device)
    vis = t[None, :] < nvis[:, None].long()
    if cand_mask is not None:
        vis &= cand_mask[:, t // cand_block] != 0
    return torch.where(vis, out, float("-inf"))


def block_max_ref(scores: torch.Tensor, cand_block: int = 8) -> torch.Tensor:
    S, T = scores.shape
    nb = -(-T // cand_block)
    pad = torch.full((S, nb * cand_block - T), float("-inf"), device=scores.device)
    return torch.cat([scores, pad], 1).unflatten(1, (nb, cand_block)).amax(-1)


# ----------------------------------------------------------------------------- AOT variants


def score_specs(target, widths=PUBLISHED):
    c = widths
    if c.index_head_dim // 2 < 32:
        # the integer MMA runs over each half of a row's codes (even / odd E2M1 lanes), and Triton's int8 dot
        # needs K >= 32: narrower widths (the tiny preset's 32) have no variant, the scorer stays its reference
        return []
    types = {"q_ptr": "*u8", "qe_ptr": "*u8", "wq_ptr": "*fp32", "k_ptr": "*u8", "ke_ptr": "*u8", "nvis_ptr": "*i32",
             "cand_ptr": "*u8", "s_ptr": "*fp32", "bmax_ptr": "*fp32", "cnt_ptr": "*i32", "S": "i32", "T": "i32",
             "NBLK": "i32"}
    out = []
    for phase, kernel, rows, bt, nw in (("prefill", _index_score_kernel, {"BQ": 16}, 128, 4),
                                        ("decode", _index_score_heads_kernel, {"PDL": False, "EARLY_Q": False}, 128,
                                         HEADS_WARPS)):
        for flavour, use_cand, bmax in (("source", False, True), ("reindex", True, False), ("plain", False, False)):
            const = dict({"H": c.index_n_heads, "CI": c.index_head_dim, "BT": bt, "CB": c.candidate_block_size,
                          "USE_CAND": use_cand, "WRITE_BMAX": bmax, "COUNT": True}, **rows)
            keys = dict(const, enable_fp_fusion=False, **({"maxnreg": HEADS_MAXNREG} if phase == "decode" else {}))
            out.append(aot_spec(kernel, f"{phase}_{flavour}_bt{bt}", types, const, num_warps=nw, num_stages=2,
                                keys=keys))
    return out
