"""CSA2 compressor of a KV-source layer: token latents for the shared compressed KV (spec §3.3).

Input x is the layer's attention input (after attn_norm). Output: the PRE-RoPE latents
of the groups completed by this call and the absolute position of the first one; the
caller derives the indexer keys from them, then rotates (compress RoPE at the group's
first-token position) and FP4-quantizes them into the group's compressed cache.

- ratio 1 (decoder source): latent_t = norm(wkv · x_t), in the model dtype, one per token,
  position t.
- ratio r > 1 (encoder sources): kv = x·wkvᵀ and g = x·wgateᵀ in fp32 (float64 in the
  float64 mode; the BF16 weights are promoted), tokens grouped in aligned, non-overlapping
  groups [r·j, r·j + r), latent_j = Σ_i softmax_i(g) ⊙ kv_i (softmax over the group's r
  tokens, per channel), then norm(latent_j.to(dtype)); position r·j. Only complete groups
  are emitted; the tail of an incomplete group is carried (HF `buffer_kv`/`buffer_gate`),
  so chunked prefill and decode emit exactly the groups a full forward emits.

`compressor_full` is the one-shot form (a sequence from position 0); `compressor_step`
the serving form: it takes and returns the carried fp32 rows explicitly (one function of
tensors, the state update the compiler wraps as one op). `compressor_step_one` is its
one-token form with no data-dependent shape and no host read of the position: it always
pools the group the token would complete (the carry's rows past `pos % ratio` are zero,
the new row goes in at `pos % ratio`) and says whether it did complete it; where it did,
the latent and the carry equal `compressor_step`'s bit for bit (the same rows, the same ops),
so a decode step can be captured as a CUDA graph.
HF reading: identical pooling; the "32-row fp32 ring" of some engines is a serving layout
of the same carried rows (spec §6.2). Known gaps: none.
"""
from __future__ import annotations

import torch

from dsv41c.prims.norms import acc_dtype, rms_norm


def _project(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor):
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    return xa @ wkv.to(acc).T, xa @ wgate.to(acc).T


def pool_groups(kv: torch.Tensor, gate: torch.Tensor, ratio: int) -> torch.Tensor:
    """kv, gate [n·r, C] (fp32) -> [n, C]: per-channel softmax-gated sum over each group."""
    kv = kv.unflatten(0, (-1, ratio))
    gate = gate.unflatten(0, (-1, ratio))
    return (kv * gate.softmax(dim=1)).sum(dim=1)


def compressor_full(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor | None, norm_w: torch.Tensor,
                    ratio: int, eps: float) -> torch.Tensor:
    """x [T, D] from position 0 -> latents [T // ratio, C] (pre-RoPE); entry j at position ratio·j."""
    if ratio == 1:
        return rms_norm(x @ wkv.T, norm_w, eps)
    kv, gate = _project(x, wkv, wgate)
    usable = (x.shape[0] // ratio) * ratio
    return rms_norm(pool_groups(kv[:usable], gate[:usable], ratio).to(x.dtype), norm_w, eps)


def compressor_step(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor | None, norm_w: torch.Tensor,
                    ratio: int, eps: float, buf_kv: torch.Tensor, buf_gate: torch.Tensor):
    """Serving update. x [T, D] continues the sequence; buf_* [b < ratio, C] carried fp32 rows.

    Returns (latents [n, C] pre-RoPE, new buf_kv, new buf_gate). The first emitted entry's
    index is the caller's running entry count (positions ratio·index).
    """
    if ratio == 1:
        return rms_norm(x @ wkv.T, norm_w, eps), buf_kv, buf_gate
    kv, gate = _project(x, wkv, wgate)
    kv = torch.cat([buf_kv.to(kv.dtype), kv])
    gate = torch.cat([buf_gate.to(gate.dtype), gate])
    usable = (kv.shape[0] // ratio) * ratio
    latents = rms_norm(pool_groups(kv[:usable], gate[:usable], ratio).to(x.dtype), norm_w, eps)
    return latents, kv[usable:], gate[usable:]


def compressor_step_one(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor, norm_w: torch.Tensor, ratio: int,
                        eps: float, buf_kv: torch.Tensor, buf_gate: torch.Tensor, pos: torch.Tensor):
    """One token (x [1, D]) at position `pos` (a scalar tensor), ratio > 1, carry buf_* [ratio - 1, C] whose
    first pos % ratio rows are valid and the rest zero. -> (latent [1, C] of the group this token closes,
    complete (bool scalar: it did close one; else the latent is not an entry), new buf_kv, new buf_gate)."""
    kv, gate = _project(x, wkv, wgate)
    b = pos.reshape(1).to(torch.int64).remainder(ratio)
    full_kv = torch.cat([buf_kv.to(kv.dtype), torch.zeros_like(kv)]).index_copy(0, b, kv)
    full_gate = torch.cat([buf_gate.to(gate.dtype), torch.zeros_like(gate)]).index_copy(0, b, gate)
    latent = rms_norm(pool_groups(full_kv, full_gate, ratio).to(x.dtype), norm_w, eps)
    complete = (b == ratio - 1).reshape(())
    new_kv = torch.where(complete, torch.zeros_like(full_kv[:-1]), full_kv[:-1]).to(buf_kv.dtype)
    new_gate = torch.where(complete, torch.zeros_like(full_gate[:-1]), full_gate[:-1]).to(buf_gate.dtype)
    return latent, complete, new_kv, new_gate
