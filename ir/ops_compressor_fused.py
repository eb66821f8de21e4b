"""The IR op `dsv41.compressor_fused`: one KV source's compressor step through the packed cache appends.

    %kc, %ks, %ic, %is, %bk, %bg = dsv41.compressor_fused(%x, %pos, %wkv, %wgate, %norm_w, %buf_kv, %buf_gate,
        %inv_c, %wk, %k_norm_w, %kv_codes, %kv_scales, %key_codes, %key_scales) {ratio, eps, kv_name, key_name}

What `fuse-compressor` makes of the chain compressor_step -> RoPE -> FP4 pack -> cache append (the compressed
KV, fp4_e4m3) and its indexer-key branch (wk -> RMSNorm -> RoPE -> fp4_ue8m0 pack -> cache append), the work of
the compressor kernel template (codegen/triton/compressor.py) for ratio 1 (wkv -> RMSNorm) and ratio 2 (gated
pair pooling, `wgate`, with the carry `buf_kv` / `buf_gate`). It writes the four caches and the carry in
place (registry `writes` / `updates`: results 0-3 are the caches after the append, 4-5 the carry); its
reference is `dsv41c/ops/compressor_fused.py`, bit for bit the chain it replaces. Cost: the linear(s) and
the indexer key's product, and the bytes moved.
Known gaps: the number of entries a step appends is data-dependent (ratio 2) and not a result.
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch
from dsv41c.ir.registry import Cost, ShapeError, register
from dsv41c.ir.shape_rules import memory_cost, need_tensor

_BUFS = ("kv_codes", "kv_scales", "key_codes", "key_scales", "buf_kv", "buf_gate")
_ARGS = ("x", "pos", "wkv", "wgate", "norm_w", "buf_kv", "buf_gate", "inv_c", "wk", "k_norm_w", "kv_codes",
         "kv_scales", "key_codes", "key_scales", "ratio", "eps", "kv_name", "key_name")


def _shape(a):
    x, wkv, wk = need_tensor(a.x), need_tensor(a.wkv), need_tensor(a.wk)
    if x.rank != 2 or wkv.rank != 2 or wk.rank != 2 or wkv.shape[1] != x.shape[1] or wk.shape[1] != wkv.shape[0]:
        raise ShapeError(f"compressor_fused: x [T, D], wkv [C, D], wk [Ci, C]; got {x}, {wkv}, {wk}")
    if a.ratio not in (1, 2) or (a.ratio == 2) != (a.wgate is not None):
        raise ShapeError(f"compressor_fused: ratio {a.ratio} with{'' if a.wgate is not None else 'out'} wgate "
                         "(ratio 2 pools gated pairs and needs wgate; ratio 1 has none)")
    return tuple(need_tensor(a[n]) for n in _BUFS)


def _impl(a):
    import dsv41c.ops.compressor_fused  # noqa: F401  (registers torch.ops.dsv41.compressor_fused)

    return torch.ops.dsv41.compressor_fused(*(a[n] for n in _ARGS))


def _cost(a, r):
    T, D = a.x.shape
    C, Ci = a.wkv.shape[0], a.wk.shape[0]
    return Cost(2 * T * D * C * (2 if a.wgate is not None else 1) + 2 * T * C * Ci, memory_cost(a, r).bytes)


register("dsv41.compressor_fused(Tensor x, Tensor pos, Tensor wkv, Tensor? wgate, Tensor norm_w, Tensor buf_kv, "
         "Tensor buf_gate, Tensor inv_c, Tensor wk, Tensor k_norm_w, Tensor kv_codes, Tensor kv_scales, "
         "Tensor key_codes, Tensor key_scales, int ratio, float eps, str kv_name, str key_name) "
         "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", shape=_shape, impl=_impl, cost=_cost,
         writes=_BUFS, updates=tuple((n, i) for i, n in enumerate(_BUFS)))
