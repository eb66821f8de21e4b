"""Time the FP8 × FP8 decode GEMM (fp8_w8a8.py) against the act_quant and bf16 paths on a GPU (graph replay).

For the decode linears (wo_b, wq_a, shared w2, the shared expert's gated w1/w3 at 1 and 8 tokens, engram wkv at
8), each row is one way to compute the linear, timed under CUDA-graph replay warm and L2-cold
(`common.ms_graph`), with its relative error:
- `bf16`: fp8_gemm with bf16 activations (act_quant False), today's default and the kernel tables' row;
- `act_quant_bf16`: act_quant True the old way (fake-quant launch, then the bf16-activation GEMM);
- `w8a8_*`: the activation quantized to E4M3 codes (one launch) and E4M3 × E4M3 tensor-core dots per 32-column
  block, over tiles (warps, weight rows, programs per SM for the K split, pipeline stages); `w8a8_default` is the
  launcher's own choice, timed first and last (interleaving: run-to-run drift shows as its two times differing);
- `quant_only`: the activation quant launch alone.
The errors of the act_quant rows are against fp8_gemm_reference(act_quant=True) in float32 and, for the
default, in float64. Floors are bytes / the copy bandwidth measured in the same run (benchmarks/floors.py).

    python benchmarks/tune_fp8_w8a8.py --out benchmarks/results/tune_fp8_w8a8.json [--only shared_w13]
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
from dsv41c.codegen.triton import fp8_w8a8 as w8  # noqa: E402
from dsv41c import formats as nx  # noqa: E402

DEV = "cuda"
LIMIT = 10.0
# (name, N, K, M, gated)
SHAPES = [("shared_w13", 2304, 5120, 8, True), ("shared_w2", 5120, 2304, 8, False), ("wo_b", 5120, 8192, 8, False),
          ("wq_a", 1280, 5120, 8, False), ("engram_wkv", 25600, 6144, 8, False),
          ("shared_w13", 2304, 5120, 1, True), ("shared_w2", 5120, 2304, 1, False), ("wo_b", 5120, 8192, 1, False),
          ("wq_a", 1280, 5120, 1, False)]
# (warps, weight rows, programs an SM the K split is planned for, stages)
TILES = [(2, 32, 8, 3), (2, 32, 12, 3), (4, 64, 4, 3), (4, 64, 6, 3), (4, 64, 8, 3), (4, 64, 6, 4), (4, 128, 3, 3),
         (8, 128, 3, 3)]


def weights(N, K):
    w = torch.randint(-126, 127, (N, K), device=DEV, dtype=torch.int8).view(torch.uint8)
    w = torch.where((w & 0x7F) == 0x7F, w ^ 1, w).view(torch.float8_e4m3fn)
    s = torch.randint(112, 118, (triton.cdiv(N, 32), triton.cdiv(K, 32)), device=DEV, dtype=torch.uint8)
    return w, s


def rows_for(name, N, K, M, gated, ceil):
    w, s = weights(N, K)
    w3, s3 = weights(N, K) if gated else (None, None)
    x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
    ref_aq = w8.w8a8_reference(x, w, s, w3, s3, LIMIT, out_dtype=torch.float32)
    ref_bf = (fg.fp8_gemm_swiglu_reference(x, w, s, w3, s3, LIMIT, out_dtype=torch.float32) if gated
              else fg.fp8_gemm_reference(x, w, s, out_dtype=torch.float32))
    wbytes = N * K * (1 + 1 / 1024) * (2 if gated else 1)
    floor = (wbytes + M * K * 2 + M * N * 2) / (ceil["copy_TBps"] * 1e12) * 1e3
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [("w8a8_default", lambda: fg._gemm(x, w, s, w3, s3, LIMIT, True, None, name, path="w8a8"), ref_aq),
             ("bf16", lambda: fg._gemm(x, w, s, w3, s3, LIMIT, False, None, name), ref_bf),
             ("act_quant_bf16", lambda: fg._gemm(x, w, s, w3, s3, LIMIT, True, None, name, path="mma"), ref_aq)]
    for nw, bn, per_sm, ns in TILES:
        sk = fg._split_k(M, N, K, bn, w8.W8A8_BK, per_sm, sms)
        t = (16, bn, w8.W8A8_BK, sk, nw, ns)
        cases.append((f"w8a8_w{nw}_bn{bn}_c{per_sm}_sk{sk}_ns{ns}",
                      lambda t=t: w8.w8a8_gemm(x, w, s, w3, s3, LIMIT, None, name, tiles=t), ref_aq))
    cases.append(("w8a8_default_again", cases[0][1], ref_aq))
    cases.append(("quant_only", lambda: w8.act_quant_e4m3(x, 16), None))
    out = []
    for label, f, ref in cases:
        row = {"shape": name, "M": M, "N": N, "K": K, "gated": gated, "variant": label, "floor_ms": floor}
        try:
            if ref is not None:
                y = f().float()
                row["rel_err"] = rel_err(y, ref)
                if label == "w8a8_default":  # against float64 too
                    x64 = nx.fake_quant_fp8_ue8m0(x.double(), 32)
                    if gated:
                        g = (x64 @ nx.dequant_fp8_weight(w, s, dtype=torch.float64).T).clamp(max=LIMIT)
                        u = (x64 @ nx.dequant_fp8_weight(w3, s3, dtype=torch.float64).T).clamp(-LIMIT, LIMIT)
                        r64 = torch.nn.functional.silu(g) * u
                    else:
                        r64 = x64 @ nx.dequant_fp8_weight(w, s, dtype=torch.float64).T
                    row["rel_err_f64"] = rel_err(y.double(), r64)
            t = ms_graph(f)
            row["graph_ms"] = t
            row["graph_cold_ms"] = getattr(t, "cold", None)
            if isinstance(row["graph_cold_ms"], float):
                row["cold_over_floor"] = row["graph_cold_ms"] / floor
        except Exception as ex:  # noqa: BLE001 - one variant failing must not lose the rest
            row["error"] = f"{type(ex).__name__}: {ex}"[:300]
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    ap.add_argument("--m", type=int, default=0, help="only this token count (default: 1 and 8)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ceil = measure_ceilings()
    doc = {**env_info(), "ceilings": ceil, "rows": []}
    only = {s for s in args.only.split(",") if s}
    for name, N, K, M, gated in SHAPES:
        if (only and name not in only) or (args.m and M != args.m):
            continue
        doc["rows"] += rows_for(name, N, K, M, gated, ceil)
        write_json(args.out, doc)  # after each shape: a run stopped at its limit keeps what it measured
    print(f"\nL2-cold graph replay, µs (floor = bytes / {ceil['copy_TBps']:.2f} TB/s):")
    for name, N, K, M, gated in SHAPES:
        rs = [r for r in doc["rows"] if (r["shape"], r["M"]) == (name, M) and isinstance(r.get("graph_cold_ms"), float)]
        if rs:
            by = {r["variant"]: r for r in rs}
            best = min((r for r in rs if r["variant"].startswith("w8a8")), key=lambda r: r["graph_cold_ms"], default=None)
            cell = lambda v: f"{by[v]['graph_cold_ms'] * 1e3:.1f}" if v in by else "-"  # noqa: E731
            print(f"  {name:11s} M={M}: bf16 {cell('bf16')}  act_quant_bf16 {cell('act_quant_bf16')}  w8a8 default "
                  f"{cell('w8a8_default')}/{cell('w8a8_default_again')}  best {best['variant'] if best else '-'} "
                  f"{best['graph_cold_ms'] * 1e3 if best else float('nan'):.1f} ({best['cold_over_floor'] if best else 0:.2f}x)")
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
