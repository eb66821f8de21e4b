"""Tracing: domain ops survive torch.export whole; the traced module's structure and numerics.

The mini preset is traced with kv-quant on (its exports are cached in-process, so the
artifact tests reuse them); the traced module is interpreted and compared bit for bit
with the reference model's serving form.
"""
import functools

import pytest
import torch

import dsv41c.ops  # noqa: F401
from dsv41c.frontend.config import preset

torch.set_num_threads(1)
ops = torch.ops.dsv41


def test_domain_ops_stay_whole_through_export_and_handle_empty_caches():
    from torch.export import Dim, export

    class M(torch.nn.Module):
        def forward(self, q, w, keys, positions):
            s = ops.index_scores(q, w, keys, positions, 2)
            sel = ops.select_topk(s, 4, ops.candidate_blocks(s, positions, 2, 2, 2))
            pool = torch.cat([q[:, 0], keys])  # as in the model: window rows first, then the cache
            return ops.sparse_attention(q, pool, sel, w[0], 0.5), sel

    args = (torch.randn(5, 2, 32), torch.randn(5, 2), torch.randn(7, 32), torch.arange(5) + 10)
    ep = export(M(), args, dynamic_shapes=({0: Dim("T", min=1)}, {0: Dim("T", min=1)}, {0: Dim("N", min=0)},
                                           {0: Dim("T", min=1)}), strict=False)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"dsv41.index_scores.default", "dsv41.select_topk.default", "dsv41.candidate_blocks.default",
            "dsv41.sparse_attention.default"} <= targets
    # one graph for every context length, including "no compressed entries yet"
    _o, sel = ep.module()(torch.randn(3, 2, 32), torch.randn(3, 2), torch.zeros(0, 32), torch.arange(3))
    assert sel.shape == (3, 4) and bool((sel == -1).all())
    # the compressor keeps an incomplete group in its fixed-size buffer
    x, wkv = torch.randn(3, 16), torch.randn(32, 16)
    lat, bk, bg = ops.compressor_step(x, torch.tensor(0), wkv, wkv.clone(), torch.ones(32), torch.zeros(1, 32),
                                      torch.zeros(1, 32), 2, 1e-6)
    assert lat.shape == (1, 32) and bool(bk.abs().sum() > 0)  # 3 tokens: one group + one carried row


@functools.lru_cache(maxsize=None)
def _traced():
    from dsv41c.frontend.trace import trace

    return trace(preset("mini"), kv_quant=True, progress=None)


def test_traced_module_structure():
    from dsv41c.frontend.inventory import expected_tensors
    from dsv41c.ir import parse_module, print_module, verify

    m, info = _traced()
    cfg = preset("mini")
    verify(m)
    assert list(m.functions) == ["prefill", "decode"] and m.attrs["outputs"][0] == "logits"
    names = set(expected_tensors(cfg))
    for f in m.functions.values():
        args = [a.name for a in f.args]
        assert args[0] == "ids"
        weights = [n for n in args[1:] if not n.startswith("state.")]
        assert set(weights) <= names and "layers.11.ffn.experts.15.w2.weight" in weights  # checkpoint names
        assert all(a.attrs.get("placement") == "persistent" for a in f.args if a.name.startswith("state."))
        assert all(op.loc for op in f.ops)
    dec = m.functions["decode"]
    assert not any("T" in str(t) for op in dec.ops for t in (r.type for r in op.results))
    by_loc = {(op.name, op.loc) for op in m.functions["prefill"].ops}
    assert ("dsv41.index_scores", "layers.6.attn.indexer") in by_loc
    assert ("dsv41.candidate_blocks", "layers.6.attn.indexer") in by_loc
    assert ("dsv41.compressor_step", "layers.2.attn.compressor") in by_loc
    assert ("dsv41.moe", "layers.11.ffn") in by_loc and ("dsv41.hc_mixes", "layers.0.hc_attn") in by_loc
    comp = [op for op in m.functions["prefill"].ops if op.name == "dsv41.compressor_step"]
    assert len(comp) == len(cfg.kv_source_layer_ids)
    assert str(comp[0].results[0].type) == "f32[n2, 64]" and str(comp[1].results[0].type) == "f32[T, 64]"
    assert parse_module(print_module(m), "traced") == m  # the text form round-trips


def test_traced_module_interprets_equal_to_the_reference_serving_form():
    from dsv41c.frontend.model.model import ReferenceModel
    from dsv41c.frontend.model.weights import dequantize_stored, stored_state_dict
    from dsv41c.frontend.step import new_state
    from dsv41c.ir import interpret

    m, _ = _traced()
    cfg = preset("mini")
    sd = stored_state_dict(cfg, seed=1)  # the plan binds the stored formats and dequantizes them itself
    ref = ReferenceModel(cfg, dequantize_stored(cfg, sd), kv_quant=True)
    ids = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(4))
    st, rst = new_state(cfg), ref.new_state()
    outs = m.attrs["outputs"]
    for fname, a, b in (("prefill", 0, 9), ("prefill", 9, 11), ("decode", 11, 12)):
        f = m.functions[fname]
        inputs = {x.name: ids[a:b] if x.name == "ids" else st[x.name] if x.name.startswith("state.") else sd[x.name]
                  for x in f.args}
        res = interpret(m, fname, inputs)
        st = dict(zip(outs[1:], res[1:]))
        want = ref.prefill(rst, ids[a:b])
        assert torch.equal(res[0], want), fname
        assert int(st["state.pos"]) == rst.pos
    for g in cfg.kv_source_layer_ids:  # a fixed-capacity cache: the valid rows, then zeros
        n = rst.comp_kv[g].shape[0]
        assert torch.equal(st[f"state.comp_kv.{g}"][:n], rst.comp_kv[g])
        assert torch.equal(st[f"state.index_k.{g}"][:n], rst.index_k[g])
        assert not st[f"state.comp_kv.{g}"][n:].any()


@pytest.mark.parametrize("name", ["tiny"])
def test_weights_named_by_checkpoint_in_first_use_order(name):
    from dsv41c.frontend.trace import weight_types

    wt = weight_types(preset(name))
    assert str(wt["layers.0.ffn.experts.0.w1.weight"]) == "f32[32, 64]"  # packed FP4 [32, 32] -> dequantized
    assert "layers.0.ffn.experts.0.w1.scale" not in wt


def test_weights_are_bound_as_stored_and_dequantized_by_an_explicit_op():
    m, _ = _traced()
    f = m.functions["prefill"]
    types = {a.name: str(a.type) for a in f.args}
    assert types["layers.11.ffn.experts.15.w2.weight"].startswith("fp4e2m1x2[")
    assert types["layers.11.ffn.experts.15.w2.scale"].startswith("e8m0[")
    assert types["layers.0.attn.wq_a.weight"].startswith("fp8e4m3[") and types["embed.weight"].startswith("bf16[")
    deq = {op.loc: op for op in f.ops if op.name == "dsv41.dequant_weight"}
    assert deq["layers.0.attn.wq_a"].attrs["fmt"] == "fp8_block"
    assert deq["layers.11.ffn.experts.15.w2"].attrs["fmt"] == "fp4_row"
    assert deq["layers.0.attn.wo_a"].attrs["bf16_round"] is True
    # every stored weight is dequantized at most once per function, at its first use
    seen = [op.operands[0].name for op in f.ops if op.name == "dsv41.dequant_weight"]
    assert len(seen) == len(set(seen))
