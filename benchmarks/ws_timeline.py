"""Where a program of the warp-specialized decode attention spends its time: a per-program timeline from clock stamps.

`sparse_attention_ws` compiled with STAMPS writes the SM clock at fixed points of each program into a [programs, 64]
int64 buffer (slot map below) and the global nanosecond timer at the consumers' start and end; this script runs the
64-query decode batch of `benchmarks/kernels_attention.py` (FP8 window + FP4 compressed KV), warm and after an L2
flush, and prints, per split, the median time of each event since the consumers' start (µs, the clock's rate taken
from the two timers), plus the spread of the programs' start and end times across the grid.

Slots: consumers 0 start (after the PDL wait), 1 q staged in shared memory, 2 + 3i block i ready, 3 + 3i its q·K^T
done, 4 + 3i its P·V done, 40 the loop done, 41 the partials stored; producer 44 + 2i tile free for block i, 45 + 2i
block i decoded and signalled; 62 / 63 the global timer at the consumers' start / end.

Variants: the shipped kernel; `decode_off` (DIAG 1: the producer gathers and decodes nothing, so the consumers set
the pace) and `mma_off` (DIAG 2: no MMA, so the producer sets it); their outputs are wrong by design.

The stamps cost the producer a few registers (triton 3.6 ptxas: 32 bytes of spills), so the stamped launch runs a
little slower than the plain one (~1-2 µs); the script times both. Run on a CUDA sm90 GPU:
`python benchmarks/ws_timeline.py --out benchmarks/results/ws_timeline.json`. What it found is in the docstring of
codegen/triton/sparse_attention_ws.py.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SLOTS = 64
# (name, ws_cfg): the launch's knobs (sparse_attention_ws.launch_ws keywords)
VARIANTS = (("default", {}), ("decode_off", {"diag": 1}), ("mma_off", {"diag": 2}))


def summarize(runs, S, n_split):
    """runs: list of [S * n_split, 64] int64 CPU tensors (one launch each)."""
    import torch

    x = torch.stack(runs).to(torch.float64)  # [R, P, 64]
    rate = (x[..., 41] - x[..., 0]) / (x[..., 63] - x[..., 62]).clamp(min=1)  # clock ticks a ns
    ghz = float(rate.median())
    rel = (x - x[..., :1]) / ghz / 1e3  # µs since the consumers' start (clock slots only)
    g0 = x[..., 62].min(dim=1, keepdim=True).values
    starts = (x[..., 62] - g0) / 1e3
    ends = (x[..., 63] - g0) / 1e3
    names = {1: "q staged"}
    for i in range(12):
        names.update({2 + 3 * i: f"blk{i} ready", 3 + 3 * i: f"blk{i} qk", 4 + 3 * i: f"blk{i} pv"})
    names.update({40: "loop done", 41: "partials stored"})
    for i in range(8):
        names.update({44 + 2 * i: f"P blk{i} tile free", 45 + 2 * i: f"P blk{i} signalled"})
    out = {"clock_GHz": ghz, "splits": []}
    for sp in range(n_split):
        sel = rel[:, sp::n_split]
        raw = x[:, sp::n_split]
        ev = {}
        for slot, name in names.items():
            v = raw[..., slot]
            if bool((v > 0).all()):
                ev[name] = round(float(sel[..., slot].median()), 3)
        out["splits"].append({
            "split": sp, "events_us": ev,
            "start_us": {"min": round(float(starts[:, sp::n_split].min()), 3),
                         "median": round(float(starts[:, sp::n_split].median()), 3),
                         "max": round(float(starts[:, sp::n_split].max()), 3)},
            "end_us": {"median": round(float(ends[:, sp::n_split].median()), 3),
                       "max": round(float(ends[:, sp::n_split].max()), 3)}})
    out["grid_span_us"] = round(float((ends.max(dim=1).values).median()), 3)
    return out


def run(args):
    import torch

    from benchmarks.common import _flush_buffer, env_info, ms_graph
    from benchmarks.kernels_attention import _attn_data, rope_table
    from dsv41c.codegen.triton import sparse_attention as sa

    S = 64
    cos, sin = rope_table(1 << 16)
    q, qpos, wkv, ckv, idx, sink, kw = _attn_data(S, True, batched=True)
    ref = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)
    stamps = torch.zeros((S * 16, SLOTS), dtype=torch.int64, device=q.device)
    buf = _flush_buffer()
    doc = {"kind": "ws_timeline", "env": env_info(), "S": S, "variants": []}
    for name, cfg in VARIANTS:
        if args.only and not re.search(args.only, name):
            continue
        rec = {"variant": name, "cfg": cfg}
        f = lambda st=None, cfg=cfg: sa.sparse_attention(  # noqa: E731
            q, qpos, wkv, ckv, idx, sink, cos, sin, ws=True, ws_cfg={**cfg, **({} if st is None else {"stamps": st})}, **kw)
        o = f(stamps)
        if "diag" not in cfg:
            rec["max_abs_vs_ref"] = float((o.float() - ref.float()).abs().max())
        n_split = int((stamps[:, 63] > 0).sum()) // S
        rec["n_split"] = n_split
        for cold in (False, True):
            runs = []
            for _ in range(args.reps):
                stamps.zero_()
                if cold:
                    buf.sum()
                f(stamps)
                torch.cuda.synchronize()
                runs.append(stamps[: S * n_split].cpu())
            rec["cold" if cold else "warm"] = summarize(runs, S, n_split)
        t_plain = ms_graph(f)
        t_st = ms_graph(lambda: f(stamps))
        rec["graph_ms"], rec["graph_cold_ms"] = float(t_plain), getattr(t_plain, "cold", None)
        rec["stamped_graph_ms"], rec["stamped_graph_cold_ms"] = float(t_st), getattr(t_st, "cold", None)
        doc["variants"].append(rec)
        print(f"== {name}: plain {rec['graph_ms'] * 1e3:.1f} / cold {(rec['graph_cold_ms'] or 0) * 1e3:.1f} µs, "
              f"stamped {rec['stamped_graph_ms'] * 1e3:.1f} / cold {(rec['stamped_graph_cold_ms'] or 0) * 1e3:.1f} µs",
              flush=True)
        for mode in ("warm", "cold"):
            sm = rec[mode]
            print(f"  {mode}: clock {sm['clock_GHz']:.2f} GHz, grid span {sm['grid_span_us']} µs")
            for sp in sm["splits"]:
                print(f"   split {sp['split']}: start {sp['start_us']}, end {sp['end_us']}")
                print("    " + ", ".join(f"{k} {v}" for k, v in sp["events_us"].items()))
    return doc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="launches summarized a mode (default 20)")
    ap.add_argument("--only", help="only the variants whose name matches this regex")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    doc = run(args)
    if args.out:
        from benchmarks.common import write_json
        write_json(args.out, doc)


if __name__ == "__main__":
    main()
