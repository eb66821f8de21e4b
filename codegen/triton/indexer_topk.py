"""Indexer top-k: stable top-k selection over long score rows (no sorting network over the row).

One file: both paths (chunked, split radix select) share the int64 keys, the tie rule and the output contract
(ordered ids or flags) that `topk_select` promises; the split path alone is ~500 lines (five kernels and its
workspace), a candidate for its own module once nobody edits it.

What (spec §3.4, §7.1): the k best of each row of scores [S, N] (fp32), descending score, ties
toward the LOWER index, -1 where the score is -inf or fewer than k entries exist; `pin` forces one
entry per row to +inf first (the newest visible candidate block).

Keys: each float score maps to an order-preserving int32 (sign-magnitude flip, -0 -> +0); with the
index, a unique int64 key (score key << 32 | 2^31-1-index) whose descending order is (descending
score, ascending index). Two paths, dispatched by `topk_select`:

Chunked (many rows, or short rows): a chunk of CHUNK scores finds its k-th largest key by a
32-step bitwise threshold search (count keys >= candidate; invalid keys count as 0, below every
candidate), keeps every key above it and, of the keys equal to it, the lowest indices (a prefix
count in index order), and stores them compactly as unique int64 keys. One merge program takes up
to MERGE / K lists of a row (all 32 chunk lists of a 131,072-score row at K = 512) and selects by
the same search on the score half, then (only when the threshold score is tied past k) on the index
half. The last pass sorts its K unique keys (bitonic tl.sort) and writes every output position (-1
past the valid ones). A row of 131,072 scores is two launches: 32 chunk programs, then one merge
program, which alone walks 16,384 keys: at one row that serial program dominates.

Split (S <= SPLIT_MAX_S rows of N >= SPLIT_MIN_N): each row over P = N / CHUNK programs (about one
per SM, `split_chunk`). Phases, each over all P programs of every row:
1-4. radix levels on the unsigned key, 8 bits each (bits 31..24, 23..16, 15..8, 7..0): each program's
   local tl.histogram (256 bins) of the keys inside the current threshold bucket, added to a per-row
   global histogram by atomics (at most min(CHUNK, 256) a program, so exact ties do not pile up on
   one address); then the digit holding the kk-th key (kk = min(k, valid)) is picked: the threshold
   bucket (h keys), `above` keys in higher buckets. Levels 2-4 run only while h > cap (SPLIT_CAP).
5. gather: keys above the bucket -> a sure list (fewer than kk), the bucket's keys -> a bucket list
   (h <= cap), slots from per-row atomic counters (unordered); after level 4 the bucket is one
   exact score: only each program's count of it is stored.
6. rank: a sure key's output position is the number of larger sure keys, a bucket key's is above +
   the number of larger bucket keys (kept when < kk), pairwise over unique keys (so equal scores
   order by index; the list loads pipelined); exact ties go in index order: above + ties in earlier
   programs + the rank in the chunk. Positions kk..k get -1. Every position is written once.
Two forms, the same indices (`topk_select_split(fused=)`):
- one launch (`_split_fused_kernel`, the default on CUDA when rows × P <= the SMs / share, so every program
  is resident, also beside a second such selection at share 2): the phases are separated by per-row grid barriers (a release increment of a counter, then
  acquire polling), every program reads each level's whole histogram and picks the digit itself (the
  same integers everywhere, so the same decisions), the keys stay in registers throughout;
- six launches (a kernel per level, gather, rank; the interpreter, ROCm, larger grids): the last program
  of a level to arrive (arrival.py) exchanges the histogram for zeros and stores the row's state; later
  levels' programs read it and exit when the row is done.
Workspace: the per-row histograms and slot counters are zeroed once and left zeroed by the kernels
(no memset in a CUDA graph); allocate them (a first call) before capture.

Specialization keys: chunked K (512 / 2048), CHUNK (4096 per chunk program; MERGE = 16384 per merge
program, 16 warps), USE_PIN, FINAL; split CHUNK (128..4096 by N and S; warps `split_warps`), BITS = 8, LEVEL,
K, CAP, R, TB, USE_PIN, MASK (the set as flags); the fused form on CUDA targets, also with PDL. The AOT variants
build the candidate selection (pinned) as flags and the top-512 as ordered indices, PDL off.

Measured (H200, torch 2.11 / triton 3.6, graph replay): before, `benchmarks/tuning/tune_indexer_topk.json`:
top-512 of 131,072 at one row 48.6 -> 24.2 µs (chunked -> five launches of 11-bit digits), candidate-2048
of 16,384 blocks 63.4 -> 29.0 µs; four rows 48.9 -> 36.1 and 63.6 -> 38.6 µs; at eight rows the split
path is slower (61.8 vs 52.4 µs), hence SPLIT_MAX_S = 4. The one-launch form with those 11-bit digits
saved only ~2 µs (`tuning/topk_phase_times_11bit.json`: 22.3 / 28.1 µs against 24.0 / 29.3 for the five
launches, 20 calls a replay; `tuning/kernels_attention_fused11bit.json`: 24.1 / 33.8 µs), and clock64
reads between its phases showed why: Triton's 2048-bin tl.histogram took 17-22 k cycles a program (its
warps' bins are combined through shared-memory atomics, 2048 per warp). With 256-bin levels a level costs
~5.5 k cycles, barrier included, and the rows refine one level more. Now (`results/kernels_attention.json`):
top-512 14.0 µs (cold 20.3), candidate-2048 16.3 µs (cold 18.5); the six-launch form of the same code
17.5 / 20.1 µs warm (`results/topk_phase_times.json`). What is left of the one-row time, in program
cycles: two levels ~12 k, gather + barrier ~5 k, rank ~0.4 k for top-512 but ~10.6 k for the 2,030 sure
keys of the candidates (pairwise).
Then (benchmarks/indexer_step.py, results/indexer_step.json): the set as flags (`as_mask`: no rank of
the sure keys) takes the candidate selection at half the SMs 22.9 -> 9.1 µs warm; 4 keys a thread instead of 16
(SPLIT_KEYS_PER_THREAD: the one launch unrolls its levels over a thread's keys, and 5,240 sm90 instructions at chunk
2048 run once a program, fetched cold) takes the top-512 at half the SMs 27.0 -> 18.0 µs cold (15.8 -> 16.3 warm).

Selected set as flags (`topk_select(as_mask=True)`, split path: MASK): the output is uint8 [S, N], 1 for the kk
selected keys; the gather keeps no sure list, a program writes its chunk's flags (sure keys 1, others 0), the
bucket keys get theirs from the slices that rank the bucket list, exact ties by the same index-order count.

Known gaps: the chunked path at one row fills 32 of the 132 SMs and the merge one, both bounded by
their 32 sequential counting steps. The pairwise rank costs n^2 comparisons for n sure or bucket keys
(the candidate selection's 2,030 sure keys as ordered ids: ~5 µs; as flags they are not ranked). The chunked
path's flags are its ids scattered by torch (extra launches). The one-launch form relies on every program being
resident, which one program per SM gives unless the GPU is partitioned (MPS / green contexts with fewer
SMs than `sm_count` reports): there it would wait forever; force `fused=False`. Its workspace and the
arrival counters are shared per device and `pool`: two split selections that run concurrently on
different streams need different pools (and share=2, so that both one-launch grids fit together). NaN scores are not handled specially by either path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.targets import interpreting, sm_count
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter, signal_done, wait_count
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw
from dsv41c.codegen.triton.widths import PUBLISHED


@triton.jit
def _compact_emit(comp, sel, kk, dst_ptr, idx_ptr, row, slot, k_out, K: tl.constexpr, FINAL: tl.constexpr):
    """Store the kk selected int64 keys of comp compactly to dst[slot, :K] (INT64_MIN pad); if FINAL,
    order those K keys descending (a bitonic tl.sort: the keys are unique) and write the decoded
    indices to idx[row, :k_out], -1 past the kk valid ones."""
    pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    base = dst_ptr + slot.to(tl.int64) * K
    tl.store(base + pos, comp, mask=sel)
    j = tl.arange(0, K)
    tl.store(base + j, tl.full((K,), -9223372036854775808, tl.int64), mask=j >= kk)
    if FINAL:
        tl.debug_barrier()  # the compact row is re-read by other threads of this program
        srt = tl.sort(tl.load(base + j), descending=True)
        idx = 2147483647 - (srt & 0xFFFFFFFF).to(tl.int32)
        idx = tl.where(j < kk, idx, -1)
        tl.store(idx_ptr + row.to(tl.int64) * k_out + j, idx, mask=j < k_out)


@triton.jit
def _kth_key32(ku, valid, kk):
    """The kk-th largest of the uint32 keys ku[valid], bit by bit from the top (32 counting steps).
    Invalid keys count as 0, below every candidate (a candidate has its current bit set)."""
    ku = tl.where(valid, ku, 0)
    thr = tl.zeros((), tl.uint32)
    bit = tl.full((), 0x80000000, tl.uint32)
    for _ in range(32):
        cand = thr | bit
        cnt = tl.sum((ku >= cand).to(tl.int32), axis=0)
        thr = tl.where(cnt >= kk, cand, thr)
        bit = bit >> 1
    return thr


@triton.jit
def _topk_chunk_kernel(s_ptr, pin_ptr, dst_ptr, idx_ptr, N, n_chunks, stride_s, k, k_out,
                       K: tl.constexpr, CHUNK: tl.constexpr, USE_PIN: tl.constexpr, FINAL: tl.constexpr):
    ch = tl.program_id(0)
    row = tl.program_id(1)
    i = ch * CHUNK + tl.arange(0, CHUNK)
    key, ku, valid = _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
    kk = tl.minimum(tl.sum(valid.to(tl.int32), axis=0), k)
    thr = _kth_key32(ku, valid, kk)
    gt = valid & (ku > thr)
    eq = valid & (ku == thr)
    # ties at the threshold: the lowest indices (the chunk is in index order)
    eq_rank = tl.cumsum(eq.to(tl.int32), axis=0)
    sel = gt | (eq & (eq_rank <= kk - tl.sum(gt.to(tl.int32), axis=0)))
    comp = (key.to(tl.int64) << 32) | (2147483647 - i).to(tl.int64)
    _compact_emit(comp, sel, kk, dst_ptr, idx_ptr, row, row * n_chunks + ch, k_out, K, FINAL)


@triton.jit
def _topk_merge_kernel(src_ptr, dst_ptr, idx_ptr, n_in, n_out, k, k_out,
                       K: tl.constexpr, CHUNK: tl.constexpr, FINAL: tl.constexpr):
    g = tl.program_id(0)
    row = tl.program_id(1)
    j = tl.arange(0, CHUNK)
    lst = g * (CHUNK // K) + j // K
    x = tl.load(src_ptr + (row.to(tl.int64) * n_in + lst) * K + j % K, mask=lst < n_in,
                other=-9223372036854775808)
    valid = x != -9223372036854775808
    hi = (x >> 32).to(tl.int32).to(tl.uint32, bitcast=True) ^ 0x80000000  # score order
    lo = (x & 0xFFFFFFFF).to(tl.uint32)  # larger = lower index
    kk = tl.minimum(tl.sum(valid.to(tl.int32), axis=0), k)
    thr = _kth_key32(hi, valid, kk)
    gt = valid & (hi > thr)
    eq = valid & (hi == thr)
    need = kk - tl.sum(gt.to(tl.int32), axis=0)
    thr_lo = tl.zeros((), tl.uint32)
    if tl.sum(eq.to(tl.int32), axis=0) > need:  # ties at the threshold: keep the lowest indices
        thr_lo = _kth_key32(lo, eq, need)
    sel = gt | (eq & (lo >= thr_lo))
    # the key rebuilt from its halves: x itself need not stay live across the searches (registers)
    x = ((hi ^ 0x80000000).to(tl.int32, bitcast=True).to(tl.int64) << 32) | lo.to(tl.int64)
    _compact_emit(x, sel, kk, dst_ptr, idx_ptr, row, row * n_out + g, k_out, K, FINAL)


# ----------------------------------------------------------------------------- split path (few rows)


@triton.jit
def _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN: tl.constexpr):
    """Scores row[i] as (signed order key int32, unsigned order key uint32, valid): -0 -> +0, the
    pinned index -> +inf, valid = inside the row and not -inf (the chunked and the split paths)."""
    m = i < N
    x = tl.load(s_ptr + row.to(tl.int64) * stride_s + i, mask=m, other=float("-inf"))
    if USE_PIN:
        pin = tl.load(pin_ptr + row)
        x = tl.where(i == pin, float("inf"), x)
    valid = m & (x != float("-inf"))
    x = tl.where(x == 0.0, 0.0, x)  # -0 -> +0: they compare equal
    u = x.to(tl.int32, bitcast=True)
    key = u ^ ((u >> 31) & 0x7FFFFFFF)  # signed order = float order
    ku = key.to(tl.uint32, bitcast=True) ^ 0x80000000  # unsigned order = float order
    return key, ku, valid


@triton.jit
def _level_digits(ku, valid, prefix, LEVEL: tl.constexpr, BITS: tl.constexpr):
    """(digit, mask) of radix level LEVEL: bits [32 - BITS·LEVEL, 32 - BITS·(LEVEL-1)) of the unsigned key,
    over the keys whose known prefix (the higher levels' digits) equals the threshold bucket's."""
    LO: tl.constexpr = 32 - BITS * LEVEL
    dig = ((ku >> LO) & ((1 << BITS) - 1)).to(tl.int32)
    if LEVEL == 1:
        return dig, valid
    else:
        return dig, valid & ((ku >> (LO + BITS)) == prefix)


@triton.jit
def _pick_digit(h, b, kk, above, prefix, cap, LEVEL: tl.constexpr, BITS: tl.constexpr):
    """From a level's row histogram h [2^BITS]: the digit holding the kk-th largest key. Returns the new
    threshold state (prefix, shift, above, h_bucket, done): the bucket is the keys with key >> shift ==
    prefix, `above` keys lie in higher buckets; done once the bucket holds <= cap keys, at the last level
    (one exact score) or with no valid score."""
    need = kk - above  # >= 1 unless the row has no valid score
    suf = tl.cumsum(h, axis=0, reverse=True)  # keys in this digit or above
    d = tl.max(tl.where(suf >= need, b, -1), axis=0)
    hd = tl.sum(tl.where(b == d, h, 0), axis=0)
    above = above + tl.sum(tl.where(b == d, suf, 0), axis=0) - hd
    if LEVEL == 1:
        prefix = d.to(tl.uint32)
    else:
        prefix = (prefix << BITS) | d.to(tl.uint32)
    shift = hd * 0 + (32 - BITS * LEVEL)  # a tensor, like the other results (the fused kernel's branches agree)
    done = ((hd <= cap) | (LEVEL == 32 // BITS) | (kk == 0)).to(tl.int32)
    return prefix, shift, above, hd, done


@triton.jit
def _store_state(st, prefix, shift, above, hd, kk, done):
    tl.store(st, prefix.to(tl.int32, bitcast=True))
    tl.store(st + 1, shift)
    tl.store(st + 2, above)
    tl.store(st + 3, hd)
    tl.store(st + 4, kk)
    tl.store(st + 5, done)


@triton.jit
def _split_hist_kernel(s_ptr, pin_ptr, hist_ptr, state_ptr, cnt_ptr, N, stride_s, k, cap, n_prog,
                       CHUNK: tl.constexpr, BITS: tl.constexpr, LEVEL: tl.constexpr, USE_PIN: tl.constexpr):
    """One radix level of a row's kk-th largest key: the histogram of the next digit (`_level_digits`)
    summed over the row's programs by atomics; the last arriver picks the digit holding the kk-th key
    (`_pick_digit`). state[row] = (prefix, shift, above, h, kk, done): the threshold bucket is the keys
    with key >> shift == prefix (h of them), `above` keys lie in higher buckets."""
    p = tl.program_id(0)
    row = tl.program_id(1)
    st = state_ptr + row * 8
    if LEVEL == 1:
        go = True
        prefix = tl.zeros((), tl.uint32)
    else:
        go = tl.load(st + 5) == 0
        prefix = tl.load(st).to(tl.uint32, bitcast=True)
    if go:
        i = p * CHUNK + tl.arange(0, CHUNK)
        key, ku, valid = _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
        NB: tl.constexpr = 1 << BITS
        dig, m = _level_digits(ku, valid, prefix, LEVEL, BITS)
        hl = tl.histogram(dig, NB, mask=m)
        b = tl.arange(0, NB)
        hrow = hist_ptr + row.to(tl.int64) * NB + b
        tl.atomic_add(hrow, hl, mask=hl > 0, sem="relaxed")  # at most min(CHUNK, NB) atomics a program
        if arrive_last(cnt_ptr + row, n_prog):
            h = tl.atomic_xchg(hrow, tl.zeros([NB], tl.int32), sem="relaxed")  # read, and zero for the next launch
            if LEVEL == 1:
                kk = tl.minimum(tl.sum(h, axis=0), k)
                above = kk * 0
            else:
                kk = tl.load(st + 4)
                above = tl.load(st + 2)
            prefix, shift, above, hd, done = _pick_digit(h, b, kk, above, prefix, cap, LEVEL, BITS)
            _store_state(st, prefix, shift, above, hd, kk, done)
            reset_counter(cnt_ptr + row)


@triton.jit
def _gather_lists(key, ku, valid, i, prefix, shift, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, row, p, n_prog,
                  K: tl.constexpr, CAP: tl.constexpr, MASK: tl.constexpr = False):
    """This program's keys above the threshold bucket -> sure[row] (fewer than kk <= K), as unique int64
    keys (score key << 32 | 2^31-1-index); the bucket's keys -> bkt[row] (h <= CAP of them) or, when the
    bucket is one exact score, only this program's count of them -> ties[row, p]. Slots come from a
    per-row atomic counter: the order in the lists is arbitrary (the rank pass sorts by unique key).
    MASK (a selected-set output, `_mask_outputs`): no sure list (a sure key is selected wherever it is)."""
    hi = ku >> shift
    comp = (key.to(tl.int64) << 32) | (2147483647 - i).to(tl.int64)
    sure = valid & (hi > prefix)
    ns = tl.sum(sure.to(tl.int32), axis=0)
    if (ns > 0) & (not MASK):
        base = tl.atomic_add(slot_ptr + row * 2, ns, sem="relaxed")
        pos = base + tl.cumsum(sure.to(tl.int32), axis=0) - 1
        tl.store(sure_ptr + row.to(tl.int64) * K + pos, comp, mask=sure)
    eq = valid & (hi == prefix)
    ne = tl.sum(eq.to(tl.int32), axis=0)
    if shift == 0:
        tl.store(ties_ptr + row.to(tl.int64) * n_prog + p, ne)
    elif ne > 0:
        base = tl.atomic_add(slot_ptr + row * 2 + 1, ne, sem="relaxed")
        pos = base + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        tl.store(bkt_ptr + row.to(tl.int64) * CAP + pos, comp, mask=eq)


@triton.jit
def _split_gather_kernel(s_ptr, pin_ptr, state_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, N, stride_s, n_prog,
                         K: tl.constexpr, CAP: tl.constexpr, CHUNK: tl.constexpr, USE_PIN: tl.constexpr,
                         MASK: tl.constexpr = False):
    """`_gather_lists` for every program of every row, the threshold from state[row]."""
    p = tl.program_id(0)
    row = tl.program_id(1)
    st = state_ptr + row * 8
    prefix = tl.load(st).to(tl.uint32, bitcast=True)
    shift = tl.load(st + 1).to(tl.uint32)
    i = p * CHUNK + tl.arange(0, CHUNK)
    key, ku, valid = _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
    _gather_lists(key, ku, valid, i, prefix, shift, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, row, p, n_prog, K, CAP,
                  MASK)


@triton.jit
def _rank_list(lst_ptr, n, j0, R: tl.constexpr, TB: tl.constexpr):
    """Entries j0 .. j0+R of the n unique int64 keys at lst_ptr and, for each, how many of the n keys
    are larger (its rank in descending order): R x TB pairwise comparisons per step. `.cg` loads: the
    lists were written by other programs (in the fused kernel, of the same launch)."""
    j = j0 + tl.arange(0, R)
    a = tl.load(lst_ptr + j, mask=j < n, other=-9223372036854775808, cache_modifier=".cg")
    r = tl.zeros((R,), tl.int32)
    for t in tl.range(0, n, TB, num_stages=3):  # the list's loads pipelined: L2 latency, not the compare, bounds it
        tt = t + tl.arange(0, TB)
        bb = tl.load(lst_ptr + tt, mask=tt < n, other=-9223372036854775808, cache_modifier=".cg")
        r += tl.sum((bb[None, :] > a[:, None]).to(tl.int32), axis=1)
    idx = 2147483647 - (a & 0xFFFFFFFF).to(tl.int32)
    return j < n, r, idx


@triton.jit
def _ties_before(ties_ptr, row, n_prog, p, above):
    """above + the exact ties the row's programs before p hold (their gather counts, `.cg`: other programs'
    stores): where this program's ties start in index order."""
    before = above
    for t in range(0, p, 128):
        tt = t + tl.arange(0, 128)
        before += tl.sum(tl.load(ties_ptr + row.to(tl.int64) * n_prog + tt, mask=tt < p, other=0,
                                 cache_modifier=".cg"), axis=0)
    return before


