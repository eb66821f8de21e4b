"""Indexer: exact integer scoring of FP4 queries/keys, candidate blocks, stable top-k (the public module).

What (spec §3.4, §7.1): `I[s,t] = Σ_h wq[s,h]·ReLU(q[s,h]·k[t])` over the visible compressed
entries (t < (p+1)//ratio; at Reindex layers also inside the candidate mask), then the block max
over blocks of 8 positions (the newest visible block pinned to +inf), the top-2048 candidate blocks
(layer 20) and the top-512 positions, ties toward the LOWER index, -1 where fewer are visible.

The two ideas live in their own modules; this one re-exports them, runs the step and registers the
templates:
- `indexer_score.py`: the scores, bit-identical to the float32 reference (exact INT8 path with
  per-head / whole-tile block fallbacks), and the candidate block max. Prefill: 16 queries are the
  int8 MMA rows; decode: one query's 32 heads are the MMA columns of a key tile.
- `indexer_topk.py`: stable top-k by per-chunk bitwise threshold search on order-preserving keys,
  then merges of the chunk lists.

`indexer_topk` runs the step: one prep launch (`step_prep`: visible counts, the pinned newest candidate
block, the scaled head weights), scoring, the candidate blocks (at the source layer) and the top-k, and
reports the fallback counts. The two selections are independent; on CUDA they run at once, the candidate
blocks on the side stream of streams.py, each gridded for half the SMs (`topk_select(share=2)`) so that
both one-launch grids with their grid barriers are resident together, each with its own workspace pool.
H200, CUDA-graph replay at one query over 131,072 entries with candidates (benchmarks/results/
kernels_attention.json): 89.2 -> 47.6 µs (L2-cold 95.8 -> 54.4) from the one-launch top-k (indexer_topk.py)
and the prep kernel, which replaced ~11 small PyTorch ops; then 47.4 -> 39.0 µs (L2-cold 53.9 -> 50.0) from
the two streams (`sequential_graph_ms` in the same JSON).
Specialization keys and variants: see the two modules. Known gaps: the scores [S, T] round-trip
through memory between scoring and top-k; at half the SMs each selection runs twice the chunk per program
(running both at their full grids would need a check that two programs of the kernel fit one SM).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton.indexer_score import (  # noqa: F401 (re-exported)
    HEADS_KERNEL_MAX_S, block_max_ref, candidate_mask, expected_fallbacks, index_scores, index_scores_ref,
    int8_rows_ok, score_block_q, score_specs, visible_counts)
from dsv41c.codegen.triton.indexer_topk import (  # noqa: F401 (re-exported)
    MERGE, split_path, topk_select, topk_select_ref, topk_specs)
from dsv41c.codegen.triton.streams import side_stream

SIDE_POOL = "topk_side"  # workspace / counter pool of the candidate selection on the side stream


@triton.jit
def _step_prep_kernel(qpos_ptr, w_ptr, nvis_ptr, pin_ptr, wq_ptr, T, ratio, cand_block, scale,
                      H: tl.constexpr, HP: tl.constexpr):
    """One query's step inputs in one launch (were ~11 small PyTorch ops, ~1-1.5 µs each under CUDA-graph
    replay at one query): nvis = min((p+1) // ratio, T) visible entries, the pinned newest candidate block
    (nvis-1) // cand_block (-1 with none visible) and wq = w · scale in fp32 (the same single rounding as
    `w.float() * scale`). qpos < -1 counts as nothing visible, as the clamped reference does downstream."""
    s = tl.program_id(0)
    nv = tl.minimum(tl.maximum(tl.load(qpos_ptr + s).to(tl.int64) + 1, 0) // ratio, T)
    tl.store(nvis_ptr + s, nv.to(tl.int32))
    tl.store(pin_ptr + s, tl.where(nv > 0, (nv - 1) // cand_block, -1).to(tl.int32))
    h = tl.arange(0, HP)
    w = tl.load(w_ptr + s * H + h, mask=h < H, other=0.0).to(tl.float32)
    tl.store(wq_ptr + s * H + h, w * scale, mask=h < H)


def step_prep(qpos, w, ratio: int, T: int, cand_block: int, scale: float):
    """(nvis int32 [S], pin int32 [S], wq fp32 [S, H]) of `_step_prep_kernel` (see there)."""
    S, H = w.shape
    if qpos.shape != (S,):
        raise ValueError(f"indexer: qpos must be [S] = [{S}] (one position per query), got {tuple(qpos.shape)}")
    dev = w.device
    nvis = torch.empty(S, dtype=torch.int32, device=dev)
    pin = torch.empty(S, dtype=torch.int32, device=dev)
    wq = torch.empty((S, H), dtype=torch.float32, device=dev)
    if S:
        _step_prep_kernel[(S,)](qpos.contiguous(), w.contiguous(), nvis, pin, wq, T, ratio, cand_block, scale, H=H,
                                HP=triton.next_power_of_2(H))
    return nvis, pin, wq


@dataclass
class IndexerOut:
    topk: torch.Tensor  # [S, topk] int32, -1 padded
    candidates: torch.Tensor | None  # [S, candidate_topk_blocks] int32 block ids (candidate source), else None
    scores: torch.Tensor  # [S, T] fp32 (-inf = invisible / not a candidate)
    block_max: torch.Tensor | None  # [S, ceil(T/8)] fp32 (candidate source)
    stats: dict


def indexer_topk(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio: int, topk: int = 512,
                 cand_mask=None, candidate_blocks: int = 0, cand_block: int = 8, with_stats: bool = True,
                 block_q: int | None = None, block_t: int = 128, chunk: int = 4096,
                 overlap_selections: bool | None = None) -> IndexerOut:
    """Indexer for S queries at positions qpos over T compressed entries (see module docstring).

    w [S, H] = weights_proj(x)·H^-0.5 (fp32). cand_mask [S, ceil(T/8)] uint8 at Reindex layers.
    candidate_blocks > 0 at the candidate source: also select that many blocks (pinned newest).
    block_q: scoring kernel (1 heads kernel, 16 queries-as-rows, None: by S); block_t: key tile.
    overlap_selections (None: on for CUDA tensors): with candidate_blocks, the candidate selection runs on a
    side stream (streams.py) concurrently with the top-k, each planned for half the SMs (`topk_select`'s
    share=2, so both one-launch grids are resident together) and with its own workspace (SIDE_POOL); the
    same indices either way."""
    if overlap_selections and not q_codes.is_cuda:
        raise ValueError("indexer_topk: overlap_selections=True needs a CUDA device (it runs the candidate "
                         f"selection on a second stream), got {q_codes.device}")
    CI = q_codes.shape[-1] * 2
    T = k_codes.shape[0]
    nvis, pin, wq = step_prep(qpos, w, ratio, T, cand_block, CI ** -0.5)
    counters = torch.zeros(2, dtype=torch.int32, device=q_codes.device) if with_stats else None
    scores, bmax = index_scores(q_codes, q_exps, wq, k_codes, k_exps, nvis, cand_mask=cand_mask,
                                cand_block=cand_block, block_max=candidate_blocks > 0, block_q=block_q,
                                block_t=block_t, counters=counters)
    cands = None
    side = None
    share = 1
    if candidate_blocks > 0:
        overlap = q_codes.is_cuda if overlap_selections is None else overlap_selections
        if overlap:  # the candidate blocks on the side stream, beside the top-k (streams.py's contract)
            side = side_stream(q_codes.device)
            side.wait_stream(torch.cuda.current_stream(q_codes.device))
            with torch.cuda.stream(side):
                cands = topk_select(bmax, candidate_blocks, pin, chunk=chunk, pool=SIDE_POOL, share=2)
            # the top-k needs half the SMs only beside a one-launch candidate grid (the chunked path never waits)
            share = 2 if split_path(*bmax.shape, candidate_blocks) else 1
        else:
            cands = topk_select(bmax, candidate_blocks, pin, chunk=chunk)
    idx = topk_select(scores, topk, chunk=chunk, share=share)
    if side is not None:
        torch.cuda.current_stream(q_codes.device).wait_stream(side)
    stats = {}
    if with_stats:
        stats = {"fallback_heads": int((~int8_rows_ok(q_codes, q_exps)).sum()),
                 "fallback_head_tiles": int(counters[0]), "fallback_tiles": int(counters[1])}
    return IndexerOut(idx, cands, scores, bmax, stats)


def indexer_topk_ref(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio: int, topk: int = 512,
                     cand_mask=None, candidate_blocks: int = 0, cand_block: int = 8, with_stats: bool = True,
                     block_q: int | None = None, block_t: int = 128, chunk: int = 4096,
                     overlap_selections: bool | None = None) -> IndexerOut:
    """The float32 reference of `indexer_topk` (same signature; block_q / block_t / chunk / overlap_selections
    only shape the expected fallback counts or do not apply)."""
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


register(KernelTemplate(
    name="indexer_score", module=__name__,
    summary="exact INT8 FP4-indexer scores (+ candidate block max), per-head / whole-tile float fallback",
    keys=("H", "CI", "BQ", "BT", "CB", "USE_CAND", "WRITE_BMAX", "COUNT", "enable_fp_fusion"),
    reference=indexer_topk_ref, launch=indexer_topk, specializations=score_specs))
register(KernelTemplate(
    name="indexer_topk", module=__name__,
    summary="stable top-k (descending score, ascending index) by int64 key sort + merge",
    keys=("K", "CHUNK", "USE_PIN", "CAP", "FINAL", "LEVEL", "BITS", "R", "TB", "RESIDENT_PROGRAMS", "SHARE"),
    reference=topk_select_ref, launch=topk_select, specializations=topk_specs))
