"""The torch.compile baseline's host side (benchmarks/compiled_baseline.py) and its table, on the CPU.

The measurement runs on the device machine (benchmarks/run_h200.sh STEPS=compiled); here: how a compiled output is
compared with the eager one (masked -inf scores, integer ids), that the case list is complete and named uniquely,
and that kernels_table.py renders the JSON with the ratio's basis and the reason a row has no CUDA graph."""
import json

import torch

from benchmarks import compiled_baseline as cb
from benchmarks import kernels_table as kt


def test_compiled_output_comparison():
    e = torch.tensor([1.0, float("-inf"), 2.0])
    assert cb._rel(e.clone(), e) == 0.0  # masked entries (-inf in both) are left out, not NaN
    assert 0 < cb._rel(torch.tensor([1.0, float("-inf"), 2.2]), e) < 0.1
    assert cb._rel(torch.tensor([1.0, 3.0, 2.0]), e) == 1.0  # finite where the eager one is masked
    assert abs(cb._rel(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3])) - 1 / 3) < 1e-6  # ids: the mismatch share
    assert cb._tensors((torch.zeros(1), [torch.ones(2)], 3)) and cb._tensors(None) == []


def test_cases_are_named_once_per_group():
    names = [n for g in ("fp8", "moe", "small") for n, _, _ in cb.GROUPS[g]()]  # attention builds CUDA tables
    assert len(names) == len(set(names)) and "fp8_gemm_swiglu_shared_w13_M8" in names and "moe_router_T1" in names
    assert set(cb.GROUPS) == {"fp8", "moe", "small", "attention"}


def test_table_renders_basis_and_capture_notes(tmp_path):
    rows = [
        {"name": "dec", "decode": True, "ours_ms": 0.05, "ours_graph_cold_ms": 0.01, "eager_ms": 0.2,
         "compiled_ms": 0.06, "compiled_graph_cold_ms": 0.03, "ratio_basis": "graph_cold", "ours_vs_compiled": 3.0,
         "ours_vs_eager": 4.0, "compile_s": 1.5, "compiled_vs_eager_rel": 0.0, "run": 1},
        {"name": "moe", "decode": True, "ours_ms": 0.1, "ours_graph_cold_ms": 0.05, "eager_ms": 5.0,
         "compiled_ms": 2.0, "compiled_graph_error": cb.NO_CAPTURE, "ratio_basis": "do_bench",
         "ours_vs_compiled": 20.0, "ours_vs_eager": 50.0, "run": 2},
        {"name": "bad", "error": "RuntimeError: boom"},
    ]
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"kind": "compiled_baseline", "env": {"gpu": "G"}, "results": rows}))
    out = kt.render(str(p))
    assert "| dec | 50.0 | 10.0 | 200.0 | 60.0 | 30.0 | 4.0× | 3.00× | 1.5 | 0.0e+00 | 1 |" in out
    assert "20.00× (do_bench)" in out and "no graph: the reference syncs with the host" in out
    assert "| bad | FAILED: RuntimeError: boom |" in out
