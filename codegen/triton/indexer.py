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
block, the scaled head weights), scoring, the candidate blocks (at the source layer; as uint8 flags [S, ceil(T/8)],
the set the Reindex layers read, or on request as ordered ids) and the top-k, and reports the fallback counts. On
sm90+ the prep, scoring and top-k launches are PDL-chained (pdl.py). The two selections are independent; on
CUDA they run at once, the candidate blocks on the side stream of streams.py, each gridded for half the SMs
(`topk_select(share=2)`) so that both one-launch grids with their grid barriers are resident together, each with
its own workspace pool.
H200, CUDA-graph replay at one query over 131,072 entries with candidates (benchmarks/results/
kernels_attention.json): 89.2 -> 47.6 µs (L2-cold 95.8 -> 54.4) from the one-launch top-k (indexer_topk.py)
and the prep kernel, which replaced ~11 small PyTorch ops; then 47.4 -> 39.0 µs (L2-cold 53.9 -> 50.0) from
the two streams (`sequential_graph_ms` in the same JSON). Then (benchmarks/indexer_step.py,
results/indexer_step.json, L2-cold / warm): 44.0-44.4 / 34.0 -> 32.3-32.95 / 25.6-25.8 µs from the candidate
blocks as flags (`cand_mask`: the selected set, not ranked; the candidate selection at half the SMs 22.9 -> 9.1 µs
warm), 4 keys a thread in the split selections (indexer_topk.py: less unrolled code, fetched cold) and the
PDL-chained launches (~2.3 µs of it).
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
    HEADS_KERNEL_MAX_S, block_max_ref, expected_fallbacks, index_scores, index_scores_ref,
    int8_rows_ok, score_block_q, score_specs, visible_counts)
from dsv41c.codegen.triton.indexer_topk import (  # noqa: F401 (re-exported)
    MERGE, ids_to_mask, split_path, topk_select, topk_select_ref, topk_specs)
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c.codegen.triton.streams import side_stream

SIDE_POOL = "topk_side"  # workspace / counter pool of the candidate selection on the side stream
PDL_INDEXER = True  # the step's launches PDL-chained (`indexer_topk`'s pdl); measured: see the module docstring


