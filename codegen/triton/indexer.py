"""Indexer: exact integer scoring of FP4 queries/keys, candidate blocks, stable top-k.

What (spec §3.4, §7.1):
`I[s,t] = Σ_h wq[s,h]·ReLU(q[s,h]·k[t])` with wq = w·d^-0.5 (w = weights_proj(x)·H^-0.5, d = 128),
queries [S, 32, 128] and keys [T, 128] in FP4 E2M1 with one UE8M0 scale per 32 channels;
-inf where t ≥ (p+1)//ratio (not yet visible) or, at Reindex layers, outside the candidate mask.
Then: block max over blocks of 8 positions (the block of the newest visible position pinned to
+inf), top-2048 candidate blocks (layer 20), and the top-512 positions, ties toward the LOWER
index (descending score, ascending index), -1 where fewer are visible.

The float32 reference fixes one order: dequantize to fp32, dot each 32-channel block (exact:
its terms are multiples of one power of two and sum to < 2^24 of it), add the four block
partials left to right, ReLU, then add the heads' `wq·relu` one head at a time (h = 0..H-1).

Exact integer path (why the kernel's scores are bit-identical to that reference): E2M1 values
times 2 are integers in [-12, 12]. For each query-head row and each key row, the per-32-channel
exponents are aligned to the row's smallest exponent (over non-zero blocks) by shifting the
integer codes left; if every shifted code fits INT8 (|v|<<shift <= 127, checked per row) the
dot is ONE int8 x int8 -> int32 product sum A over all 128 channels, and the real dot is
A · 2^(eq_min-127) · 2^(ek_min-127) / 4, exactly. The same row bound makes the reference's
left-to-right block sum exact too: every partial sum is an integer multiple of
2^(eq_min+ek_min-256) no larger than Σ|q_int8||k_int8| <= 128·127·127 < 2^24. So both equal
the real dot, and the remaining fp32 steps (ReLU, wq·r, the per-head sum in order h = 0..H-1)
are the same operations in the same order. Rows that fail the INT8 check fall back:
a query-head row that fails sends its head (for the program's 16 queries) down the block
path for that key tile ("per-head fallback"); a key row that fails sends the whole key tile down
the block path for every head ("whole-tile fallback"). The block path computes each 32-channel
block's integer dot (int8, unshifted) times its two scales, exactly, and adds the four block
partials left to right in fp32: the reference's order, so it matches bit for bit whatever the
exponent spread. The launch wrapper reports both counts (kernel-side atomics).
fp fusion is disabled at launch: `acc + wq·r` must not contract into an FMA.

Top-k (no sorting network over the long rows): each float score maps to an order-preserving int32 (sign-magnitude
flip, -0 -> +0). A chunk of CHUNK scores finds its k-th largest key by a 32-step bitwise threshold
search (count keys >= candidate), keeps every key above it and, of the keys equal to it, the
lowest indices (a prefix count in index order), and stores them compactly as unique int64 keys
(score key << 32 | 2^31-1-index), whose descending order is (descending score, ascending index).
Groups of CHUNK/K lists merge by the same search on the score half, then (only when the threshold
score is tied past k) a second search on the index half; the last pass orders its K survivors
(rank = number of larger keys for K <= 512, a bitonic tl.sort for K = 2048) and writes the indices.

Specialization keys: H (32), CI (128), BQ (queries per program, 16 = the int8 MMA M), BT (key
tile), CB (candidate block 8), USE_CAND, WRITE_BMAX; top-k: K (512 / 2048), CHUNK (4096).
Variants: prefill scoring (BT 128) and decode scoring (BT 256; one query pads BQ to 16), Reindex
(USE_CAND) and candidate-source (WRITE_BMAX) flavours; top-k 512 and 2048.

Known gaps: exactness needs exponents with eq_min+ek_min >= 107 (no fp32 underflow of the
products) -- the quantizer's scale floor keeps realistic data far inside; UE8M0 byte 0 is not
decoded. One query in decode wastes 15/16 of the MMA rows (the bytes, not the MMA, bound it).
The scores [S, T] round-trip through memory between scoring and top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton.kv_quant import _bcast_groups, aot_spec, e2m1_decode_x2, pow2_float
from dsv41c import formats as nx

INT64_MIN = -(2**63)
NEG_INF_KEY = -2139095041  # order key of -inf: 0xFF800000 ^ 0x7FFFFFFF as int32


# ============================================================================ scoring


@triton.jit
def _align_rows(E, O, ex, R: tl.constexpr, IH: tl.constexpr, NB: tl.constexpr):
    """Integer codes x2 (even/odd halves [R, IH]) + UE8M0 bytes [R, NB] -> codes shifted to the
    row's smallest non-zero-block exponent, the row scale 2^(emin-127), and "fits INT8"."""
    a = tl.maximum(tl.abs(E), tl.abs(O))
    bm = tl.max(tl.reshape(a, (R, NB, 16)), axis=2)
    nz = bm > 0
    emin = tl.min(tl.where(nz, ex, 255), axis=1)
    emin = tl.where(emin == 255, 127, emin)
    sh = tl.minimum(tl.where(nz, ex - emin[:, None], 0), 8)
    ok = tl.max(bm << sh, axis=1) <= 127
    shb = _bcast_groups(sh, R, NB, 16)
    return E << shb, O << shb, pow2_float(emin - 127), ok


