"""hoist-invariants: the weight-only ops of a step run once; every later call equals a plan that runs
them every time, bit for bit; the kill switch; the executor's cache follows the weight tensors."""
import json
import os

import torch

import dsv41c
from dsv41c.ir.parser import parse_module
from dsv41c.passes.hoist_invariants import HoistInvariants
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import parse_pipeline
from dsv41c.runtime.executor import Function

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "hoist-invariants.ir")
IDS = [5, 17, 42, 7, 99, 3, 8, 9]


def _golden():
    with open(GOLDEN) as f:
        return parse_module(f.read())


def test_marks_and_stats():
    res = HoistInvariants(max_bytes=1024).run(_golden())
    ops = {op.results[0].name: op for op in res.module.functions["decode"].ops if op.results}
    assert [n for n, op in ops.items() if op.attrs.get("once")] == ["ws", "wu"]
    assert ops["ws"].results[0].attrs["placement"] == "persistent"
    assert res.stats["hoisted"] == 2 and res.stats["kept-large"] == 1 and res.stats["kept-bytes"] == 64 * 32 * 4


def test_kill_switch():
    res = PassManager(parse_pipeline("hoist-invariants"), env={"DSV41C_DISABLE_HOIST_INVARIANTS": "1"}).run(_golden())
    assert not any(op.attrs.get("once") for op in res.module.functions["decode"].ops)


def _every_time(model):
    """The same model with every `once` op run on every call (what the plan was before the pass)."""
    for fn in model.program.functions.values():
        for op in fn.ops:
            op.once = False
        fn._once_keep, fn._once_in, fn._once_cache = set(), [], None
    return model


def test_artifact_equals_the_plan_run_every_time(tiny_off):
    with open(os.path.join(tiny_off, "program.json")) as f:
        dec = json.load(f)["functions"]["decode"]["ops"]
    assert sum(1 for r in dec if r.get("once")) > 0.2 * len(dec)  # tiny decode: about a quarter of its ops
    a, b = dsv41c.load(tiny_off), _every_time(dsv41c.load(tiny_off))
    sa, sb = a.new_session(), b.new_session()
    assert torch.equal(a.prefill(sa, IDS), b.prefill(sb, IDS))
    for t in (4, 5, 6):  # the first decode fills the cache, the later ones read it
        assert torch.equal(a.decode(sa, t), b.decode(sb, t))


def test_cache_skips_the_once_ops_and_follows_the_weights():
    from dsv41c.codegen.cpu import lower_function

    m = HoistInvariants(max_bytes=1024).run(_golden()).module
    fn = Function("decode", lower_function(m.functions["decode"], ["y", "z", "state.kv"], {}))
    ran = []
    w_small, w_big = torch.randn(64), torch.randn(64, 32)
    inputs = lambda ws: [torch.tensor([3]), torch.tensor(0), torch.zeros(8, 64), ws, w_big]  # noqa: E731
    first = fn.run(inputs(w_small), observe=lambda rec, a, r: ran.append(rec["target"]))
    n_first = len(ran)
    ran.clear()
    again = fn.run(inputs(w_small), observe=lambda rec, a, r: ran.append(rec["target"]))
    assert len(ran) == n_first - 2 and "dsv41.dequant_weight.default" in ran  # %wb's stays in the step
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    other = torch.randn(64)  # other weight tensors: the once ops run again
    ran.clear()
    out = fn.run(inputs(other), observe=lambda rec, a, r: ran.append(rec["target"]))
    assert len(ran) == n_first
    torch.testing.assert_close(out[0], (other * 3.0)[None, :])
