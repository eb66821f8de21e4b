"""Ahead-of-time builds (codegen/aot.py): Triton kernels compiled for CUDA and ROCm targets on a machine
with no GPU, with the matrix instructions checked in the assembly.

Uses a test-only template (a small tl.dot GEMM with a jitted helper) so the build stays a few
kernels long; conftest turns TRITON_INTERPRET on, so these kernels are InterpretedFunctions and
the build's JITFunction conversion is exercised too.
"""
import json
import os
import re

import pytest
import triton
import triton.language as tl

from dsv41c.codegen import aot, aot_compat
from dsv41c.codegen.matrix import KernelBuildError
from dsv41c.codegen.templates import AotSpec, KernelTemplate

TARGETS4 = ["cuda:sm80", "cuda:sm90", "rocm:gfx942", "rocm:gfx1100"]
EXPECTED = {"cuda:sm80": "mma.sync", "cuda:sm90": "wgmma", "rocm:gfx942": "v_mfma", "rocm:gfx1100": "v_wmma"}


@triton.jit
def _scale_tile(acc, s):
    return acc * s


@triton.jit
def _test_gemm(a_ptr, b_ptr, c_ptr, K, scale, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * (BN * tl.num_programs(1)) + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * (BN * tl.num_programs(1)) + rn[None, :], _scale_tile(acc, scale))


@triton.jit
def _test_broken(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + undefined_name)  # noqa: F821 - fails to compile


_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32", "scale": "fp32"}


