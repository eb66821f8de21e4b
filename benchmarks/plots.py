"""The plots of docs/BENCHMARKS.md, from the kept results: one script, one PNG per figure.

    python3 benchmarks/plots.py [--results benchmarks/results] [--out docs/images]

`e2e_bench.png` (from every `e2e_bench_*.json` of one GPU), two panels:
- prefill: tok/s against prompt length, one line per system (a length that ran out of memory is
  marked at the bottom of the axis with an x);
- decode at batch 1: ms/token (p50) per context for each system, beside the device time of one
  profiled step and the bytes roofline (active weight bytes plus the KV read, over the measured
  copy bandwidth), on a log axis: the gap between the wall time and the device time is host work.
A case measured in several files takes the figure of the file sorted last; a file whose `note` says
its TTFT includes the first call (JIT builds) is skipped for prefill; once a system's decode has been
replayed as a CUDA graph in some file (`cuda_graph`), its op-by-op decode rows are left out.
Known gaps: only the end-to-end figure; the kernel tables of docs/KERNELS.md are text.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys


def _load(results: str) -> list:
    runs = []
    for f in sorted(glob.glob(os.path.join(results, "e2e_bench_*.json"))):
        with open(f) as fh:
            d = json.load(fh)
        d["_file"] = os.path.basename(f)
        runs.append(d)
    return runs


def collect(runs: list) -> dict:
    """-> {"prefill": {system: {T: tok/s or None}}, "decode": {system: {C: ms}}, "device_ms": {system: {C: ms}},
    "roofline_ms": {C: ms}, "gpu": name}."""
    out = {"prefill": {}, "decode": {}, "device_ms": {}, "roofline_ms": {}, "gpu": None}
    # a system whose decode has been replayed as a CUDA graph somewhere: its op-by-op figures are history
    graphed = {n for d in runs for n, s in d.get("systems", {}).items() for r in s.get("decode", [])
               if r.get("cuda_graph")}
    for d in runs:
        out["gpu"] = out["gpu"] or (d.get("hardware") or {}).get("gpu")
        first_call_inside = "first call" in (d.get("note") or "")
        for r in (d.get("decode_roofline") or {}).get("per_context", []):
            if "roofline_ms" in r:
                out["roofline_ms"][r["context"]] = r["roofline_ms"]
        for name, s in d.get("systems", {}).items():
            if not first_call_inside:
                for r in s.get("prefill", []):
                    out["prefill"].setdefault(name, {})[r["tokens"]] = r.get("tok_s")
            rows = [r for r in s.get("decode", []) if name not in graphed or r.get("cuda_graph")]
            for r in rows:
                out["decode"].setdefault(name, {})[r["context"]] = r.get("ms_p50")
            prof = s.get("profile_decode_step") or {}
            ctx = [r["context"] for r in rows if "ms_p50" in r]
            if "device_time_ms" in prof and ctx:
                out["device_ms"].setdefault(name, {})[ctx[0]] = prof["device_time_ms"]
    return out


def plot_e2e(data: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rows in sorted(data["prefill"].items()):
        ok = sorted((t, v) for t, v in rows.items() if v)
        bad = sorted(t for t, v in rows.items() if not v)
        line = a.plot([t for t, _ in ok], [v for _, v in ok], marker="o", label=name)[0] if ok else None
        if bad:
            a.scatter(bad, [1] * len(bad), marker="x", color=line.get_color() if line else "gray",
                      label=f"{name}: out of memory")
    a.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="prefill tok/s", title="cold prefill")
    lengths = sorted({t for rows in data["prefill"].values() for t in rows})
    a.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a.set_xticks(lengths, [str(t) for t in lengths])
    a.legend(fontsize=8)
    contexts = sorted({c for rows in data["decode"].values() for c in rows})
    names = sorted(data["decode"])
    bars = [(f"{n} wall p50", data["decode"][n]) for n in names]
    bars += [(f"{n} device", data["device_ms"][n]) for n in sorted(data["device_ms"])]
    bars += [("bytes roofline", data["roofline_ms"])]
    w = 0.8 / max(len(bars), 1)
    for i, (label, rows) in enumerate(bars):
        xs = [j + i * w for j, c in enumerate(contexts) if rows.get(c)]
        ys = [rows[c] for c in contexts if rows.get(c)]
        b.bar(xs, ys, width=w, label=label)
    b.set_xticks([j + 0.4 - w / 2 for j in range(len(contexts))], [str(c) for c in contexts])
    b.set(yscale="log", xlabel="context tokens", ylabel="ms per token", title="decode, batch 1")
    b.legend(fontsize=8)
    fig.suptitle(f"bench preset (official widths, 32 routed experts), {data['gpu'] or 'GPU'}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(here, "results"))
    ap.add_argument("--out", default=os.path.join(here, "..", "docs", "images"))
    args = ap.parse_args(argv)
    runs = _load(args.results)
    if not runs:
        print(f"plots: no e2e_bench_*.json in {args.results}", file=sys.stderr)
        return 2
    print(plot_e2e(collect(runs), os.path.join(args.out, "e2e_bench.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
