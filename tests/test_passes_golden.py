"""Golden tests: each pass through the CLI, `python -m dsv41c opt X.ir -p SPEC`, exact text.

Every `tests/golden/<name>.ir` (except `*.expected.ir`) is one case: its `# RUN:` line
gives the pass spec (default: the file's stem), and stdout must equal
`<name>.expected.ir` byte for byte. Every registered pass has `<pass>.ir`.
To refresh after an intended change: run the RUN line and review the diff.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsv41c.passes.registry import PASSES

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parents[1]
CASES = sorted(p for p in GOLDEN.glob("*.ir") if not p.name.endswith(".expected.ir"))
_RUN = re.compile(r"^# RUN: dsv41c opt %s -p (\S+)\s*$", re.M)


def pass_spec(path: Path) -> str:
    m = _RUN.search(path.read_text())
    return m.group(1) if m else path.stem


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_through_the_cli(path):
    proc = subprocess.run([sys.executable, "-m", "dsv41c", "opt", str(path), "-p", pass_spec(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    expected = path.with_name(path.stem + ".expected.ir").read_text()
    assert proc.stdout == expected


def test_every_pass_has_a_golden_file():
    missing = [n for n in PASSES if not (GOLDEN / f"{n}.ir").exists() or not (GOLDEN / f"{n}.expected.ir").exists()]
    assert missing == []


def test_expected_files_are_fixed_points_of_the_printer():
    from dsv41c.ir.parser import parse_module
    from dsv41c.ir.printer import print_module
    from dsv41c.ir.verifier import verify

    for path in GOLDEN.glob("*.expected.ir"):
        m = parse_module(path.read_text(), str(path))
        verify(m)
        assert print_module(m) == path.read_text()
