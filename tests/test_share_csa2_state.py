"""share-csa2-state: the CSA2 producers counted against the layer plan, duplicates merged, the answer kept."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv41c.frontend.config import preset
from dsv41c.ir.core import Op
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.types import EVENT
from dsv41c.ir.verifier import verify
from dsv41c.passes.base import PassError
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import make_pass


@pytest.fixture(scope="module")
def tiny():
    from csa2_helpers import traced

    return traced("tiny")


def _inputs(m, fname, cfg, sd, ids):
    from dsv41c.frontend.step import new_state

    st = new_state(cfg)
    return {a.name: ids if a.name == "ids" else st[a.name] if a.name.startswith("state.") else sd[a.name]
            for a in m.functions[fname].args}


def _recompute_topk(m, src: int, dst: int, mutate=None):
    """Layer `dst` (a Reuse layer) recomputes the index scores and top-k of its source layer `src` behind a stream
    event, and its attention reads that copy: the duplicate a careless lowering or a segment stamped twice makes."""
    f = m.functions["decode"]
    seg = [op for op in f.ops if (op.loc or "").startswith(f"layers.{src}.attn.indexer")]
    at = next(i for i, op in enumerate(f.ops) if (op.loc or "").startswith(f"layers.{dst}.attn"))
    remap, copies = {}, [Op("stream.record", [], [EVENT], {"stream": 0}, f"layers.{dst}.attn")]
    for op in seg:
        c = Op(op.name, [remap.get(id(v), v) for v in op.operands], [r.type for r in op.results], dict(op.attrs),
               op.loc.replace(f"layers.{src}.", f"layers.{dst}."))
        if mutate is not None:
            mutate(c)
        remap.update({id(r): cr for r, cr in zip(op.results, c.results)})
        copies.append(c)
    f.ops[at:at] = copies
    topk = next(op for op in seg if op.name == "dsv41.select_topk").results[0]
    for op in f.ops[at + len(copies):]:
        if (op.loc or "").startswith(f"layers.{dst}."):
            op.operands = [remap.get(id(v), v) if v is topk else v for v in op.operands]
    return m


def test_the_full_plans_producers_one_per_group(tiny):
    res = PassManager([make_pass("share-csa2-state")]).run(tiny.clone())
    st = res.records[0].stats
    assert not res.records[0].changed and st["plan_checked"] == 1
    for fn in ("prefill", "decode"):
        assert (st[f"compressors.ratio2:{fn}"], st[f"compressors.ratio1:{fn}"]) == (3, 1)
        assert (st[f"index_key_producers:{fn}"], st[f"index_scorers:{fn}"], st[f"topk_producers:{fn}"],
                st[f"candidate_producers:{fn}"]) == (4, 8, 8, 1)
        assert st[f"duplicates_found:{fn}"] == st[f"duplicates_removed:{fn}"] == 0


def test_a_reuse_layer_recomputing_its_top_k_is_merged_and_the_answer_kept():
    from csa2_helpers import traced, weights

    cfg = preset("mini")  # layer 9 reuses the top-k of the re-indexing layer 8
    m = _recompute_topk(traced("mini"), 8, 9)
    verify(m)
    # cse does not look across the stream event; the plan check alone would refuse the extra scorer
    assert sum(op.name == "dsv41.index_scores" for op in make_pass("cse").run(m.clone()).module.functions["decode"]
               .ops) == 5
    before = m.clone()
    res = PassManager([make_pass("share-csa2-state")]).run(m)
    verify(res.module)
    st = res.records[0].stats
    assert res.records[0].changed
    assert st["duplicates_found:decode"] == st["duplicates_removed:decode"] == 2
    assert st["duplicates.scorers:decode"] == st["duplicates.topk:decode"] == 1
    assert st["index_scorers:decode"] == 4 and not any(
        (op.loc or "").startswith("layers.9.attn.indexer") for op in res.module.functions["decode"].ops)
    sd = weights("mini", 2)
    ids = torch.tensor([7])
    want = interpret(before, "decode", _inputs(before, "decode", cfg, sd, ids))
    got = interpret(res.module, "decode", _inputs(res.module, "decode", cfg, sd, ids))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_a_recomputation_that_differs_is_not_merged_and_the_plan_refuses_it(tiny):
    def other_ratio(op):  # not the same state: the entries' visibility differs
        if op.name == "dsv41.index_scores":
            op.attrs = {**op.attrs, "ratio": 2}

    m = _recompute_topk(tiny.clone(), 24, 25, other_ratio)
    with pytest.raises(PassError, match=r"@decode: group 20, layer 25 \(reuse\): has 1 indexer-query scorer, "
                                        r"the layer plan gives it none"):
        make_pass("share-csa2-state").run(m)


@pytest.mark.parametrize("old, new, message", [
    ("index_source_layer_ids=2,8,14,20,24,28,32,36", "index_source_layer_ids=2,8,14,20,24,26,28,32,36",
     r"group 20, layer 26 \(reindex\): has no indexer-query scorer; the layer plan gives it one"),
    ("kv_source_layer_ids=2,8,14,20", "kv_source_layer_ids=2,8,20",
     r"group 8, layer 14 \(reindex\): has 1 compressor, the layer plan gives it none"),
    ("num_hidden_layers=40", "num_hidden_layers=4x", r"the module's layer_plan attribute: num_hidden_layers must be "
                                                     r"integers, got '4x'"),
])
def test_a_plan_the_ir_does_not_follow_is_an_error_naming_group_and_layer(tiny, old, new, message):
    m = tiny.clone()
    assert old in m.attrs["layer_plan"]
    m.attrs = {**m.attrs, "layer_plan": m.attrs["layer_plan"].replace(old, new)}
    with pytest.raises(PassError, match=message):
        make_pass("share-csa2-state").run(m)


def test_the_kill_switch_leaves_the_duplicate(tiny, monkeypatch):
    monkeypatch.setenv("DSV41C_DISABLE_SHARE_CSA2_STATE", "1")
    m = _recompute_topk(tiny.clone(), 24, 25)
    res = PassManager([make_pass("share-csa2-state")]).run(m)
    assert res.records[0].disabled
    assert sum(op.name == "dsv41.index_scores" for op in res.module.functions["decode"].ops) == 9


def test_inspect_json_shows_the_producers_per_function(tiny_off):
    from dsv41c.runtime.commands import describe

    for fn in ("prefill", "decode"):
        c = describe(tiny_off)["functions"][fn]["csa2"]
        assert (c["compressors.ratio2"], c["compressors.ratio1"], c["index_key_producers"], c["index_scorers"],
                c["topk_producers"], c["candidate_producers"], c["duplicates_removed"]) == (3, 1, 4, 8, 8, 1, 0)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 100_000))
def test_random_csa2_modules_keep_their_values(seed):
    from dsv41c.ir.testing import random_inputs, same_outputs
    from dsv41c.ir.testing_csa2 import random_csa2_module

    m = random_csa2_module(seed)
    out = make_pass("share-csa2-state").run(m.clone()).module
    verify(out)
    for s in (seed, seed + 1):
        ins = random_inputs(m, "decode", s, T=3, N1=5)
        assert same_outputs(interpret(m, "decode", ins), interpret(out, "decode", ins)), s