def _gemm_specs(target):
    if target.startswith("ascend"):
        return []
    # 128x128 tiles with 8 warps: big enough for wgmma on sm90
    return [AotSpec(_test_gemm, "bm128_bn128", _SIG, {"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=2,
                    keys={"BM": 128, "BN": 128, "BK": 64})]


def _broken_specs(target):
    return [AotSpec(_test_broken, "b128", {"x_ptr": "*fp32"}, {"BLOCK": 128}, keys={"BLOCK": 128})] \
        if target == "cuda:sm90" else []


GEMM = KernelTemplate("test_gemm", __name__, "test-only fp16 GEMM", ("BM", "BN", "BK"), reference=None, launch=None,
                      specializations=_gemm_specs)
BROKEN = KernelTemplate("test_broken", __name__, "test-only kernel that does not compile", ("BLOCK",),
                        reference=None, launch=None, specializations=_broken_specs)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / "kernels"
    manifest = aot.build(TARGETS4, str(out), templates={"test_gemm": GEMM, "test_broken": BROKEN}, log=None)
    return out, manifest


def test_build_writes_binaries_and_assembly_for_each_target(built):
    out, manifest = built
    kernels = {(k["target"], k["template"]): k for k in manifest["kernels"]}
    for t in TARGETS4:
        k = kernels[(t, "test_gemm")]
        assert k["status"] == "built", k.get("error")
        exts = ("ptx", "cubin") if t.startswith("cuda") else ("amdgcn", "hsaco")
        assert sorted(k["files"]) == sorted(exts)
        for ext in exts:
            path = out / k["files"][ext]
            assert path.is_file() and path.stat().st_size > 0
            assert k["files"][ext] == f"{t.replace(':', '-')}/test_gemm.bm128_bn128.{ext}"  # deterministic names
        binary = (out / k["files"][exts[1]]).read_bytes()
        assert binary[:4] == b"\x7fELF"  # cubin and HSACO are ELF objects
        assert k["entry"] == "_test_gemm" and k["metadata"]["num_warps"] == 8
        assert k["triton"] == triton.__version__ and len(k["source_hash"]) == 64
        assert k["keys"] == {"BM": 128, "BN": 128, "BK": 64}


@pytest.mark.parametrize("target", TARGETS4)
def test_expected_matrix_instructions_are_in_the_assembly(built, target):
    out, manifest = built
    k = next(k for k in manifest["kernels"] if k["target"] == target and k["template"] == "test_gemm")
    mi = k["matrix_instructions"]
    assert mi["expected"] == EXPECTED[target] and mi["dots"] >= 1
    assert mi["check"] == "ok", mi
    text = (out / k["files"]["ptx" if target.startswith("cuda") else "amdgcn"]).read_text()
    assert EXPECTED[target] in text  # disassembly agrees with the manifest
    assert sum(n for name, n in mi["found"].items() if name.startswith(EXPECTED[target])) > 0
    if target == "cuda:sm90":
        assert not any(name.startswith("mma.sync") for name in mi["found"])  # wgmma, not the Ampere fallback


def test_failing_kernel_is_recorded_and_the_build_goes_on(built):
    out, manifest = built
    bad = [k for k in manifest["kernels"] if k["template"] == "test_broken"]
    assert len(bad) == 1 and bad[0]["status"] == "failed" and "undefined_name" in bad[0]["error"]
    assert manifest["summary"]["failed"] == 1
    assert manifest["summary"]["built"] == 4
    assert any("test_broken" in f for f in manifest["summary"]["failures"])
    matrix = json.loads((out / "kernel_matrix.json").read_text())
    row = next(r for r in matrix["rows"] if r["name"] == "test_broken")
    assert row["cells"]["cuda:sm90"]["build"].startswith("failed")
    assert "failed: test_broken @ cuda:sm90" in (out / "kernel_matrix.txt").read_text()


def test_manifest_records_sources_and_versions(built):
    out, manifest = built
    assert manifest["kind"] == "dsv41c-kernels" and manifest["targets"] == TARGETS4
    assert manifest["pointer_alignment"] == 16 and manifest["line_info"] is False
    hip = [s for s in manifest["sources"] if s["language"] == "hip"]
    assert sorted(s["target"] for s in hip) == ["rocm:gfx1100", "rocm:gfx942"]
    for s in hip:
        assert (out / s["files"]["source"]).is_file()
        assert s["status"] in ("source emitted, not built (no hipcc)", "built")
    # line info off: no absolute source paths leak into the binaries
    for k in manifest["kernels"]:
        for rel in k.get("files", {}).values():
            assert os.path.dirname(__file__).encode() not in (out / rel).read_bytes()
    assert not [p for p in os.listdir(out.parent) if p.startswith(".kernels.")]  # temp dirs cleaned up


def test_rebuild_is_byte_identical_and_replaces_a_previous_build(built, tmp_path):
    out, manifest = built
    again = tmp_path / "again"
    aot.build(TARGETS4, str(again), templates={"test_gemm": GEMM, "test_broken": BROKEN}, log=None)
    for rel in ["manifest.json", "kernel_matrix.json"] + [f for k in manifest["kernels"] for f in
                                                           k.get("files", {}).values()]:
        assert (out / rel).read_bytes() == (again / rel).read_bytes(), rel
    # a previous kernel build in the way is replaced atomically
    aot.build(["cuda:sm80"], str(again), templates={"test_gemm": GEMM}, log=None, sources=False)
    assert json.loads((again / "manifest.json").read_text())["targets"] == ["cuda:sm80"]
    assert not (again / "cuda-sm90").exists()


def test_output_directory_that_is_not_a_build_is_left_alone(tmp_path):
    victim = tmp_path / "data"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    with pytest.raises(KernelBuildError, match="not a dsv41c kernel build"):
        aot.build(["cuda:sm80"], str(victim), templates={"test_gemm": GEMM}, log=None)
    assert (victim / "keep.txt").read_text() == "precious"
    assert os.listdir(tmp_path) == ["data"]


def test_unknown_target_is_a_user_error(tmp_path):
    with pytest.raises(KernelBuildError, match="unknown target 'cuda:sm99'"):
        aot.build("cuda:sm99", str(tmp_path / "x"), templates={}, log=None)
    assert not (tmp_path / "x").exists()


def test_signature_must_type_every_argument():
    fn = aot_compat.as_jit_function(_test_gemm)
    with pytest.raises(KernelBuildError, match="argument 'scale' has no type"):
        aot_compat.make_ast_source(fn, {k: v for k, v in _SIG.items() if k != "scale"}, {"BM": 16, "BN": 16, "BK": 16})
    with pytest.raises(KernelBuildError, match="unknown arguments"):
        aot_compat.make_ast_source(fn, dict(_SIG, bogus="i32"), {"BM": 16, "BN": 16, "BK": 16})


def test_cli_build_exits_nonzero_with_a_summary_on_failure(tmp_path, monkeypatch, capsys):
    from argparse import Namespace

    from dsv41c.codegen.commands import cmd_kernels

    monkeypatch.setattr(aot, "load_templates", lambda: ({"test_gemm": GEMM, "test_broken": BROKEN}, [], {}))
    rc = cmd_kernels(Namespace(matrix=False, build=True, json=False, targets="cuda:sm80,cuda:sm90",
                               output=str(tmp_path / "k")))
    out, err = capsys.readouterr()
    assert rc == 1
    assert "2 built, 1 failed" in out and "FAILED cuda:sm90 test_broken/b128" in out
    # one progress line per kernel ("cached" where an earlier build of the same kernel filled the cache)
    assert err.count("\n") >= 3 and re.search(r"cuda:sm80 test_gemm/bm128_bn128: (built|cached)", err)
    assert (tmp_path / "k" / "manifest.json").is_file()
    with pytest.raises(KernelBuildError, match="needs -o"):
        cmd_kernels(Namespace(matrix=False, build=True, json=False, targets="cuda:sm80", output=None))


@pytest.mark.gpu
def test_aot_cubin_loads_and_runs_on_this_gpu(tmp_path):
    """The GPU tier: a cubin built ahead of time runs through the CUDA driver API with the
    manifest's launch metadata (block = 32·num_warps, dynamic shared memory, Triton's two
    trailing scratch-pointer parameters) and matches torch."""
    import ctypes

    import torch

    major, minor = torch.cuda.get_device_capability()
    target = f"cuda:sm{major}{minor}"
    if target not in ("cuda:sm80", "cuda:sm90", "cuda:sm100"):
        pytest.skip(f"no AOT target for {target}")
    manifest = aot.build([target], str(tmp_path / "k"), templates={"test_gemm": GEMM}, log=None, sources=False)
    k = manifest["kernels"][0]
    assert k["status"] == "built", k.get("error")
    md = k["metadata"]
    assert md["global_scratch_size"] == 0 and md["profile_scratch_size"] == 0
    cubin = (tmp_path / "k" / k["files"]["cubin"]).read_bytes()

    M = N = K = 256
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.zeros(M, N, device="cuda", dtype=torch.float32)
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(rc, what):
        assert rc == 0, f"{what}: CUresult {rc}"

    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(func), module, k["entry"].encode()), "cuModuleGetFunction")
    if md["shared"] > 48 * 1024:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cuda.cuFuncSetAttribute(func, 8, ctypes.c_int(md["shared"])), "cuFuncSetAttribute")
    args = [ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(c.data_ptr()),
            ctypes.c_int32(K), ctypes.c_float(0.5), ctypes.c_void_p(0), ctypes.c_void_p(0)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in args])
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    check(cuda.cuLaunchKernel(func, M // 128, N // 128, 1, 32 * md["num_warps"], 1, 1, md["shared"], stream,
                              params, None), "cuLaunchKernel")
    torch.cuda.synchronize()
    torch.testing.assert_close(c, (a.float() @ b.float()) * 0.5, rtol=2e-3, atol=2e-3)
    cuda.cuModuleUnload(module)


