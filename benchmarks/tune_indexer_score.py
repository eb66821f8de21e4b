"""Time the decode indexer scoring (the heads kernel, one query × 131,072 keys) in its launch variants.

Variants (`index_scores` arguments): 2-4 programs of 4 warps per SM, with and without a register cap (`maxnreg`;
0: none), and 64-key tiles. Cases: typical keys at one query (no fallback), one adversarial query head (every
tile takes the block path), and four queries. Each variant's scores are compared bit for bit with the float32
reference (and its fallback counts kept); times are CUDA-graph replay medians, warm and L2-cold (`ms_graph`),
every variant timed twice, interleaved (all variants, then all again), so drift shows as a spread.

The kept results/tune_indexer_score.json (session 20) also has `one_loop_p2`: the kernel as of commit 93eb728,
with the block path a branch inside the key loop, run through a temporary switch that was removed once the
two-loop kernel (its `two_loops_*` rows) was adopted; this script no longer times it.

    python benchmarks/tune_indexer_score.py --out tune_indexer_score.json   # H200, ~2 min
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, ms_graph, write_json  # noqa: E402
from benchmarks.kernels_attention import _indexer_data  # noqa: E402
from dsv41c.codegen.triton import indexer_score as ix  # noqa: E402
from dsv41c.codegen.triton.kv_quant import sm_count  # noqa: E402

H, T = 32, 131072


def variants(sms: int, S: int) -> dict:
    per_q = lambda k: max(1, k * sms // S)  # noqa: E731 - programs per query at k programs per SM
    out = {"two_loops_p2": dict(maxnreg=0, programs=per_q(2))}
    for k in (2, 3, 4):
        out[f"two_loops_r128_p{k}"] = dict(maxnreg=128, programs=per_q(k))
    out["two_loops_r128_p4_bt64"] = dict(maxnreg=128, programs=per_q(4), block_t=64)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args()
    sms = sm_count(torch.device("cuda"))
    doc = {"kind": "tune_indexer_score", "env": env_info(), "sms": sms, "cases": {}}
    for case, S, spread in (("typical_S1", 1, False), ("fallback_S1", 1, True), ("typical_S4", 4, False)):
        qp, qe, w, kp, ke = _indexer_data(S, H, T, spread=spread)
        qpos = torch.full((S,), T + 5, dtype=torch.int32, device="cuda") - torch.arange(S, device="cuda",
                                                                                        dtype=torch.int32)
        nvis = ix.visible_counts(qpos, 1, T)
        wq = w.float() * 128 ** -0.5
        ref = ix.index_scores_ref(qp, qe, wq, kp, ke, nvis)
        res = doc["cases"][case] = {}
        vs = variants(sms, S)
        for rnd in range(2):
            for name, kw in vs.items():
                r = res.setdefault(name, {"args": kw, "graph_us": [], "graph_cold_us": []})
                try:
                    cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
                    a, _ = ix.index_scores(qp, qe, wq, kp, ke, nvis, counters=cnt, **kw)
                    r["score_bit_mismatches"] = int((a.view(torch.int32) != ref.view(torch.int32)).sum())
                    r["fallback_head_tiles"], r["fallback_tiles"] = int(cnt[0]), int(cnt[1])
                    g = ms_graph(lambda kw=kw: ix.index_scores(qp, qe, wq, kp, ke, nvis, **kw), rep=args.rep)
                    r["graph_us"].append(float(g) * 1e3 if isinstance(g, float) else g)
                    r["graph_cold_us"].append(getattr(g, "cold", 0.0) * 1e3 if isinstance(g, float) else None)
                except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
                    r["error"] = f"{type(e).__name__}: {e}"[:400]
                    r["trace"] = traceback.format_exc()[-1500:]
                write_json(args.out, doc)
        for name, r in res.items():
            print(case, name, r.get("score_bit_mismatches"), r.get("graph_us"), r.get("graph_cold_us"), r.get("error", ""))
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
