"""The kernel matrix (codegen/matrix.py) and `dsv41c kernels --matrix`."""
import json
import os
import subprocess
import sys

import pytest

from dsv41c.codegen import hip
from dsv41c.codegen import templates as registry
from dsv41c.codegen.matrix import TARGETS, KernelBuildError, KernelMatrix, parse_targets
from dsv41c.codegen.templates import AotSpec, KernelTemplate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL9 = ["cuda:sm80", "cuda:sm90", "cuda:sm100", "rocm:gfx942", "rocm:gfx950", "rocm:gfx1100",
        "ascend:a2", "ascend:a3", "ascend:a5"]


def _k():  # a stand-in kernel object: the matrix never compiles
    pass


def _fake(name, specs_for, generic_on=None):
    return KernelTemplate(name, "dsv41c.codegen.triton.fake_" + name, "test-only", ("BM",), reference=None,
                          launch=None, specializations=specs_for, generic_on=generic_on or {})


def _spec(v, **keys):
    return AotSpec(_k, v, {"x": "*fp16"}, {}, keys=keys)


def _fp8_specs(target):
    if target.startswith("ascend"):
        return []
    if target == "rocm:gfx1100":
        return [_spec("dequant_fp16", BM=64, path="dequant")]
    return [_spec("bm64", BM=64), _spec("bm128", BM=128)]


def _raising(target):
    if target == "cuda:sm100":
        raise RuntimeError("no tile for sm100")
    return [_spec("only", BM=16)]


FAKES = {
    "fake_fp8_gemm": _fake("fake_fp8_gemm", _fp8_specs,
                           {"rocm:gfx1100": "no FP8 matrix instructions on RDNA3: dequant to fp16 + WMMA"}),
    "fake_cuda_only": _fake("fake_cuda_only", lambda t: [_spec("v", BM=32)] if t.startswith("cuda") else []),
    "fake_raising": _fake("fake_raising", _raising),
}


@pytest.fixture(scope="module")
def fake_matrix():
    return KernelMatrix.build(templates=FAKES)


def test_targets_are_the_nine_of_the_design():
    assert list(TARGETS) == ALL9
    assert [t.name for t in parse_targets("rocm:gfx942, cuda:sm90,rocm:gfx942")] == ["rocm:gfx942", "cuda:sm90"]
    with pytest.raises(KernelBuildError, match="unknown target 'rocm:gfx90a'"):
        parse_targets("cuda:sm90,rocm:gfx90a")
    # facts the variants depend on, as data
    assert not TARGETS["rocm:gfx1100"].fp8_matrix and TARGETS["rocm:gfx942"].fp8_matrix
    assert TARGETS["ascend:a5"].fp4_matrix and not TARGETS["ascend:a2"].fp4_matrix
    assert not TARGETS["ascend:a3"].fp8_matrix


def test_matrix_covers_every_registered_template_and_every_target():
    templates = registry.all_templates()
    m = KernelMatrix.build()
    triton_rows = [r for r in m.rows if r.kind == "triton"]
    assert [r.name for r in triton_rows] == sorted(templates)
    assert m.targets == ALL9
    for r in m.rows:
        assert sorted(r.cells) == sorted(ALL9), r.name
        for t, c in r.cells.items():
            assert c.status in ("native", "generic", "missing", "error", "n/a"), (r.name, t, c)
            if c.status in ("native", "generic"):
                assert c.variants and all("keys" in v and v["variant"] for v in c.variants)
            if c.status in ("generic", "missing", "error"):
                assert c.reason, (r.name, t)
    # every kernel module of the registry is imported, or reported absent or broken in the gaps
    gaps = "\n".join(m.gaps())
    for mod in registry.KERNEL_MODULES:
        assert (mod in sys.modules) ^ (mod in m.absent_modules or mod in m.broken_modules), mod
        if mod not in sys.modules:
            assert f"kernel module {mod}" in gaps


def test_a_kernel_module_that_fails_to_import_is_a_gap_not_a_crash(monkeypatch, tmp_path):
    pkg = tmp_path / "dsv41c_fake_kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("import this_module_does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "KERNEL_MODULES", registry.KERNEL_MODULES + ("dsv41c_fake_kernels.broken",
                                                                               "dsv41c_fake_kernels.absent"))
    m = KernelMatrix.build()
    assert m.absent_modules[-1:] == ["dsv41c_fake_kernels.absent"]
    assert "this_module_does_not_exist_anywhere" in m.broken_modules["dsv41c_fake_kernels.broken"]
    gaps = m.gaps()
    assert gaps[-1].startswith("error: kernel module dsv41c_fake_kernels.broken does not import")


def test_native_generic_missing_error_cells(fake_matrix):
    rows = {r.name: r for r in fake_matrix.rows}
    g = rows["fake_fp8_gemm"]
    assert g.cells["cuda:sm90"].status == "native" and len(g.cells["cuda:sm90"].variants) == 2
    assert g.cells["cuda:sm90"].variants[1]["keys"] == {"BM": 128}
    c = g.cells["rocm:gfx1100"]
    assert c.status == "generic" and "no FP8 matrix instructions" in c.reason
    assert c.variants == [{"variant": "dequant_fp16", "keys": {"BM": 64, "path": "dequant"}, "num_warps": 4,
                           "num_stages": 2}]
    assert g.cells["ascend:a2"].status == "missing" and "no Triton backend" in g.cells["ascend:a2"].reason
    assert rows["fake_cuda_only"].cells["rocm:gfx942"].status == "missing"
    e = rows["fake_raising"].cells["cuda:sm100"]
    assert e.status == "error" and "no tile for sm100" in e.reason
    # a Triton variant declared for a target without a Triton backend is shown, and marked unbuildable
    a = rows["fake_raising"].cells["ascend:a5"]
    assert a.status == "native" and a.build.startswith("not buildable")


