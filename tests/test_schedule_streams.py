"""schedule-streams: random valid interleavings of the scheduled tiny and mini plans equal the
serial result bit for bit; the verifier's stream rules refuse what a GPU could get wrong; the
plan lowers to program.json steps with their streams; the cost report; the target dependence."""
from __future__ import annotations

import json

import pytest
import torch

from dsv41c.frontend.config import preset
from dsv41c.ir.interpreter import interpret, random_order
from dsv41c.ir.parser import parse_module
from dsv41c.ir.verifier import verify, verify_errors
from dsv41c.passes.manager import PassManager
from dsv41c.passes.pipeline import build_pipeline, pipeline_specs
from dsv41c.passes.registry import make_pass

ORDERS = 20
CONTEXT = 64


def _scheduled(name, target):
    """The traced preset through `target`'s pipeline; target "cpu": the cpu pipeline with
    schedule-streams before plan-memory (the reference plan scheduled as a GPU plan is)."""
    from dsv41c.frontend.trace import trace
    from dsv41c.passes.plan_memory import binding_attrs

    cfg = preset(name)
    m, _ = trace(cfg, kv_quant=False, progress=None, max_context=CONTEXT)  # small caches: fast runs
    m.attrs = {**m.attrs, **binding_attrs(cfg, chunk=8, max_context=CONTEXT)}
    specs = pipeline_specs(target)
    if target == "cpu":
        specs.insert(specs.index("plan-memory"), "schedule-streams")
    res = PassManager(build_pipeline(specs)).run(m)
    verify(res.module)  # the stream rules and the arena-reuse rule against plan-memory's offsets
    return cfg, res


def _inputs(f, cfg, sd, ids):
    from dsv41c.frontend.step import new_state

    st = new_state(cfg, max_context=CONTEXT)
    return {a.name: ids if a.name == "ids" else st[a.name].clone() if a.name.startswith("state.") else sd[a.name]
            for a in f.args}


@pytest.fixture
def dequant_once(monkeypatch):
    """Every run dequantizes the same stored weights: the result (a pure function of the weight tensor) is
    computed once and reused, so 20 interleavings cost little more than one; every op still runs in order."""
    import dataclasses

    from dsv41c.ir.registry import _REGISTRY, get

    d = get("dsv41.dequant_weight")
    memo = {}

    def impl(a):
        key = (id(a.w), id(a.scale), a.fmt, a.dtype, a.bf16_round, a.block)
        if key not in memo:
            memo[key] = (a.w, d.impl(a))  # the weight kept alive, so its id is not reused
        return memo[key][1]

    monkeypatch.setitem(_REGISTRY, d.name, dataclasses.replace(d, impl=impl))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: thread start-up costs more than it saves
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name, target, fn, n", [pytest.param("tiny", "cpu", "decode", 1, marks=pytest.mark.slow),
                                                 ("mini", "cpu", "prefill", 6)])
def test_random_interleavings_equal_the_serial_result_bit_for_bit(name, target, fn, n, dequant_once):
    from dsv41c.frontend.model.weights import stored_state_dict

    cfg, res = _scheduled(name, target)
    m = res.module
    f = m.functions[fn]
    stats = next(r for r in res.records if r.name == "schedule-streams").stats
    assert stats["layers-split"] > 0 and stats["events"] > 0 and stats["ops:stream1"] > 0
    assert stats["engram-ops-ahead"] > 0 and stats["ops:stream2"] > 0
    sd = stored_state_dict(cfg, seed=3)
    ids = torch.tensor([5, 17, 42, 7, 99, 3][:n])
    serial = interpret(m, fn, _inputs(f, cfg, sd, ids))
    orders = {tuple(random_order(f, seed)) for seed in range(ORDERS)}
    assert len(orders) == ORDERS and tuple(range(len(f.ops))) not in orders  # real, distinct reorderings
    for order in orders:
        got = interpret(m, fn, _inputs(f, cfg, sd, ids), order=list(order))
        assert all(torch.equal(a, b) for a, b in zip(serial, got))


def test_an_interleaving_without_the_events_is_caught():
    # the golden plan with its events removed: some random order runs the join before the KV path
    text = open("tests/golden/schedule-streams.expected.ir").read()
    m = parse_module(text)
    f = m.functions["decode"]
    f.ops = [op for op in f.ops if not op.name.startswith("stream.")]
    from dsv41c.ir.interpreter import InterpreterError

    ins = [torch.randn(3, 16), *[torch.randn(16, 16)] * 2, torch.randn(16), torch.randn(16, 16), torch.randn(4, 16)]
    with pytest.raises(InterpreterError, match="has not been computed yet"):
        for seed in range(50):
            interpret(m, "decode", ins, order=random_order(f, seed))
    assert any("no wait on an event recorded after its definition" in e for e in verify_errors(m))


_HEAD = "func @f(%x: f32[4, 16], %w: f32[16, 16]) -> (f32[4, 16]) {\n"


