"""benchmarks/plots.py draws docs/BENCHMARKS.md's end-to-end figure from the kept results."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plots():
    spec = importlib.util.spec_from_file_location("plots", os.path.join(ROOT, "benchmarks", "plots.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_collect_reads_the_kept_figures():
    plots = _plots()
    runs = plots._load(os.path.join(ROOT, "benchmarks", "results"))
    assert runs, "no e2e_bench_*.json kept"
    data = plots.collect(runs)
    graphed = {n for d in runs for n, s in d["systems"].items() for r in s.get("decode", []) if r.get("cuda_graph")}
    for d in runs:  # every measured decode p50 of a file appears (the last file of a case wins), except the
        for name, s in d["systems"].items():  # op-by-op figures of a system whose decode has been a CUDA graph
            for r in s.get("decode", []):
                if name not in graphed or r.get("cuda_graph"):
                    assert r["context"] in data["decode"][name]
    assert graphed and all(c in data["decode"]["dsv41c"] for c in (512, 8192, 32768))
    assert data["roofline_ms"] and all(v > 0 for v in data["roofline_ms"].values())


def test_plot_writes_a_png(tmp_path):
    plots = _plots()
    rc = plots.main(["--results", os.path.join(ROOT, "benchmarks", "results"), "--out", str(tmp_path)])
    assert rc == 0
    with open(tmp_path / "e2e_bench.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_no_results_is_one_clear_error(tmp_path, capsys):
    assert _plots().main(["--results", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "no e2e_bench_*.json" in capsys.readouterr().err


def test_a_first_call_file_is_skipped_for_prefill(tmp_path):
    plots = _plots()
    row = {"system": "x", "prefill": [{"tokens": 8, "tok_s": 1.0}], "decode": []}
    for name, note in (("a", "ttft includes the first call"), ("b", None)):
        d = {"systems": {"x": row}, "note": note} if note else {"systems": {"x": dict(row, prefill=[])}}
        (tmp_path / f"e2e_bench_{name}.json").write_text(json.dumps(d))
    assert plots.collect(plots._load(str(tmp_path)))["prefill"].get("x", {}) == {}
