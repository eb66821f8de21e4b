"""Time the one-launch decode router (`moe_router.router`, fused GEMV + top-k) with the gate GEMV's k-step prefetch
off and on, and on with a register cap, at 1, 4 and 8 tokens (384 experts, top-6, hidden 5120).

Each variant's weights and expert ids must equal the prefetch-off variant's bit for bit (the same arithmetic);
the share of rows whose ids equal `router_reference`'s is kept too. Times: CUDA-graph replay medians, warm and
L2-cold (`ms_graph`), every variant twice, interleaved. Variants are module switches (`GEMV_PREFETCH`,
`GEMV_MAXNREG`) set around each call.

    python benchmarks/tune_router_decode.py --out tune_router_decode.json   # H200, ~1 min
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, ms_graph, write_json  # noqa: E402
from dsv41c.codegen.triton import moe_router as mr  # noqa: E402

VARIANTS = {"prefetch_off": (False, None), "prefetch_on": (True, None), "prefetch_on_r80": (True, 80)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    E, D, K = 384, 5120, 6
    gw = (torch.randn(E, D, device="cuda") * 0.02).bfloat16()
    bias = torch.randn(E, device="cuda") * 0.01
    doc = {"kind": "tune_router_decode", "env": env_info(), "cases": {}}
    saved = (mr.GEMV_PREFETCH, mr.GEMV_MAXNREG)
    try:
        for T in (1, 4, 8):
            x = torch.randn(T, D, device="cuda").bfloat16()
            ref_w, ref_i = mr.router_reference(x, gw, bias, K)
            res = doc["cases"][f"T{T}"] = {}
            base = None
            for rnd in range(2):
                for name, (pf, cap) in VARIANTS.items():
                    mr.GEMV_PREFETCH, mr.GEMV_MAXNREG = pf, cap
                    r = res.setdefault(name, {"graph_us": [], "graph_cold_us": []})
                    w, i = mr.router(x, gw, bias, K)
                    torch.cuda.synchronize()
                    if base is None:
                        base = (w.clone(), i.clone())
                    r["identical_to_prefetch_off"] = bool(torch.equal(w, base[0]) and torch.equal(i, base[1]))
                    r["ids_equal_reference_rows"] = float((i == ref_i).all(-1).float().mean())
                    g = ms_graph(lambda: mr.router(x, gw, bias, K))
                    r["graph_us"].append(float(g) * 1e3 if isinstance(g, float) else g)
                    r["graph_cold_us"].append(getattr(g, "cold", 0.0) * 1e3 if isinstance(g, float) else None)
                    write_json(args.out, doc)
            for name, r in res.items():
                print(f"T{T}", name, r["identical_to_prefetch_off"], r["graph_us"], r["graph_cold_us"])
    finally:
        mr.GEMV_PREFETCH, mr.GEMV_MAXNREG = saved
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
