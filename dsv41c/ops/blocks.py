"""Domain ops of the blocks around attention: MoE, Engram, mHC mixes.

Like `kv_path.py`: `torch.library.custom_op`s in namespace `dsv41`, eager bodies are the
reference primitives (`_prims.py`), fake implementations give export the shapes.

- `moe`: router (sqrtsoftplus, biased stable top-k, renormalized weights) + routed and
  shared clamped-SwiGLU experts, one op. The routed experts come as ONE flat list
  `[e0.w1, e0.w2, e0.w3, e1.w1, ...]` so that every expert matrix stays a separate,
  checkpoint-named argument (the runtime binds them lazily; nothing is stacked).
- `engram_hash`: row ids of a chunk given the last max_n-1 tokens (padded at the
  sequence start with the pad id, which is what a full forward hashes there).
- `engram_apply`: gather the rows, project, gate and add into every stream.
- `hc_mixes`: the mHC pre/post/comb of one site (including Sinkhorn).

Known gaps: image spans (`bias_vl`, DEAD tokens) are not exposed; the tokenizer's
compressed vocabulary is the identity map, as in the reference.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from dsv41c.ops import _prims as P


@torch.library.custom_op("dsv41::moe", mutates_args=())
def moe(x: torch.Tensor, gate_w: torch.Tensor, gate_bias: torch.Tensor, experts: list[torch.Tensor],
        sw1: torch.Tensor, sw2: torch.Tensor, sw3: torch.Tensor, top_k: int, route_scale: float,
        swiglu_limit: float, gate_temp: float, norm_topk_prob: bool) -> torch.Tensor:
    """x [T, D] -> [T, D]; experts = [w1, w2, w3] per routed expert, flattened."""
    return P.moe_forward(x, gate_w, gate_bias, experts[0::3], experts[1::3], experts[2::3], sw1, sw2, sw3,
                         top_k=top_k, route_scale=route_scale, swiglu_limit=swiglu_limit, gate_temp=gate_temp,
                         norm_topk_prob=norm_topk_prob)


@moe.register_fake
def _(x, gate_w, gate_bias, experts, sw1, sw2, sw3, top_k, route_scale, swiglu_limit, gate_temp, norm_topk_prob):
    return torch.empty_like(x)


def engram_cfg(layer_ids, max_ngram: int, n_heads: int, vocab: int, compressed_vocab: int, pad_id: int):
    """The config fields `engram_row_ids` reads, from plain op arguments."""
    return SimpleNamespace(engram_layer_ids=tuple(int(i) for i in layer_ids), engram_max_ngram_size=int(max_ngram),
                           engram_n_heads=int(n_heads), engram_vocab_size=int(vocab),
                           engram_compressed_vocab_size=int(compressed_vocab), engram_pad_token_id=int(pad_id))


@torch.library.custom_op("dsv41::engram_hash", mutates_args=())
def engram_hash(history: torch.Tensor, ids: torch.Tensor, layer_ids: list[int], layer_pos: int, max_ngram: int,
                n_heads: int, vocab: int, compressed_vocab: int, pad_id: int) -> torch.Tensor:
    """Row ids [T, (max_n-1)·n_heads] (int64) of chunk `ids` after `history` [max_n-1]."""
    cfg = engram_cfg(layer_ids, max_ngram, n_heads, vocab, compressed_vocab, pad_id)
    return P.chunk_row_ids(cfg, layer_pos, history, ids)


@engram_hash.register_fake
def _(history, ids, layer_ids, layer_pos, max_ngram, n_heads, vocab, compressed_vocab, pad_id):
    return torch.empty(ids.shape[0], (max_ngram - 1) * n_heads, dtype=torch.int64, device=ids.device)


@torch.library.custom_op("dsv41::engram_apply", mutates_args=())
def engram_apply(H: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, wkv: torch.Tensor,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """H [T, hc, D] plus the gated n-gram value of each token's rows, in H's dtype."""
    return P.engram_apply(H, rows, table, wkv, q_weight, k_weight, eps)


@engram_apply.register_fake
def _(H, rows, table, wkv, q_weight, k_weight, eps):
    return torch.empty_like(H)


@torch.library.custom_op("dsv41::hc_mixes", mutates_args=())
def hc_mixes(H: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
             hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """H [T, hc, D] -> (pre [T, hc], post [T, hc], comb [T, hc, hc]) in the accumulation dtype."""
    return P.hc_mixes(H, fn, base, scale, iters=iters, hc_eps=hc_eps, norm_eps=norm_eps)


@hc_mixes.register_fake
def _(H, fn, base, scale, iters, hc_eps, norm_eps):
    acc = torch.float64 if H.dtype == torch.float64 else torch.float32
    T, hc = H.shape[0], H.shape[1]
    return H.new_empty(T, hc, dtype=acc), H.new_empty(T, hc, dtype=acc), H.new_empty(T, hc, hc, dtype=acc)