@triton.jit
def _rank_outputs(idx_ptr, s_ptr, pin_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, N, stride_s, k, n_prog, row, p,
                  prefix, shift, above, h, kk, K: tl.constexpr, CAP: tl.constexpr, CHUNK: tl.constexpr,
                  R: tl.constexpr, TB: tl.constexpr, USE_PIN: tl.constexpr):
    """This program's share of the row's output positions: a sure key's position is its rank among the
    sure keys; a bucket key's is above + its rank in the bucket (kept when < kk); an exact tie's is above
    + the ties in earlier programs + its rank in this chunk (index order); -1 from kk to k. R-entry
    slices of the lists, strided over the row's programs."""
    out = idx_ptr + row.to(tl.int64) * k
    for j0 in range(p * R, k, n_prog * R):
        j = j0 + tl.arange(0, R)
        tl.store(out + j, tl.full((R,), -1, tl.int32), mask=(j >= kk) & (j < k))
    for j0 in range(p * R, above, n_prog * R):
        m, r, idx = _rank_list(sure_ptr + row.to(tl.int64) * K, above, j0, R, TB)
        tl.store(out + r, idx, mask=m)
    if shift != 0:
        for j0 in range(p * R, h, n_prog * R):
            m, r, idx = _rank_list(bkt_ptr + row.to(tl.int64) * CAP, h, j0, R, TB)
            r = above + r
            tl.store(out + r, idx, mask=m & (r < kk))
    else:
        before = _ties_before(ties_ptr, row, n_prog, p, above)
        if before < kk:  # some of this chunk's ties are taken (the lowest indices overall)
            i = p * CHUNK + tl.arange(0, CHUNK)
            key, ku, valid = _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
            eq = valid & (ku == prefix)
            pos = before + tl.cumsum(eq.to(tl.int32), axis=0) - 1
            tl.store(out + pos, i, mask=eq & (pos < kk))
    if p == 0:  # the gather's slot counters, zero for the next launch (nothing else reads them here)
        tl.store(slot_ptr + row * 2 + tl.arange(0, 2), tl.zeros((2,), tl.int32))