@triton.jit
def _index_score_kernel(q_ptr, qe_ptr, wq_ptr, k_ptr, ke_ptr, nvis_ptr, cand_ptr, s_ptr, bmax_ptr, cnt_ptr,
                        S, T, NBLK,
                        H: tl.constexpr, CI: tl.constexpr, BQ: tl.constexpr, BT: tl.constexpr, CB: tl.constexpr,
                        USE_CAND: tl.constexpr, WRITE_BMAX: tl.constexpr, COUNT: tl.constexpr):
    IH: tl.constexpr = CI // 2
    NB: tl.constexpr = CI // 32
    pid_t = tl.program_id(0)
    pid_q = tl.program_id(1)
    qs = pid_q * BQ + tl.arange(0, BQ)
    qmask = qs < S
    qs64 = qs.to(tl.int64)
    nvis = tl.load(nvis_ptr + qs, mask=qmask, other=0)
    t = pid_t * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    c = tl.arange(0, IH)
    nb = tl.arange(0, NB)
    if pid_t * BT < tl.max(nvis, axis=0):
        kb = tl.load(k_ptr + t64[:, None] * IH + c[None, :], mask=tmask[:, None], other=0).to(tl.int32)
        kE = e2m1_decode_x2(kb & 15)
        kO = e2m1_decode_x2(kb >> 4)
        kex = tl.load(ke_ptr + t64[:, None] * NB + nb[None, :], mask=tmask[:, None], other=127).to(tl.int32)
        kEs, kOs, kscale, k_ok = _align_rows(kE, kO, kex, BT, IH, NB)
        tile_ok = tl.min(k_ok.to(tl.int32), axis=0) > 0
        kEs8 = tl.trans(kEs.to(tl.int8))
        kOs8 = tl.trans(kOs.to(tl.int8))
        acc = tl.zeros((BQ, BT), tl.float32)
        for h in range(H):
            qrow = qs64 * H + h
            qb = tl.load(q_ptr + qrow[:, None] * IH + c[None, :], mask=qmask[:, None], other=0).to(tl.int32)
            qE = e2m1_decode_x2(qb & 15)
            qO = e2m1_decode_x2(qb >> 4)
            qex = tl.load(qe_ptr + qrow[:, None] * NB + nb[None, :], mask=qmask[:, None], other=127).to(tl.int32)
            qEs, qOs, qscale, q_ok = _align_rows(qE, qO, qex, BQ, IH, NB)
            head_ok = tl.min((q_ok | (qs >= S)).to(tl.int32), axis=0) > 0
            if tile_ok & head_ok:
                ia = tl.dot(qEs.to(tl.int8), kEs8, out_dtype=tl.int32)
                ia = tl.dot(qOs.to(tl.int8), kOs8, ia, out_dtype=tl.int32)
                d = ((ia.to(tl.float32) * qscale[:, None]) * kscale[None, :]) * 0.25
            else:
                # the reference's order: exact per-32-channel partials, added left to right
                kE8 = tl.trans(kE.to(tl.int8))
                kO8 = tl.trans(kO.to(tl.int8))
                d = tl.zeros((BQ, BT), tl.float32)
                for b in tl.static_range(NB):
                    inb = ((c // 16) == b)[None, :]
                    pb = tl.dot(tl.where(inb, qE, 0).to(tl.int8), kE8, out_dtype=tl.int32)
                    pb = tl.dot(tl.where(inb, qO, 0).to(tl.int8), kO8, pb, out_dtype=tl.int32)
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


# ============================================================================ top-k


@triton.jit
def _compact_rank_emit(comp, sel, kk, dst_ptr, idx_ptr, row, slot, k_out,
                       K: tl.constexpr, N_IN: tl.constexpr, FINAL: tl.constexpr, RANK: tl.constexpr):
    """Store the kk selected int64 keys of comp [N_IN] compactly to dst[slot, :K] (INT64_MIN pad);
    if FINAL, order those K keys (descending) and write the decoded indices to idx[row, :k_out]:
    by rank counting (K^2 compares, K <= 512) or by a bitonic sort (K = 2048)."""
    pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    base = dst_ptr + slot.to(tl.int64) * K
    tl.store(base + pos, comp, mask=sel)
    j = tl.arange(0, K)
    tl.store(base + j, tl.full((K,), -9223372036854775808, tl.int64), mask=j >= kk)
    if FINAL:
        tl.debug_barrier()  # the compact row is re-read by other threads of this program
        if RANK:
            mine = tl.load(base + j)
            mu = mine.to(tl.uint64, bitcast=True) ^ 0x8000000000000000
            rank = tl.zeros((K,), tl.int32)
            JC: tl.constexpr = 64 if K >= 64 else K
            for j0 in range(0, K, JC):
                ou = tl.load(base + j0 + tl.arange(0, JC)).to(tl.uint64, bitcast=True) ^ 0x8000000000000000
                rank += tl.sum((ou[None, :] > mu[:, None]).to(tl.int32), axis=1)
            idx = 2147483647 - (mine & 0xFFFFFFFF).to(tl.int32)
            tl.store(idx_ptr + row.to(tl.int64) * k_out + rank, idx, mask=(j < kk) & (rank < k_out))
        else:
            srt = tl.sort(tl.load(base + j), descending=True)
            idx = 2147483647 - (srt & 0xFFFFFFFF).to(tl.int32)
            idx = tl.where(j < kk, idx, -1)
            tl.store(idx_ptr + row.to(tl.int64) * k_out + j, idx, mask=j < k_out)


@triton.jit
def _kth_key32(ku, valid, kk):
    """The kk-th largest of the uint32 keys ku[valid], bit by bit from the top (32 counting steps)."""
    thr = tl.zeros((), tl.uint32)
    bit = tl.full((), 0x80000000, tl.uint32)
    for _ in range(32):
        cand = thr | bit
        cnt = tl.sum((valid & (ku >= cand)).to(tl.int32), axis=0)
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
    _compact_rank_emit(comp, sel, kk, dst_ptr, idx_ptr, row, row * n_chunks + ch, k_out, K, CHUNK, FINAL, K <= 512)


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
    _compact_rank_emit(x, sel, kk, dst_ptr, idx_ptr, row, row * n_out + g, k_out, K, CHUNK, FINAL, K <= 512)


def topk_select(scores: torch.Tensor, k: int, pin: torch.Tensor | None = None, chunk: int = 4096) -> torch.Tensor:
    """Top-k indices of each row of scores [S, N] (fp32): descending score, ties toward the lower
    index; `pin` [S] (int32, -1 = none) is forced to +inf first; -1 where the score is -inf or
    fewer than k entries exist. Returns int32 [S, k].

    Chunks of CHUNK scores each keep their k best (a 32-step bitwise threshold search on the
    order-preserving score key, threshold ties by lowest index); groups of CHUNK/K lists are
    merged the same way on the unique int64 (score, index) keys; the last pass sorts its K keys."""
    S, N = scores.shape
    out = torch.full((S, k), -1, dtype=torch.int32, device=scores.device)
    if S == 0 or N == 0 or k == 0:
        return out
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    K = triton.next_power_of_2(k)
    CHUNK = max(triton.next_power_of_2(chunk), 2 * K)
    n = triton.cdiv(N, CHUNK)
    use_pin = pin is not None
    pin_t = pin.to(torch.int32).contiguous() if use_pin else out
    nw = 8 if CHUNK >= 4096 else 4
    if n == 1:
        CHUNK = max(triton.next_power_of_2(N), K)
    buf = torch.empty((S, n, K), dtype=torch.int64, device=scores.device)
    _topk_chunk_kernel[(n, S)](scores, pin_t, buf, out, N, n, scores.stride(0), k, k,
                               K=K, CHUNK=CHUNK, USE_PIN=use_pin, FINAL=n == 1, num_warps=nw)
    G = CHUNK // K
    while n > 1:
        n_next = triton.cdiv(n, G)
        nxt = torch.empty((S, n_next, K), dtype=torch.int64, device=scores.device)
        _topk_merge_kernel[(n_next, S)](buf, nxt, out, n, n_next, k, k, K=K, CHUNK=CHUNK,
                                        FINAL=n_next == 1, num_warps=nw)
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


# ============================================================================ host: scoring


@dataclass
class IndexerOut:
    topk: torch.Tensor  # [S, topk] int32, -1 padded
    candidates: torch.Tensor | None  # [S, candidate_topk_blocks] int32 block ids (candidate source), else None
    scores: torch.Tensor  # [S, T] fp32 (-inf = invisible / not a candidate)
    block_max: torch.Tensor | None  # [S, ceil(T/8)] fp32 (candidate source)
    stats: dict


def visible_counts(qpos: torch.Tensor, ratio: int, T: int) -> torch.Tensor:
    """Number of visible compressed entries per query: t < (p+1)//ratio."""
    return torch.clamp((qpos.long() + 1) // ratio, max=T).to(torch.int32)


def candidate_mask(blocks: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Candidate block ids [S, Kb] (-1 padded) -> uint8 flags [S, n_blocks]."""
    S = blocks.shape[0]
    m = torch.zeros((S, n_blocks + 1), dtype=torch.uint8, device=blocks.device)
    b = torch.where(blocks >= 0, blocks.long(), n_blocks)
    m.scatter_(1, b, 1)
    return m[:, :n_blocks].contiguous()


def index_scores(q_codes, q_exps, wq, k_codes, k_exps, nvis, *, cand_mask=None, cand_block=8, block_max=False,
                 block_q=16, block_t=128, counters=None):
    """Scores [S, T] (and block max [S, ceil(T/cand_block)] if asked). q_codes [S, H, CI/2] uint8,
    q_exps [S, H, CI/32] uint8, wq [S, H] fp32 (already times d^-0.5), k_codes [T, CI/2],
    k_exps [T, CI/32], nvis [S] int32, cand_mask [S, ceil(T/cand_block)] uint8 or None.
    counters: int32 [2] accumulating (per-head fallbacks, whole-tile fallbacks) or None."""
    S, H, IH = q_codes.shape
    CI = IH * 2
    T = k_codes.shape[0]
    dev = q_codes.device
    NBLK = triton.cdiv(T, cand_block)
    scores = torch.empty((S, T), dtype=torch.float32, device=dev)
    bmax = torch.empty((S, NBLK), dtype=torch.float32, device=dev) if block_max else scores
    if S == 0 or T == 0:
        return scores, (bmax if block_max else None)
    grid = (triton.cdiv(T, block_t), triton.cdiv(S, block_q))
    _index_score_kernel[grid](
        q_codes.contiguous(), q_exps.contiguous(), wq.float().contiguous(), k_codes.contiguous(),
        k_exps.contiguous(), nvis.to(torch.int32).contiguous(),
        cand_mask.contiguous() if cand_mask is not None else nvis, scores, bmax,
        counters if counters is not None else nvis, S, T, NBLK,
        H=H, CI=CI, BQ=block_q, BT=block_t, CB=cand_block, USE_CAND=cand_mask is not None,
        WRITE_BMAX=block_max, COUNT=counters is not None, num_warps=4, enable_fp_fusion=False)
    return scores, (bmax if block_max else None)


def int8_rows_ok(codes: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """The kernel's per-row INT8 check, in torch: codes [..., CI/2] packed, exps [..., CI/32]."""
    v = (nx.e2m1_decode(nx.unpack_fp4(codes)) * 2).to(torch.int32)
    bm = v.abs().unflatten(-1, (-1, 32)).amax(-1)
    e = exps.to(torch.int32)
    nz = bm > 0
    emin = torch.where(nz, e, 255).amin(-1, keepdim=True)
    emin = torch.where(emin == 255, 127, emin)
    sh = torch.where(nz, e - emin, 0).clamp(max=8)
    return (bm << sh).amax(-1) <= 127


def expected_fallbacks(q_codes, q_exps, k_codes, k_exps, nvis, block_q=16, block_t=128) -> dict:
    """Fallback counts the scoring kernel must report for these inputs (its tiling rules)."""
    S, H = q_codes.shape[:2]
    T = k_codes.shape[0]
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


def indexer_topk(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio: int, topk: int = 512,
                 cand_mask=None, candidate_blocks: int = 0, cand_block: int = 8, with_stats: bool = True,
                 block_q: int = 16, block_t: int = 128, chunk: int = 4096) -> IndexerOut:
    """Indexer for S queries at positions qpos over T compressed entries (see module docstring).

    w [S, H] = weights_proj(x)·H^-0.5 (fp32). cand_mask [S, ceil(T/8)] uint8 at Reindex layers.
    candidate_blocks > 0 at the candidate source: also select that many blocks (pinned newest)."""
    CI = q_codes.shape[-1] * 2
    T = k_codes.shape[0]
    wq = w.float() * (CI ** -0.5)
    nvis = visible_counts(qpos, ratio, T)
    counters = torch.zeros(2, dtype=torch.int32, device=q_codes.device) if with_stats else None
    scores, bmax = index_scores(q_codes, q_exps, wq, k_codes, k_exps, nvis, cand_mask=cand_mask,
                                cand_block=cand_block, block_max=candidate_blocks > 0, block_q=block_q,
                                block_t=block_t, counters=counters)
    cands = None
    if candidate_blocks > 0:
        pin = torch.where(nvis > 0, (nvis - 1) // cand_block, -1).to(torch.int32)
        cands = topk_select(bmax, candidate_blocks, pin, chunk=chunk)
    idx = topk_select(scores, topk, chunk=chunk)
    stats = {}
    if with_stats:
        stats = {"fallback_heads": int((~int8_rows_ok(q_codes, q_exps)).sum()),
                 "fallback_head_tiles": int(counters[0]), "fallback_tiles": int(counters[1])}
    return IndexerOut(idx, cands, scores, bmax, stats)


# ----------------------------------------------------------------------------- reference


def index_scores_ref(q_codes, q_exps, wq, k_codes, k_exps, nvis, *, cand_mask=None, cand_block=8, key_chunk=16384):
    """The float32 reference scores (see module docstring for the pinned order)."""
    S, H, IH = q_codes.shape
    CI = IH * 2
    T = k_codes.shape[0]
    q = nx.dequant_fp4_ue8m0(q_codes, q_exps, 32).unflatten(-1, (CI // 32, 32))  # [S,H,NB,32]
    out = torch.empty((S, T), dtype=torch.float32, device=q_codes.device)
    wq = wq.float()
    for t0 in range(0, T, key_chunk):
        k = nx.dequant_fp4_ue8m0(k_codes[t0:t0 + key_chunk], k_exps[t0:t0 + key_chunk], 32)
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


def indexer_topk_ref(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio: int, topk: int = 512,
                     cand_mask=None, candidate_blocks: int = 0, cand_block: int = 8, with_stats: bool = True,
                     block_q: int = 16, block_t: int = 128, chunk: int = 4096) -> IndexerOut:
    CI = q_codes.shape[-1] * 2
    T = k_codes.shape[0]
    wq = w.float() * (CI ** -0.5)
    nvis = visible_counts(qpos, ratio, T)
    scores = index_scores_ref(q_codes, q_exps, wq, k_codes, k_exps, nvis, cand_mask=cand_mask, cand_block=cand_block)
    bmax = cands = None
    if candidate_blocks > 0:
        bmax = block_max_ref(scores, cand_block)
        pin = torch.where(nvis > 0, (nvis - 1) // cand_block, -1)
        cands = topk_select_ref(bmax, candidate_blocks, pin)
    idx = topk_select_ref(scores, topk)
    stats = expected_fallbacks(q_codes, q_exps, k_codes, k_exps, nvis, block_q, block_t) if with_stats else {}
    return IndexerOut(idx, cands, scores, bmax, stats)


# ----------------------------------------------------------------------------- registration


def _score_specs(target):
    from dsv41c.frontend.config import preset

    c = preset("full")
    types = {"q_ptr": "*u8", "qe_ptr": "*u8", "wq_ptr": "*fp32", "k_ptr": "*u8", "ke_ptr": "*u8", "nvis_ptr": "*i32",
             "cand_ptr": "*u8", "s_ptr": "*fp32", "bmax_ptr": "*fp32", "cnt_ptr": "*i32", "S": "i32", "T": "i32",
             "NBLK": "i32"}
    out = []
    for phase, bt in (("prefill", 128), ("decode", 256)):
        for flavour, use_cand, bmax in (("source", False, True), ("reindex", True, False), ("plain", False, False)):
            const = {"H": c.index_n_heads, "CI": c.index_head_dim, "BQ": 16, "BT": bt, "CB": c.candidate_block_size,
                     "USE_CAND": use_cand, "WRITE_BMAX": bmax, "COUNT": True}
            keys = dict(const, enable_fp_fusion=False)
            out.append(aot_spec(_index_score_kernel, f"{phase}_{flavour}_bt{bt}", types, const, num_warps=4,
                                num_stages=2, keys=keys))
    return out


def _topk_specs(target):
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
                                {"K": K, "CHUNK": chunk, "FINAL": final}, num_warps=8))
    return out


register(KernelTemplate(
    name="indexer_score", module=__name__,
    summary="exact INT8 FP4-indexer scores (+ candidate block max), per-head / whole-tile float fallback",
    keys=("H", "CI", "BQ", "BT", "CB", "USE_CAND", "WRITE_BMAX"),
    reference=indexer_topk_ref, launch=indexer_topk, specializations=_score_specs))
register(KernelTemplate(
    name="indexer_topk", module=__name__,
    summary="stable top-k (descending score, ascending index) by int64 key sort + merge",
    keys=("K", "CHUNK", "USE_PIN"), reference=topk_select_ref, launch=topk_select, specializations=_topk_specs))
