"""The domain op `dsv41::compressor_fused`: one KV source's whole compressor step, as the compressor kernel does it.

    x [T, D] -> compressor_step (wkv -> RMSNorm, or the ratio-2 gated pair pooling, with the carry)
             -> latents [n, C] at entry positions ratio·(at + j), at = pos // ratio
             -> RoPE (compress table)              -> FP4 E2M1 + E4M3/16 pack -> compressed-KV cache rows at..at+n-1
             -> indexer key k_norm(wk · latent) -> RoPE -> FP4 E2M1 + UE8M0/32 pack -> indexer-key cache rows

Its eager body is exactly the chain `frontend/segments.py: Compress` traces, made of the same domain ops and
primitives in the same order (compressor_step, rope_cos_sin, rms_norm, apply_rope, kv_pack, cache_append), so it
equals that chain bit for bit. Results: the four caches after the append and the carry buffers after the
step (each a new tensor, as the ops it stands for return them).
One token at ratio > 1 (a decode step) takes the branch-free form (`prims.compressor.compressor_step_one`):
the group the token would close is always pooled, rotated and packed, and the cache rows at `pos // ratio`
are written with it where the token closed the group, else with the rows already there, so the step has
no data-dependent shape and reads nothing back to the host (a CUDA graph can hold it); the caches and the
carry equal the chain's bit for bit.
Known gaps: none known.
"""
from __future__ import annotations

import torch

from dsv41c.prims.compressor import compressor_step_one
from dsv41c.prims.norms import rms_norm
from dsv41c.prims.rope import apply_rope, rope_cos_sin
from dsv41c.prims.state import masked_rows


@torch.library.custom_op("dsv41::compressor_fused", mutates_args=())
def compressor_fused(x: torch.Tensor, pos: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor | None,
                     norm_w: torch.Tensor, buf_kv: torch.Tensor, buf_gate: torch.Tensor, inv_c: torch.Tensor,
                     wk: torch.Tensor, k_norm_w: torch.Tensor, kv_codes: torch.Tensor, kv_scales: torch.Tensor,
                     key_codes: torch.Tensor, key_scales: torch.Tensor, ratio: int, eps: float, kv_name: str,
                     key_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor]:
    """See the module docstring: -> (kv_codes, kv_scales, key_codes, key_scales, buf_kv, buf_gate) after the step."""
    ops = torch.ops.dsv41
    one = ratio > 1 and x.shape[0] == 1
    if one:
        lat, complete, bk, bg = compressor_step_one(x, wkv, wgate, norm_w, ratio, eps, buf_kv, buf_gate, pos)
    else:
        lat, bk, bg = ops.compressor_step(x, pos, wkv, wgate, norm_w, buf_kv, buf_gate, ratio, eps)
    at = pos if ratio == 1 else pos // ratio
    cos, sin = rope_cos_sin(inv_c, (at + torch.arange(lat.shape[0], device=lat.device)) * ratio)
    k = rms_norm(lat @ wk.T, k_norm_w, eps)
    kc, ks = ops.kv_pack(apply_rope(k, cos, sin), "fp4_ue8m0")
    cc, cs = ops.kv_pack(apply_rope(lat, cos, sin), "fp4_e4m3")
    if one:  # the rows already there where the token closed no group
        cc, cs = masked_rows(kv_codes, cc, at, complete), masked_rows(kv_scales, cs, at, complete)
        kc, ks = masked_rows(key_codes, kc, at, complete), masked_rows(key_scales, ks, at, complete)
    return (ops.cache_append(kv_codes, cc, at, ratio, kv_name + ".codes"),
            ops.cache_append(kv_scales, cs, at, ratio, kv_name + ".scales"),
            ops.cache_append(key_codes, kc, at, ratio, key_name + ".codes"),
            ops.cache_append(key_scales, ks, at, ratio, key_name + ".scales"), bk, bg)


@compressor_fused.register_fake
def _(x, pos, wkv, wgate, norm_w, buf_kv, buf_gate, inv_c, wk, k_norm_w, kv_codes, kv_scales, key_codes, key_scales,
      ratio, eps, kv_name, key_name):
    return tuple(torch.empty_like(t) for t in (kv_codes, kv_scales, key_codes, key_scales, buf_kv, buf_gate))