@triton.jit
def _mask_outputs(mask_ptr, ku, valid, i, N, slot_ptr, bkt_ptr, ties_ptr, n_prog, row, p, prefix, shift, above, h, kk,
                  CAP: tl.constexpr, R: tl.constexpr, TB: tl.constexpr):
    """The selected SET as flags (MASK): mask[row, i] = 1 for the kk selected keys, 0 elsewhere, with no order
    among them, so no sure key is ranked (the pairwise rank of the sure list is most of an ordered selection of
    2,048 of 16,384: module docstring). This program writes its chunk's flags, except for the bucket keys
    of a bucket that is not one exact score: those are written by the R-entry slices that rank the bucket list
    (selected when above + rank < kk). An exact tie is selected by index order, as in `_rank_outputs`."""
    out = mask_ptr + row.to(tl.int64) * N
    hi = ku >> shift
    sure = valid & (hi > prefix)
    eq = valid & (hi == prefix)
    if shift == 0:  # the bucket is one exact score: the lowest indices of it first
        before = _ties_before(ties_ptr, row, n_prog, p, above)
        pos = before + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        tl.store(out + i, (sure | (eq & (pos < kk))).to(tl.uint8), mask=i < N)
    else:
        tl.store(out + i, sure.to(tl.uint8), mask=(i < N) & (eq == 0))
        for j0 in range(p * R, h, n_prog * R):
            m, r, idx = _rank_list(bkt_ptr + row.to(tl.int64) * CAP, h, j0, R, TB)
            tl.store(out + idx, (above + r < kk).to(tl.uint8), mask=m)
    if p == 0:  # the gather's slot counters, zero for the next launch (nothing else reads them here)
        tl.store(slot_ptr + row * 2 + tl.arange(0, 2), tl.zeros((2,), tl.int32))


