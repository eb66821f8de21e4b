"""fuse-compressor: each packed KV-source chain becomes one dsv41.compressor_fused, computing the same bits."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsv41c.frontend.config import preset
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.testing import random_inputs, same_outputs
from dsv41c.ir.verifier import verify
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import make_pass

GOLDEN = Path(__file__).parent / "golden" / "fuse-compressor.ir"


def test_both_chains_fuse_and_leave_nothing_of_themselves():
    m = parse_module(GOLDEN.read_text())
    res = make_pass("fuse-compressor").run(m.clone())
    verify(res.module)
    st = res.stats
    assert (st["fused.ratio1:ratio1"], st["fused.ratio2:ratio2"]) == (1, 1)
    left = {op.name for op in res.module.ops()}
    assert left == {"dsv41.compressor_fused", "aten.new_zeros"}  # the ratio-1 carry's empty buffers stay
    for fn in m.functions:  # the chain's packed rows, caches and carry, bit for bit, wherever the rows land
        for seed in (0, 1, 2):
            ins = random_inputs(m, fn, seed)
            ins[1] = torch.tensor(seed * 5)  # state.pos: appends at rows 0, 2 (ratio 2) / 5, 10 (ratio 1)
            assert same_outputs(interpret(m, fn, ins), interpret(res.module, fn, ins)), (fn, seed)


@pytest.fixture(scope="module")
def tiny_fq():
    from csa2_helpers import traced

    return traced("tiny")


def test_a_fake_quantized_chain_is_left_alone_and_counted(tiny_fq):
    res = make_pass("fuse-compressor").run(tiny_fq.clone())
    assert not res.changed and res.stats["fused:decode"] == 0 and res.stats["not_fused.fake_quantized"] == 8


def test_the_kill_switch_keeps_the_chain(monkeypatch):
    monkeypatch.setenv("DSV41C_DISABLE_FUSE_COMPRESSOR", "1")
    res = PassManager([make_pass("fuse-compressor")]).run(parse_module(GOLDEN.read_text()))
    assert res.records[0].disabled and not any(op.name == "dsv41.compressor_fused" for op in res.module.ops())


def test_a_chain_whose_latent_is_read_elsewhere_is_not_fused():
    text = GOLDEN.read_text()
    m = parse_module(text)
    f = m.functions["ratio1"]
    lat = next(op for op in f.ops if op.name == "dsv41.compressor_step").results[0]
    f.returns = list(f.returns) + [lat]  # the pre-RoPE latent leaves the chain: the fused op does not give it
    f.result_types = [v.type for v in f.returns]
    res = make_pass("fuse-compressor").run(m)
    assert res.stats["not_fused.escapes"] == 1 and res.stats["fused:ratio1"] == 0


def test_the_compressor_contract_is_the_fused_ops_compressed_kv_half():
    import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)
    from dsv41c.ir.kernel_contracts import ContractError, check_call, reference_call
    from dsv41c.ir.types import DTYPES, TensorType
    from dsv41c.prims.rope import rope_cos_sin

    keys = {"key.C": 64, "key.ROPE": 16, "key.RATIO": 1, "key.act": "f32"}
    types = [TensorType(DTYPES[d], s) for d, s in (
        ("f32", (3, 64)), ("f32", (64, 64)), ("f32", (64,)), ("f32", (40, 8)), ("f32", (40, 8)), ("i64", (3,)),
        ("i64", (3,)), ("fp4e2m1x2", (16, 32)), ("fp8e4m3", (16, 4)))]
    assert [str(t) for t in check_call("compressor", types, keys)] == ["fp4e2m1x2[16, 32]", "fp8e4m3[16, 4]"]
    with pytest.raises(ContractError, match=r"operand 'kv_scale' dim 1 must be C // 16 = 4, got fp8e4m3\[16, 8\]"):
        check_call("compressor", types[:8] + [TensorType(DTYPES["fp8e4m3"], (16, 8))], keys)
    g = torch.Generator().manual_seed(3)
    x, wkv, nw = torch.randn(3, 64, generator=g), torch.randn(64, 64, generator=g) / 8, torch.rand(64, generator=g)
    wk, knw, inv = torch.randn(32, 64, generator=g) / 8, torch.rand(32, generator=g), torch.rand(8, generator=g)
    caches = [torch.zeros(16, 32, dtype=torch.uint8), torch.zeros(16, 4, dtype=torch.float8_e4m3fn),
              torch.zeros(16, 16, dtype=torch.uint8), torch.zeros(16, 1, dtype=torch.float8_e8m0fnu)]
    empty = torch.zeros(0, 64)
    pos = torch.tensor(5)
    fused = torch.ops.dsv41.compressor_fused(x, pos, wkv, None, nw, empty, empty, inv, wk, knw, *caches, 1, 1e-20,
                                             "kv", "key")
    cos, sin = rope_cos_sin(inv, torch.arange(40))
    rows = torch.arange(5, 8)
    kc, ks = reference_call("compressor", [x, wkv, nw, cos, sin, rows, rows, caches[0], caches[1]], keys)
    assert torch.equal(kc, fused[0]) and torch.equal(ks.view(torch.uint8), fused[1].view(torch.uint8))


def _packed(cfg_name):
    from csa2_helpers import traced

    return make_pass("lower-kv-fp4").run(traced(cfg_name)).module


def _args(m, fname, cfg, sd, ids, state):
    out = {}
    for a in m.functions[fname].args:
        if a.name == "ids":
            out[a.name] = ids
        elif a.name in state:
            out[a.name] = state[a.name]
        elif a.name.startswith("state."):  # a packed buffer: zero bytes unpack to the zero float state
            out[a.name] = torch.zeros([int(d) for d in a.type.shape], dtype=a.type.dtype.torch)
        else:
            out[a.name] = sd[a.name]
    return out


def test_the_mini_plan_fuses_every_source_and_keeps_its_prefill_bit_for_bit():
    from csa2_helpers import weights

    from dsv41c.frontend.step import new_state

    cfg = preset("mini")
    before = _packed("mini")
    res = make_pass("fuse-compressor").run(before.clone())
    after = res.module
    verify(after)
    assert res.stats["fused:prefill"] == res.stats["fused:decode"] == 2  # mini: one ratio-2 and one ratio-1 source
    for fn in ("prefill", "decode"):
        names = [op.name for op in after.functions[fn].ops]
        assert "dsv41.compressor_step" not in names and not any(
            op.name in ("dsv41.cache_append", "dsv41.kv_pack") and ".attn.compressor" in (op.loc or "")
            for op in after.functions[fn].ops)  # none of the matched chains left behind
    sd = weights("mini", 2)
    ids = torch.randint(0, cfg.vocab_size, (9,), generator=torch.Generator().manual_seed(0))  # odd: a carry
    st = new_state(cfg)
    want = interpret(before, "prefill", _args(before, "prefill", cfg, sd, ids, st))
    got = interpret(after, "prefill", _args(after, "prefill", cfg, sd, ids, st))
    assert same_outputs(want, got)  # logits, every cache and the carry the odd token leaves


def test_share_csa2_state_counts_the_fused_plan_as_the_layer_plan_wants():
    m = make_pass("fuse-compressor").run(_packed("tiny")).module
    st = make_pass("share-csa2-state").run(m).stats
    for fn in ("prefill", "decode"):
        assert (st[f"compressors.ratio2:{fn}"], st[f"compressors.ratio1:{fn}"], st[f"index_key_producers:{fn}"],
                st[f"index_scorers:{fn}"], st[f"candidate_producers:{fn}"]) == (3, 1, 4, 8, 1)
