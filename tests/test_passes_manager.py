"""The pass manager and `dsv41c opt`: dumps, kill switch, timings, verify-each, errors."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from dsv41c.cli import main
from dsv41c.ir.parser import parse_module
from dsv41c.ir.printer import print_module
from dsv41c.passes.base import ModulePass, PassError, PassResult, kill_switch
from dsv41c.passes.commands import cmd_opt
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import PASSES, parse_pipeline

KNOWN = ", ".join(sorted(PASSES))  # what an unknown pass name's error lists

GOLDEN = Path(__file__).parent / "golden"
SRC = GOLDEN / "canonicalize.ir"
PIPE = "fold-shapes,canonicalize,cse,dce"


def module():
    return parse_module(SRC.read_text(), str(SRC))


def test_dumps_are_complete_and_named(tmp_path):
    res = PassManager(parse_pipeline(PIPE), dump_dir=str(tmp_path)).run(module())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00_input.ir", "01_fold-shapes.diff", "01_fold-shapes.ir", "02_canonicalize.diff",
                     "02_canonicalize.ir", "03_cse.diff", "03_cse.ir", "04_dce.diff", "04_dce.ir", "index.json"]
    assert (tmp_path / "00_input.ir").read_text() == print_module(module())
    assert (tmp_path / "04_dce.ir").read_text() == print_module(res.module)
    index = json.loads((tmp_path / "index.json").read_text())
    assert [p["name"] for p in index["passes"]] == PIPE.split(",") and index["failed"] is None
    canon = index["passes"][1]
    assert canon["changed"] is True and canon["stats"]["fold-mul-one"] == 2 and canon["seconds"] >= 0
    assert canon["files"] == ["02_canonicalize.ir", "02_canonicalize.diff"]
    diff = (tmp_path / "02_canonicalize.diff").read_text()
    assert diff.startswith("--- 01_fold-shapes.ir\n+++ 02_canonicalize.ir\n") and "-  %a1 = aten.mul" in diff
    unchanged = [p for p in index["passes"] if not p["changed"]]
    for p in unchanged:  # a pass that changed nothing has an empty diff
        assert (tmp_path / p["files"][1]).read_text() == ""
    for f in tmp_path.glob("0[1-4]_*.ir"):  # every dump reads back
        assert print_module(parse_module(f.read_text())) == f.read_text()


def test_dump_filter_and_stale_files(tmp_path):
    (tmp_path / "07_old.ir").write_text("stale")
    (tmp_path / "notes.txt").write_text("mine")
    PassManager(parse_pipeline(PIPE), dump_dir=str(tmp_path), dump_filter="^(canonicalize|dce)$").run(module())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00_input.ir", "02_canonicalize.diff", "02_canonicalize.ir", "04_dce.diff", "04_dce.ir",
                     "index.json", "notes.txt"]
    # a diff is against the IR right before its pass, even when that pass's dump was filtered out
    diff = (tmp_path / "02_canonicalize.diff").read_text()
    assert diff.startswith("--- 01_fold-shapes.ir\n+++ 02_canonicalize.ir\n") and "-  %a1 = aten.mul" in diff
    index = json.loads((tmp_path / "index.json").read_text())
    assert [p["files"] for p in index["passes"]] == [[], ["02_canonicalize.ir", "02_canonicalize.diff"], [],
                                                     ["04_dce.ir", "04_dce.diff"]]


def test_kill_switch_skips_and_records(monkeypatch):
    assert kill_switch("fold-shapes") == "DSV41C_DISABLE_FOLD_SHAPES"
    monkeypatch.setenv("DSV41C_DISABLE_CANONICALIZE", "1")
    res = PassManager(parse_pipeline("canonicalize,dce")).run(module())
    rec = res.records[0]
    assert rec.disabled and rec.stats == {"disabled": True} and not rec.changed
    assert any(op.name == "aten.mul" for op in res.module.functions["decode"].ops)  # x*1 was not folded
    monkeypatch.setenv("DSV41C_DISABLE_CANONICALIZE", "0")  # "0" means on
    assert not PassManager(parse_pipeline("canonicalize")).run(module()).records[0].disabled


def _args(tmp_path, **kw):
    base = dict(input=str(SRC), passes=PIPE, output=str(tmp_path / "out.ir"), timings=False, verify_each=False,
                dump_dir=None, dump_filter=None)
    return argparse.Namespace(**{**base, **kw})


def test_timings_print_per_pass(tmp_path, capsys):
    assert cmd_opt(_args(tmp_path, timings=True)) == 0
    err = capsys.readouterr().err
    assert err.startswith("pass timings (wall clock):")
    for i, name in enumerate(PIPE.split(","), 1):
        assert any(line.split()[:2] == [str(i), name] and float(line.split()[2]) >= 0 for line in err.splitlines())
    assert "total" in err.splitlines()[-1]


def test_opt_writes_output_and_kill_switch_in_the_cli(tmp_path, monkeypatch):
    assert cmd_opt(_args(tmp_path)) == 0
    assert (tmp_path / "out.ir").read_text() == (GOLDEN / "canonicalize.expected.ir").read_text()
    monkeypatch.setenv("DSV41C_DISABLE_CANONICALIZE", "yes")
    assert cmd_opt(_args(tmp_path)) == 0
    assert "aten.mul" in (tmp_path / "out.ir").read_text()


@dataclass(frozen=True)
class Corrupt(ModulePass):
    """Breaks the IR on purpose: drops the function's first op."""

    name: ClassVar[str] = "corrupt"

    def run(self, module):
        module.functions["decode"].ops.pop(0)
        return PassResult(module, True, {"dropped": 1})


