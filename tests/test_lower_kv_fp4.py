"""lower-kv-fp4: packed KV state, bit for bit the fake-quantized plan; its refusals, kill switch and bytes."""
from __future__ import annotations

import pytest
import torch

from dsv41c.frontend.config import preset
from dsv41c.ir import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.verifier import verify
from dsv41c.passes.base import PassError
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import make_pass

torch.set_num_threads(1)
FMT = {"comp_kv": "fp4_e4m3", "index_k": "fp4_ue8m0", "window": "fp8_ue8m0"}


def _zero_state(module, fname, cfg):
    st = {a.name: torch.zeros(list(a.type.shape), dtype=a.type.dtype.torch) for a in module.functions[fname].args
          if a.name.startswith("state.")}
    st["state.tokens_tail"][:] = cfg.engram_pad_token_id
    return st


@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_packed_plan_interprets_bit_for_bit_as_the_fake_quantized_one(name):
    from dsv41c.frontend.model.weights import stored_state_dict
    from dsv41c.frontend.trace import trace
    from dsv41c.prims.kv_pack import kv_unpack

    cfg = preset(name)
    before, _ = trace(cfg, kv_quant=True, progress=None, max_context=40)
    res = PassManager([make_pass("lower-kv-fp4")]).run(before.clone())
    after, stats = res.module, res.records[0].stats
    verify(after)
    n_groups = len(cfg.kv_source_layer_ids)
    assert stats["packed_buffers"] == 2 * (2 * n_groups + cfg.num_hidden_layers)  # both functions
    for f in after.functions.values():
        names = {op.name for op in f.ops}
        assert not names & {"dsv41.fq_compressed_kv", "dsv41.fq_indexer", "dsv41.fq_window_kv"}
        types = {a.name: str(a.type) for a in f.args}
        assert types["state.comp_kv.2.codes"] == f"fp4e2m1x2[20, {cfg.head_dim // 2}]"
        assert types["state.comp_kv.2.scales"] == f"fp8e4m3[20, {cfg.head_dim // 16}]"
        assert types["state.index_k.2.scales"] == f"e8m0[20, {cfg.index_head_dim // 32}]"
        assert types["state.window.0.codes"] == f"fp8e4m3[{cfg.sliding_window - 1}, {cfg.head_dim}]"
        assert "state.comp_kv.2" not in types and types["state.buf_kv.2"].startswith("f32[")  # the carry stays float
    sd = stored_state_dict(cfg, seed=3)
    ids = torch.randint(0, cfg.vocab_size, (33,), generator=torch.Generator().manual_seed(5))
    sb, sa = _zero_state(before, "prefill", cfg), _zero_state(after, "prefill", cfg)
    ob, oa = before.attrs["outputs"], after.attrs["outputs"]
    for fname, a, b in (("prefill", 0, 19), ("prefill", 19, 31), ("decode", 31, 32), ("decode", 32, 33)):
        def inputs(m, st):
            return {x.name: ids[a:b] if x.name == "ids" else st[x.name] if x.name.startswith("state.") else sd[x.name]
                    for x in m.functions[fname].args}

        rb, ra = interpret(before, fname, inputs(before, sb)), interpret(after, fname, inputs(after, sa))
        assert torch.equal(rb[0], ra[0]), fname  # the logits, bit for bit
        sb, sa = dict(zip(ob[1:], rb[1:])), dict(zip(oa[1:], ra[1:]))
    assert int(sb["state.pos"]) == 33
    for k, v in sb.items():
        if k + ".codes" in sa:  # the packed state holds exactly the fake-quantized rows
            assert torch.equal(kv_unpack(sa[k + ".codes"], sa[k + ".scales"], FMT[k.split(".")[1]], v.dtype), v), k
        else:
            assert torch.equal(sa[k], v), k


