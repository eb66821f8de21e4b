"""Time the decode indexer scoring (the heads kernel, one query × 131,072 keys) in its launch variants.

Variants (`index_scores` arguments): programs of 4 warps per SM, 2 uncapped, 4 capped at 128 registers
(`maxnreg`; the default, `indexer_score.heads_launch`), 5 at 96 and 6 at 80; 2 programs of 8 warps capped at 128
(128- and 256-key tiles; at 128 keys neither loop spills). Cases: typical keys at one
query (no fallback), one adversarial query head (every tile takes the block path), and four queries. Each
variant's scores are compared bit for bit with the float32 reference (and its fallback counts kept); times are
CUDA-graph replay medians, warm and L2-cold (`ms_graph`), every variant timed twice, interleaved (all variants,
then all again), so drift shows as a spread.

Kept runs (tuning/): `tune_indexer_score.json` also has `one_loop_p2`, the kernel as of commit
93eb728 (the block path a branch inside the key loop), and its `two_loops_*` rows predate the scale fold;
`tune_indexer_score_fold.json` has `*_nofold` rows (the fold off) and `tune_indexer_score_prefetch.json`
`*_prefetch` rows (a register prefetch of the next key tile): switches that were measured and then removed, so
this script no longer times them; nor the first two files' `two_loops_r128_p2` and `*_bt64` (64-key tiles), nor
the third's `r128_p3` and `r168_p3_prefetch`.

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
from dsv41c.codegen.triton.targets import sm_count

H, T = 32, 131072


def variants(sms: int, S: int) -> dict:
    per_q = lambda k: max(1, k * sms // S)  # noqa: E731 - programs per query at k programs per SM
    return {"p2": dict(maxnreg=0, programs=per_q(2)),
            "r128_p4": dict(maxnreg=128, programs=per_q(4)),  # the default (heads_launch)
            "r96_p5": dict(maxnreg=96, programs=per_q(5)), "r80_p6": dict(maxnreg=80, programs=per_q(6)),
            "w8_r128_p2": dict(maxnreg=128, programs=per_q(2), num_warps=8),
            "w8_bt256_r128_p2": dict(maxnreg=128, programs=per_q(2), num_warps=8, block_t=256)}


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
            print(case, name, r.get("score_bit_mismatches"), r.get("graph_us"), r.get("graph_cold_us"),
                  r.get("error", ""))
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
