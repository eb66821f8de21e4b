"""A plan's `kernel.call @indexer_score`: the exact integer index scores, launched with the call's keys.

`index_scores_call(q_codes, q_exps, w, k_codes, k_exps, qpos, *, H, CI, BQ, BT, ratio)` takes the operands in the
order of the template's kernel contract (ir/kernel_contracts.py: the packed FP4 queries and keys, the head
weights w = weights_proj(x)·H^-0.5, the query positions) and the keys specialize-kernels fixed (BQ: 1 = the
decode kernel, one query's heads as MMA columns; 16 = queries as rows; BT: the key tile), and returns the
scores [S, T] (-inf where an entry is not visible yet): `indexer_score.index_scores` with the visible
counts and the d^-0.5 folded into w here, as `indexer.indexer_topk` does.
Known gaps: the fallback counters are not kept (the plan has no value for them); the top-k and candidate
selections stay separate ops (their kernels are not called from plans yet).
"""
from __future__ import annotations

import torch

from dsv41c.codegen.triton.indexer_score import index_scores, visible_counts


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def index_scores_call(q_codes, q_exps, w, k_codes, k_exps, qpos, *, H: int, CI: int, BQ: int, BT: int, ratio: int,
                      **_) -> torch.Tensor:
    if q_codes.shape[1] != H or q_codes.shape[2] * 2 != CI:
        raise ValueError(f"indexer_score: q_codes {tuple(q_codes.shape)} is not [S, {H}, {CI // 2}] as the call's "
                         "keys H and CI say")
    T = k_codes.shape[0]
    nvis = visible_counts(qpos, int(ratio), T)
    wq = w.float() * CI ** -0.5
    scores, _ = index_scores(_u8(q_codes), _u8(q_exps), wq, _u8(k_codes), _u8(k_exps), nvis, block_q=int(BQ),
                             block_t=int(BT))
    return scores