@dataclass(frozen=True)
class Crash(ModulePass):
    name: ClassVar[str] = "crash"

    def run(self, module):
        raise ZeroDivisionError("boom")


def test_verify_each_names_the_pass_and_its_predecessors(tmp_path):
    passes = parse_pipeline("fold-shapes,dce") + [Corrupt()] + parse_pipeline("cse")
    with pytest.raises(PassError) as ei:
        PassManager(passes, verify_each=True, dump_dir=str(tmp_path)).run(module())
    msg = str(ei.value)
    assert msg.startswith("IR invalid after pass 'corrupt' (#3; ran before: fold-shapes, dce): @decode: op #")
    assert "is not defined in @decode" in msg
    assert json.loads((tmp_path / "index.json").read_text())["failed"] == "corrupt"


def test_a_crashing_pass_is_named_not_swallowed():
    with pytest.raises(ZeroDivisionError) as ei:
        PassManager(parse_pipeline("dce") + [Crash()]).run(module())
    assert "in pass 'crash' (#2; ran before: dce)" in ei.value.__notes__[0]


def test_pipeline_text_and_options():
    (fs,) = parse_pipeline('fold-shapes{bind="T=1,L=8"}')
    assert fs.bind == "T=1,L=8" and fs.spec() == 'fold-shapes{bind="T=1,L=8"}'
    (c,) = parse_pipeline("canonicalize{max_sweeps=3}")
    assert c.max_sweeps == 3 and parse_pipeline(c.spec())[0] == c
    assert [p.name for p in parse_pipeline(" dce , cse ")] == ["dce", "cse"]
    for bad, msg in [("frob", f"unknown pass 'frob' (known: {KNOWN})"),
                     ("dce{x=1}", "pass 'dce' has no option 'x' (options: none)"),
                     ("canonicalize{max_sweeps=many}", "option 'max_sweeps' wants a int, got 'many'"),
                     ("fold-shapes{bind=\"T=1}", "unbalanced quotes or braces"), ("", "no passes given")]:
        with pytest.raises(PassError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
            parse_pipeline(bad)
    with pytest.raises(PassError, match=r"fold-shapes: bad bind 'T' \(missing '='\)"):
        parse_pipeline("fold-shapes{bind=T}")[0].run(module())


@pytest.mark.parametrize("text, spec, message", [
    ("func @f() -> () {\n  return %x\n}\n", "dce", "dsv41c opt: error: {p}:2:10: use of undefined value %x in @f"),
    ("func @f(%x: f32[3]) -> (f32[3]) {\n  %y = aten.nope(%x) : (f32[3]) -> f32[3]\n  return %y\n}\n", "dce",
     "dsv41c opt: error: {p}: @f: op #0 aten.nope (%y): unknown op 'aten.nope'"),
    ("func @f() -> () {\n  return\n}\n", "dce,frob", f"dsv41c opt: error: unknown pass 'frob' (known: {KNOWN})"),
])
def test_cli_errors_are_one_line_and_leave_no_output(tmp_path, capsys, text, spec, message):
    src = tmp_path / "in.ir"
    src.write_text(text)
    out = tmp_path / "out.ir"
    assert main(["opt", str(src), "-p", spec, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == message.format(p=src) + "\n"
    assert not out.exists()


def test_a_pass_that_breaks_the_ir_fails_opt_without_output(tmp_path, monkeypatch):
    import dsv41c.passes.registry as reg

    monkeypatch.setitem(reg.PASSES, "corrupt", f"{__name__}:Corrupt")
    with pytest.raises(PassError, match=r"IR invalid after the pipeline \(corrupt\); rerun with --verify-each"):
        cmd_opt(_args(tmp_path, passes="corrupt"))
    assert not (tmp_path / "out.ir").exists()


@dataclass(frozen=True)
class Miscompile(ModulePass):
    """Keeps the IR valid but changes its value: x*1 becomes x*2."""

    name: ClassVar[str] = "miscompile"

    def run(self, module):
        for op in module.functions["decode"].ops:
            if op.name == "aten.mul" and type(op.attrs.get("other")) is int and op.attrs["other"] == 1:
                op.attrs = {**op.attrs, "other": 2}
        return PassResult(module, True, {})


def test_numeric_oracle_names_the_pass_that_changed_values():
    import torch

    from dsv41c.ir.testing import random_inputs
    from dsv41c.passes.manager import NumericOracle

    ins = {"decode": random_inputs(module(), "decode", 0)}
    res = PassManager(parse_pipeline(PIPE), instruments=[NumericOracle(ins)]).run(module())
    assert res.changed
    with pytest.raises(PassError, match=r"pass 'miscompile' \(#2; ran before: fold-shapes\) changed output 1 of "
                                        r"@decode \(numeric oracle"):
        PassManager(parse_pipeline("fold-shapes") + [Miscompile()], instruments=[NumericOracle(ins)]).run(module())
    assert isinstance(ins["decode"][0], torch.Tensor)
