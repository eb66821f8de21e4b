"""The read-floor benchmark's host side and its read kernel (benchmarks/read_floor.py), on the CPU.

The GPU measurement itself runs on the device machine (benchmarks/run_h200.sh STEPS=read_floor); here:
which rows of a kernel-benchmark JSON count as decode cases, that every configuration covers the buffer,
and that the read kernel (in Triton's interpreter) reads every element exactly once."""
import json

import pytest
import torch

from benchmarks import read_floor as rf


def _doc(tmp_path, rows, launch=0.001):
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"ceilings": {"copy_TBps": 4.0, "launch_floor_ms": launch}, "results": rows}))
    return str(p)


def test_decode_cases_keep_bytes_floors_not_below_the_launch_floor(tmp_path):
    rows = [
        {"name": "big", "goal": "decode <= 2x bytes floor", "bytes": 8e6, "floor_ms": 0.002, "graph_cold_ms": 0.005},
        {"name": "near", "goal": "decode <= 2x bytes floor", "bytes": 3.9e6, "floor_ms": 0.00096},  # within 5 %
        {"name": "tiny", "goal": "decode <= 2x bytes floor", "bytes": 1e3, "floor_ms": 0.0009},  # launch-bound
        {"name": "prefill", "bytes": 8e8, "floor_ms": 0.2},  # no decode goal
        {"name": "flops", "goal": "decode <= 2x bytes floor", "bytes": 4e6, "floor_ms": 0.008},
        {"name": "failed", "error": "boom"},
    ]
    cases = rf.decode_cases([_doc(tmp_path, rows)])
    assert [c["name"] for c in cases] == ["big", "near", "flops"]
    kinds = {c["name"]: c["floor_kind"] for c in cases}
    assert kinds == {"big": "bytes", "near": "bytes", "flops": "flops"}  # 4e6 B at 4 TB/s is 1 µs, not 8


@pytest.mark.parametrize("sweep", ["default", "wide"])
@pytest.mark.parametrize("n", [1, 1000, 1_643_200, 226_046_400])
def test_every_config_covers_the_buffer_once(n, sweep):
    cfgs = rf._configs(n, 132, sweep)
    assert cfgs and max(g for _, g, *_ in cfgs) <= max(rf.SWEEPS[sweep][0]) * 132  # the output buffer's size
    for name, grid, chunk, block, unroll, nw in cfgs:
        assert grid * chunk >= n > (grid - 1) * chunk, name  # no program past the end, none missing
        assert chunk % 16 == 0 and block in (512, 1024, 2048, 4096) and nw in (4, 8), name


def test_a_json_that_is_not_a_kernel_benchmark_is_named(tmp_path):
    p = tmp_path / "tune.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="tune.json is not a kernel benchmark JSON"):
        rf.decode_cases([str(p)])


def test_read_kernel_sums_every_element_once():
    n = 5000
    buf = torch.arange(n, dtype=torch.int32)
    for name, grid, chunk, block, unroll, nw in rf._configs(n, 2)[:4]:
        out = torch.zeros(grid, dtype=torch.int32)
        rf._read_kernel[(grid,)](buf, out, n, CHUNK=chunk, BLOCK=block, UNROLL=unroll, num_warps=nw)
        assert int(out.sum()) == n * (n - 1) // 2, name


def test_kernels_table_shows_the_read_floor_column(tmp_path):
    from benchmarks import kernels_table as kt

    row = {"name": "lin_M1", "triton_ms": 0.01, "floor_ms": 0.0015, "best_over_floor": 3.8, "rel_err": 1e-3,
           "goal": "decode <= 2x bytes floor", "goal_met": False, "launch_bound": False}
    p = _doc(tmp_path, [row])
    plain = kt.render(p)
    assert "read floor" not in plain and "read-bound" not in plain
    read = {"lin_M1": {"read_floor_ms": 0.0042, "read_bound": True}}
    table = kt.render(p, read).splitlines()
    head, sep, line = table[2], table[3], table[4]
    assert "| read floor ms |" in head and head.count("|") == sep.count("|") == line.count("|")
    assert "| 0.0042 |" in line and line.endswith("✘ (read-bound) |")
    both = kt.render(_doc(tmp_path, [{**row, "launch_bound": True}]), read).splitlines()[4]
    assert both.endswith("✘ (launch-bound, read-bound) |")  # both said, neither hidden


