"""plan-chunks: the largest prefill chunk whose weights + state + arena fit the budget; the refusals
with their figures; the chunk reaches plan-memory; `dsv41c compile --memory-budget`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from dsv41c.ir.parser import parse_module
from dsv41c.passes.base import PassError
from dsv41c.passes.manager import PassManager
from dsv41c.passes.plan_chunks import chunk_table
from dsv41c.passes.registry import make_pass, parse_pipeline

GOLDEN = Path(__file__).parent / "golden" / "plan-chunks.ir"
WEIGHTS, STATE = 64 * 64 * 4, 128 * 64 * 4


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: torch's thread start-up costs more than it saves (and the cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _golden():
    return parse_module(GOLDEN.read_text(), str(GOLDEN))


def test_the_largest_chunk_that_fits_is_chosen_with_its_table():
    m = _golden()
    res = make_pass("plan-chunks", budget=100000).run(m)
    s = res.stats
    assert res.changed and s["chunk"] == 64 and m.attrs["chunk"] == 64 and m.attrs["memory.bind.prefill"] == "T=64"
    assert (s["weights-bytes"], s["state-bytes"], s["decode-arena-bytes"]) == (WEIGHTS, STATE, 512)
    table = chunk_table(s)
    assert [r["chunk"] for r in table] == [16, 32, 64, 128, 256, 512, 1024]  # up to the module's max_context
    for r in table:  # %a and %b live together: 2 x T x 256 bytes
        assert r["arena_bytes"] == 512 * r["chunk"] and r["total_bytes"] == WEIGHTS + STATE + 512 * r["chunk"]
    assert s["total-bytes"] == 81920 and s["headroom-bytes"] == 100000 - 81920
    # the weights are read once a chunk: bytes per prompt token fall as 1/chunk
    assert table[0]["weight_bytes_per_token"] == WEIGHTS / 16 and table[-1]["weight_bytes_per_token"] == WEIGHTS / 1024


def test_plan_memory_places_the_arena_at_the_chosen_chunk():
    m = PassManager(parse_pipeline("plan-chunks{budget=100000},plan-memory")).run(_golden()).module
    assert m.attrs["memory.prefill.binding"] == "T=64" and m.attrs["memory.prefill.arena_bytes"] == 512 * 64


@pytest.mark.parametrize("budget, message", [
    (40000, r"the budget 0.00 GiB \(40000 bytes\) cannot hold the weights 0.00 GiB \(16384 bytes\) \+ the persistent "
            r"state 0.00 GiB \(32768 bytes\) \+ the decode arena 0.00 GiB \(512 bytes\) = 0.00 GiB \(49664 bytes\)"),
    (50000, r"cannot hold even a chunk of 16: weights .*\(16384 bytes\) \+ state .*\(32768 bytes\) \+ arena "
            r".*\(8192 bytes\) = .*\(57344 bytes\)"),
])
def test_a_budget_too_small_is_refused_with_the_figures(budget, message):
    with pytest.raises(PassError, match=message):
        make_pass("plan-chunks", budget=budget).run(_golden())


def test_no_budget_keeps_the_chunk_and_the_kill_switch_skips():
    m = _golden()
    res = make_pass("plan-chunks").run(m)
    assert not res.changed and "chunk" not in m.attrs and res.stats["weights-bytes"] == WEIGHTS
    res = PassManager([make_pass("plan-chunks", budget=100000)], env={"DSV41C_DISABLE_PLAN_CHUNKS": "1"}).run(_golden())
    assert res.records[0].disabled and "chunk" not in res.module.attrs


def test_compile_with_a_memory_budget(tmp_path):
    from dsv41c.cli import main
    from dsv41c.runtime.commands import describe

    out = tmp_path / "t.dsv41c"
    budget = 5_800_000  # tiny at a context of 256: weights 4.8 MB, state 0.4 MB, the arena 0.4-1.2 MB by chunk
    assert main(["compile", "--preset", "tiny", "--kv-quant", "off", "--max-context", "256", "--memory-budget",
                 f"{budget}B", "-o", str(out)]) == 0
    rep = json.load(open(os.path.join(out, "reports", "chunks.json")))
    d = describe(str(out))
    chunk = rep["chunk"]
    assert d["options"]["chunk"] == chunk and d["options"]["memory_budget"] == budget
    assert [r["chunk"] for r in rep["table"]] == [16, 32, 64, 128, 256]  # up to --max-context
    fits = [r["chunk"] for r in rep["table"] if r["total_bytes"] <= budget]
    assert chunk == max(fits) and rep["total_bytes"] <= budget < rep["table"][-1]["total_bytes"]
    arena = d["arena"]["prefill"]
    assert arena["chunk"] == chunk and arena["bytes"] == rep["arena_bytes"]  # plan-memory planned at that chunk
    plan = json.load(open(os.path.join(out, "reports", "memory.json")))["functions"]["prefill"]["binding"]
    assert plan["T"] == chunk and all(v == chunk // 2 for k, v in plan.items() if k.startswith("n"))  # ratio-2 rows
