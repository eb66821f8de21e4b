"""The arena: plan-memory gives views no bytes and keeps their base while they are read; the runtime
writes each planned value at its offset and gets the same bits as torch's allocator; values larger than
their slot and unplanned views of the arena stay correct."""
from __future__ import annotations

import json

import torch

from dsv41c.codegen.cpu import emit_program
from dsv41c.ir.parser import parse_module
from dsv41c.passes.plan_memory import PlanMemory, plan_module
from dsv41c.runtime.executor import Program

VIEWS = """func @prefill(%x: f32[T, 64], %w: f32[64, 64]) -> (f32[T, 64], f32[T, 4, 16]) {
  %a = aten.mm(%x, %w) : (f32[T, 64], f32[64, 64]) -> f32[T, 64]
  %v = aten.reshape(%a) {size = [T, 4, 16]} : (f32[T, 64]) -> f32[T, 4, 16]
  %b = aten.mm(%x, %w) : (f32[T, 64], f32[64, 64]) -> f32[T, 64]
  %c = aten.relu(%b) : (f32[T, 64]) -> f32[T, 64]
  %u = aten.reshape(%v) {size = [T, 64]} : (f32[T, 4, 16]) -> f32[T, 64]
  %d = aten.add(%u, %c) : (f32[T, 64], f32[T, 64]) -> f32[T, 64]
  %e = aten.mm(%d, %w) : (f32[T, 64], f32[64, 64]) -> f32[T, 64]
  %r = aten.reshape(%e) {size = [T, 4, 16]} : (f32[T, 64]) -> f32[T, 4, 16]
  return %d, %r
}
"""


def _planned(text: str, bind: str):
    m = parse_module(text)
    PlanMemory(bind=bind).run(m)
    return m


def test_a_view_has_no_bytes_and_keeps_its_base_until_its_last_read():
    m = _planned(VIEWS, "T=4")
    f = m.functions["prefill"]
    by = {b.name: b for b in plan_module(m)["prefill"].buffers}
    assert set(by) == {"a", "b", "c"}  # no views; %d is returned; %e is the base of a returned view
    assert by["a"].end == 5  # read through %v and %u by %d (op #5), not only by the reshape at op #1
    placed = {r.name: r.attrs.get("arena_offset") for op in f.ops for r in op.results}
    assert placed["v"] is None and placed["u"] is None and placed["e"] is None and placed["r"] is None
    assert placed["a"] != placed["b"] and placed["a"] != placed["c"]  # %a is live while both are


def _program(text: str, bind: str) -> Program:
    return Program(json.loads(emit_program(_planned(text, bind), {})))


def _run(prog: Program, inputs, arena: bool):
    fn = prog["prefill"]
    fn.use_arena = arena
    return fn.run(list(inputs)), fn


def test_the_arena_run_equals_the_allocator_run_and_a_longer_input_falls_back():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    prog = _program(VIEWS, "T=4")
    spec = prog["prefill"].arena_spec
    assert spec["bytes"] > 0 and spec["binding"] == {"T": 4}
    for T in (3, 4, 9):  # at most the binding: in the arena; past it: torch's allocator
        x = torch.randn(T, 64, generator=g)
        want, _ = _run(prog, [x, w], arena=False)
        got, fn = _run(prog, [x, w], arena=True)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        a = fn.arena(None)
        assert (a.stats["oversize"] > 0) == (T > 4) and (a.stats["placed"] > 0) == (T <= 4)
        assert not any(a.owns(t) for t in got)  # a returned value never lives in the arena
        a.stats.update(placed=0, placed_bytes=0, oversize=0, copied_out=0)


UNPLANNED = """func @prefill(%x: f32[4, 64]) -> (f32[64, 4]) {
  %a = aten.mul(%x) {other = 2.0} : (f32[4, 64]) -> f32[4, 64]
  %t = aten.clone(%a) : (f32[4, 64]) -> f32[4, 64]
  %b = aten.add(%x, %x) : (f32[4, 64], f32[4, 64]) -> f32[4, 64]
  %c = aten.mul(%b) {other = 3.0} : (f32[4, 64]) -> f32[4, 64]
  %d = aten.add(%t, %c) : (f32[4, 64], f32[4, 64]) -> f32[4, 64]
  %r = aten.t(%d) : (f32[4, 64]) -> f32[64, 4]
  return %r
}
"""


