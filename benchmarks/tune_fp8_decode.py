"""Sweep the FP8 block-scaled GEMM's decode tiles (M = 1 and 8 tokens) on a GPU, under CUDA-graph replay.

For the dense linears whose decode time matters most (wo_b 5120×8192, engram wkv 25600×6144,
wq_a 1280×5120, shared w2 5120×2304) and a handful of (BN, BK, SPLIT_K, num_warps, num_stages)
tiles: relative error against x·dequant(W)ᵀ on fresh random data, the graph-replay median, and
the time over the bytes floor (weights + activations over the copy bandwidth measured here).
The best tile per shape is printed last; `_tiles` in codegen/triton/fp8_gemm.py takes it by hand.

    python benchmarks/tune_fp8_decode.py --out tune_fp8_decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import triton  # noqa: E402

from benchmarks.common import env_info, measure_ceilings, ms_graph, rel_err, write_json  # noqa: E402
from dsv41c.codegen.triton import fp8_gemm as fg  # noqa: E402
from dsv41c import formats as nx  # noqa: E402

DEV = "cuda"
SHAPES = [("wo_b", 5120, 8192, 1), ("engram_wkv", 25600, 6144, 8), ("wq_a", 1280, 5120, 1), ("shared_w2", 5120, 2304, 8)]
# (BN, BK, SPLIT_K or None = the launcher's rule, num_warps, num_stages)
TILES = [(64, 256, None, 4, 4), (64, 128, None, 4, 4), (64, 256, None, 4, 6), (128, 256, None, 4, 4),
         (128, 128, None, 8, 4), (32, 256, None, 4, 4), (64, 512, None, 4, 3), (64, 256, 1, 4, 4),
         (128, 256, 1, 4, 4), (64, 256, 2, 4, 4), (128, 128, 2, 4, 6), (256, 128, 1, 8, 4)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ceil = measure_ceilings()
    doc = {**env_info(), "ceilings": ceil, "rows": []}
    for name, N, K, M in SHAPES:
        w = torch.randint(-126, 127, (N, K), device=DEV, dtype=torch.int8).view(torch.uint8)
        w = torch.where((w & 0x7F) == 0x7F, w ^ 1, w).view(torch.float8_e4m3fn)
        s = torch.randint(112, 118, (triton.cdiv(N, 32), triton.cdiv(K, 32)), device=DEV, dtype=torch.uint8)
        x = (torch.randn(M, K, device=DEV)).to(torch.bfloat16)
        ref = x.float() @ nx.dequant_fp8_weight(w, s, dtype=torch.bfloat16).float().T
        floor = (N * K * (1 + 1 / 1024) + M * K * 2 + M * N * 2) / (ceil["copy_TBps"] * 1e12) * 1e3
        for BN, BK, SK, nw, ns in TILES:
            row = {"shape": name, "M": M, "N": N, "K": K, "BN": BN, "BK": BK, "num_warps": nw, "num_stages": ns}
            try:
                if K % BK:
                    continue
                sk = fg._split_k(M, N, K, BN, BK) if SK is None else SK
                tiles = (16, BN, BK, 1, sk, nw, ns)
                row["SPLIT_K"] = sk
                f = lambda: fg._gemm(x, w, s, None, None, 0.0, False, None, "fp8_gemm", tiles=tiles)  # noqa: E731
                row["rel_err"] = rel_err(f(), ref)
                row["graph_ms"] = ms_graph(f)
                row["over_floor"] = row["graph_ms"] / floor if isinstance(row["graph_ms"], float) else None
            except Exception as ex:  # noqa: BLE001 - one tile failing must not lose the rest
                row["error"] = f"{type(ex).__name__}: {ex}"[:300]
            doc["rows"].append(row)
            print(json.dumps(row), flush=True)
        write_json(args.out, doc)
    print(f"\nbest tile per shape (graph replay; floor = bytes / {ceil['copy_TBps']:.2f} TB/s):")
    for name, N, K, M in SHAPES:
        ok = [r for r in doc["rows"] if r["shape"] == name and isinstance(r.get("graph_ms"), float)]
        dflt = next((r for r in ok if (r["BN"], r["BK"], r["num_stages"]) == (64, 256 if K % 256 == 0 else 128, 4)
                     and r["SPLIT_K"] == fg._split_k(M, N, K, 64, r["BK"])), None)
        if ok:
            b = min(ok, key=lambda r: r["graph_ms"])
            print(f"  {name:11s} M={M}: best BN={b['BN']} BK={b['BK']} SK={b['SPLIT_K']} nw={b['num_warps']} "
                  f"ns={b['num_stages']} {b['graph_ms'] * 1e3:7.1f} us ({b['over_floor']:.2f}x floor); default "
                  f"{dflt['graph_ms'] * 1e3 if dflt else float('nan'):7.1f} us")
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
