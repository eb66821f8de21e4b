"""plan-memory: the arena placement's properties, the lifetimes, the caching-allocator model,
the pass on IR (values placed, streams extend lifetimes, bad bindings refused), the reports."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv41c.ir.parser import parse_module
from dsv41c.passes.arena_fit import ALIGN, ORDERS, align, best_placement, lower_bound, overlaps, place
from dsv41c.passes.base import PassError
from dsv41c.passes.caching_allocator import round_size, segment_size, simulate
from dsv41c.passes.manager import PassManager
from dsv41c.passes.plan_memory import PlanMemory, config_binding, memory_report, memory_report_files, plan_module
from dsv41c.passes.registry import parse_pipeline

GOLDEN = Path(__file__).parent / "golden" / "plan-memory.ir"

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20), st.integers(1, 5000)), min_size=0, max_size=60)


def _buffers(raw):
    return [(s, s + n, align(z)) for s, n, z in raw]


@settings(max_examples=150, deadline=None)
@given(spans)
def test_no_two_buffers_meet_in_time_and_address(raw):
    bufs = _buffers(raw)
    for how in ORDERS:
        offs, arena = place(bufs, how)
        assert overlaps(bufs, offs) == []
        assert all(o % ALIGN == 0 for o in offs)
        assert all(o + z <= arena for o, (_, _, z) in zip(offs, bufs))
        assert arena >= lower_bound(bufs)


@settings(max_examples=60, deadline=None)
@given(spans)
def test_the_best_order_is_kept_and_the_plan_is_deterministic(raw):
    bufs = _buffers(raw)
    offs, arena, how = best_placement(bufs)
    assert arena == min(place(bufs, h)[1] for h in ORDERS)
    assert (offs, arena, how) == best_placement(list(bufs))


def test_lower_bound_is_the_peak_of_live_bytes():
    assert lower_bound([(0, 2, 256), (1, 3, 512), (3, 4, 1024), (5, 5, 256)]) == 1536
    assert lower_bound([]) == 0


def test_freed_gaps_are_reused_best_fit():
    # A [0,1024) S1 [1024,1280) B [1280,1792) S2 [1792,2048); at 5 A and B are dead: holes of 1024
    # and 512 bytes; C (512) takes the one it fits best, and the arena does not grow
    bufs = [(0, 4, 1024), (1, 9, 256), (2, 4, 512), (3, 9, 256), (5, 9, 512)]
    offs, arena = place(bufs, "start")
    assert offs == [0, 1024, 1280, 1792, 1280] and arena == 2048
    assert overlaps(bufs, offs) == []


def test_caching_allocator_model():
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(0) == 512
    assert segment_size(4096) == 2 << 20 and segment_size(3 << 20) == 20 << 20
    assert segment_size(11 << 20) == 12 << 20
    # two small blocks split one 2 MiB segment; a freed block is reused by a smaller request
    est = simulate([("alloc", 0, 1000), ("alloc", 1, 1000), ("free", 0), ("alloc", 2, 100)])
    assert est.reserved_peak == 2 << 20 and est.segments == 1 and est.allocated_peak == 2048
    # a large request never comes from the small pool, and 1 MiB + 1 opens a 20 MiB segment
    est = simulate([("alloc", 0, 100), ("alloc", 1, (1 << 20) + 1), ("free", 1), ("alloc", 2, 5 << 20)])
    assert est.reserved_peak == (2 << 20) + (20 << 20) and est.segments == 2
    # freed neighbours coalesce: two 8 MiB frees then a 16 MiB request fit the first 20 MiB segment
    est = simulate([("alloc", 0, 8 << 20), ("alloc", 1, 8 << 20), ("free", 0), ("free", 1), ("alloc", 2, 16 << 20)])
    assert est.segments == 1


def _golden():
    return parse_module(GOLDEN.read_text(), str(GOLDEN))


def test_pass_places_transients_and_keeps_args_and_returns_out():
    m = _golden()
    PlanMemory(bind="T=4").run(m)
    f = m.functions["prefill"]
    assert all("arena_offset" not in a.attrs for a in f.args)
    assert all("arena_offset" not in v.attrs for v in f.returns)
    placed = {r.name: r.attrs["arena_offset"] for op in f.ops for r in op.results if "arena_offset" in r.attrs}
    assert set(placed) == {"a", "b", "c", "d", "e", "s", "k", "g"}
    assert m.attrs["memory.prefill.arena_bytes"] == m.attrs["memory.prefill.lower_bound"] == 4096
    assert m.attrs["memory.prefill.no_reuse"] == 8 * 1024


def test_a_use_on_a_side_stream_keeps_the_buffer_until_the_join():
    plan = plan_module(_golden(), "T=4")["prefill"]
    by = {b.name: b for b in plan.buffers}
    wait = 12  # stream.wait(%j) on stream 0: the first op after which stream 1's read of %s is ordered
    assert by["s"].end == wait - 1 and by["k"].end == 13
    off = dict(zip((b.name for b in plan.buffers), plan.offsets))
    assert off["g"] != off["s"]  # %g is born while stream 1 may still read %s


def test_bindings_default_and_explicit():
    m = _golden()
    env = plan_module(m)["prefill"].binding
    assert env == {"T": 2048, "N": 4096}
    m.attrs = {**m.attrs, "memory.bind.prefill": "T=8"}
    assert plan_module(m)["prefill"].binding["T"] == 8
    assert plan_module(m, "T=2")["prefill"].binding["T"] == 2


def test_bad_binding_is_refused_with_the_option_named():
    with pytest.raises(PassError, match=r"bad binding 'T'.*NAME=INT"):
        parse_pipeline('plan-memory{bind="T"}')[0].run(_golden())
    with pytest.raises(PassError, match=r"bad binding 'T=x'"):
        PlanMemory(bind="T=x").run(_golden())


def test_kill_switch_leaves_the_module_unplanned():
    m = _golden()
    res = PassManager(parse_pipeline("plan-memory"), env={"DSV41C_DISABLE_PLAN_MEMORY": "1"}).run(m)
    assert res.records[0].disabled and not any("arena_offset" in r.attrs for op in m.functions["prefill"].ops
                                               for r in op.results)


def test_stats_and_report_agree():
    m = _golden()
    stats = PlanMemory(bind="T=4").run(m).stats
    rep = memory_report(m)["prefill"]
    assert stats["arena-bytes:prefill"] == rep["bytes"] == 4096
    assert stats["caching-allocator:prefill"] == rep["caching_allocator_estimate"] == 2 << 20
    assert rep["binding"] == {"N": 4096, "T": 4} and rep["lower_bound"] <= rep["bytes"] <= rep["no_reuse"]


def test_report_files_are_json_and_pictures():
    import json

    m = _golden()
    PlanMemory(bind="T=4").run(m)
    files = memory_report_files(m)
    assert json.loads(files["reports/memory.json"])["functions"]["prefill"]["bytes"] == 4096
    assert files["reports/memory_prefill.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in files["reports/memory_prefill.svg"][:400]
    assert memory_report_files(m) == files  # reproducible bytes


def test_config_binding_bounds_caches_and_emitted_rows():
    from dsv41c.frontend.config import preset

    b = config_binding(preset("tiny"), chunk=64, max_context=4096)
    assert "T=64" in b["prefill"] and "N2=2048" in b["prefill"] and "N20=4096" in b["prefill"]
    assert "n2=32" in b["prefill"] and "n2=1" in b["decode"] and "T=" not in b["decode"]


def test_compiled_artifact_carries_the_plan_at_the_goal(tiny_off, capsys):
    import json
    import types

    from dsv41c.runtime.commands import cmd_inspect, describe

    rep = json.loads((Path(tiny_off) / "reports" / "memory.json").read_text())["functions"]
    for fn in ("prefill", "decode"):
        assert rep[fn]["lower_bound"] <= rep[fn]["bytes"] <= 1.05 * rep[fn]["lower_bound"]
        assert (Path(tiny_off) / "reports" / f"memory_{fn}.png").stat().st_size > 1000
    assert describe(str(tiny_off))["arena"]["prefill"]["chunk"] == rep["prefill"]["binding"]["T"]
    cmd_inspect(types.SimpleNamespace(artifact=str(tiny_off), json=False, memory=True))
    out = capsys.readouterr().out
    assert "lower bound" in out and "memory_prefill.svg" in out and "(missing)" not in out