def test_gaps_are_listed_at_the_end_of_the_table(fake_matrix):
    text = fake_matrix.render()
    tail = text[text.index("\ngaps ("):]
    assert "missing: fake_cuda_only @ rocm:gfx942,rocm:gfx950,rocm:gfx1100 (no variant for this target)" in tail
    assert "missing: fake_cuda_only @ ascend:a2,ascend:a3,ascend:a5 (no Triton backend for ascend" in tail
    assert "error: fake_raising @ cuda:sm100 (specializations('cuda:sm100') raised RuntimeError" in tail
    assert "not built: fake_raising @ ascend:a2,ascend:a3,ascend:a5" in tail
    if hip.hipcc() is None:
        assert ("not built: hip:indexer_score_fp4 @ rocm:gfx942,rocm:gfx950,rocm:gfx1100 "
                "(source emitted, not built (no hipcc))") in tail
    # the generic reason is printed with its variant
    assert "fake_fp8_gemm/dequant_fp16 generic @ gfx1100: BM=64 path=dequant -- no FP8 matrix instructions" in text
    header = text.splitlines()[0].split()
    assert header == ["template"] + ALL9


def test_emitted_source_rows_have_their_own_build_state(fake_matrix):
    rows = {r.name: r for r in fake_matrix.rows}
    hip = rows["hip:indexer_score_fp4"]
    assert hip.kind == "hip" and hip.covers == "indexer"
    assert [t for t, c in hip.cells.items() if c.status != "n/a"] == ["rocm:gfx942", "rocm:gfx950", "rocm:gfx1100"]
    for t in ("rocm:gfx942", "rocm:gfx1100"):
        assert hip.cells[t].build in ("source emitted, not built (no hipcc)",
                                      "source emitted, not built yet (hipcc found: dsv41c kernels --build)")
    attn = rows["ascendc:sparse_attention_fp4"]
    assert [t for t, c in attn.cells.items() if c.status != "n/a"] == ["ascend:a2", "ascend:a3", "ascend:a5"]
    # A5 has hardware FP8/FP4 formats, A2/A3 do not: a different variant, with the reason as data
    a2, a5 = attn.cells["ascend:a2"], attn.cells["ascend:a5"]
    assert a5.status == "native" and a5.variants[0]["variant"] == "hw_fp8_fp4"
    assert a2.status == "generic" and a2.variants[0]["variant"] == "scalar_codec" and "no FP8/FP4" in a2.reason
    assert a2.build.startswith("source emitted, not built (")
    assert "CANN" in a2.build


def test_json_round_trip(fake_matrix):
    d = fake_matrix.to_json()
    back = KernelMatrix.from_json(json.loads(json.dumps(d)))
    assert back.to_json() == d
    assert back.render() == fake_matrix.render()
    assert d["gaps"] == fake_matrix.gaps()
    with pytest.raises(KernelBuildError, match="unsupported format"):
        KernelMatrix.from_json({"format": 99})


def test_apply_build_marks_built_and_failed(fake_matrix):
    m = KernelMatrix.from_json(fake_matrix.to_json())
    m.apply_build([
        {"template": "fake_fp8_gemm", "target": "cuda:sm90", "variant": "bm64", "status": "built"},
        {"template": "fake_fp8_gemm", "target": "cuda:sm90", "variant": "bm128", "status": "built"},
        {"template": "fake_cuda_only", "target": "cuda:sm90", "variant": "v", "status": "built",
         "matrix_instructions": {"check": "fallback: mma.sync instead of wgmma"}},
        {"template": "fake_fp8_gemm", "target": "cuda:sm80", "variant": "bm64", "status": "failed",
         "error": "CompilationError: boom\nmore"},
    ])
    rows = {r.name: r for r in m.rows}
    assert rows["fake_fp8_gemm"].cells["cuda:sm90"].build == "built"
    assert rows["fake_fp8_gemm"].cells["cuda:sm80"].build == "failed (1/1): bm64: CompilationError: boom"
    assert "failed: fake_fp8_gemm @ cuda:sm80" in "\n".join(m.gaps())
    assert rows["fake_cuda_only"].cells["cuda:sm90"].build.startswith("built; 1/1 variants without")
    assert ("matrix: fake_cuda_only @ cuda:sm90 (1/1 variants without the target's matrix instruction: "
            "v: fallback: mma.sync instead of wgmma)") in m.gaps()
    assert "native(1) built*" in m.render()


def _cli(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "dsv41c", "kernels", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_cli_matrix_json():
    p = _cli("--matrix", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["targets"] == ALL9
    names = [r["name"] for r in d["rows"]]
    assert set(registry.all_templates()) <= set(names)
    assert "hip:indexer_score_fp4" in names and "ascendc:compressor_fused" in names
    assert KernelMatrix.from_json(d).to_json() == d


def test_cli_matrix_table_ends_with_gaps():
    p = _cli("--matrix")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.rstrip("\n").splitlines()
    assert lines[0].split() == ["template"] + ALL9
    start = next(i for i, ln in enumerate(lines) if ln.startswith("gaps"))
    assert all(ln.startswith("  ") for ln in lines[start + 1:])  # nothing after the gap list
    assert any("ascendc:sparse_attention_fp4" in ln and "no CANN" in ln for ln in lines[start:])


def test_cli_bad_target_is_one_line_exit_2(tmp_path):
    p = _cli("--build", "--targets", "cuda:sm99", "-o", str(tmp_path / "k"))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "dsv41c kernels: error: unknown target 'cuda:sm99' (choose from " + ", ".join(ALL9) + ")"]
    assert not (tmp_path / "k").exists()
