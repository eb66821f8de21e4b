"""The one generated table of docs/KERNELS.md (benchmarks/kernels_table.py --combined), on the CPU.

Each kernel row beside its eager reference, torch.compile of that reference and its floor: the torch.compile
figure and ratio come from compiled_baseline.py's JSON where it has the case (both sides from one run), else from
the kernel JSON's own do_bench of the compiled reference, marked; sweep rows (no reference) are left out."""
import json

from benchmarks import kernels_table as kt


def _write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def test_combined_table_takes_torch_compile_from_the_baseline_run(tmp_path):
    ceil = {"copy_TBps": 4.0, "bf16_TFLOPs": 700.0, "launch_floor_ms": 0.001}
    rows = [
        {"name": "lin_M1", "triton_ms": 0.03, "graph_cold_ms": 0.006, "eager_ms": 0.12, "speedup_vs_eager": 4.0,
         "floor_ms": 0.0015, "best_over_floor": 4.0, "rel_err": 1e-3, "goal": "decode <= 2x bytes floor",
         "goal_met": False, "launch_bound": False},
        {"name": "norm_T8192", "triton_ms": 0.05, "eager_ms": 0.5, "speedup_vs_eager": 10.0, "compiled_ms": 0.06,
         "floor_ms": 0.04, "rel_err": 0.0},
        {"name": "score_S1_bt128", "triton_ms": 0.07, "graph_cold_ms": 0.0115, "eager_ms": 16.0,
         "speedup_vs_eager": 233.0, "floor_ms": 0.0022, "rel_err": 0.0},
        {"name": "score_S1_sweep", "triton_ms": 0.009, "eager_ms": None, "floor_ms": 0.0022},
        {"name": "broken", "error": "boom"},
    ]
    k = _write(tmp_path, "k.json", {"env": {"gpu": "G"}, "ceilings": ceil, "results": rows})
    comp = _write(tmp_path, "c.json", {"kind": "compiled_baseline", "env": {"gpu": "G"}, "results": [
        {"name": "lin_M1", "ours_vs_compiled": 3.15, "ratio_basis": "graph_cold", "compiled_graph_cold_ms": 0.0191,
         "compiled_ms": 0.05},
        {"name": "score_S1", "ours_vs_compiled": 14.87, "ratio_basis": "graph_cold", "compiled_graph_cold_ms": 0.1723},
    ]})
    read = {"lin_M1": {"read_floor_ms": 0.0043}}
    out = kt.render_combined([k, comp], read).splitlines()
    table = [ln for ln in out if ln.startswith("| ")]
    head, body = table[0], table[1:]
    assert "| torch.compile ms | × torch.compile |" in head and "| × eager |" in head
    by = {ln.split(" | ")[0][2:]: ln for ln in body}
    assert set(by) == {"lin_M1", "norm_T8192", "score_S1_bt128", "broken"}  # the sweep row is left out
    assert "| 0.0191 | 3.15× |" in by["lin_M1"] and "| 0.0043 |" in by["lin_M1"]
    assert by["lin_M1"].endswith("✘ (read-bound) |")  # 4.3 µs to read the bytes against a 3 µs budget
    assert "| 0.0600 | 1.20× ᵈ |" in by["norm_T8192"]  # the kernel JSON's own do_bench of torch.compile
    assert "| 0.1723 | 14.87× |" in by["score_S1_bt128"]  # the baseline's name has no `_bt128`
    assert "FAILED: boom" in by["broken"]
    assert all(ln.count("|") == head.count("|") for ln in body)