@pytest.mark.parametrize("body, message", [
    # a use on stream 0 of a value stream 1 defines, no event at all
    ("  %a = aten.neg(%x) {stream = 1} : (f32[4, 16]) -> f32[4, 16]\n"
     "  %b = aten.relu(%a) : (f32[4, 16]) -> f32[4, 16]\n  return %b",
     "@f: op #1 aten.relu (%b): operand 0 (%a) is defined on stream 1 at op #0 and used on stream 0 with no wait on "
     "an event recorded after its definition"),
    # the event is recorded on stream 1 BEFORE the definition: waiting on it orders nothing about %a
    ("  %e = stream.record() {stream = 1} : () -> event\n"
     "  %a = aten.neg(%x) {stream = 1} : (f32[4, 16]) -> f32[4, 16]\n"
     "  stream.wait(%e) {stream = 0} : (event) -> ()\n"
     "  %b = aten.relu(%a) : (f32[4, 16]) -> f32[4, 16]\n  return %b",
     "@f: op #3 aten.relu (%b): operand 0 (%a) is defined on stream 1 at op #1 and used on stream 0 with no wait"),
    # a side stream's result returned without stream 0 ever joining it
    ("  %a = aten.neg(%x) {stream = 1} : (f32[4, 16]) -> f32[4, 16]\n  return %a",
     "@f: return value 0 (%a) is defined on stream 1 at op #0 and stream 0 never waits for it"),
])
def test_unordered_cross_stream_uses_are_refused(body, message):
    errors = verify_errors(parse_module(_HEAD + body + "\n}\n"))
    assert errors and message in errors[0], errors


_REUSE = ('module {memory.f.binding = ""}\n\n'
          "func @f(%x: f32[4, 16]) -> (f32[4, 16]) {\n"
          "  %a {arena_offset = 0} = aten.neg(%x) : (f32[4, 16]) -> f32[4, 16]\n"
          "  %e0 = stream.record() {stream = 0} : () -> event\n"
          "  stream.wait(%e0) {stream = 1} : (event) -> ()\n"
          "  %k {arena_offset = 256} = aten.relu(%a) {stream = 1} : (f32[4, 16]) -> f32[4, 16]\n"
          "  %e1 = stream.record() {stream = 1} : () -> event\n"
          "%JOIN"
          "  %g {arena_offset = 0} = aten.neg(%x) : (f32[4, 16]) -> f32[4, 16]\n"
          "%LATE"
          "  %h = aten.add(%g, %k) : (f32[4, 16], f32[4, 16]) -> f32[4, 16]\n"
          "  return %h\n}\n")
_WAIT = "  stream.wait(%e1) {stream = 0} : (event) -> ()\n"


def test_arena_bytes_reused_before_the_reading_stream_joined_are_refused():
    # %g takes %a's bytes [0, 256); stream 1 reads %a (into %k) and is joined only after %g
    early = parse_module(_REUSE.replace("%JOIN", "").replace("%LATE", _WAIT))
    errors = verify_errors(early)
    assert errors and ("@f: op #5 aten.neg (%g): result %g at arena bytes [0, 256) reuses bytes of %a (op #0, bytes "
                       "[0, 256)), which may still be read until op #5: no stream that reads it has joined") in errors[0]
    assert verify_errors(parse_module(_REUSE.replace("%JOIN", _WAIT).replace("%LATE", ""))) == []


@pytest.fixture
def writer_op():
    """A registered op that writes its first operand in place (as a cache append does)."""
    from dsv41c.ir.registry import _REGISTRY, register

    def impl(a):
        a.buf.add_(a.x)

    register("test.accumulate_(Tensor buf, Tensor x) -> ()", shape=lambda a: (), impl=impl, writes=("buf",))
    yield
    del _REGISTRY["test.accumulate_"]


_WRITE = ("func @f(%s: f32[4, 16] {placement = \"persistent\"}, %x: f32[4, 16]) -> (f32[4, 16]) {\n"
          "%BODY  return %r\n}\n")


@pytest.mark.parametrize("body, message", [
    # stream 1 reads %s while stream 0 overwrites it, unordered
    ("  %e = stream.record() {stream = 0} : () -> event\n  stream.wait(%e) {stream = 1} : (event) -> ()\n"
     "  %r = aten.neg(%s) {stream = 1} : (f32[4, 16]) -> f32[4, 16]\n"
     "  test.accumulate_(%s, %x) : (f32[4, 16], f32[4, 16]) -> ()\n"
     "  %j = stream.record() {stream = 1} : () -> event\n  stream.wait(%j) {stream = 0} : (event) -> ()\n",
     "@f: op #3 test.accumulate_: writes %s, which op #2 on stream 1 reads before it, with no wait on an event "
     "recorded after op #2"),
    # written on stream 1, read on stream 0 with no event after the write
    ("  test.accumulate_(%s, %x) {stream = 1} : (f32[4, 16], f32[4, 16]) -> ()\n"
     "  %r = aten.neg(%s) : (f32[4, 16]) -> f32[4, 16]\n",
     "@f: op #1 aten.neg (%r): reads %s, which op #0 on stream 1 writes in place before it"),
])
def test_in_place_writes_unordered_with_another_streams_access_are_refused(writer_op, body, message):
    errors = verify_errors(parse_module(_WRITE.replace("%BODY", body)))
    assert errors and message in errors[0], errors