def test_kernels_table_floors_a_cold_row_without_a_verdict_by_its_better_time(tmp_path):
    from benchmarks import kernels_table as kt

    # timed cold but given no decode verdict (no best_over_floor): the better of do_bench and the cold replay
    row = {"name": "worst_case", "triton_ms": 0.075, "graph_ms": 0.0218, "graph_cold_ms": 0.025, "floor_ms": 0.0025,
           "triton_over_floor": 30.0, "rel_err": 0.0}
    line = kt.render(_doc(tmp_path, [row])).splitlines()[4]
    assert "| 10.00 |" in line and "30.00" not in line
    verdict = {**row, "best_over_floor": 7.0}  # a row with a verdict keeps its own ratio
    assert "| 7.00 |" in kt.render(_doc(tmp_path, [verdict])).splitlines()[4]


def test_refloor_uses_twice_the_bf16_rate_for_int8_and_redoes_the_decode_verdict():
    from benchmarks.floors import floor_ms, int8_rate, refloor

    ceil = {"copy_TBps": 4.0, "bf16_TFLOPs": 700.0, "int8_TOPs": 128.0, "launch_floor_ms": 0.001}
    assert int8_rate(ceil) == 1400.0 and int8_rate({**ceil, "int8_TOPs": 2000.0}) == 2000.0
    # 8 MB and 1 GOP of int8: 2 µs of bytes; 7.8 µs of FLOPs at 128 TOP/s, 0.71 µs at 1400
    row = {"name": "idx", "bytes": 8e6, "flops": 1e9, "flop_kind": "int8", "floor_ms": 1e9 / 128e12 * 1e3,
           "triton_ms": 0.02, "graph_ms": 0.012, "graph_cold_ms": 0.014, "goal": "decode <= 2x bytes floor",
           "goal_met": True, "best_over_floor": 1.79, "launch_bound": False}
    new = refloor(row, ceil)
    assert new["floor_ms"] == floor_ms(ceil, 8e6, 1e9, "int8")[0] == 8e6 / 4e12 * 1e3
    assert new["refloored_from"] == row["floor_ms"] and new["goal_met"] is False
    assert abs(new["best_over_floor"] - 0.014 / 0.002) < 1e-9
    eager = {**row, "goal": ">= 5x eager", "goal_met": True}
    assert refloor(eager, ceil)["goal_met"] is True  # a goal that is not the floor's keeps its verdict
    same = {**row, "flop_kind": "bf16", "floor_ms": max(8e6 / 4e12, 1e9 / 700e12) * 1e3}
    assert refloor(same, ceil) is same  # nothing to redo


def test_rederive_keeps_the_measured_read_floors(tmp_path):
    ceil = {"copy_TBps": 4.0, "bf16_TFLOPs": 700.0, "int8_TOPs": 128.0, "launch_floor_ms": 0.001}
    row = {"name": "idx", "bytes": 8e6, "flops": 1e9, "flop_kind": "int8", "floor_ms": 1e9 / 128e12 * 1e3,
           "triton_ms": 0.02, "graph_cold_ms": 0.014, "goal": "decode <= 2x bytes floor", "goal_met": True}
    k = tmp_path / "k.json"
    k.write_text(json.dumps({"ceilings": ceil, "results": [row]}))
    rfj = tmp_path / "rf.json"
    rfj.write_text(json.dumps({"cases": [{"name": "idx", "read_floor_ms": 0.0045, "read_bound": False,
                                          "budget_ms": 0.0156, "read_config": "p4"}]}))
    doc = rf.rederive(str(rfj), [str(k)])
    c = doc["cases"][0]
    assert c["read_floor_ms"] == 0.0045 and c["read_config"] == "p4"  # measured: kept
    assert c["budget_ms"] == 2 * 0.002 and c["read_bound"] is True and c["goal_met"] is False
    assert doc["rederived"][0]["why"].startswith("floors and verdicts")
