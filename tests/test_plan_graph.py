"""`dsv41c inspect ARTIFACT --graph LAYER -o FILE.svg`: one layer's scheduled plan as SVG (dsv41c/plan_graph.py).

The artifact is the mini preset (12 layers, every kind of layer: sliding-window, compressed with an indexer,
Engram) for cuda:sm90 without kernel binaries, whose plan has schedule-streams' lanes and events; compiled once
for the module (mini compiles in half of tiny's time). What the picture must hold is counted from `plan.ir`
itself: one lane per stream the layer's ops use, one box per op, one event arrow per record/wait pair.
"""
from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

from dsv41c.cli import main

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    from dsv41c.driver import build_artifact

    path = str(tmp_path_factory.mktemp("graph") / "mini-sm90.dsv41c")
    build_artifact(path, preset="mini", target="cuda:sm90", kernels=False)
    return path


@pytest.fixture(scope="module")
def plan(sm90):
    from dsv41c.ir.parser import parse_module

    with open(os.path.join(sm90, "plan.ir")) as f:
        return parse_module(f.read())


def layer_ops(plan, function, layer):
    pat = re.compile(rf"layers\.{layer}(\.|$)")
    return [(i, op) for i, op in enumerate(plan[function].ops) if pat.match(op.loc or "")]


def ids(svg_path, prefix):
    root = ET.parse(svg_path).getroot()
    return {e.get("id")[len(prefix):] for e in root.iter() if (e.get("id") or "").startswith(prefix)}


def one_error(capsys, argv, *needles):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's errors leave through SystemExit
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("dsv41c inspect: error: "), err
    for n in needles:
        assert n in err[0], (n, err[0])
    return err[0]


@pytest.mark.parametrize("function,layer,lanes", [("decode", 1, {"0", "1", "2"}), ("prefill", 2, {"0", "1"})])
def test_the_svg_has_a_lane_per_stream_a_box_per_op_and_an_arrow_per_event(sm90, plan, tmp_path, capsys,
                                                                             function, layer, lanes):
    """Layer 1 has an Engram: its look-ahead runs on a third stream; layer 2 compresses with an indexer."""
    out = tmp_path / "layer.svg"
    argv = ["inspect", sm90, "--graph", str(layer), "-o", str(out)] + (["--function", function]
                                                                       if function != "decode" else [])
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    ops = layer_ops(plan, function, layer)
    assert {str(op.attrs.get("stream", 0)) for _, op in ops} == lanes
    assert ids(out, "lane-") == lanes
    assert ids(out, "op-") == {str(i) for i, _ in ops}
    made = {id(r): i for i, op in ops for r in op.results}
    pairs = {f"{made[id(op.operands[0])]}-{i}" for i, op in ops if op.name == "stream.wait"}
    assert pairs and ids(out, "event-") == pairs
    text = out.read_text()
    kernels = {op.attrs["variant"] for _, op in ops if op.name == "kernel.call"}
    assert kernels and all(f">{v}<" in text for v in kernels), "a kernel call's box names its variant"
    assert text.count("<title>") >= len(ops)  # a tooltip per op
    assert ("Engram look-ahead" in text) == ("2" in lanes)


def test_a_layer_the_plan_does_not_have_is_one_line_and_writes_nothing(sm90, tmp_path, capsys):
    out = tmp_path / "x.svg"
    one_error(capsys, ["inspect", sm90, "--graph", "12", "-o", str(out)], "--graph 12", "layers 0..11")
    assert not out.exists()


def test_a_function_the_plan_does_not_have(sm90, tmp_path, capsys):
    one_error(capsys, ["inspect", sm90, "--graph", "0", "--function", "verify", "-o", str(tmp_path / "x.svg")],
              "@verify", "prefill, decode")


def test_an_artifact_without_plan_ir(sm90, tmp_path, capsys):
    bare = tmp_path / "bare.dsv41c"
    bare.mkdir()
    shutil.copy(os.path.join(sm90, "manifest.json"), bare / "manifest.json")
    one_error(capsys, ["inspect", str(bare), "--graph", "0", "-o", str(tmp_path / "x.svg")], "no plan.ir")
    one_error(capsys, ["inspect", str(tmp_path), "--graph", "0", "-o", str(tmp_path / "x.svg")],
              "not a dsv41c artifact")


def test_bad_output_paths_and_options_are_one_line_and_write_nothing(sm90, tmp_path, capsys):
    one_error(capsys, ["inspect", sm90, "--graph", "0", "-o", str(tmp_path / "missing" / "x.svg")],
              "-o", "does not exist")
    d = tmp_path / "dir.svg"
    d.mkdir()
    one_error(capsys, ["inspect", sm90, "--graph", "0", "-o", str(d)], "-o", "is a directory")
    one_error(capsys, ["inspect", sm90, "--graph", "0", "-o", str(tmp_path / "x.png")], "SVG")
    one_error(capsys, ["inspect", sm90, "--graph", "0"], "needs -o")
    one_error(capsys, ["inspect", sm90, "-o", str(tmp_path / "x.svg")], "--graph")
    one_error(capsys, ["inspect", sm90, "--graph", "0", "--json", "-o", str(tmp_path / "x.svg")], "--json")
    one_error(capsys, ["inspect", sm90, "--graph", "-1", "-o", str(tmp_path / "x.svg")], "--graph")
    assert not [p for p in tmp_path.iterdir() if p.is_file()]
