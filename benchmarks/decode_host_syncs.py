"""Which ops of a GPU artifact's decode step synchronize with the host (what keeps the step from being a CUDA graph).

    python3 benchmarks/decode_host_syncs.py ARTIFACT [--out FILE.json]

Loads the artifact on the GPU with seeded weights, prefills a short prompt, runs one decode step op by op,
then a second under `torch.cuda.set_sync_debug_mode("warn")`: every synchronizing call (a read of a device
value on the host, a copy from pageable host memory) warns, and the warnings are counted per op of the plan
(target and loc, layer numbers folded). Then it tries the capture the loader makes and reports its outcome.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import warnings

import torch

import dsv41c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    m = dsv41c.load(a.artifact, device="cuda", seeded_weights=a.seed)
    s = m.new_session()
    m.prefill(s, list(range(3, 19)), last_only=True)
    m.cuda_graphs = False
    m.decode(s)
    per: collections.Counter = collections.Counter()
    where: dict = {}

    def observe(rec, args, res):
        torch.cuda.synchronize()
        for w in caught:
            key = (rec["target"], re.sub(r"\d+", "N", rec.get("loc", "?")))
            per[key] += 1
            where.setdefault(f"{key[0]} @ {key[1]}", str(w.message).splitlines()[0][:200])
        caught.clear()

    m.observe = observe
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            m.decode(s)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    m.observe = None
    rows = [{"target": t, "loc": loc, "syncs": n} for (t, loc), n in per.most_common()]
    for r in rows:
        print(f"{r['syncs']:5d}  {r['target']}  {r['loc']}")
    m.cuda_graphs = True
    s2 = m.new_session()
    m.prefill(s2, list(range(3, 19)), last_only=True)
    m.decode(s2)
    m.decode(s2)
    res = {"artifact": a.artifact, "syncs_per_op": rows, "first_message": where,
           "captured": s2.graph is not None, "graph_error": m.graph_error,
           "graph_streams": None if s2.graph is None else ("one" if s2.graph.serial else "plan"),
           "graph_streams_error": None if s2.graph is None else s2.graph.first_error}
    print("captured:", res["captured"], res["graph_error"] or "", res["graph_streams_error"] or "")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
