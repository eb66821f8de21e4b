"""Sweep the FP8 block-scaled GEMM's decode paths (M = 1 and 8 tokens) on a GPU, under CUDA-graph replay.

For the dense linears whose decode time matters (wo_b 5120×8192, engram wkv 25600×6144, wq_a
1280×5120, shared w2 5120×2304, the shared expert's gated w1/w3 2304×5120) and each path:
- `mma`: the tensor-core kernel with its split-K epilogue folded into the launch (last arriver),
- `mma_reduce`: the same with the separate `splitk_reduce_kernel` launch (the previous default),
- `gemv`: one token on the CUDA cores (`fp8_gemv_kernel`), a few (BN, BK, SPLIT_K, warps) tiles,
- `mma_f32_*` / `mma_bits_*` (M > 1): the tensor-core kernel with the weight decoder forced to DECODE_W 0
  (E4M3 -> fp32 per element, × scale, -> bf16) or 1 (bf16x2 bit assembly from 32-bit words, x permuted to
  `k_order_w`), default and larger tiles (the plain `mma` rows use the launcher's default decoder),
relative error against x·dequant(W)ᵀ on fresh random data, the graph-replay median, and the time
over the bytes floor (weights + activations over the copy bandwidth measured here). The best per
shape is printed last; `_tiles`/`_gemv_tiles` in codegen/triton/fp8_gemm.py take it by hand.

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
# (name, N, K, M, gated)
SHAPES = [("wo_b", 5120, 8192, 1, False), ("wo_b", 5120, 8192, 8, False), ("wq_a", 1280, 5120, 1, False),
          ("wq_a", 1280, 5120, 8, False), ("shared_w2", 5120, 2304, 1, False), ("shared_w2", 5120, 2304, 8, False),
          ("shared_w13", 2304, 5120, 1, True), ("shared_w13", 2304, 5120, 8, True),
          ("engram_wkv", 25600, 6144, 8, False)]
# gemv tiles: (BN, BK, SPLIT_K or None = the launcher's rule, num_warps, num_stages)
GEMV_TILES = [(64, 128, None, 4, 3), (32, 128, None, 4, 3), (32, 256, None, 4, 3), (64, 256, None, 4, 3),
              (64, 128, None, 8, 3), (32, 128, None, 2, 3), (64, 128, 1, 4, 3), (32, 128, 1, 4, 3)]

# folded tensor-core tiles tried at M = 8: (BN, BK, num_warps, num_stages)
MMA_TILES = [(32, 128, 4, 4), (64, 128, 4, 6), (64, 256, 4, 3), (128, 128, 4, 4), (32, 256, 4, 4)]


# tiles tried with each forced weight decoder at M > 1 (None: the launcher's default tile)
DECODE_W_TILES = [None, (64, 128, 4, 4), (128, 128, 4, 4), (256, 128, 4, 3), (128, 256, 4, 3)]


def _variants(N, K, M, gated):
    """(path, fold, tiles, label, decode_w) to time for one shape (decode_w None: the launcher's default)."""
    out = [("mma", True, None, "mma", None), ("mma", False, None, "mma_reduce", None)]
    if M > 1:
        for BN, BK, nw, ns in MMA_TILES:
            if K % BK == 0:
                sk = fg._split_k(M, N, K, BN, BK)
                out.append(("mma", True, (16, BN, BK, 1, sk, nw, ns), f"mma_bn{BN}_bk{BK}_sk{sk}_w{nw}_s{ns}", None))
        for dw, name in ((0, "mma_f32"), (1, "mma_bits")):
            for t in DECODE_W_TILES:
                if t is None:
                    out.append(("mma", True, None, f"{name}_default", dw))
                    continue
                BN, BK, nw, ns = t
                if K % BK == 0 and not (gated and BN > 128):
                    sk = fg._split_k(M, N, K, BN, BK)
                    out.append(("mma", True, (16, BN, BK, 1, sk, nw, ns), f"{name}_bn{BN}_bk{BK}_sk{sk}_w{nw}_s{ns}",
                                dw))
    if M == 1:
        for BN, BK, SK, nw, ns in GEMV_TILES:
            if K % BK or (gated and BN * BK > 32 * 256):
                continue
            sk = fg._split_k(1, N, K, BN, BK) if SK is None else SK
            if K % (BK * sk):
                continue
            out.append(("gemv", True, (BN, BK, sk, nw, ns), f"gemv_bn{BN}_bk{BK}_sk{sk}_w{nw}", None))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ceil = measure_ceilings()
    doc = {**env_info(), "ceilings": ceil, "rows": []}
    for name, N, K, M, gated in SHAPES:
        def wq(N=N, K=K):
            w = torch.randint(-126, 127, (N, K), device=DEV, dtype=torch.int8).view(torch.uint8)
            w = torch.where((w & 0x7F) == 0x7F, w ^ 1, w).view(torch.float8_e4m3fn)
            s = torch.randint(112, 118, (triton.cdiv(N, 32), triton.cdiv(K, 32)), device=DEV, dtype=torch.uint8)
            return w, s
        w, s = wq()
        w3, s3 = wq() if gated else (None, None)
        x = (torch.randn(M, K, device=DEV)).to(torch.bfloat16)
        if gated:
            ref = fg.fp8_gemm_swiglu_reference(x, w, s, w3, s3, 10.0).float()
        else:
            ref = x.float() @ nx.dequant_fp8_weight(w, s, dtype=torch.bfloat16).float().T
        wbytes = N * K * (1 + 1 / 1024) * (2 if gated else 1)
        floor = (wbytes + M * K * 2 + M * N * 2) / (ceil["copy_TBps"] * 1e12) * 1e3
        for path, fold, tiles, label, dw in _variants(N, K, M, gated):
            row = {"shape": name, "M": M, "N": N, "K": K, "gated": gated, "variant": label, "tiles": tiles,
                   "decode_w": dw}
            try:
                f = lambda: fg._gemm(x, w, s, w3, s3, 10.0, False, None, name, tiles=tiles, path=path,  # noqa: E731
                                     fold=fold, decode_w=dw)
                row["rel_err"] = rel_err(f(), ref)
                row["graph_ms"] = ms_graph(f)
                row["graph_cold_ms"] = getattr(row["graph_ms"], "cold", None)  # L2 flushed before each replay
                row["over_floor"] = row["graph_ms"] / floor if isinstance(row["graph_ms"], float) else None
            except Exception as ex:  # noqa: BLE001 - one variant failing must not lose the rest
                row["error"] = f"{type(ex).__name__}: {ex}"[:300]
            doc["rows"].append(row)
            print(json.dumps(row), flush=True)
        write_json(args.out, doc)
    print(f"\nbest variant per shape (graph replay; floor = bytes / {ceil['copy_TBps']:.2f} TB/s):")
    for name, N, K, M, gated in SHAPES:
        ok = [r for r in doc["rows"] if (r["shape"], r["M"]) == (name, M) and isinstance(r.get("graph_ms"), float)]
        if ok:
            b = min(ok, key=lambda r: r["graph_ms"])
            base = next((r for r in ok if r["variant"] == "mma_reduce"), None)
            print(f"  {name:11s} M={M}: best {b['variant']:28s} {b['graph_ms'] * 1e3:7.1f} us "
                  f"({b['over_floor']:.2f}x floor); mma+reduce {base['graph_ms'] * 1e3 if base else float('nan'):7.1f} us")
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