@triton.jit
def _step_prep_kernel(qpos_ptr, w_ptr, nvis_ptr, pin_ptr, wq_ptr, T, ratio, cand_block, scale,
                      H: tl.constexpr, HP: tl.constexpr, PDL: tl.constexpr = False):
    """One query's step inputs in one launch (were ~11 small PyTorch ops, ~1-1.5 µs each under CUDA-graph
    replay at one query): nvis = min((p+1) // ratio, T) visible entries, the pinned newest candidate block
    (nvis-1) // cand_block (-1 with none visible) and wq = w · scale in fp32 (the same single rounding as
    `w.float() * scale`). qpos < -1 counts as nothing visible, as the clamped reference does downstream.
    PDL (pdl.py): qpos and w may be the previous kernel's: wait first, then release the scoring launch."""
    grid_wait(PDL)
    grid_release(PDL)
    s = tl.program_id(0)
    nv = tl.minimum(tl.maximum(tl.load(qpos_ptr + s).to(tl.int64) + 1, 0) // ratio, T)
    tl.store(nvis_ptr + s, nv.to(tl.int32))
    tl.store(pin_ptr + s, tl.where(nv > 0, (nv - 1) // cand_block, -1).to(tl.int32))
    h = tl.arange(0, HP)
    w = tl.load(w_ptr + s * H + h, mask=h < H, other=0.0).to(tl.float32)
    tl.store(wq_ptr + s * H + h, w * scale, mask=h < H)


def step_prep(qpos, w, ratio: int, T: int, cand_block: int, scale: float, pdl: bool = False):
    """(nvis int32 [S], pin int32 [S], wq fp32 [S, H]) of `_step_prep_kernel` (see there); pdl: launched with
    programmatic dependent launch (pdl.py; the caller checks `pdl_for`)."""
    S, H = w.shape
    if qpos.shape != (S,):
        raise ValueError(f"indexer: qpos must be [S] = [{S}] (one position per query), got {tuple(qpos.shape)}")
    dev = w.device
    nvis = torch.empty(S, dtype=torch.int32, device=dev)
    pin = torch.empty(S, dtype=torch.int32, device=dev)
    wq = torch.empty((S, H), dtype=torch.float32, device=dev)
    if S:
        _step_prep_kernel[(S,)](qpos.contiguous(), w.contiguous(), nvis, pin, wq, T, ratio, cand_block, scale, H=H,
                                HP=triton.next_power_of_2(H), PDL=pdl, **launch_kw(pdl))
    return nvis, pin, wq


@dataclass
class IndexerOut:
    topk: torch.Tensor  # [S, topk] int32, -1 padded
    candidates: torch.Tensor | None  # [S, candidate_topk_blocks] int32 block ids, best first (candidate_ids=True)
    cand_mask: torch.Tensor | None  # [S, ceil(T/8)] uint8, 1 = a candidate block (candidate source), else None
    scores: torch.Tensor  # [S, T] fp32 (-inf = invisible / not a candidate)
    block_max: torch.Tensor | None  # [S, ceil(T/8)] fp32 (candidate source)
    stats: dict


def indexer_topk(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio: int, topk: int = 512,
                 cand_mask=None, candidate_blocks: int = 0, cand_block: int = 8, with_stats: bool = True,
                 block_q: int | None = None, block_t: int = 128, chunk: int = 4096,
                 overlap_selections: bool | None = None, pdl: bool | None = None,
                 candidate_ids: bool = False) -> IndexerOut:
    """Indexer for S queries at positions qpos over T compressed entries (see module docstring).

    w [S, H] = weights_proj(x)·H^-0.5 (fp32). cand_mask [S, ceil(T/8)] uint8 at Reindex layers.
    candidate_blocks > 0 at the candidate source: also select that many blocks (pinned newest).
    block_q: scoring kernel (1 heads kernel, 16 queries-as-rows, None: by S); block_t: key tile.
    overlap_selections (None: on for CUDA tensors): with candidate_blocks, the candidate selection runs on a
    side stream (streams.py) concurrently with the top-k, each planned for half the SMs (`topk_select`'s
    share=2, so both one-launch grids are resident together) and with its own workspace (SIDE_POOL); the
    same indices either way.
    pdl (None: PDL_INDEXER where the device has it, `pdl_for`): the prep, scoring (heads kernel, its query decoded
    before its wait: `index_scores`' early_q) and the main stream's one-launch top-k are PDL-launched, each
    scheduled while its predecessor drains; the side stream's candidate selection is not (its predecessor is
    the cross-stream wait). The same indices either way.
    candidate_ids: the candidate blocks also as ordered block ids (`IndexerOut.candidates`, best first); by
    default only their flags (`cand_mask`, what `index_scores(cand_mask=)` reads at the Reindex layers), which
    the selection writes without ranking its blocks (`topk_select`'s as_mask)."""
    if overlap_selections and not q_codes.is_cuda:
        raise ValueError("indexer_topk: overlap_selections=True needs a CUDA device (it runs the candidate "
                         f"selection on a second stream), got {q_codes.device}")
    CI = q_codes.shape[-1] * 2
    T = k_codes.shape[0]
    pdl = pdl_for(q_codes.device) and (PDL_INDEXER if pdl is None else bool(pdl))
    counters = torch.zeros(2, dtype=torch.int32, device=q_codes.device) if with_stats else None
    overlap = candidate_blocks > 0 and (q_codes.is_cuda if overlap_selections is None else overlap_selections)
    nvis, pin, wq = step_prep(qpos, w, ratio, T, cand_block, CI ** -0.5, pdl=pdl)
    # the query codes come from before the prep launch: the scoring may decode them before its wait
    scores, bmax = index_scores(q_codes, q_exps, wq, k_codes, k_exps, nvis, cand_mask=cand_mask,
                                cand_block=cand_block, block_max=candidate_blocks > 0, block_q=block_q,
                                block_t=block_t, counters=counters, pdl=pdl, early_q=pdl)
    cands = cmask = None
    side = None
    share = 1
    if candidate_blocks > 0:
        if overlap:  # the candidate blocks on the side stream, beside the top-k (streams.py's contract)
            side = side_stream(q_codes.device)
            side.wait_stream(torch.cuda.current_stream(q_codes.device))
            with torch.cuda.stream(side):
                cands = topk_select(bmax, candidate_blocks, pin, chunk=chunk, pool=SIDE_POOL, share=2,
                                    as_mask=not candidate_ids)
            # the top-k needs half the SMs only beside a one-launch candidate grid (the chunked path never waits)
            share = 2 if split_path(*bmax.shape, candidate_blocks) else 1
        else:
            cands = topk_select(bmax, candidate_blocks, pin, chunk=chunk, as_mask=not candidate_ids)
    idx = topk_select(scores, topk, chunk=chunk, share=share, pdl=pdl)
    if side is not None:
        torch.cuda.current_stream(q_codes.device).wait_stream(side)
    if cands is not None:
        cmask = ids_to_mask(cands, bmax.shape[1]) if candidate_ids else cands
        cands = cands if candidate_ids else None
    stats = {}
    if with_stats:
        stats = {"fallback_heads": int((~int8_rows_ok(q_codes, q_exps)).sum()),
                 "fallback_head_tiles": int(counters[0]), "fallback_tiles": int(counters[1])}
    return IndexerOut(idx, cands, cmask, scores, bmax, stats)


def indexer_topk_ref(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio: int, topk: int = 512,
                     cand_mask=None, candidate_blocks: int = 0, cand_block: int = 8, with_stats: bool = True,
                     block_q: int | None = None, block_t: int = 128, chunk: int = 4096,
                     overlap_selections: bool | None = None, pdl: bool | None = None,
                     candidate_ids: bool = False) -> IndexerOut:
    """The float32 reference of `indexer_topk` (same signature; block_q / block_t / chunk / overlap_selections /
    pdl only shape the expected fallback counts or do not apply); the candidates both as ids and as flags."""
    CI = q_codes.shape[-1] * 2
    T = k_codes.shape[0]
    wq = w.float() * (CI ** -0.5)
    nvis = visible_counts(qpos, ratio, T)
    scores = index_scores_ref(q_codes, q_exps, wq, k_codes, k_exps, nvis, cand_mask=cand_mask, cand_block=cand_block)
    bmax = cands = cmask = None
    if candidate_blocks > 0:
        bmax = block_max_ref(scores, cand_block)
        pin = torch.where(nvis > 0, (nvis - 1) // cand_block, -1)
        cands = topk_select_ref(bmax, candidate_blocks, pin)
        cmask = ids_to_mask(cands, bmax.shape[1])
    idx = topk_select_ref(scores, topk)
    stats = expected_fallbacks(q_codes, q_exps, k_codes, k_exps, nvis, block_q, block_t) if with_stats else {}
    return IndexerOut(idx, cands, cmask, scores, bmax, stats)


# ----------------------------------------------------------------------------- registration


register(KernelTemplate(
    name="indexer_score", module=__name__,
    summary="exact INT8 FP4-indexer scores (+ candidate block max), per-head / whole-tile float fallback",
    keys=("H", "CI", "BQ", "BT", "CB", "USE_CAND", "WRITE_BMAX", "COUNT", "PDL", "EARLY_Q", "enable_fp_fusion"),
    reference=indexer_topk_ref, launch=indexer_topk, specializations=score_specs))
register(KernelTemplate(
    name="indexer_topk", module=__name__,
    summary="stable top-k (descending score, ascending index) by int64 key sort + merge",
    keys=("K", "CHUNK", "USE_PIN", "CAP", "FINAL", "LEVEL", "BITS", "R", "TB", "PDL", "MASK", "RESIDENT_PROGRAMS",
          "SHARE"),
    reference=topk_select_ref, launch=topk_select, specializations=topk_specs))