@triton.jit
def _split_rank_kernel(idx_ptr, s_ptr, pin_ptr, state_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, N, stride_s, k,
                       n_prog, K: tl.constexpr, CAP: tl.constexpr, CHUNK: tl.constexpr, R: tl.constexpr,
                       TB: tl.constexpr, USE_PIN: tl.constexpr, MASK: tl.constexpr = False):
    """`_rank_outputs` (MASK: `_mask_outputs`, idx_ptr the uint8 flags) for every program of every row, the
    threshold state from state[row]."""
    p = tl.program_id(0)
    row = tl.program_id(1)
    st = state_ptr + row * 8
    if MASK:
        i = p * CHUNK + tl.arange(0, CHUNK)
        key, ku, valid = _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
        _mask_outputs(idx_ptr, ku, valid, i, N, slot_ptr, bkt_ptr, ties_ptr, n_prog, row, p,
                      tl.load(st).to(tl.uint32, bitcast=True), tl.load(st + 1).to(tl.uint32), tl.load(st + 2),
                      tl.load(st + 3), tl.load(st + 4), CAP, R, TB)
        return
    _rank_outputs(idx_ptr, s_ptr, pin_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, N, stride_s, k, n_prog, row, p,
                  tl.load(st).to(tl.uint32, bitcast=True), tl.load(st + 1), tl.load(st + 2), tl.load(st + 3),
                  tl.load(st + 4), K, CAP, CHUNK, R, TB, USE_PIN)


