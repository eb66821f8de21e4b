"""Progress bars on a terminal, and nothing else in a log (dsv41c/progress.py, the tracer's and the pass
manager's bars).

A "terminal" here is a text stream whose `isatty()` says True: tqdm writes to it as to a tty. What a log (any
other stream) receives must be exactly the lines it received before bars existed.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from dsv41c.ir.parser import parse_module
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import parse_pipeline
from dsv41c.progress import NoBar, progress_bar

SRC = Path(__file__).parent / "golden" / "canonicalize.ir"
PIPE = "fold-shapes,canonicalize,cse,dce"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_off_a_terminal_a_bar_is_nothing_and_lines_pass_through():
    log = io.StringIO()
    bar = progress_bar(log, 3, "passes", unit="pass")
    assert isinstance(bar, NoBar)
    bar.set_postfix_str("cse")
    bar.write("  exported Ffn (first used at layers.0.): 31 ops, 0.6 s")
    bar.update(1)
    bar.close()
    assert log.getvalue() == "  exported Ffn (first used at layers.0.): 31 ops, 0.6 s\n"


def test_on_a_terminal_the_bar_draws_keeps_the_lines_and_clears_itself(monkeypatch):
    tty = Terminal()
    bar = progress_bar(tty, 3, "passes", unit="pass")
    assert not isinstance(bar, NoBar)
    bar.set_postfix_str("cse")
    bar.write("a line")
    bar.update(3)
    bar.close()
    out = tty.getvalue()
    assert "passes:" in out and "cse" in out and "\ra line\n" in out
    assert out.endswith("\r")  # leave=False: the bar's line is blanked once closed
    monkeypatch.setenv("DSV41C_PROGRESS", "0")
    assert isinstance(progress_bar(Terminal(), 3, "passes"), NoBar)


def test_the_pass_manager_shows_each_pass_on_a_terminal_and_nothing_in_a_log():
    tty, log = Terminal(), io.StringIO()
    PassManager(parse_pipeline(PIPE), progress=tty).run(parse_module(SRC.read_text()))
    PassManager(parse_pipeline(PIPE), progress=log).run(parse_module(SRC.read_text()))
    assert log.getvalue() == ""
    out = tty.getvalue()
    assert "passes:" in out and "/4 " in out
    for name in PIPE.split(","):
        assert name in out, name


@pytest.fixture(scope="module")
def traced():
    """The tiny preset traced twice, onto a log and onto a terminal (the second reuses the exports)."""
    from dsv41c.frontend.config import preset
    from dsv41c.frontend.trace import trace

    log, tty = io.StringIO(), Terminal()
    trace(preset("tiny"), kv_quant=False, progress=log)
    trace(preset("tiny"), kv_quant=False, progress=tty)
    return log.getvalue(), tty.getvalue()


def test_tracing_onto_a_log_prints_one_line_per_segment_and_no_bar(traced):
    log, _ = traced
    lines = log.splitlines()
    assert lines and "\r" not in log
    assert all(re.fullmatch(r"  (exported|reused) \w+ \(first used at [\w.]+\): \d+ ops, \d+\.\d s", ln)
               for ln in lines), lines


def test_tracing_onto_a_terminal_counts_the_layers_of_both_functions(traced):
    _, tty = traced
    assert "tracing:" in tty and "/80 " in tty  # tiny: 40 layers, in @prefill and in @decode
    assert "@prefill layers.0" in tty and "@decode layers.39" in tty
    assert re.search(r"\r  reused Prologue \(first used at model\): \d+ ops", tty)  # the lines stay, above the bar
