"""Stable value names: a pass's dump diff shows what the pass changed, nothing renumbered.

The pass manager writes the printer's names back onto the values before the pipeline and
after each pass; `dsv41c opt` on a dump prints what the compile printed next.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dsv41c.ir.core import Op
from dsv41c.ir.parser import parse_module
from dsv41c.ir.printer import name_values, print_module
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import parse_pipeline

ROOT = Path(__file__).resolve().parents[1]

NUMBERED = """\
func @f(%x: bf16[4, 8], %m: f32[4, 8]) -> (bf16[8, 4], f32[4, 8], f32[4, 8]) {
  %0 = aten.view(%x) {size = [32]} : (bf16[4, 8]) -> bf16[32]
  %1 = aten.reshape(%0) {size = [8, 4]} : (bf16[32]) -> bf16[8, 4]
  %2 = aten.mul(%m) {other = 1} : (f32[4, 8]) -> f32[4, 8]
  %3 = aten.exp(%2) : (f32[4, 8]) -> f32[4, 8]
  %4 = aten.exp(%2) : (f32[4, 8]) -> f32[4, 8]
  return %1, %3, %4
}
"""


def _run(text: str, spec: str, **kw):
    return PassManager(parse_pipeline(spec), **kw).run(parse_module(text)).module


def test_removing_ops_renumbers_nothing_and_a_replacement_keeps_the_name():
    out = print_module(_run(NUMBERED, "canonicalize,cse,dce"))
    # view-of-view made a new reshape: it takes the replaced value's name; exp %3 survives as %3.
    assert out == ("func @f(%x: bf16[4, 8], %m: f32[4, 8]) -> (bf16[8, 4], f32[4, 8], f32[4, 8]) {\n"
                   "  %1 = aten.reshape(%x) {size = [8, 4]} : (bf16[4, 8]) -> bf16[8, 4]\n"
                   "  %3 = aten.exp(%m) : (f32[4, 8]) -> f32[4, 8]\n"
                   "  return %1, %3, %3\n}\n")


def test_a_new_value_takes_a_number_no_surviving_value_holds():
    m = parse_module(NUMBERED)
    f = m.functions["f"]
    f.ops = [op for op in f.ops if op.results[0].name != "0"]  # %0 gone: its number is not reused first
    f.ops[0].operands = [f.args[0]]
    new = Op("aten.neg", [f.args[1]], [f.args[1].type])
    f.ops.insert(0, new)
    name_values(m)
    assert new.results[0].name == "5"
    assert [op.results[0].name for op in f.ops] == ["5", "1", "2", "3", "4"]
    assert print_module(m) == print_module(parse_module(print_module(m)))


def test_names_survive_printing_and_naming_agrees_with_the_printer():
    m = parse_module(NUMBERED)
    for op in m.functions["f"].ops:
        op.results[0].name = None
    before = print_module(m)
    name_values(m)
    assert print_module(m) == before  # naming writes back exactly what the printer shows
    assert [op.results[0].name for op in m.functions["f"].ops] == ["0", "1", "2", "3", "4"]


def test_opt_on_a_dump_prints_what_the_pipeline_dumped_next(tmp_path):
    dump = tmp_path / "d"
    _run(NUMBERED.replace("%0", "%v"), "canonicalize,cse", dump_dir=str(dump))
    for stem, spec in (("01_canonicalize", "canonicalize"), ("02_cse", "cse")):
        prev = sorted(dump.glob("0*.ir"))[int(stem[:2]) - 1]
        proc = subprocess.run([sys.executable, "-m", "dsv41c", "opt", str(prev), "-p", spec],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == (dump / f"{stem}.ir").read_text()
    diff = (dump / "02_cse.diff").read_text()
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    # cse merged the second exp into the first: one op gone, the return names %3 twice; nothing else.
    assert changed == ["-  %4 = aten.exp(%m) : (f32[4, 8]) -> f32[4, 8]", "-  return %1, %3, %4",
                       "+  return %1, %3, %3"]
