"""Indexer top-k: stable top-k selection over long score rows (no sorting network over the row).

What (spec §3.4, §7.1): the k best of each row of scores [S, N] (fp32), descending score, ties
toward the LOWER index, -1 where the score is -inf or fewer than k entries exist; `pin` forces one
entry per row to +inf first (the newest visible candidate block).

Algorithm: each float score maps to an order-preserving int32 (sign-magnitude flip, -0 -> +0).
A chunk of CHUNK scores finds its k-th largest key by a 32-step bitwise threshold search (count
keys >= candidate; invalid keys count as 0, below every candidate), keeps every key above it and,
of the keys equal to it, the lowest indices (a prefix count in index order), and stores them
compactly as unique int64 keys (score key << 32 | 2^31-1-index), whose descending order is
(descending score, ascending index). One merge program takes up to MERGE / K lists of a row (all
32 chunk lists of a 131,072-score row at K = 512) and selects by the same search on the score half,
then (only when the threshold score is tied past k) on the index half. The last pass sorts its K
unique keys (bitonic tl.sort) and writes every output position (-1 past the valid ones), so the
host allocates without filling. A decode row of 131,072 scores is two launches: 32 chunk programs,
then one merge program.

Specialization keys: K (512 / 2048), CHUNK (4096 per chunk program; MERGE = 16384 per merge
program, 16 warps), USE_PIN, FINAL.

Known gaps: at one row the chunk stage fills 32 of the 132 SMs and the merge one; both stages are
bounded by their 32 sequential counting steps (a block reduction each), not by bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import aot_spec


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


MERGE = 16384  # keys one merge program selects from (MERGE / K lists)


def topk_select(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int = 4096,
                merge: int = MERGE) -> torch.Tensor:
    """Top-k indices of each row of scores [S, N] (fp32): descending score, ties toward the lower
    index; `pin` [S] (int32, -1 = none) is forced to +inf first; -1 where the score is -inf or
    fewer than k entries exist. Returns int32 [S, k].

    Chunks of `chunk` scores each keep their k best (threshold search on the order-preserving score
    key, threshold ties by lowest index); groups of merge/K lists are merged the same way on the
    unique int64 (score, index) keys; the last pass orders its K keys and writes every position."""
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
    pin_t = (pin if pin.dtype == torch.int32 and pin.is_contiguous() else pin.to(torch.int32).contiguous()) \
        if use_pin else out
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


def topk_select_ref(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int = 4096) -> torch.Tensor:
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


def topk_specs(target):
    from dsv41c.frontend.config import preset

    c = preset("full")
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
    return out
