"""Time the indexer's selection kernels at few queries: the chunked path (one program per chunk, then
one merge program per row) against the split path (each row over ~all SMs: radix histogram levels,
gather, pairwise rank; `codegen/triton/indexer_topk.py`) in its default form (one launch with grid
barriers where the grid fits the SMs) and its six-launch form, on one GPU.

Cases, each at S = 1, 4, 8, 16, 32 rows:
- topk512: top-512 of 131,072 fp32 scores (randn, the last 1,000 not visible = -inf);
- cand2048: top-2048 of 16,384 block maxima (max over 8 of those scores), the newest visible block pinned;
and at S = 1 the adversarial rows (scores rounded to 0.1: many exact ties; one value everywhere), a
chunk sweep of the split path, its refinement bound `cap` and the rank's entries per step (RANK_R).
For each: CUDA-graph replay median (triton.testing.do_bench_cudagraph) and plain do_bench median
of `topk_select_chunked` (old), `topk_select_split` (new: its default form; split_six: fused=False) and
`topk_select` (the dispatch), and
whether each output is identical (indices and order) to `topk_select_ref`. The JSON is rewritten
after every case; every case runs in its own try/except.

    python benchmarks/tune_indexer_topk.py --out tune_indexer_topk.json   # H200, < 3 min
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, ms, ms_graph, write_json  # noqa: E402

from dsv41c.codegen.triton import indexer_topk as tk  # noqa: E402

T, NB = 131072, 16384


def make(S, kind, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    sc = torch.randn(S, T, device="cuda", generator=g)
    if kind == "ties":
        sc = sc.round(decimals=1)
    elif kind == "equal":
        sc = torch.ones(S, T, device="cuda")
    sc[:, T - 1000:] = float("-inf")
    nvis = T - 1000
    bm = sc.view(S, NB, 8).amax(-1)
    pin = torch.full((S,), (nvis - 1) // 8, dtype=torch.int32, device="cuda")
    return sc, bm, pin


def time_fn(f, rep=60):
    f()
    torch.cuda.synchronize()
    g = ms_graph(f, rep=rep)
    return {"graph_us": g * 1e3 if isinstance(g, float) else g, "bench_us": ms(f, rep=rep) * 1e3}


def case(x, k, pin, paths, rep=60):
    ref = tk.topk_select_ref(x, k, pin)
    res = {}
    for name, fn in paths.items():
        try:
            f = lambda fn=fn: fn(x, k, pin)  # noqa: E731
            out = f()
            torch.cuda.synchronize()
            r = {"identical": bool(torch.equal(out, ref))}
            r.update(time_fn(f, rep))
            res[name] = r
        except Exception as e:  # noqa: BLE001 - one path failing must not hide the others
            res[name] = {"error": f"{type(e).__name__}: {e}"[:400], "trace": traceback.format_exc()[-1500:]}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows", default="1,4,8,16,32")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds of cases before the rest are skipped")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/tune_indexer_topk.py needs a CUDA GPU")
    doc = {"env": env_info(), "defaults": {"SPLIT_MAX_S": tk.SPLIT_MAX_S, "SPLIT_MIN_N": tk.SPLIT_MIN_N,
                                           "SPLIT_CAP": tk.SPLIT_CAP}, "cases": []}
    paths = {"old_chunked": lambda x, k, p: tk.topk_select_chunked(x, k, p),
             "new_split": lambda x, k, p: tk.topk_select_split(x, k, p),
             "split_six": lambda x, k, p: tk.topk_select_split(x, k, p, fused=False),
             "dispatch": lambda x, k, p: tk.topk_select(x, k, p)}
    jobs = []
    for S in [int(s) for s in a.rows.split(",")]:
        jobs.append((f"topk512_S{S}_N{T}", S, "randn", "topk", paths, {}))
        jobs.append((f"cand2048_S{S}_NB{NB}", S, "randn", "cand", paths, {}))
    for kind in ("ties", "equal"):
        jobs.append((f"topk512_S1_N{T}_{kind}", 1, kind, "topk", paths, {}))
        jobs.append((f"cand2048_S1_NB{NB}_{kind}", 1, kind, "cand", paths, {}))
    for chunk in (256, 512, 1024, 2048, 4096):  # 4096: the largest split_chunk picks
        jobs.append((f"topk512_S1_split_chunk{chunk}", 1, "randn", "topk",
                     {"new_split": lambda x, k, p, c=chunk: tk.topk_select_split(x, k, p, chunk=c)}, {"chunk": chunk}))
    for chunk in (64, 128, 256, 512):
        jobs.append((f"cand2048_S1_split_chunk{chunk}", 1, "randn", "cand",
                     {"new_split": lambda x, k, p, c=chunk: tk.topk_select_split(x, k, p, chunk=c)}, {"chunk": chunk}))
    for cap in (128, 256, 1024, 4096):  # the default is SPLIT_CAP (512)
        jobs.append((f"topk512_S1_split_cap{cap}", 1, "randn", "topk",
                     {"new_split": lambda x, k, p, c=cap: tk.topk_select_split(x, k, p, cap=c)}, {"cap": cap}))
        jobs.append((f"cand2048_S1_split_cap{cap}", 1, "randn", "cand",
                     {"new_split": lambda x, k, p, c=cap: tk.topk_select_split(x, k, p, cap=c)}, {"cap": cap}))
    def with_rank_r(r):  # topk_select_split reads RANK_R at each call (a graph keeps what it captured)
        def run(x, k, p):
            keep, tk.RANK_R = tk.RANK_R, r
            try:
                return tk.topk_select_split(x, k, p)
            finally:
                tk.RANK_R = keep
        return run

    for r in (8, 32):  # list entries ranked per program step (default RANK_R = 16)
        jobs.append((f"topk512_S1_split_rank_r{r}", 1, "randn", "topk", {"new_split": with_rank_r(r)}, {"rank_r": r}))
        jobs.append((f"cand2048_S1_split_rank_r{r}", 1, "randn", "cand", {"new_split": with_rank_r(r)}, {"rank_r": r}))
    t0 = time.time()
    for name, S, kind, what, pths, extra in jobs:
        e = {"name": name, "S": S, "data": kind, **extra}
        if time.time() - t0 > a.budget:
            e["skipped"] = "budget"
        else:
            try:
                sc, bm, pin = make(S, kind)
                x, k, p = (sc, 512, None) if what == "topk" else (bm, 2048, pin)
                st = torch.empty((S, 8), dtype=torch.int32, device="cuda")
                tk.topk_select_split(x, k, p, state=st)  # which path row 0 took (level, bucket size)
                e["split_state_row0"] = dict(zip(("prefix", "shift", "above", "h", "kk", "done"), st[0, :6].tolist()))
                e.update(case(x, k, p, pths))
            except Exception as ex:  # noqa: BLE001
                e["error"] = f"{type(ex).__name__}: {ex}"[:400]
                e["trace"] = traceback.format_exc()[-1500:]
        doc["cases"].append(e)
        short = {kk: (v.get("graph_us"), v.get("identical")) for kk, v in e.items()
                 if isinstance(v, dict) and "graph_us" in v}
        print(name, short, e.get("error", ""), flush=True)
        write_json(a.out, doc)
    doc["wall_s"] = time.time() - t0
    write_json(a.out, doc)


if __name__ == "__main__":
    main()
