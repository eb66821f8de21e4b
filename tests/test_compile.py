"""`dsv41c compile`: artifact layout and manifest, determinism, the full preset, bad input.

The tiny artifact is the session-wide fixture of conftest.py (shared with test_runtime.py); the export cache makes the second, byte-compared
build cheap (conversion, stamping, passes, codegen and the random checkpoint all rerun).
"""
import json
import os
import time

import pytest

from dsv41c.driver import build_artifact, expected_inventory_hash


def _files(root):
    out = {}
    for r, _d, names in os.walk(root):
        for n in names:
            p = os.path.join(r, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def test_manifest_layout_and_plan(tiny_off):
    from dsv41c.frontend.config import preset
    from dsv41c.ir import parse_module, verify
    from dsv41c.passes.pipeline import build_pipeline, pipeline_specs
    from dsv41c.runtime.manifest import read_manifest
    from dsv41c.runtime.weights import index_hash

    m = read_manifest(tiny_off)
    cfg = preset("tiny")
    assert m["target"] == "cpu" and m["format_version"] == 1
    assert m["config_hash"] == cfg.hash() and m["config"] == cfg.to_json_dict()
    assert m["options"]["kv_quant"] is False
    assert m["pipeline"] == [p.spec() for p in build_pipeline(target="cpu")]
    ck = m["checkpoint"]
    assert ck["location"] == "checkpoint"
    assert ck["index_hash"] == index_hash(os.path.join(tiny_off, "checkpoint"))
    assert ck["inventory_hash"] == expected_inventory_hash(cfg)
    for f in ("plan.ir", "program.json", "reports/passes.json", "reports/layer_plan.json", "reports/ops.json"):
        assert f in m["files"], f
    with open(os.path.join(tiny_off, "plan.ir")) as f:
        mod = parse_module(f.read(), "plan.ir")
    verify(mod)
    assert list(mod.functions) == ["prefill", "decode"]
    dec = mod.functions["decode"]
    assert "T" not in {s for a in dec.args for s in a.type.free_symbols()}  # decode is the T = 1 plan
    assert all(op.loc for f in mod.functions.values() for op in f.ops)
    # kv-quant off: no fake quantizer is left in the plan
    assert not [op for op in dec.ops if op.name.startswith("dsv41.fq_")]
    passes = json.load(open(os.path.join(tiny_off, "reports/passes.json")))
    assert [p["name"] for p in passes["passes"]] == [p.split("{")[0] for p in pipeline_specs("cpu")]


def test_same_inputs_give_a_byte_identical_artifact(tiny_off, tmp_path):
    again = build_artifact(str(tmp_path / "again.dsv41c"), preset="tiny", kv_quant=False)["path"]
    a, b = _files(tiny_off), _files(again)
    assert sorted(a) == sorted(b)
    assert [k for k in a if a[k] != b[k]] == []


@pytest.mark.slow
def test_full_preset_compiles_symbolically(tmp_path, capsys):
    from dsv41c.frontend.config import preset
    from dsv41c.runtime.loader import load
    from dsv41c.runtime.manifest import ArtifactError

    t0 = time.perf_counter()
    info = build_artifact(str(tmp_path / "full.dsv41c"), preset="full")
    seconds = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[full preset] compiled symbolically in {seconds:.1f} s "
              f"(trace {info['trace_seconds']:.1f} s, ops {info['ops']})")
    path = info["path"]
    m = json.load(open(os.path.join(path, "manifest.json")))
    cfg = preset("full")
    assert m["checkpoint"]["location"] is None and "checkpoint/" not in "".join(m["files"])
    assert m["checkpoint"]["inventory_hash"] == expected_inventory_hash(cfg)
    with open(os.path.join(path, "plan.ir")) as f:
        text = f.read()
    head = text[:text.index("\n", text.index("func @prefill"))]
    assert "%ids: i64[T]" in head and "%state.comp_kv.20.codes: fp4e2m1x2[1048576, 256]" in head  # fixed capacity, packed
    assert f"%layers.39.ffn.experts.{cfg.n_routed_experts - 1}.w3.weight" in head
    prog = json.load(open(os.path.join(path, "program.json")))["functions"]["decode"]
    moe = [op for op in prog["ops"] if op["target"] == "dsv41.moe.default"]
    assert len(moe) == cfg.num_hidden_layers and len(moe[0]["args"][3]) == 3 * cfg.n_routed_experts
    assert sum(a["role"] == "weight" for a in prog["args"]) > 3 * cfg.n_routed_experts * cfg.num_hidden_layers
    from dsv41c.runtime.commands import describe

    kv = describe(path)["kv_bytes_per_token"]  # from the packed state buffers lower-kv-fp4 made (spec §3.12)
    assert kv == {"global": 890, "window_per_layer": 528, "window_bytes_per_layer": 127 * 528, "source": "lower-kv-fp4"}
    with pytest.raises(ArtifactError, match="names no checkpoint"):
        load(path)  # the plan alone: weights must be bound explicitly


def test_bad_compile_requests_fail_in_one_line(tmp_path, capsys):
    from dsv41c.cli import main

    out = str(tmp_path / "x.dsv41c")
    assert main(["compile", "-o", out]) == 2
    assert main(["compile", "--preset", "tiny", "--target", "cuda:sm75", "-o", out]) == 2
    assert main(["compile", "--preset", "nope", "-o", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("dsv41c compile: error: ") for line in err), err
    assert "either a checkpoint directory or --preset" in err[0]
    assert "unknown target 'cuda:sm75'" in err[1] and "unknown preset" in err[2]
    assert not os.path.exists(out)