def test_a_hanging_or_crashing_compiler_fails_only_its_kernel(tmp_path, monkeypatch):
    import signal
    import time

    def flaky(name, t, tg, spec, tmp, restore=True):
        if tg.name == "cuda:sm80":
            time.sleep(30)  # a compiler that hangs
        if tg.name == "cuda:sm90":
            import faulthandler

            faulthandler.disable()  # pytest's fault handler would print this deliberate crash's stack as if real
            os.kill(os.getpid(), signal.SIGSEGV)  # a compiler that crashes
        return {"template": name, "variant": spec.variant, "target": tg.name, "status": "built",
                "matrix_instructions": {"check": "ok", "expected": "v_mfma", "found": {}, "dots": 1}}

    monkeypatch.setattr(aot, "_build_one", flaky)
    monkeypatch.setenv("DSV41C_AOT_TIMEOUT", "2")
    t0 = time.time()
    m = aot.build(["cuda:sm80", "cuda:sm90", "rocm:gfx942"], str(tmp_path / "k"), templates={"test_gemm": GEMM},
                  log=None, sources=False)
    assert time.time() - t0 < 25
    by = {k["target"]: k for k in m["kernels"]}
    assert by["cuda:sm80"]["status"] == "failed" and "timed out after 2 s" in by["cuda:sm80"]["error"]
    assert by["cuda:sm90"]["status"] == "failed" and "signal 11" in by["cuda:sm90"]["error"]
    assert by["rocm:gfx942"]["status"] == "built", by["rocm:gfx942"].get("error")
    assert m["summary"]["failed"] == 2


def test_matrix_check_takes_a_variant_s_chosen_family():
    """A variant may ask for another matrix family than its target's usual one on purpose (AotSpec.matrix: the FP8
    decode tile's 2 warps give mma.sync on Hopper): its check is then against that family, and the entry says so."""
    from dsv41c.codegen.aot_compat import matrix_instructions
    from dsv41c.codegen.matrix import TARGETS
    from dsv41c.codegen.triton import fp8_gemm as fg

    ttir, asm = "tt.dot", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};"
    sm90 = TARGETS["cuda:sm90"]
    assert matrix_instructions(sm90, ttir, asm)["check"] == "fallback: mma.sync instead of wgmma"
    chosen = matrix_instructions(sm90, ttir, asm, "mma.sync")
    assert chosen["check"] == "ok" and chosen["expected"] == "mma.sync" and "wgmma" in chosen["chosen"]
    assert "chosen" not in matrix_instructions(TARGETS["cuda:sm80"], ttir, asm, "mma.sync")  # its usual family
    specs = {s.variant: s for s in fg._gemm_variants("cuda:sm90", False)}
    assert specs["wo_b_decode"].matrix == "mma.sync" and specs["wo_b_decode"].num_warps == 2
    assert specs["engram_wkv_decode"].matrix is None and specs["engram_wkv_decode"].num_warps == 4  # word decoder
    assert specs["wo_b_prefill"].matrix is None
    for other in ("cuda:sm80", "cuda:sm100", "rocm:gfx942"):  # the 2-warp tile was measured on sm90 only
        assert all(s.matrix is None and s.num_warps >= 4 for s in fg._gemm_variants(other, False)), other