def test_a_result_sharing_the_arena_unplanned_is_copied_out(monkeypatch):
    """An op the plan does not know as a view returns one (here clone, patched to return its input's
    view): the executor copies it out of the arena, so the later writes into %a's bytes do not reach it."""
    prog = _program(UNPLANNED, "")
    fn = prog["prefill"]
    clone = next(op for op in fn.ops if op.rec["target"] == "aten.clone")
    clone.fn, clone.place, clone.form = (lambda t: t.view_as(t)), None, None
    x = torch.randn(4, 64)
    got = fn.run([x])[0]
    assert torch.equal(got, (x * 2 + (x + x) * 3).t())
    assert fn.arena(None).stats["copied_out"] == 1


def test_the_tiny_artifact_gives_the_same_bits_with_and_without_its_arena(tiny_off, monkeypatch):
    import dsv41c

    runs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("DSV41C_ARENA", flag)
        m = dsv41c.load(tiny_off)
        s = m.new_session()
        runs[flag] = [m.prefill(s, [3, 1, 4, 1, 5])] + [m.decode(s) for _ in range(3)]
        stats = m.arena_stats()
        if flag == "1":
            for name in ("prefill", "decode"):
                st = stats[name]
                assert st["placed"] > 0 and st["oversize"] == 0 and st["copied_out"] == 0, (name, st)
                assert 0 < st["bytes"] and st["slots_written"] <= st["slots"]
        else:
            assert stats == {}
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))


def test_owns_is_by_storage():
    from dsv41c.runtime.arena import Arena

    a = Arena({"bytes": 1024, "binding": {"T": 2}}, None)
    assert a.tensor.numel() == 1024 and a.owns(a.tensor[256:512].view(torch.float32)) and not a.owns(torch.zeros(4))


def test_the_coverage_script_accounts_for_every_placed_byte(tiny_off):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "arena_coverage.py")
    spec = importlib.util.spec_from_file_location("arena_coverage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, r in mod.coverage(tiny_off).items():
        parts = sum(r[k]["bytes"] for k in ("written", "kernel", "domain", "other"))
        assert parts == r["placed_bytes"] > 0 and r["arena_bytes"] <= r["written"]["bytes"], name
        assert r["arena_bytes"] <= r["planned_arena_bytes"], name  # the written values only, placed again
        assert 0 < r["written_share_of_bytes"] <= 1 and r["views"] > 0 and r["domain"]["values"] > 0


def test_a_damaged_arena_record_is_refused_naming_the_op():
    import pytest

    from dsv41c.runtime.manifest import ArtifactError

    spec = json.loads(emit_program(_planned(VIEWS, "T=4"), {}))
    f = spec["functions"]["prefill"]
    i = next(k for k, r in enumerate(f["ops"]) if r.get("arena"))
    for bad, msg in (({"offset": f["arena"]["bytes"]}, r"not inside the \d+-byte arena"),
                     ({"offset": -256}, "not inside"), ({"dtype": "int99"}, "not a torch dtype"),
                     ({"shape": ["__import__('os')"]}, "size expression")):
        s = json.loads(json.dumps(spec))
        s["functions"]["prefill"]["ops"][i]["arena"][0].update(bad)
        with pytest.raises(ArtifactError, match=rf"@prefill: op #{i} aten.mm .*{msg}"):
            Program(s)


def test_the_capture_bisect_script_needs_a_gpu_and_says_so(capsys):
    import importlib.util
    import os

    import pytest

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would build and capture")
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "arena_capture.py")
    spec = importlib.util.spec_from_file_location("arena_capture", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([]) == 2 and "needs a CUDA GPU" in capsys.readouterr().err
