"""`--emit mlir`: every distinct traced segment exported by torch-mlir's FX importer, parsed back by torch-mlir-opt."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch_mlir = pytest.importorskip("torch_mlir", reason="torch-mlir is in the test extra: pip install -e '.[test]'")

from dsv41c.frontend.config import preset  # noqa: E402
from dsv41c.frontend.export_mlir import ExportError, emit_mlir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _opt():
    exe = shutil.which("torch-mlir-opt") or os.path.join(os.path.dirname(sys.executable), "torch-mlir-opt")
    assert os.path.exists(exe), "the torch-mlir wheel ships torch-mlir-opt"
    return exe


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlir") / "segments"
    cfg = preset("tiny")
    return cfg, out, emit_mlir(cfg, str(out))


def test_every_file_parses_back_with_torch_mlir_opt(exported):
    _, out, index = exported
    files = sorted(p.name for p in out.glob("*.mlir"))
    assert files == sorted(e["file"] for e in index["files"]) and len(files) >= 10
    for name in files:
        p = subprocess.run([_opt(), str(out / name)], capture_output=True, text=True)
        assert p.returncode == 0, f"{name}: {p.stderr[:2000]}"
        assert f"func.func @{name[:-5]}(" in p.stdout


def test_domain_ops_stay_whole_as_torch_operators(exported):
    cfg, out, index = exported
    from dsv41c.frontend.trace import trace

    module, _ = trace(cfg, progress=None)  # the same exports, re-stamped: which dsv41 ops the step uses
    in_ir = {op.name.split(".", 1)[1] for f in module.functions.values() for op in f.ops
             if op.name.startswith("dsv41.")} - {"dequant_weight"}  # the tracer's own op, not a segment's
    text = "".join((out / e["file"]).read_text() for e in index["files"])
    in_mlir = {e for f in index["files"] for e in f["dsv41_ops"]}
    assert in_ir and in_ir <= in_mlir
    for op in in_ir:
        assert f'torch.operator "torch.dsv41.{op}"' in text


def test_index_names_every_input(exported):
    _, out, _ = exported
    idx = json.loads((out / "index.json").read_text())
    attn = next(e for e in idx["files"] if e["file"] == "AttnIn.mlir")
    assert "attn.wq_a.weight" in attn["inputs"] and attn["segment"] == ["AttnIn"]


def test_a_non_export_directory_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("keep")
    with pytest.raises(ExportError, match="is not an MLIR export"):
        emit_mlir(preset("tiny"), str(tmp_path / "x"))
    assert (tmp_path / "x" / "mine.txt").read_text() == "keep"


def test_the_cli_refuses_an_unknown_format_before_compiling(tmp_path):
    p = subprocess.run([sys.executable, "-m", "dsv41c", "compile", "--preset", "tiny", "-o", str(tmp_path / "a.dsv41c"),
                        "--emit", "tflite", str(tmp_path / "t")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "--emit tflite: unknown format" in p.stderr, p.stderr
    assert not (tmp_path / "a.dsv41c").exists()
