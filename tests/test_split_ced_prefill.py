"""split-ced-prefill: the suffix derived from the graph; the encoder call on the prefix then the
prefill on the suffix give the unsplit prefill's last logits and whole state (kv-quant off, tiny
and mini, prompts longer than 20 windows); the golden's analysis; FLOPs; the kill switch."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsv41c.frontend.config import preset
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.verifier import verify
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import make_pass
from dsv41c.passes.split_ced_prefill import ENCODER, ced_report

GOLDEN = Path(__file__).parent / "golden" / "split-ced-prefill.ir"


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: torch's thread start-up costs more than it saves (and the cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(m, fn, ids, state, sd):
    f = m.functions[fn]
    outs = interpret(m, fn, {a.name: ids if a.name == "ids" else state[a.name].clone() if a.name.startswith("state.")
                             else sd[a.name] for a in f.args})
    names = m.attrs.get(f"outputs.{fn}", m.attrs["outputs"])
    return dict(zip(names, outs))


def _rel(a, b):
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else float("inf")
    return float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-30))


@pytest.mark.parametrize("name, decoder, T", [("mini", 6, 330)])
def test_the_split_prefill_equals_the_unsplit_one(name, decoder, T):
    from dsv41c.frontend.model.weights import stored_state_dict
    from dsv41c.frontend.step import new_state
    from dsv41c.frontend.trace import trace

    cfg = preset(name)
    m, _ = trace(cfg, kv_quant=False, progress=None)
    res = make_pass("split-ced-prefill").run(m)
    verify(m)
    R = cfg.sliding_window - 1
    S = res.stats["suffix"]
    assert S == decoder * R + 1 and T > 20 * cfg.sliding_window  # derived: 20 decoder windows (tiny), 6 (mini)
    assert [res.stats[f"suffix:layer{n}"] for n in sorted(ced_report(res.stats)["layers"], key=int)] == \
        [(decoder - j) * R + 1 for j in range(decoder)]
    sd = stored_state_dict(cfg, seed=4)
    ids = torch.randint(3, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(5))
    st = new_state(cfg)
    whole = _run(m, "prefill", ids, st, sd)
    mid = {**st, **{k: v for k, v in _run(m, ENCODER, ids[:T - S], st, sd).items()}}
    split = _run(m, "prefill", ids[T - S:], mid, sd)
    assert _rel(split["logits"][-1], whole["logits"][-1]) <= 1e-5
    bad = {k: _rel(split[k], whole[k]) for k in whole if k.startswith("state.")}
    assert max(bad.values()) <= 1e-5, {k: v for k, v in bad.items() if v > 1e-5}


def _golden():
    return parse_module(GOLDEN.read_text(), str(GOLDEN))


def test_the_golden_split():
    m = _golden()
    stats = make_pass("split-ced-prefill").run(m).stats
    # layer 1 (the decoder) has a ring of 3 rows and nothing global depends on it: S = 3 + 1
    assert stats["suffix"] == 4 and stats["suffix:layer1"] == 4 and stats["decoder-layers"] == 1
    assert m.attrs["outputs.prefill_encoder"] == ("state.pos", "state.window.0", "state.cache")
    rep = ced_report(stats)
    for T in ("8192", "32768", "131072"):
        f = rep["flops"][T]
        assert 0 < f["per_layer_bound"] <= f["split"] < f["unsplit"]


def test_a_prefill_without_a_decoder_ring_is_left_alone():
    # the cache appends layer 1's output: both rings feed global state, so there is no decoder
    lines = GOLDEN.read_text().splitlines(keepends=True)
    g = next(ln for ln in lines if ln.lstrip().startswith("%g = "))
    lines.remove(g)
    at = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("%logits = "))
    lines.insert(at, g.replace("%h0,", "%h1,"))
    m = parse_module("".join(lines))
    res = make_pass("split-ced-prefill").run(m)
    assert not res.changed and res.stats == {"decoder-layers": 0} and ENCODER not in m.functions


def test_kill_switch():
    res = PassManager([make_pass("split-ced-prefill")], env={"DSV41C_DISABLE_SPLIT_CED_PREFILL": "1"}).run(_golden())
    assert res.records[0].disabled and ENCODER not in res.module.functions


def test_compile_with_the_split_runs_exactly_from_the_artifact(tmp_path):
    """tiny, compiled with --ced-split: the artifact's @prefill_encoder on the prefix, then its @prefill on the
    suffix, through the runtime's executor, give the unsplit prefill's last logits and state."""
    from dsv41c.cli import main
    from dsv41c.runtime.commands import describe
    from dsv41c.runtime.loader import load

    out = tmp_path / "t.dsv41c"
    assert main(["compile", "--preset", "tiny", "--kv-quant", "off", "--ced-split", "-o", str(out)]) == 0
    d = describe(str(out))
    cfg = preset("tiny")
    S = (cfg.sliding_window - 1) * 20 + 1
    assert d["options"]["ced_split"] == {"encoder": ENCODER, "suffix": S} and d["ced_split"]["suffix"] == S
    assert d["ced_split"]["layers"] == {str(20 + j): S - 15 * j for j in range(20)}
    for T in ("8192", "32768", "131072"):
        f = d["ced_split"]["flops"][T]
        assert f["per_layer_bound"] <= f["split"] < f["unsplit"]
    assert ENCODER in d["functions"]
    model = load(str(out))
    T = 330  # more than 20 windows of 16
    ids = torch.randint(3, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(6))
    whole = model.new_session()
    logits = model.prefill(whole, ids)
    split = model.new_session()
    enc = model.program[ENCODER]
    w = model._weights_of(ENCODER)
    ins = [ids[:T - S] if a["role"] == "input" else split.state[a["name"]] if a["role"] == "state" else w[a["name"]]
           for a in enc.args]
    with torch.no_grad():
        split.state.update(zip(enc.output_names, enc.run(ins)))
    tail = model.prefill(split, ids[T - S:])
    assert _rel(tail[-1], logits[-1]) <= 1e-5
    bad = {k: _rel(split.state[k], v) for k, v in whole.state.items()}
    assert max(bad.values()) <= 1e-5, {k: v for k, v in bad.items() if v > 1e-5}
