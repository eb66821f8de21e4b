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
    from dsv41c.frontend.trace import trace

    m, _ = trace(preset("tiny"), kv_quant=True, progress=None)
    return m


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
