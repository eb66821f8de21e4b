"""GPU plans checked on a machine without a GPU: kernel calls chosen per target, binaries built in,
the plan run with its kernels in Triton's interpreter against the cpu plan, every call checked."""
from __future__ import annotations

import json
import os

import pytest
import torch

from dsv41c.driver import build_artifact
from dsv41c.kernel_check import check_kernel_calls
from dsv41c.runtime.loader import load

IDS = [5, 17, 42, 7]


@pytest.fixture(scope="module")
def sm90_f32(tmp_path_factory):
    """mini (every kind of layer in 12; tiny's 40 layers interpret 3x slower) for cuda:sm90, float32
    activations (the verification build), KV quantization off, binaries built."""
    path = str(tmp_path_factory.mktemp("gpu") / "mini-sm90-f32.dsv41c")
    build_artifact(path, preset="mini", target="cuda:sm90", kv_quant=False, activation_dtype="float32")
    return path


def _rel_l2(a, b):
    return float(torch.linalg.norm(a.double() - b.double()) / torch.linalg.norm(b.double()))


@pytest.mark.slow
def test_the_float32_gpu_plan_interpreted_equals_the_cpu_plan_and_each_kernel_call_its_reference(sm90_f32, mini_off):
    from dsv41c.frontend.config import preset
    from dsv41c.frontend.layer_plan import layer_plan

    gpu, cpu = load(sm90_f32, interpret=True), load(mini_off)
    # the checked run's own logits (every call's result is the launcher's, what the run continues with): the plan
    # is interpreted once, not once for the check and again for the comparison with the cpu plan
    logits = []
    for name in ("prefill", "decode"):
        def keep(*args, _run=getattr(gpu, name), **kwargs):
            logits.append(_run(*args, **kwargs))
            return logits[-1]
        setattr(gpu, name, keep)
    report = check_kernel_calls(gpu, IDS, decode_steps=1)  # the calls' own inputs, launcher vs contract reference
    assert report["failures"] == []
    # every dense FP8 linear of both functions ran as a kernel: wq_a, wq_b, wkv, wo_b per layer, indexer wq_b
    # where the layer owns an indexer query
    cfg = preset("mini")
    queries = sum(1 for s in layer_plan(cfg)[: cfg.num_hidden_layers] if s.ratio and s.owns_indexer_query)
    by = report["by_variant"]
    L = cfg.num_hidden_layers
    assert sum(r["calls"] for k, r in by.items() if k.startswith("fp8_gemm/")) == 2 * (4 * L + queries)
    # every layer's MoE FFN (router, stacked FP4 experts read packed, FP8 shared expert) ran as one call, and every
    # RMSNorm (attention, FFN, q and kv norms per layer, the final norm, the compressors') as one
    assert by["moe_ffn/backbone_gemv"]["calls"] == 2 * L
    assert sum(r["calls"] for k, r in by.items() if k.startswith("rmsnorm/")) >= 2 * (4 * L + 1)
    assert sum(r["calls"] for k, r in by.items() if k.startswith("mhc_pre/")) == 2 * 2 * L  # both sites a layer
    assert set(t.split("/")[0] for t in by) >= {"fp8_gemm", "moe_ffn", "rmsnorm", "mhc_pre"}
    variants = set(by)
    assert "fp8_gemm/wq_a_prefill" in variants and variants & {"fp8_gemm/wq_a_gemv", "fp8_gemm/wq_a_decode"}
    assert len(logits) == 2  # check_kernel_calls ran one prefill of IDS, then one greedy decode step
    sc = cpu.new_session()
    (lg, dg), lc = logits, cpu.prefill(sc, IDS)
    assert _rel_l2(lg, lc) <= 1e-4
    dc = cpu.decode(sc)
    assert _rel_l2(dg, dc) <= 1e-4
    assert int(torch.argmax(dg)) == int(torch.argmax(dc)) and int(torch.argmax(lg[-1])) == int(torch.argmax(lc[-1]))


def test_the_gpu_artifact_carries_each_called_variant_once_with_its_hashes(sm90_f32):
    with open(os.path.join(sm90_f32, "manifest.json")) as f:
        m = json.load(f)
    assert m["target"] == "cuda:sm90" and m["options"]["dtype"] == "float32"
    called = set()
    with open(os.path.join(sm90_f32, "plan.ir")) as f:
        for x in f:
            if "kernel.call" in x:
                called.add((x.split('template = "')[1].split('"')[0], x.split('variant = "')[1].split('"')[0]))
                if "key.components" in x:  # the other binaries that call's launch runs
                    called |= {tuple(c.split("/")) for c in x.split('key.components = "')[1].split('"')[0].split(",")}
    entries = m["kernels"]
    names = [(e["template"], e["variant"]) for e in entries]
    assert len(names) == len(set(names)) and set(names) == called  # once, however many layers call it
    for e in entries:
        assert e["status"] == "built" and e["target"] == "cuda:sm90" and e["source_hash"] and e["triton"]
        for rel in e["files"].values():
            assert os.path.isfile(os.path.join(sm90_f32, "kernels", rel)), rel
    assert any(rel.endswith(".cubin") for e in entries for rel in e["files"].values())


def test_a_gpu_artifact_without_a_gpu_says_how_to_run_it(sm90_f32):
    from dsv41c.runtime.manifest import ArtifactError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ArtifactError, match="--interpret"):
        load(sm90_f32)


@pytest.mark.parametrize("target", ["cuda:sm90", "rocm:gfx942"])
def test_other_targets_get_a_plan_with_their_kernel_calls(tmp_path, target):
    path = str(tmp_path / "p.dsv41c")
    build_artifact(path, preset="tiny", target=target, kernels=False)
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    assert m["target"] == target and m["kernels"]
    assert all(e["target"] == target and e["status"].startswith("not built") for e in m["kernels"])
    with open(os.path.join(path, "plan.ir")) as f:
        text = f.read()
    assert f'target = "{target}"' in text and "template = \"fp8_gemm\"" in text
    from dsv41c.runtime.commands import describe

    d = describe(path)  # what `dsv41c inspect --json` shows
    assert d["target"] == target and d["kv_bytes_per_token"]["global"] > 0
    dec = d["functions"]["decode"]
    assert sum(dec["kernel_calls"]["fp8_gemm"].values()) == 4 * 40 + 8 and dec["aten_left"] > 0
    assert dec["kernel_calls"]["moe_ffn"] == {"backbone_gemv": 40}
    # per layer 4 (attention, FFN, q, kv), the final norm; the compressors' norms are inside their fused op
    assert sum(dec["kernel_calls"]["rmsnorm"].values()) == 4 * 40 + 1
    assert sum(dec["kernel_calls"]["mhc_pre"].values()) == 2 * 40


def test_an_ascend_target_gets_a_plan_and_says_its_kernels_are_not_built(tmp_path):
    path = str(tmp_path / "a.dsv41c")
    build_artifact(path, preset="tiny", target="ascend:a3")
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    assert m["target"] == "ascend:a3" and m["kernel_build"].startswith("not built")
    assert not os.path.exists(os.path.join(path, "kernels"))