def test_packed_formats_are_the_kernels_layouts():
    from dsv41c import formats
    from dsv41c.prims import quant
    from dsv41c.prims.kv_pack import kv_pack, kv_unpack

    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 64, generator=g) * torch.logspace(-5, 3, 24)[:, None]
    x[0, :7] = -1e-9  # negative values that round to zero keep their sign, as the fake quantizer's
    for fmt, ref, fq in (("fp4_e4m3", formats.quant_fp4_e4m3, quant.fq_compressed_kv),
                         ("fp4_ue8m0", formats.quant_fp4_ue8m0, quant.fq_indexer),
                         ("fp8_ue8m0", formats.quant_fp8_ue8m0, quant.fq_window_kv)):
        codes, scales = kv_pack(x, fmt)
        want_c, want_s = ref(x)  # what the kernels' references (codegen/triton/kv_quant.py) produce
        assert torch.equal(codes.view(torch.uint8), want_c.view(torch.uint8)), fmt
        assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8)), fmt
        for dt in (torch.float32, torch.bfloat16, torch.float64):
            xd = x.to(dt)
            got = kv_unpack(*kv_pack(xd, fmt), fmt, dt)
            assert got.dtype == dt and torch.equal(got.view(torch.uint8), fq(xd).view(torch.uint8)), (fmt, dt)


def test_the_kill_switch_leaves_the_fake_quantizers(monkeypatch):
    from pathlib import Path

    text = (Path(__file__).parent / "golden" / "lower-kv-fp4.ir").read_text()
    monkeypatch.setenv("DSV41C_DISABLE_LOWER_KV_FP4", "1")
    m = parse_module(text)
    res = PassManager([make_pass("lower-kv-fp4")]).run(m)
    assert res.records[0].disabled and res.module == parse_module(text)


_MIXED = """func @prefill(%state.comp_kv.2: f32[16, 32] {placement = "persistent"}, %lat: f32[2, 32], %at: i64[]) -> (f32[16, 32]) {
  %comp = dsv41.fq_compressed_kv(%lat) : (f32[2, 32]) -> f32[2, 32] loc("layers.2.attn.compressor")
  %c1 = dsv41.cache_append(%state.comp_kv.2, %comp, %at) {name = "state.comp_kv.2", ratio = 2} : (f32[16, 32], f32[2, 32], i64[]) -> f32[16, 32] loc("layers.2.attn.compressor")
  %c2 = dsv41.cache_append(%c1, %lat, %at) {name = "state.comp_kv.2", ratio = 2} : (f32[16, 32], f32[2, 32], i64[]) -> f32[16, 32] loc("layers.3.attn.compressor")
  return %c2
}
"""


def test_a_buffer_written_with_float_and_fake_quantized_rows_is_refused():
    with pytest.raises(PassError, match=r"lower-kv-fp4: @prefill: buffer state.comp_kv.2 is written by "
                                        r"dsv41.cache_append at loc\(layers.3.attn.compressor\) with rows that are "
                                        r"not fake-quantized"):
        make_pass("lower-kv-fp4").run(parse_module(_MIXED))


def test_kv_quant_off_has_nothing_to_pack():
    text = _MIXED.replace('  %comp = dsv41.fq_compressed_kv(%lat) : (f32[2, 32]) -> f32[2, 32] loc("layers.2.attn.compressor")\n',
                          "").replace("%comp,", "%lat,")
    res = make_pass("lower-kv-fp4").run(parse_module(text))
    assert not res.changed and res.stats["packed_buffers"] == 0


def test_a_kv_quant_artifact_describes_and_runs_on_its_packed_state(mini_on):
    import json
    import os

    from dsv41c.runtime.loader import load

    m = json.load(open(os.path.join(mini_on, "manifest.json")))
    cfg = preset("mini")
    cap = -(-m["options"]["max_context"] // 2)
    assert m["state"]["state.comp_kv.2.codes"] == {"dtype": "fp4e2m1x2", "shape": [cap, cfg.head_dim // 2]}
    assert m["state"]["state.window.0.scales"] == {"dtype": "e8m0", "shape": [cfg.sliding_window - 1, cfg.head_dim // 32]}
    assert "state.comp_kv.2" not in m["state"]
    model = load(mini_on)
    s = model.new_session()  # the runtime allocates the packed buffers once, from the plan
    assert s.state["state.index_k.6.codes"].dtype == torch.uint8 and s.state["state.window.3.codes"].dtype == \
        torch.float8_e4m3fn and s.state["state.window.3.scales"].dtype == torch.float8_e8m0fnu
    model.prefill(s, [3, 1, 4, 1, 5, 9, 2, 6])
    assert s.state["state.comp_kv.6.codes"][:8].any() and not s.state["state.comp_kv.6.codes"][8:].any()