def test_the_pass_orders_in_place_writes_it_splits(writer_op):
    # the write goes with the KV path (it reads the layer's wkv); the Q path's read of the state must
    # come after it: schedule-streams adds the event, the verifier accepts, and interleavings agree
    text = ("func @f(%x: f32[4, 16], %layers.0.attn.wq_a.weight: f32[16, 16], %layers.0.attn.wkv.weight: "
            "f32[16, 16], %state.kv: f32[4, 16] {placement = \"persistent\"}) -> (f32[4, 16]) {\n"
            "  %kv = aten.mm(%x, %layers.0.attn.wkv.weight) : (f32[4, 16], f32[16, 16]) -> f32[4, 16] "
            "loc(\"layers.0.attn\")\n"
            "  test.accumulate_(%state.kv, %kv) : (f32[4, 16], f32[4, 16]) -> () loc(\"layers.0.attn\")\n"
            "  %q = aten.mm(%x, %layers.0.attn.wq_a.weight) : (f32[4, 16], f32[16, 16]) -> f32[4, 16] "
            "loc(\"layers.0.attn\")\n"
            "  %o = aten.add(%q, %state.kv) : (f32[4, 16], f32[4, 16]) -> f32[4, 16] loc(\"layers.0.attn\")\n"
            "  return %o\n}\n")
    before = parse_module(text)
    m = parse_module(text)
    make_pass("schedule-streams").run(m)
    f = m.functions["f"]
    assert [op.attrs.get("stream", 0) for op in f.ops if not op.name.startswith("stream.")] == [1, 1, 0, 0]
    assert verify_errors(m) == []
    ins = [torch.randn(4, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(4, 16)]
    want = interpret(before, "f", [x.clone() for x in ins])[0]
    for seed in range(ORDERS):
        assert torch.equal(interpret(m, "f", [x.clone() for x in ins], order=random_order(f, seed))[0], want)


def _golden():
    return parse_module(open("tests/golden/schedule-streams.ir").read())


def test_stats_report_the_serial_and_the_scheduled_time_per_layer():
    from dsv41c.passes.stream_cost import LAUNCH_S, stream_report

    m = _golden()
    stats = make_pass("schedule-streams").run(m).stats
    assert stats["serial-ns:decode:layer0"] > stats["streams-ns:decode:layer0"] > 0
    # the events' ops counted on their streams; layer 0's KV norm, wkv, mul and cat on stream 1 run beside
    # its wq_a and mul on stream 0
    rep = stream_report(m)["decode"]
    assert rep["ops_per_stream"] == {"0": 9, "1": 6, "2": 2} and rep["events"] == 3
    lay = rep["layers"][0]
    assert lay["serial_us"] == pytest.approx(stats["serial-ns:decode:layer0"] / 1000, abs=1e-3)
    assert lay["streams_us"] >= lay["work_bound_us"] and lay["critical_path_us"] <= lay["serial_us"]
    assert lay["serial_us"] - lay["streams_us"] >= LAUNCH_S * 1e6 - 1e-3  # a launch hidden at least


def test_kill_switch_leaves_one_stream():
    res = PassManager([make_pass("schedule-streams")], env={"DSV41C_DISABLE_SCHEDULE_STREAMS": "1"}).run(_golden())
    assert res.records[0].disabled
    assert not any("stream" in op.attrs or op.name.startswith("stream.") for op in res.module.ops())


def test_the_plan_lowers_with_streams_and_runs_serially():
    from dsv41c.codegen.cpu import lower_function
    from dsv41c.runtime.executor import Function

    m = _golden()
    make_pass("schedule-streams").run(m)
    spec = json.loads(json.dumps(lower_function(m.functions["decode"], ["p", "win"], {})))
    assert spec["streams"] == [0, 1, 2]
    steps = spec["ops"]
    assert all("stream" in s for s in steps)
    rec = [s for s in steps if s["target"] == "rt.record"]
    wait = [s for s in steps if s["target"] == "rt.wait"]
    assert len(rec) == len(wait) == 3 and {s["stream"] for s in rec} == {0, 1, 2}
    assert all(w["args"][0]["v"] in {r["out"][0] for r in rec} for w in wait)
    ins = [torch.randn(3, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(16), torch.randn(16, 16),
           torch.randn(4, 16)]
    got = Function("decode", spec).run(ins)
    want = interpret(_golden(), "decode", ins)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_gpu_targets_schedule_and_the_cpu_target_stays_serial():
    assert "schedule-streams" not in pipeline_specs("cpu")
    assert "schedule-streams" not in pipeline_specs("ascend:a3")
    for t in ("cuda:sm90", "rocm:gfx942"):
        specs = [s.split("{")[0] for s in pipeline_specs(t)]
        assert specs.index("specialize-kernels") < specs.index("schedule-streams") < specs.index("plan-memory")
