"""Time the decode router's two one-launch forms: the fused GEMV (`router_decode_kernel`: a program per token, BE
experts and K split, each token's programs re-reading the gate) against the tensor-core form
(`router_decode_mma_kernel`: a program per BE experts and K split that multiplies its gate tile with every token's
x) at several tiles, at 1, 2, 4 and 8 tokens (384 experts, top-6, hidden 5120, bf16 x and gate).

Each row: the share of tokens whose expert ids equal `router_reference`'s and, where all do, the largest relative
difference of the routing weights from the reference's. Times: CUDA-graph replay medians, warm and L2-cold (`ms_graph`), every
variant twice, interleaved (so drift shows).

    python benchmarks/tune_router_decode.py --out tune_router_decode.json   # H200, ~2 min
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

# (BE experts, BK, K_PER_SPLIT, stages, warps): programs = 384/BE x 5120/K_PER_SPLIT
MMA_TILES = [(16, 256, 1024, 3, 4), (16, 512, 1024, 2, 4), (16, 256, 512, 2, 4), (16, 512, 512, 1, 4),
             (16, 128, 640, 5, 4), (32, 256, 512, 2, 4), (64, 128, 256, 2, 4), (16, 256, 1024, 3, 2)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,2,4,8")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    E, D, K = 384, 5120, 6
    gw = (torch.randn(E, D, device="cuda") * 0.02).bfloat16()
    bias = torch.randn(E, device="cuda") * 0.01
    doc = {"kind": "tune_router_decode", "env": env_info(), "E": E, "D": D, "top_k": K, "rows": []}
    variants = {"gemv": dict(mma=False)}
    variants.update({"mma_be{}_bk{}_kps{}_ns{}_w{}".format(*t): dict(mma=True, mma_tiles=t) for t in MMA_TILES})
    for T in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(T, D, device="cuda").bfloat16()
        ref_w, ref_i = mr.router_reference(x, gw, bias, K)
        for rnd in range(2):
            for name, kw in variants.items():
                row = {"T": T, "variant": name, "round": rnd, **{k: list(v) if isinstance(v, tuple) else v
                                                                  for k, v in kw.items()}}
                try:
                    w, i = mr.router(x, gw, bias, K, **kw)
                    torch.cuda.synchronize()
                    same = (i == ref_i).all(-1)
                    row["ids_equal_reference_rows"] = float(same.float().mean())
                    row["weights_max_rel_diff"] = float(((w - ref_w).abs() / ref_w.abs()).max()) if bool(same.all()) \
                        else None
                    g = ms_graph(lambda: mr.router(x, gw, bias, K, **kw))
                    row["graph_us"] = float(g) * 1e3 if isinstance(g, float) else g
                    row["graph_cold_us"] = getattr(g, "cold", 0.0) * 1e3 if isinstance(g, float) else None
                except Exception as e:  # noqa: BLE001 - a tile that does not compile is a row, not the end
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                doc["rows"].append(row)
                print(f"T{T}", name, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                                      if k in ("ids_equal_reference_rows", "graph_us", "graph_cold_us", "error")},
                      flush=True)
                write_json(args.out, doc)
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
