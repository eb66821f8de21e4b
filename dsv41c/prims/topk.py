"""Deterministic top-k: descending score, ties broken toward the LOWER index (spec §7.1).

`torch.topk` leaves the order of equal scores unspecified, and exact ties are common here
(an indexer score is a sum of ReLU terms, so every position where all heads' dot products
are negative scores exactly 0). A stable descending sort keeps equal scores in ascending
index order, which is the project's convention for the indexer top-k, the candidate
blocks and the MoE router alike.

`stable_topk(scores, k)` returns indices [..., k] (int64) with -1 in every slot whose score
is -inf or that lies beyond the last column (fewer than k columns): -inf picks are dropped,
as HF drops them ("leftover picks come back -inf").
Known gaps: NaN scores are not expected anywhere and are not handled specially.
"""
from __future__ import annotations

import torch


def stable_topk(scores: torch.Tensor, k: int, drop_neg_inf: bool = True) -> torch.Tensor:
    n = scores.shape[-1]
    kk = min(k, n)
    # +0.0 turns -0.0 into +0.0 so that the two zeros can never be ordered apart.
    order = torch.sort(scores + 0.0, dim=-1, descending=True, stable=True).indices[..., :kk]
    if drop_neg_inf:
        vals = scores.gather(-1, order)
        order = torch.where(vals > float("-inf"), order, torch.full_like(order, -1))
    if kk < k:
        order = torch.cat([order, order.new_full((*order.shape[:-1], k - kk), -1)], dim=-1)
    return order
