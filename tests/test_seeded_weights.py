"""Seeded weights: the same bytes for the compiled plan and the reference, whatever order they are asked in.

A compiled tiny artifact loaded with `seeded_weights=SEED` (no checkpoint read) generates what the
reference built from `seeded_stored_dict(cfg, SEED)` runs, so both give the same greedy tokens and
logits; each tensor depends on (seed, name) only; the bench driver's roofline counts the plan's
stored weight bytes; its ratios compare like with like.
"""
from __future__ import annotations

import torch

import dsv41c
from dsv41c.bench_e2e import decode_roofline, prefill_roofline, ratios
from dsv41c.frontend.config import preset
from dsv41c.frontend.inventory import expected_tensors
from dsv41c.frontend.model.generate import greedy_generate
from dsv41c.frontend.model.model import ReferenceModel
from dsv41c.frontend.model.weights import dequantize_stored, seeded_stored_dict
from dsv41c.seeded_weights import seeded_stored


def test_a_tensor_depends_on_seed_and_name_only():
    a = seeded_stored("layers.3.attn.wq_a.weight", "fp8_block", (64, 64), 5, "cpu")
    b = seeded_stored("layers.3.attn.wq_a.weight", "fp8_block", (64, 64), 5, "cpu")
    c = seeded_stored("layers.4.attn.wq_a.weight", "fp8_block", (64, 64), 5, "cpu")
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
    assert not torch.equal(a[0].view(torch.uint8), c[0].view(torch.uint8))
    q, s = seeded_stored("layers.1.ffn.experts.0.w1.weight", "fp4_row", (64, 128), 5, "cpu")
    assert q.dtype == torch.uint8 and tuple(q.shape) == (64, 64) and tuple(s.shape) == (64, 4)


def test_compiled_plan_on_seeded_weights_equals_the_reference_on_the_same(tiny_off):
    cfg = preset("tiny")
    model = dsv41c.load(tiny_off, seeded_weights=3)
    names = [n for n in expected_tensors(cfg) if not n.startswith("mtp.")]
    ref = ReferenceModel(cfg, dequantize_stored(cfg, seeded_stored_dict(cfg, 3, names=names)), kv_quant=False)
    prompt = [5, 6, 7, 8]
    assert model.generate(prompt, 4) == greedy_generate(ref, prompt, 4)
    s, st = model.new_session(), ref.new_state()
    a, b = model.prefill(s, prompt), ref.prefill(st, prompt)
    assert float((a - b).norm() / b.norm()) <= 1e-5
    other = dsv41c.load(tiny_off, seeded_weights=4)
    assert not torch.equal(other.prefill(other.new_session(), prompt), a)


def test_roofline_and_ratios(tiny_off):
    cfg = preset("tiny")
    r = decode_roofline(tiny_off, cfg, [64, 128], 1e12)
    assert 0 < r["routed_expert_bytes"] and r["active_weight_bytes"] > 0
    a, b = r["per_context"]
    assert b["bytes_per_token"] - a["bytes_per_token"] == 64 * r["kv_bytes_per_token_global"]
    assert abs(a["roofline_ms"] - 1e3 * a["bytes_per_token"] / 1e12) < 1e-12
    p = prefill_roofline(tiny_off, cfg, 1e15)
    # 2 FLOPs per weight element of the matrices a token multiplies: more than the head alone, less than every
    # matrix with every expert
    head = cfg.vocab_size * cfg.hidden_size
    assert 2 * head < p["matmul_flops_per_token"] < 2 * 8 * r["active_weight_bytes"] + 2 * r["routed_expert_bytes"]
    assert abs(p["matmul_bound_tok_s"] - 1e15 / p["matmul_flops_per_token"]) < 1e-6
    sys_ = {"dsv41c": {"prefill": [{"tokens": 8, "tok_s": 30.0}], "decode": [{"context": 8, "tok_s": 4.0}],
                       "peak_memory_gib": 7.0},
            "eager": {"prefill": [{"tokens": 8, "tok_s": 10.0}], "decode": [{"context": 8, "tok_s": 2.0}],
                      "peak_memory_gib": 10.0},
            "compile": {"error": "exit status 1"}}
    assert ratios(sys_) == {"dsv41c_vs_eager": {"prefill_8_speedup": 3.0, "decode_8_speedup": 2.0,
                                                "peak_memory_ratio": 0.7}}