# ----------------------------------------------------------------------------- the same in one launch


@triton.jit
def _grid_sync(cnt_ptr, target):
    """Barrier over a row's programs (all resident: the launcher checks the grid fits the SMs): count this
    program in (arrival.signal_done: CTA barrier, gpu-scope release), then spin until `target` programs have
    (arrival.wait_count: gpu-scope acquire). The counter only grows within a launch; the last program out
    resets it."""
    signal_done(cnt_ptr)
    wait_count(cnt_ptr, target)


@triton.jit
def _fused_level(ku, valid, b, hist_ptr, cnt_ptr, n_prog, n_sync, kk, above, prefix, cap,
                 BITS: tl.constexpr, LEVEL: tl.constexpr):
    """One radix level inside the fused kernel: this program's histogram added to the row's (level
    LEVEL's own NB bins), a barrier, then every program reads the whole histogram and picks the digit
    itself (the same integers in every program, so the same state): no last arriver, no state round trip."""
    NB: tl.constexpr = 1 << BITS
    dig, m = _level_digits(ku, valid, prefix, LEVEL, BITS)
    hl = tl.histogram(dig, NB, mask=m)
    hrow = hist_ptr + (LEVEL - 1) * NB + b
    tl.atomic_add(hrow, hl, mask=hl > 0, sem="relaxed")
    _grid_sync(cnt_ptr, n_sync * n_prog)
    h = tl.load(hrow, cache_modifier=".cg")
    if LEVEL == 1:
        kk = tl.minimum(tl.sum(h, axis=0), kk)  # kk came in as k
        above = kk * 0
    prefix, shift, above, hd, done = _pick_digit(h, b, kk, above, prefix, cap, LEVEL, BITS)
    return kk, prefix, shift, above, hd, done


@triton.jit
def _split_fused_kernel(idx_ptr, s_ptr, pin_ptr, hist_ptr, state_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr,
                        cnt_ptr, N, stride_s, k, cap, n_prog, K: tl.constexpr, CAP: tl.constexpr,
                        CHUNK: tl.constexpr, BITS: tl.constexpr, R: tl.constexpr, TB: tl.constexpr,
                        USE_PIN: tl.constexpr, PDL: tl.constexpr = False, MASK: tl.constexpr = False):
    """The split path's launches in one: the same phases (`_level_digits` / `_pick_digit`, `_gather_lists`,
    `_rank_outputs`) separated by per-row grid barriers (`_grid_sync`) instead of kernel boundaries, the
    row's keys kept in registers from the first phase to the last. Levels 2..4 run only while the bucket is
    fuller than cap (the same decision in every program of the row). Every program must be resident at
    once: the launcher runs it only when rows × programs × share <= the GPU's SMs (one program per SM always
    fits, also with `share` such launches running at once).
    hist [S, 4, 2^BITS] (one histogram per level: a level's bins are read by every program after its
    barrier, so they are zeroed only at the end, by program 0), the slot counters and the barrier counter
    are left at zero for the next launch / graph replay.
    PDL (pdl.py): the scores are the previous kernel's, so the wait comes first; the release right after lets
    the next kernel be scheduled into what this grid leaves free (every program of this grid has executed the
    release, so the whole grid is resident by then and its barriers cannot starve)."""
    tl.static_assert(BITS == 8, "the fused kernel unrolls four radix levels of 8 bits")
    grid_wait(PDL)
    grid_release(PDL)
    NB: tl.constexpr = 1 << BITS
    p = tl.program_id(0)
    row = tl.program_id(1)
    cnt = cnt_ptr + row
    hist = hist_ptr + row.to(tl.int64) * (4 * NB)
    i = p * CHUNK + tl.arange(0, CHUNK)
    key, ku, valid = _row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
    b = tl.arange(0, NB)
    kk, prefix, shift, above, hd, done = _fused_level(ku, valid, b, hist, cnt, n_prog, 1, k, 0,
                                                      tl.zeros((), tl.uint32), cap, BITS, 1)
    n_sync = p * 0 + 1
    if done == 0:
        kk, prefix, shift, above, hd, done = _fused_level(ku, valid, b, hist, cnt, n_prog, 2, kk, above, prefix,
                                                          cap, BITS, 2)
        n_sync = p * 0 + 2
        if done == 0:
            kk, prefix, shift, above, hd, done = _fused_level(ku, valid, b, hist, cnt, n_prog, 3, kk, above,
                                                              prefix, cap, BITS, 3)
            n_sync = p * 0 + 3
            if done == 0:
                kk, prefix, shift, above, hd, done = _fused_level(ku, valid, b, hist, cnt, n_prog, 4, kk, above,
                                                                  prefix, cap, BITS, 4)
                n_sync = p * 0 + 4
    _gather_lists(key, ku, valid, i, prefix, shift.to(tl.uint32), slot_ptr, sure_ptr, bkt_ptr, ties_ptr, row, p,
                  n_prog, K, CAP, MASK)
    _grid_sync(cnt, (n_sync + 1) * n_prog)
    if MASK:
        _mask_outputs(idx_ptr, ku, valid, i, N, slot_ptr, bkt_ptr, ties_ptr, n_prog, row, p, prefix,
                      shift.to(tl.uint32), above, hd, kk, CAP, R, TB)
    else:
        _rank_outputs(idx_ptr, s_ptr, pin_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, N, stride_s, k, n_prog, row,
                      p, prefix, shift, above, hd, kk, K, CAP, CHUNK, R, TB, USE_PIN)
    if p == 0:  # every program read every histogram before the gather barrier: zero them for the next launch
        for lv in range(0, n_sync):
            tl.store(hist + lv * NB + b, tl.zeros((NB,), tl.int32))
        _store_state(state_ptr + row * 8, prefix, shift, above, hd, kk, done)
    # the last program out leaves the barrier counter at 0 (every program has passed every barrier by then)
    if arrive_last(cnt, (n_sync + 2) * n_prog):
        reset_counter(cnt)


