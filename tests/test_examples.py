"""Every script in examples/ runs as a user would run it, on the tiny preset, and does what it says.

The pass-dumps example compiles once; the compile-and-run example then loads that artifact
(it compiles only when given a path that does not exist), so CI pays for one compile.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args, env=None):
    p = subprocess.run([sys.executable, str(EXAMPLES / script), *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, **(env or {})}, timeout=600)
    assert p.returncode == 0, f"{script} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("examples")


@pytest.fixture(scope="module")
def dumped(work):
    return _run("read_pass_dumps.py", work)


def test_every_example_is_tested():
    here = Path(__file__).read_text()
    assert sorted(p.name for p in EXAMPLES.glob("*.py") if f'"{p.name}"' not in here) == []


def test_read_pass_dumps(dumped, work):
    lines = {ln.split()[1]: ln for ln in dumped.splitlines() if ln[:2].strip().isdigit()}
    assert "fold-shapes" in lines and "changed=True" in lines["fold-shapes"]
    # stable names: fold-shapes' diff is its few rewritten ops, not the whole module renumbered
    n = int(lines["fold-shapes"].split("diff lines=")[1].split()[0])
    assert 0 < n < 1000
    assert "first hunk of fold-shapes:\n@@" in dumped and "sym.const" in dumped
    assert (work / "dumps" / "00_input.ir").exists()


def test_compile_and_run(dumped, work):
    out = _run("compile_and_run.py", work / "tiny-dumped.dsv41c")
    assert "prefill logits (6, 512)" in out and "generate agrees" in out


def test_custom_pipeline(work):
    out = _run("custom_pipeline.py", work)
    assert "return %a, %a" in out and "01_canonicalize.diff" in out


def test_kernels_for_two_targets(work):
    out = _run("kernels_for_two_targets.py", work, env={"DSV41C_CACHE_DIR": str(work / "cache")})
    assert "cuda:sm90" in out and "rocm:gfx942" in out
    assert "cuda-sm90/fp8_ue8m0_dequant.c512_bf16.cubin" in out and "rocm-gfx942/add_rmsnorm" in out
    again = _run("kernels_for_two_targets.py", work, env={"DSV41C_CACHE_DIR": str(work / "cache")})
    assert again.splitlines()[-4:] == out.splitlines()[-4:]
