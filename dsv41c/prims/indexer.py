"""Sparse indexer of the CSA2 compressed KV: keys, scores, visibility, candidates, top-k (spec §3.4).

Keys (KV-source layers only; one per compressed entry, shared by the KV group):
    k = fq_indexer( RoPE_compress( k_norm(wk · latent_preRoPE), pos = ratio·t ) )
Queries (every index source — Full and Reindex layers), from the attention's q_res:
    q = fq_indexer( RoPE_compress( wq_b_idx · q_res, pos = query position ) )   [T, h, d]
    w = weights_proj(x) · h^-0.5                                               [T, h]
Score (fp32; float64 in the float64 mode):
    I[s, t] = Σ_h w[s, h] · ReLU(q[s, h] · k[t]) · d^-0.5
Visibility: entry t is visible to the query at absolute position p iff t < (p+1) // ratio
(its group's last token has been seen); invisible scores are -inf.
Level 1 (candidate source, layer 20): block score = max of I over blocks of
`candidate_block_size` entries; the block holding the newest visible entry
((len-1) // block) is pinned (+inf); the top `candidate_topk_blocks` blocks are kept
(-inf blocks dropped) -> boolean candidate mask over entries.
Level 2 (later index sources of the same KV group, "consumes"): I = -inf outside the mask.
Top-k: the `index_topk` best entries per query, -inf picks dropped; the selection is used by
this layer and the following Reuse layers of its group.
All rankings use `stable_topk` (ties toward the lower index, spec §7.1).

HF reading: as `DeepseekV41Indexer` / `select_candidate_blocks` with absolute positions;
selected entries may overlap the window (no dedupe, spec §3.4 NOTE).
Known gaps: none known.
"""
from __future__ import annotations

import torch

from dsv41c.prims.norms import acc_dtype, rms_norm
from dsv41c.prims.quant import fq_indexer
from dsv41c.prims.rope import apply_rope
from dsv41c.prims.topk import stable_topk


def index_keys(latent: torch.Tensor, wk: torch.Tensor, k_norm_w: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, eps: float, kv_quant: bool) -> torch.Tensor:
    """Pre-RoPE latents [n, C] -> indexer keys [n, d] (rotated at the entries' positions)."""
    k = rms_norm(latent @ wk.T, k_norm_w, eps)
    return fq_indexer(apply_rope(k, cos, sin), kv_quant)


def index_query(q_res: torch.Tensor, x: torch.Tensor, wq_b: torch.Tensor, weights_proj: torch.Tensor,
                n_heads: int, cos: torch.Tensor, sin: torch.Tensor, kv_quant: bool):
    """-> (q [T, h, d], head weights [T, h] in the accumulation dtype)."""
    q = (q_res @ wq_b.T).unflatten(-1, (n_heads, -1))
    q = fq_indexer(apply_rope(q, cos, sin), kv_quant)
    w = (x @ weights_proj.T).to(acc_dtype(x.dtype)) * n_heads**-0.5
    return q, w


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                 ratio: int) -> torch.Tensor:
    """I [T, N] with invisible entries at -inf. q [T, h, d], w [T, h], keys [N, d], positions [T].

    keys may be a fixed-capacity cache whose rows past the entry count are not written yet: only the
    rows some query can see ((max position + 1) // ratio) are scored, the rest are -inf, so the scores
    of a cache and of its valid prefix are the same numbers (the same products, the same shapes)."""
    acc = w.dtype
    d, N = q.shape[-1], keys.shape[0]
    n = min(int((positions.max() + 1) // ratio), N) if positions.numel() else 0
    s = torch.einsum("thd,nd->thn", q.to(acc), keys[:n].to(acc)).relu() * d**-0.5
    scores = (s * w.unsqueeze(-1)).sum(dim=1)
    if n < N:
        scores = torch.cat([scores, scores.new_full((scores.shape[0], N - n), float("-inf"))], dim=-1)
    visible = torch.arange(N, device=q.device)[None, :] < ((positions[:, None] + 1) // ratio)
    return scores.masked_fill(~visible, float("-inf"))


def candidate_blocks(scores: torch.Tensor, positions: torch.Tensor, ratio: int, topk_blocks: int,
                     block_size: int) -> torch.Tensor:
    """Level 1: bool mask [T, N] of the entries in each query's kept blocks."""
    T, N = scores.shape
    pad = -N % block_size
    padded = torch.cat([scores, scores.new_full((T, pad), float("-inf"))], dim=-1)
    blocks = padded.unflatten(-1, (-1, block_size)).amax(dim=-1)
    newest = ((positions + 1) // ratio - 1).div(block_size, rounding_mode="floor")  # -1: nothing visible
    pinned = torch.arange(blocks.shape[-1], device=scores.device)[None, :] == newest[:, None]
    blocks = blocks.masked_fill(pinned, float("inf"))
    keep_idx = stable_topk(blocks, topk_blocks)
    keep = torch.zeros(T, blocks.shape[-1] + 1, dtype=torch.bool, device=scores.device)
    keep.scatter_(-1, torch.where(keep_idx < 0, blocks.shape[-1], keep_idx), True)  # -1 -> dummy column
    return keep[:, :-1].repeat_interleave(block_size, dim=-1)[:, :N]


def select_topk(scores: torch.Tensor, k: int, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Level 2 mask (if given) + top-k: entry indices [T, k], -1 where nothing was selected."""
    if candidates is not None:
        scores = scores.masked_fill(~candidates, float("-inf"))
    return stable_topk(scores, k)


def indexer_select(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, ratio: int,
                   index_topk: int, *, produce: tuple[int, int] | None = None,
                   candidates: torch.Tensor | None = None):
    """Indexer score + (level-1 candidates) + (level-2 mask) + top-k in one call.

    produce = (candidate_topk_blocks, candidate_block_size) at the candidate source;
    candidates = the published mask at a consuming index source.
    Returns (selected entries [T, index_topk] with -1 = none, scores [T, N], candidate mask or None).
    """
    scores = index_scores(q, w, keys, positions, ratio)
    made = candidate_blocks(scores, positions, ratio, *produce) if produce is not None else None
    return select_topk(scores, index_topk, candidates), scores, made


def topk_bias(sel: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Selected indices [T, k] (-1 = none) -> additive bias [T, n]: 0 selected, -inf elsewhere."""
    T = sel.shape[0]
    bias = torch.full((T, n + 1), float("-inf"), dtype=dtype, device=sel.device)
    bias.scatter_(-1, torch.where(sel < 0, n, sel), 0.0)
    return bias[:, :n]