MERGE = 16384  # keys one merge program selects from (MERGE / K lists)
SPLIT_MAX_S = 4  # rows up to which topk_select splits each row over many programs (H200: faster at S <= 4, slower at 8)
SPLIT_MIN_N = 8192  # shorter rows: the one-program-per-chunk path is already one or two short launches
SPLIT_CAP = 512  # largest threshold bucket ranked pairwise (h^2 work); a fuller one is refined one more level
# keys a thread holds in a split-path program (`split_warps`): the one-launch kernel unrolls its four levels and
# gather over them, so its straight-line code grows with it (static sm90 SASS, Triton 3.9, top-512 at chunk 2048:
# 5,240 instructions at 16 keys a thread, 3,448 at 8, 2,736 at 4), and it runs once per program, fetched from DRAM
# when the L2 is cold. H200, L2-cold graph replay, twice, interleaved (tuning/indexer_step_keys_per_thread.json): the
# top-512 at half the SMs 26.9-27.0 µs at 16 keys a thread, 19.5-19.6 at 8, 18.0 at 4 (warm 15.8 / 14.7-14.8 /
# 16.3-16.4); the whole one-query step (PDL, candidates as flags) 43.9-44.1 / 35.6-35.8 / 32.3-32.4 (warm 28.0-28.2
# / 24.5 / 25.6)
SPLIT_KEYS_PER_THREAD = 4
RANK_R = 16  # list entries a program ranks per step (k = 2048 sure keys: 128 slices, about one per program)
_BITS = 8  # radix digit width: four levels of 8 bits, 256 bins each. Triton's tl.histogram combines its warps'
# bins through shared-memory atomics, so its cost grows with the bins: on the H200 (triton 3.6, in-kernel clock
# reads) a 2048-bin histogram of 128..1024 keys took 17-22 k cycles a program, most of the one-row selection
_LEVELS = 32 // _BITS
_NB = 1 << _BITS


def split_path(S: int, N: int, k: int) -> bool:
    """Whether `topk_select` takes the split path (few long rows) for scores [S, N] and k, rather than chunks."""
    return 0 < S <= SPLIT_MAX_S and N >= SPLIT_MIN_N and k > 0


def topk_select(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int = 4096,
                merge: int = MERGE, pool: str = "split", share: int = 1, pdl: bool = False,
                as_mask: bool = False) -> torch.Tensor:
    """Top-k indices of each row of scores [S, N] (fp32): descending score, ties toward the lower
    index; `pin` [S] (int32, -1 = none) is forced to +inf first; -1 where the score is -inf or
    fewer than k entries exist. Returns int32 [S, k].

    Few long rows (S <= SPLIT_MAX_S, N >= SPLIT_MIN_N, `split_path`): `topk_select_split` (each row over ~all
    SMs, or 1/share of them).
    Otherwise chunks of `chunk` scores each keep their k best (threshold search on the
    order-preserving score key, threshold ties by lowest index); groups of merge/K lists are merged
    the same way on the unique int64 (score, index) keys; the last pass orders its K keys and writes
    every position.

    pool / share (the split path): the workspace and counters to use, and the fraction 1/share of the SMs
    to plan its grid for; a caller that runs two selections at once on two streams gives each its own pool
    and share=2, so that both one-launch grids are resident together (indexer.indexer_topk). pdl: the one-launch
    split kernel is launched with programmatic dependent launch (pdl.py; the caller checks `pdl_for`); the other
    forms ignore it.
    as_mask: return the selected SET instead, uint8 flags [S, N] (1 = selected), for a consumer that only asks
    whether an entry was selected (the candidate blocks: a mask is what the Reindex layers read). The split path
    then skips ranking its sure keys (`_mask_outputs`); the chunked path selects the indices and scatters them."""
    S, N = scores.shape
    if split_path(S, N, k):
        return topk_select_split(scores, k, pin, pool=pool, share=share, pdl=pdl, mask=as_mask)
    idx = topk_select_chunked(scores, k, pin, chunk=chunk, merge=merge)
    return ids_to_mask(idx, N) if as_mask else idx


