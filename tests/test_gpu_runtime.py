"""The CUDA runtime: what can be checked without a GPU here, and the GPU checks themselves (marked `gpu`).

Without a GPU: the factory ops of a plan are the ones given the run's device; a kernel binary from
another Triton ABI or another architecture is refused in one line naming the kernel and both
sides; the parameter list of a binary agrees with its PTX entry; a launch is served by a binary
only when constexprs, launch options, argument dtypes and alignment all match, and the reason of
a miss names the argument. On a GPU: the tiny float32 verification build against the eager
float32 reference on the same GPU (greedy tokens equal, logits rel-L2 <= 1e-3).
"""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch

from dsv41c.aten_targets import takes_device as _takes_device
from dsv41c.runtime.executor import Program
from dsv41c.runtime.manifest import ArtifactError


def test_factory_ops_are_those_that_make_a_tensor_from_nothing():
    a = torch.ops.aten
    assert _takes_device(a.arange.start_step) and _takes_device(a.full.default) and _takes_device(a.scalar_tensor)
    assert not _takes_device(a.full_like.default) and not _takes_device(a._to_copy.default)
    assert not _takes_device(a.add.Tensor) and not _takes_device(torch.ops.dsv41.moe.default)


def test_the_plans_factory_ops_are_marked(tiny_off):
    with open(os.path.join(tiny_off, "program.json")) as f:
        prog = Program(json.load(f))
    fn = prog["decode"]
    marked = {op.rec["target"] for op in fn.ops if op.factory}
    assert marked and marked <= {"aten.arange.start_step", "aten.full", "aten.scalar_tensor", "aten.zeros",
                                 "aten.ones", "aten.empty.memory_format"}
    # every op that makes a tensor with no tensor operand is marked
    for op in fn.ops:
        if op.rec["target"].startswith("aten.") and not any(isinstance(x, dict) and "v" in x for x in op.rec["args"]) \
                and not any(isinstance(v, dict) and "v" in v for v in op.rec.get("kwargs", {}).values()):
            if op.rec["target"] in ("aten.arange.start_step", "aten.full", "aten.scalar_tensor"):
                assert op.factory, op.where


@pytest.fixture(scope="module")
def sm90_manifest(tmp_path_factory):
    from dsv41c.driver import build_artifact

    path = str(tmp_path_factory.mktemp("bins") / "tiny-sm90.dsv41c")
    build_artifact(path, preset="tiny", target="cuda:sm90")
    with open(os.path.join(path, "manifest.json")) as f:
        return path, json.load(f)


def test_a_binary_of_another_triton_abi_or_arch_is_refused(sm90_manifest):
    from dsv41c.runtime.kernel_binaries import check_entry

    _, m = sm90_manifest
    e = next(k for k in m["kernels"] if k["status"] == "built")
    name = f"{e['template']}/{e['variant']}"
    built = e["triton"]
    assert check_entry(e, "cuda:sm90", built, "sm90") == name
    major, minor = built.split(".")[:2]
    other = f"{major}.{int(minor) + 1}.0"
    with pytest.raises(ArtifactError) as err:
        check_entry(e, "cuda:sm90", other, "sm90")
    msg = str(err.value)
    assert name in msg and built in msg and other in msg and "\n" not in msg
    with pytest.raises(ArtifactError, match=rf"kernel {name}: built for sm90, the device is sm80"):
        check_entry(e, "cuda:sm90", built, "sm80")


def test_binary_parameters_agree_with_the_ptx_entry(sm90_manifest):
    from dsv41c.runtime.kernel_binaries import Binary, _ptx_params, _scratch_params, find_jit

    path, m = sm90_manifest
    seen = 0
    for e in m["kernels"]:
        if e["status"] != "built":
            continue
        jit = find_jit(e)
        b = Binary(e, None, None, list(jit.arg_names))
        with open(os.path.join(path, "kernels", e["files"]["ptx"])) as f:
            n = _ptx_params(f.read(), e["entry"])
        assert n == len(b.runtime) + _scratch_params(e["metadata"]), e["variant"]
        seen += 1
    assert seen >= 5


def _fp8_gemm_binary(m):
    from dsv41c.runtime.kernel_binaries import Binary, BinaryKernel, find_jit

    e = next(k for k in m["kernels"] if k["status"] == "built" and k["template"] == "fp8_gemm")
    jit = find_jit(e)
    b = Binary(e, None, None, list(jit.arg_names))
    return e, b, BinaryKernel(jit, [b], Counter(), {}, strict=False)


def _call_values(e, kernel, dtype=torch.bfloat16, offset=0):
    vals = dict(kernel._defaults)
    vals.update(e["constexprs"])
    N, K = e["constexprs"]["N"], e["constexprs"]["K"]
    for n, ty in e["signature"].items():
        if ty.startswith("*"):
            dt = {"*bf16": dtype, "*u8": torch.uint8, "*fp32": torch.float32, "*i32": torch.int32}[ty]
            vals[n] = torch.zeros(N * K + 64, dtype=dt)[offset:]
        elif ty == "i32" or ty == "i64":
            vals[n] = 1
        elif ty == "fp32":
            vals[n] = 0.0
    return vals


def test_a_launch_is_served_only_by_a_binary_that_matches(sm90_manifest):
    _, m = sm90_manifest
    e, b, kernel = _fp8_gemm_binary(m)
    ok = _call_values(e, kernel)
    assert b.matches(ok, {"num_warps": b.num_warps}) is None
    why = b.matches(_call_values(e, kernel, dtype=torch.float32), {})
    assert why is not None and "x_ptr" in why and "torch.float32" in why and "*bf16" in why
    k = next(iter(e["constexprs"]))
    bad = dict(ok, **{k: -1})
    assert f"constexpr {k}=-1" in b.matches(bad, {})
    assert "num_warps" in b.matches(ok, {"num_warps": b.num_warps * 2})
    assert "aligned" in b.matches(_call_values(e, kernel, offset=1), {})


@pytest.mark.gpu
def test_tiny_float32_build_on_the_gpu_equals_the_eager_reference(tmp_path):
    import dsv41c
    from dsv41c.driver import build_artifact
    from dsv41c.frontend.model.generate import greedy_generate
    from dsv41c.frontend.model.model import load_reference

    torch.backends.cuda.matmul.allow_tf32 = False
    p = torch.cuda.get_device_properties(0)
    path = str(tmp_path / "tiny-f32.dsv41c")
    build_artifact(path, preset="tiny", target=f"cuda:sm{p.major}{p.minor}", kv_quant=False,
                   activation_dtype="float32")
    model = dsv41c.load(path, device="cuda")
    ref = load_reference(os.path.join(path, "checkpoint"), "float32", kv_quant=False, device="cuda")
    prompt = list(range(3, 19))
    want = greedy_generate(ref, prompt, 32)
    assert model.generate(prompt, 32) == want
    s, st = model.new_session(), ref.new_state()
    a, b = model.prefill(s, prompt), ref.prefill(st, prompt)
    assert float((a.double() - b.double()).norm() / b.double().norm()) <= 1e-3
    assert model.binaries is not None and model.binaries.loaded > 0
