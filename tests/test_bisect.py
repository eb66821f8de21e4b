"""`dsv41c bisect` names the first kernel call that leaves its tolerance.

The GPU plan of tiny (float32 verification build, kv-quant off) runs with every kernel call served by its
contract's reference (fast, exact), except one deliberately wrong variant of the dense FP8 linear (test only:
the wq_a projection's output nudged); bisect must name that call's loc, template and variant, and find nothing
without the fault. A cpu plan has no kernel call and says so.
"""
from __future__ import annotations

import pytest
import torch

import dsv41c
from dsv41c.bisect import bisect
from dsv41c.ir.kernel_contracts import reference_call


@pytest.fixture(scope="module")
def tiny_sm90_plan(tmp_path_factory):
    from dsv41c.driver import build_artifact

    path = str(tmp_path_factory.mktemp("bisect") / "tiny-sm90-f32.dsv41c")
    build_artifact(path, preset="tiny", target="cuda:sm90", kv_quant=False, activation_dtype="float32",
                   kernels=False)
    return path


def _reference_launchers(monkeypatch, wrong=None):
    import dsv41c.runtime.kernels as rk

    def launcher(template):
        def run(*args, **keys):
            out = reference_call(template, list(args), {f"key.{k}": v for k, v in keys.items()})
            if wrong is not None and wrong(template, keys):
                out = out + 1e-2 * out.abs().max()
            return out
        return run

    monkeypatch.setattr(rk, "launcher", launcher)


def test_bisect_names_the_injected_wrong_variant(tiny_sm90_plan, monkeypatch):
    _reference_launchers(monkeypatch, wrong=lambda t, k: t == "fp8_gemm" and (k.get("N"), k.get("K")) == (32, 64)
                         and k.get("mode") == "decode")
    model = dsv41c.load(tiny_sm90_plan, interpret=True)
    rep = bisect(model, torch.tensor([3, 4]), decode_steps=1)
    f = rep["first"]
    assert f is not None and f["function"] == "decode" and f["loc"] == "layers.0.attn.wq_a"
    assert (f["template"], f["variant"]) == ("fp8_gemm", "wq_a_decode") and f["error_over_tolerance"] > 1
    assert rep["past_tolerance"] >= 1 and rep["checked"] > rep["past_tolerance"]


def test_bisect_finds_nothing_without_a_fault(tiny_sm90_plan, monkeypatch):
    _reference_launchers(monkeypatch)
    rep = bisect(dsv41c.load(tiny_sm90_plan, interpret=True), torch.tensor([3, 4]), decode_steps=1)
    assert rep["first"] is None and rep["checked"] > 0 and rep["past_tolerance"] == 0


def test_bisect_of_a_cpu_plan_says_it_has_no_kernel_call(tiny_off, capsys):
    from dsv41c.cli import main

    assert main(["bisect", tiny_off, "--ids", "1,2,3"]) == 0
    assert "has no kernel call" in capsys.readouterr().out
