"""The kernel build cache, -j, the template filter and build_variants (codegen/kernel_cache.py, aot_jobs.py).

A test-only elementwise template keeps each compile a few seconds; every build here uses its
own cache directory under tmp_path, never the user's.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl

from dsv41c.codegen import aot
from dsv41c.codegen.kernel_cache import KernelCache, kernel_key, module_closure
from dsv41c.codegen.matrix import KernelBuildError
from dsv41c.codegen.templates import AotSpec, KernelTemplate


@triton.jit
def _test_scale(x_ptr, y_ptr, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) * s)


def _specs(target):
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "s": "fp32"}
    return [AotSpec(_test_scale, f"b{b}", sig, {"BLOCK": b}, keys={"BLOCK": b}) for b in (128, 256)]


SCALE = KernelTemplate("test_scale", __name__, "test-only y = x * s", ("BLOCK",), reference=None, launch=None,
                       specializations=_specs)
OTHER = KernelTemplate("test_other", __name__, "test-only, filtered out", ("BLOCK",), reference=None, launch=None,
                       specializations=_specs)
TARGETS = ["cuda:sm80", "rocm:gfx942"]


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def cold_and_warm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kcache")
    cache = KernelCache(str(tmp / "cache"))
    m1 = aot.build(TARGETS, str(tmp / "cold"), templates={"test_scale": SCALE, "test_other": OTHER}, log=None,
                   sources=False, jobs=2, cache=cache, template_filter="^test_sc")
    cold = (cache.hits, cache.misses, cache.stored)
    warm_cache = KernelCache(str(tmp / "cache"))
    m2 = aot.build(TARGETS, str(tmp / "warm"), templates={"test_scale": SCALE, "test_other": OTHER}, log=None,
                   sources=False, jobs=2, cache=warm_cache, template_filter="^test_sc")
    return tmp, m1, m2, cold, (warm_cache.hits, warm_cache.misses, warm_cache.stored)


def test_a_warm_build_compiles_nothing_and_writes_the_same_bytes(cold_and_warm):
    tmp, m1, m2, cold, warm = cold_and_warm
    assert cold == (0, 4, 4) and warm == (4, 0, 0)
    assert m1["summary"]["built"] == 4 and m1["summary"]["failed"] == 0
    assert _files(tmp / "cold") == _files(tmp / "warm")  # manifest included: same inputs, same artifact


def test_the_template_filter_keeps_only_matching_templates(cold_and_warm):
    _, m1, _, _, _ = cold_and_warm
    assert {k["template"] for k in m1["kernels"]} == {"test_scale"}
    with pytest.raises(KernelBuildError, match="matches no template"):
        aot.build(TARGETS, "/nonexistent/x", templates={"test_scale": SCALE}, log=None, template_filter="^nope")
    with pytest.raises(KernelBuildError, match="not a regular expression"):
        aot.build(TARGETS, "/nonexistent/x", templates={"test_scale": SCALE}, log=None, template_filter="(")


def test_the_key_moves_with_what_the_binary_depends_on():
    spec = _specs("cuda:sm80")[0]
    base = kernel_key("test_scale", __name__, spec, "cuda:sm80", "3.9.0", "h")
    assert base == kernel_key("test_scale", __name__, spec, "cuda:sm80", "3.9.0", "h")
    assert len({base,
                kernel_key("test_scale", __name__, spec, "cuda:sm90", "3.9.0", "h"),
                kernel_key("test_scale", __name__, spec, "cuda:sm80", "3.9.1", "h"),
                kernel_key("test_scale", __name__, spec, "cuda:sm80", "3.9.0", "edited"),
                kernel_key("test_scale", __name__, _specs("cuda:sm80")[1], "cuda:sm80", "3.9.0", "h")}) == 5
    # helpers in sibling modules count as the template's source
    assert "dsv41c.codegen.aot_compat" in module_closure("dsv41c.codegen.aot")


def test_build_variants_puts_the_asked_kernels_under_the_target_dir(cold_and_warm, tmp_path):
    tmp = cold_and_warm[0]
    cache = KernelCache(str(tmp / "cache"))
    out = tmp_path / "kernels"
    entries = aot.build_variants([("test_scale", "b256", "rocm:gfx942"), ("test_scale", "b128", "cuda:sm80")],
                                 str(out), cache=cache, templates={"test_scale": SCALE})
    assert cache.hits == 2 and cache.misses == 0
    assert [(e["target"], e["variant"], e["status"]) for e in entries] == [
        ("cuda:sm80", "b128", "built"), ("rocm:gfx942", "b256", "built")]
    assert sorted(_files(out)) == ["cuda-sm80/test_scale.b128.cubin", "cuda-sm80/test_scale.b128.ptx",
                                   "rocm-gfx942/test_scale.b256.amdgcn", "rocm-gfx942/test_scale.b256.hsaco"]
    assert (out / entries[0]["files"]["cubin"]).read_bytes() == (tmp / "cold" / entries[0]["files"]["cubin"]).read_bytes()
    with pytest.raises(KernelBuildError, match="no such variant.*b128, b256"):
        aot.build_variants([("test_scale", "b64", "cuda:sm80")], str(out), cache=None, templates={"test_scale": SCALE})
    with pytest.raises(KernelBuildError, match="not a Triton target"):
        aot.build_variants([("test_scale", "b128", "ascend:a2")], str(out), cache=None, templates={"test_scale": SCALE})


def test_the_cli_refuses_zero_jobs_and_a_filter_matching_nothing(tmp_path):
    env = {**os.environ, "DSV41C_CACHE_DIR": str(tmp_path / "cache")}
    for extra, msg in ((["-j", "0"], "-j/--jobs: must be >= 1, got 0"), (["--templates", "^zzz"], "matches no template")):
        p = subprocess.run([sys.executable, "-m", "dsv41c", "kernels", "--build", "--targets", "cuda:sm80",
                            "-o", str(tmp_path / "k"), *extra], capture_output=True, text=True, env=env)
        assert p.returncode == 2 and msg in p.stderr, p.stderr
        assert not (tmp_path / "k").exists()