def ids_to_mask(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Selected indices [S, k] (-1 padded) -> uint8 flags [S, n] (1 = selected)."""
    m = torch.zeros((idx.shape[0], n + 1), dtype=torch.uint8, device=idx.device)
    m.scatter_(1, torch.where(idx >= 0, idx.long(), n), 1)
    return m[:, :n].contiguous()


def topk_select_chunked(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int = 4096,
                        merge: int = MERGE) -> torch.Tensor:
    """The one-program-per-chunk path of `topk_select` (chunk lists, then merges); same contract."""
    S, N = scores.shape
    dev = scores.device
    if S == 0 or N == 0 or k == 0:
        return torch.full((S, k), -1, dtype=torch.int32, device=dev)
    out = torch.empty((S, k), dtype=torch.int32, device=dev)
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    K = triton.next_power_of_2(k)
    CHUNK = max(triton.next_power_of_2(chunk), 2 * K)
    n = triton.cdiv(N, CHUNK)
    use_pin = pin is not None
    pin_t = _pin_i32(pin) if use_pin else out
    if n == 1:
        CHUNK = max(triton.next_power_of_2(N), K)
    buf = torch.empty((S, n, K), dtype=torch.int64, device=dev)
    _topk_chunk_kernel[(n, S)](scores, pin_t, buf, out, N, n, scores.stride(0), k, k,
                               K=K, CHUNK=CHUNK, USE_PIN=use_pin, FINAL=n == 1, num_warps=8 if CHUNK >= 4096 else 4)
    MCHUNK = max(triton.next_power_of_2(merge), 2 * K)
    G = MCHUNK // K
    while n > 1:
        n_next = triton.cdiv(n, G)
        nxt = torch.empty((S, n_next, K), dtype=torch.int64, device=dev)
        _topk_merge_kernel[(n_next, S)](buf, nxt, out, n, n_next, k, k, K=K, CHUNK=MCHUNK, FINAL=n_next == 1,
                                        num_warps=16 if MCHUNK >= 16384 else (8 if MCHUNK >= 4096 else 4))
        buf, n = nxt, n_next
    return out


def _pin_i32(pin):
    return pin if pin.dtype == torch.int32 and pin.is_contiguous() else pin.to(torch.int32).contiguous()


_SPLIT_WS: dict = {}


def _split_workspace(dev, S: int, levels: int = 1, pool: str = "split"):
    """(hist [S, levels·_NB], slots [S, 2]) int32, zeroed once and left zeroed by the kernels (the six-launch
    path's last arriver of a radix level exchanges its histogram for zeros, the one-launch kernel's program 0
    zeroes its _LEVELS histograms; the rank pass zeroes the slot counters), so a CUDA-graph replay needs no
    memset. One buffer per `levels` (1: the six launches, _LEVELS: the one launch) and `pool` (selections that
    may run concurrently on two streams use different pools); grown, never shrunk; allocate (first call)
    before capture."""
    key = (dev.type, dev.index, levels, pool)
    ws = _SPLIT_WS.get(key)
    if ws is None or ws[0].shape[0] < S:
        n = max(S, 8)
        ws = (torch.zeros((n, levels * _NB), dtype=torch.int32, device=dev),
              torch.zeros((n, 2), dtype=torch.int32, device=dev))
        _SPLIT_WS[key] = ws
    return ws


def fused_for(dev, programs: int) -> bool:
    """Whether the one-launch split kernel may run: CUDA (not the interpreter, whose programs run one after
    another and would wait forever at the first barrier; not ROCm, untested) and a grid that is resident all
    at once, which one program per SM guarantees (`programs` <= the SM count)."""
    if interpreting() or dev.type != "cuda" or torch.version.hip is not None:
        return False
    return programs <= sm_count(dev)


def split_warps(chunk: int) -> int:
    """Warps of a split-path program: chunk / (32 · SPLIT_KEYS_PER_THREAD), 4 to 16."""
    return min(16, max(4, chunk // (32 * SPLIT_KEYS_PER_THREAD)))


def split_chunk(N: int, S: int, dev, share: int = 1) -> int:
    """Scores per program of the split path: about one program per SM over all rows (so the one-launch form's
    grid is resident), or per 1/share of the SMs (two selections running at once: both grids together then
    fit one program per SM), 128..4096 (with 11-bit digits the 2048-bin histogram spilled at 8192 on sm90;
    not re-measured with 8-bit ones)."""
    per_row = max(1, sm_count(dev) // (max(S, 1) * max(share, 1)))
    return min(4096, max(128, triton.next_power_of_2(triton.cdiv(N, per_row))))


def topk_select_split(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int | None = None,
                      cap: int = SPLIT_CAP, state: torch.Tensor | None = None, fused: bool | None = None,
                      pool: str = "split", share: int = 1, pdl: bool = False, mask: bool = False) -> torch.Tensor:
    """`topk_select` for few long rows: each row split over P = ceil(N / chunk) programs (module
    docstring: four 8-bit radix levels, a gather, a pairwise-rank pass). fused (None: `fused_for`): all of
    it in one launch with grid barriers (`_split_fused_kernel`), else six launches; the same indices either
    way. `state` (int32 [S, 8], optional): where the per-row threshold state is left
    (prefix, shift, above, h, kk, done), for tests that check which path a row took. pool: the workspace and
    arrival counters (`_split_workspace`, arrival.counters); share: plan the default chunk for 1/share of the
    SMs (`split_chunk`), and allow the one-launch form only for grids of at most SMs / share programs, so
    that `share` such selections running at once on different streams (different pools) are all resident.
    pdl: the one-launch kernel only (`_split_fused_kernel`'s PDL). mask: return uint8 flags [S, N] of the selected
    set (`topk_select`'s as_mask; `_mask_outputs`) instead of the ordered indices."""
    if scores.dim() != 2:
        raise ValueError(f"topk_select_split: scores must be [S, N], got shape {tuple(scores.shape)}")
    S, N = scores.shape
    dev = scores.device
    if S == 0 or N == 0 or k == 0:
        if mask:
            return torch.zeros((S, N), dtype=torch.uint8, device=dev)
        return torch.full((S, k), -1, dtype=torch.int32, device=dev)
    if N >= 2 ** 31 - 1:
        raise ValueError(f"topk_select_split: row length {N} does not fit the 31-bit index half of the key")
    if scores.dtype != torch.float32:
        raise ValueError(f"topk_select_split: scores must be float32, got {scores.dtype}")
    if pin is not None and tuple(pin.shape) != (S,):
        raise ValueError(f"topk_select_split: pin must be [S] = [{S}], got shape {tuple(pin.shape)}")
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    if share < 1:
        raise ValueError(f"topk_select_split: share must be >= 1, got {share}")
    CHUNK = triton.next_power_of_2(chunk if chunk is not None else split_chunk(N, S, dev, share))
    if cap < 0:
        raise ValueError(f"topk_select_split: cap must be >= 0, got {cap}")
    CAP = triton.next_power_of_2(max(cap, 2))  # bucket list size; cap itself is the refinement bound
    P = triton.cdiv(N, CHUNK)
    K = triton.next_power_of_2(k)
    out = torch.empty((S, N) if mask else (S, k), dtype=torch.uint8 if mask else torch.int32, device=dev)
    use_pin = pin is not None
    pin_t = _pin_i32(pin) if use_pin else out
    if fused is None:
        fused = fused_for(dev, P * S * share)
    elif fused and not fused_for(dev, P * S * share):
        why = ("the Triton interpreter runs programs one after another" if interpreting() else
               f"{dev} is not a CUDA GPU" if dev.type != "cuda" or torch.version.hip is not None else
               f"{P * S} programs (rows × programs, which must all be resident) × share {share} exceed the GPU's "
               f"{sm_count(dev)} SMs")
        raise ValueError(f"topk_select_split: fused=True is not possible here: {why}; use fused=False")
    hist, slots = _split_workspace(dev, S, _LEVELS if fused else 1, pool)
    cnt = counters(dev, S, pool=pool)
    if state is None:
        state = torch.empty((S, 8), dtype=torch.int32, device=dev)
    elif state.shape != (S, 8) or state.dtype != torch.int32 or not state.is_contiguous():
        raise ValueError(f"topk_select_split: state must be contiguous int32 [{S}, 8]")
    sure = torch.empty((1,) if mask else (S, K), dtype=torch.int64, device=dev)  # mask: no sure list
    bkt = torch.empty((S, CAP), dtype=torch.int64, device=dev)
    ties = torch.empty((S, P), dtype=torch.int32, device=dev)
    nw = split_warps(CHUNK)
    grid = (P, S)
    if fused:
        _split_fused_kernel[grid](out, scores, pin_t, hist, state, slots, sure, bkt, ties, cnt, N, scores.stride(0),
                                  k, cap, P, K=K, CAP=CAP, CHUNK=CHUNK, BITS=_BITS, R=RANK_R, TB=256,
                                  USE_PIN=use_pin, PDL=pdl, MASK=mask, num_warps=nw, **launch_kw(pdl))
        return out
    for level in range(1, _LEVELS + 1):
        _split_hist_kernel[grid](scores, pin_t, hist, state, cnt, N, scores.stride(0), k, cap, P,
                                 CHUNK=CHUNK, BITS=_BITS, LEVEL=level, USE_PIN=use_pin, num_warps=nw)
    _split_gather_kernel[grid](scores, pin_t, state, slots, sure, bkt, ties, N, scores.stride(0), P,
                               K=K, CAP=CAP, CHUNK=CHUNK, USE_PIN=use_pin, MASK=mask, num_warps=nw)
    _split_rank_kernel[grid](out, scores, pin_t, state, slots, sure, bkt, ties, N, scores.stride(0), k, P,
                             K=K, CAP=CAP, CHUNK=CHUNK, R=RANK_R, TB=256, USE_PIN=use_pin, MASK=mask, num_warps=nw)
    return out


def topk_select_ref(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int = 4096,
                    as_mask: bool = False) -> torch.Tensor:
    if as_mask:
        return ids_to_mask(topk_select_ref(scores, k, pin), scores.shape[1])
    s = scores.float().clone()
    if pin is not None:
        rows = torch.nonzero(pin >= 0).flatten()
        s[rows, pin[rows].long()] = float("inf")
    v, i = torch.sort(s, dim=-1, descending=True, stable=True)
    i = torch.where(v == float("-inf"), -1, i)[:, :k].to(torch.int32)
    if i.shape[1] < k:
        i = torch.cat([i, torch.full((i.shape[0], k - i.shape[1]), -1, dtype=torch.int32, device=i.device)], 1)
    return i


# ----------------------------------------------------------------------------- AOT variants


def topk_specs(target, widths=PUBLISHED):
    c = widths
    out = []
    for k in (c.index_topk, c.candidate_topk_blocks):
        K = triton.next_power_of_2(k)
        chunk = max(4096, 2 * K)
        for final in (False, True):
            tag = f"k{K}_{'final' if final else 'part'}"
            out.append(aot_spec(_topk_chunk_kernel, f"chunk_{tag}",
                                {"s_ptr": "*fp32", "pin_ptr": "*i32", "dst_ptr": "*i64", "idx_ptr": "*i32", "N": "i32",
                                 "n_chunks": "i32", "stride_s": "i32", "k": "i32", "k_out": "i32"},
                                {"K": K, "CHUNK": chunk, "USE_PIN": k == c.candidate_topk_blocks, "FINAL": final}, num_warps=8))
            out.append(aot_spec(_topk_merge_kernel, f"merge_{tag}",
                                {"src_ptr": "*i64", "dst_ptr": "*i64", "idx_ptr": "*i32", "n_in": "i32", "n_out": "i32",
                                 "k": "i32", "k_out": "i32"},
                                {"K": K, "CHUNK": MERGE, "FINAL": final}, num_warps=16))
        # the split path at one decode row: 131,072 scores / 16,384 blocks over ~128 programs (split_chunk)
        pin = k == c.candidate_topk_blocks
        schunk = 128 if pin else 1024
        n_row = 16384 if pin else 131072
        row = {"s_ptr": "*fp32", "pin_ptr": "*i32", "N": "i32", "stride_s": "i32", "state_ptr": "*i32"}
        for level in range(1, _LEVELS + 1):
            out.append(aot_spec(_split_hist_kernel, f"split_hist{level}_k{K}_c{schunk}",
                                {**row, "hist_ptr": "*i32", "cnt_ptr": "*i32", "k": "i32", "cap": "i32", "n_prog": "i32"},
                                {"CHUNK": schunk, "BITS": _BITS, "LEVEL": level, "USE_PIN": pin},
                                num_warps=split_warps(schunk)))
        lists = {"slot_ptr": "*i32", "sure_ptr": "*i64", "bkt_ptr": "*i64", "ties_ptr": "*i32", "n_prog": "i32"}
        # the candidate blocks (pinned) as the flags the Reindex layers read (MASK), the top-k as ordered indices
        out.append(aot_spec(_split_gather_kernel, f"split_gather_k{K}_c{schunk}", {**row, **lists},
                            {"K": K, "CAP": SPLIT_CAP, "CHUNK": schunk, "USE_PIN": pin, "MASK": pin},
                            num_warps=split_warps(schunk)))
        out.append(aot_spec(_split_rank_kernel, f"split_rank_k{K}_c{schunk}",
                            {**row, **lists, "idx_ptr": "*u8" if pin else "*i32", "k": "i32"},
                            {"K": K, "CAP": SPLIT_CAP, "CHUNK": schunk, "R": RANK_R, "TB": 256, "USE_PIN": pin,
                             "MASK": pin}, num_warps=split_warps(schunk)))
        if target.startswith("cuda:"):  # the one-launch form (its grid barriers are only exercised on CUDA)
            # share 1: alone on the GPU; share 2: twice the chunk, beside the other selection of the indexer step
            # on a second stream (indexer.indexer_topk), so that both grids are resident together
            for share in (1, 2):
                fchunk = schunk * share
                fused_ce = {"K": K, "CAP": SPLIT_CAP, "CHUNK": fchunk, "BITS": _BITS, "R": RANK_R, "TB": 256,
                            "USE_PIN": pin, "PDL": False, "MASK": pin}
                out.append(aot_spec(_split_fused_kernel, f"split_fused_k{K}_c{fchunk}",
                                    {"idx_ptr": "*u8" if pin else "*i32", "s_ptr": "*fp32", "pin_ptr": "*i32",
                                     "hist_ptr": "*i32",
                                     "state_ptr": "*i32", "slot_ptr": "*i32", "sure_ptr": "*i64", "bkt_ptr": "*i64",
                                     "ties_ptr": "*i32", "cnt_ptr": "*i32", "N": "i32", "stride_s": "i32", "k": "i32",
                                     "cap": "i32", "n_prog": "i32"},
                                    fused_ce, num_warps=split_warps(fchunk),
                                    # the grid's programs must all be resident (its barriers wait on each other): a
                                    # runtime launches this variant only where RESIDENT_PROGRAMS × SHARE <= the SMs
                                    # (SHARE such grids at once), the six-launch variants elsewhere
                                    keys={**fused_ce, "RESIDENT_PROGRAMS": n_row // fchunk, "SHARE": share}))
    return out
