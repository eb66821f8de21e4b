"""Sweep the FP8 block-scaled GEMM's decode paths (M = 1 and 8 tokens) on a GPU, under CUDA-graph replay.

For the dense linears whose decode time matters (wo_b 5120×8192, engram wkv 25600×6144, wq_a
1280×5120, shared w2 5120×2304, the shared expert's gated w1/w3 2304×5120): the default path (one
token: `fp8_gemv_kernel`; 8 tokens: the tensor-core kernel, split-K folded), the old MMA + reduce
launch as the control, at one token the gemv's k-loop pipelines and K splits, at 8 tokens both weight
decoders forced (`decode_w` 0 / 1; the `default` rows at 8 tokens of shared w1/w3, shared w2, wq_a
and wo_b time fp8_warp_split.py, the new default there, while every row that passes an mma option still times the
split-K tile); for each the relative error against x·dequant(W)ᵀ on fresh random
data, the graph-replay median (warm and L2-cold), and the time
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
from dsv41c import formats  # noqa: E402
from dsv41c.codegen.triton import targets as tgt  # noqa: E402

DEV = "cuda"
# (name, N, K, M, gated)
SHAPES = [("wo_b", 5120, 8192, 1, False), ("wo_b", 5120, 8192, 8, False), ("wq_a", 1280, 5120, 1, False),
          ("wq_a", 1280, 5120, 8, False), ("shared_w2", 5120, 2304, 1, False), ("shared_w2", 5120, 2304, 8, False),
          ("shared_w13", 2304, 5120, 1, True), ("shared_w13", 2304, 5120, 8, True),
          ("engram_wkv", 25600, 6144, 8, False)]
# Earlier runs: tuning/tune_fp8_prefetch.json (the L2 prefetch of the weight rows: slower everywhere, off; the
# bf16x2 word decoder won at engram wkv only) and tuning/tune_fp8_decode.json (the one-token gemv's k-loop
# pipeline, 2-4 cp.async stages: slower, PIPE 1 stays).
# This (fifth) run: the K split, now that a split need not divide K/BK (`split_bounds`). Nsight Compute showed
# the default grids at 0.48-0.76 waves of the resident program slots (wo_b one token: 320 programs, 2.4 of 16 warps
# per scheduler, DRAM 45 % busy, L1TEX scoreboard stalls), so each shape is timed with the split that gives
# c programs per SM for c = 2..8 (the gemv also with BN 32 rows, fewer registers). TUNE_M=1 / 8 limits the run
# to those shapes. Kept as tuning/tune_fp8_split.json; the same sweep at TUNE_M=1 over a word-decoding,
# hand-prefetched gemv (slower, reverted) as tuning/tune_fp8_gemv_words.json. Sixth run (TUNE_M=8,
# TUNE_BN128=1): the tensor-core tile at BN 128 rows, 4 and 8 warps, 2-4 programs
# per SM. Seventh (TUNE_M=8): the tensor-core k loop at 2, 3, 5, 6 stages.
# Eighth (tuning/tune_fp8_rpf.json; the script as of commit c2ec43b, TUNE_M=1 TUNE_RPF=1): the one-token gemv
# with a register prefetch of the next k tile, BK 64 / 128 and a register cap (slower or equal; reverted).
# Ninth (TUNE_M=1 TUNE_SEG=1, tuning/tune_fp8_gemv_seg.json): the gemv with each thread's 16 consecutive products
# summed before its accumulator (SEG 16: 63 instead of 122 registers, static sm90 SASS), so more programs fit an SM.
# Tenth (TUNE_M=8 TUNE_W2=1, tuning/tune_fp8_mma_sync.json): the tensor-core decode tile at 1-2 warps, where Triton
# emits mma.sync instead of wgmma (sm90 SASS of the 4-warp tile: each of its 8 wgmma per k step is followed by a
# wait for it, and its weight bytes come from shared memory as 16-bit LDS; at 2 warps, BN 32: HMMA.16816, LDS.64).
# Eleventh (TUNE_M=8 TUNE_CONF=1, tuning/tune_fp8_mma_conf.json): the new 2-warp default, its split at one program an
# SM fewer and more, and the old 4-warp tile, each twice, interleaved.
# Twelfth (TUNE_M=8 TUNE_BK=1): the 2-warp tile at k tiles of 64 and 32 (sm90 SASS, Triton
# 3.6, shared w1/w3: 96 / 86 registers instead of 128, so 10-11 programs fit an SM instead of 8) at 8-14 programs an
# SM and 3-6 stages. TUNE_SHAPES=a,b limits any run to those linears.
# Thirteenth (TUNE_M=8 TUNE_SPF=1, tuning/tune_fp8_spf.json): the tensor-core k loop's scale bytes loaded one k tile
# ahead (SPF, the new default) against loading them in the step that uses them, each twice, interleaved.
# Fourteenth (TUNE_M=8 TUNE_STACK=1 TUNE_SHAPES=shared_w13): the gated linear's stacked tile (GATED 2: 16 rows of w1
# and the same 16 of w3 in one 32-row tile, one dot, planned as a plain linear of 2N rows) against the paired one.
# Fifteenth (TUNE_PAIRS=1, slower everywhere): the byte-pair decoder (DECODE_W 2, inline PTX; static sm90 SASS, Triton 3.6: 300-303 instructions a k
# step for the plain 2-warp tile against 369-375, 329 for the stacked gated one against 416)
# against the per-element one on the same tiles, interleaved; at one token on
# the mma path (the default there is the gemv).
# Sixteenth (TUNE_REGS=1 as of commit 83c57b6; the path was then reverted): fp8_mma_gemv.py, mma.sync on E4M3
# weights decoded in registers (no shared memory; 4.4 static SASS instructions a weight against ~6, 68-72 registers)
# against the default tile, BN 16 / 32 and splits planned for 8-24 programs an SM: correct (its gpu test passed)
# and slower on every linear.
def _sk_for(per_sm, tiles, steps):
    return max(1, min(steps, per_sm * tgt.N_SMS_HINT // tiles))


def _variants(N, K, M, gated):
    """(label, _gemm keyword arguments) to time for one shape."""
    out = [("default", {})]
    if M == 1 and os.environ.get("TUNE_SEG") == "1":  # the per-thread segment sums (SEG), interleaved with the default
        BN, BK, SK, nw, pipe = fg._gemv_tiles(N, K, gated)
        cands = [(BN, BK, 4), (BN, BK, 6), (BN, BK, 8), (BN, 2 * BK, 3), (BN, 2 * BK, 4)]
        if BN != 64:  # the gated gemv's 32 rows: also 64 (two 32-row groups a program)
            cands += [(64, BK, 4), (64, BK, 6)]
        for bn, bk, per_sm in cands:
            if K % bk == 0:
                sk = fg._split_k(1, N, K, bn, bk, per_sm)
                out.append((f"seg16_bn{bn}_bk{bk}_c{per_sm}_sk{sk}",
                            {"path": "gemv", "tiles": (bn, bk, sk, nw, pipe, 16)}))
        return out + [("default_again", {})]
    if M > 1 and os.environ.get("TUNE_CONF") == "1":  # the 2-warp default vs its neighbours and the old 4-warp tile
        BM, BN, BK, GM, SK, nw, ns = fg._tiles(M, N, K, gated, mma_sync=fg.mma_sync_decode_for(torch.device(DEV)))
        old = ("mma_4w_gated" if gated else "mma_4w")
        sk4 = fg._split_k(M, N, K, 64, BK, fg.DECODE_PROGRAMS_PER_SM[old])
        around = []
        if nw == 2:
            per = fg.DECODE_PROGRAMS_PER_SM["mma_gated" if gated else "mma"]
            for c in (per - 1, per + 1):
                sk = fg._split_k(M, N, K, BN, BK, c)
                around.append((f"mma_bn32_w2_c{c}_sk{sk}", {"tiles": (BM, BN, BK, GM, sk, nw, ns)}))
        four = (f"mma_bn64_w4_sk{sk4}", {"tiles": (BM, 64, BK, GM, sk4, 4, ns)})
        return out + around + [four, ("default_again", {})] + around + [four]
    if M > 1 and gated and os.environ.get("TUNE_STACK") == "1":  # the stacked gated tile (GATED 2), interleaved
        mma_sync = fg.mma_sync_decode_for(torch.device(DEV))
        BM, BN, BK, GM, SK, nw, ns = fg._tiles(M, 2 * N, K, True, mma_sync=mma_sync, stacked=True)
        st = [("stacked", {"stack": True}), ("stacked_spf_off", {"stack": True, "spf": False})]
        sks = [int(v) for v in os.environ.get("TUNE_STACK_SK", "").split(",") if v]  # explicit K splits
        for sk in sks or [fg._split_k(M, 2 * N, K, BN, BK, c) for c in (8, 12)]:
            st.append((f"stacked_sk{sk}", {"stack": True, "tiles": (BM, BN, BK, GM, sk, nw, ns)}))
        if sks:  # the paired tile at the same splits
            BMp, BNp, BKp, GMp, _, nwp, nsp = fg._tiles(M, N, K, True, mma_sync=mma_sync)
            st += [(f"paired_sk{sk}", {"stack": False, "tiles": (BMp, BNp, BKp, GMp, sk, nwp, nsp)}) for sk in sks]
        return [("paired", {"stack": False})] + st + [("paired_again", {"stack": False})] + st[:2]
    if os.environ.get("TUNE_PAIRS") == "1":  # the byte-pair decoder (DECODE_W 2, inline PTX) on the same tiles, twice
        pairs = {"decode_w": 2, "path": "mma"}
        base = {"path": "mma"} if M == 1 else {}
        if gated and M > 1:  # the stacked tile (the default) and the paired one
            return [("default", {}), ("pairs", pairs), ("paired", {"stack": False}),
                    ("paired_pairs", dict(pairs, stack=False)), ("default_again", {}), ("pairs_again", pairs)]
        return [("mma_decode_w0", dict(base, decode_w=0)), ("pairs", pairs), ("mma_decode_w0_again", dict(base, decode_w=0)),
                ("pairs_again", pairs)] + ([("default", {})] if M == 1 else [])
    if M > 1 and os.environ.get("TUNE_SPF") == "1":  # the scale prefetch (SPF, on by default) off, interleaved
        return out + [("spf_off", {"spf": False}), ("default_again", {}), ("spf_off_again", {"spf": False})]
    if M > 1 and os.environ.get("TUNE_BK") == "1":  # smaller k tiles (fewer registers: more programs an SM), interleaved
        BM, BN, BK, GM, SK, nw, ns = fg._tiles(M, N, K, gated, mma_sync=fg.mma_sync_decode_for(torch.device(DEV)))
        for bk, per_sm, ns2 in ((64, 8, 3), (64, 10, 3), (64, 12, 3), (64, 14, 3), (64, 10, 4), (64, 12, 4),
                                (32, 10, 4), (32, 12, 4), (32, 14, 4), (32, 12, 6)):
            if K % bk == 0:
                sk = fg._split_k(M, N, K, BN, bk, per_sm)
                out.append((f"mma_bk{bk}_c{per_sm}_sk{sk}_ns{ns2}", {"tiles": (BM, BN, bk, GM, sk, nw, ns2)}))
        return out + [("default_again", {})]
    if M > 1 and os.environ.get("TUNE_W2") == "1":  # mma.sync tiles (num_warps < 4: no wgmma), interleaved
        BM, BN, BK, GM, SK, nw, ns = fg._tiles(M, N, K, gated, mma_sync=fg.mma_sync_decode_for(torch.device(DEV)))
        for bn, nw2, ns2, per_sm in ((32, 2, 3, 6), (32, 2, 3, 8), (32, 2, 3, 10), (64, 2, 3, 5), (64, 2, 3, 6),
                                     (32, 2, 4, 8), (16, 1, 3, 12), (16, 1, 3, 16)):
            sk = fg._split_k(M, N, K, bn, BK, per_sm)
            out.append((f"mma_bn{bn}_w{nw2}_ns{ns2}_c{per_sm}_sk{sk}", {"tiles": (BM, bn, BK, GM, sk, nw2, ns2)}))
        return out + [("default_again", {})]
    if M == 1:
        t = fg._gemv_tiles(N, K, gated)
        if t:
            BN, BK, SK, nw, pipe = t
            for bn in sorted({BN, 32}):
                tiles = triton.cdiv(N, bn)
                for sk in sorted({_sk_for(c, tiles, K // BK) for c in (2, 3, 4, 5, 6, 8)}):
                    out.append((f"gemv_bn{bn}_sk{sk}", {"path": "gemv", "tiles": (bn, BK, sk, nw, pipe)}))
    else:
        BM, BN, BK, GM, SK, nw, ns = fg._tiles(M, N, K, gated, mma_sync=fg.mma_sync_decode_for(torch.device(DEV)))
        tiles = triton.cdiv(N, BN) * triton.cdiv(M, BM)
        stages_only = os.environ.get("TUNE_STAGES_ONLY") == "1"  # the default and 3 stages (plus 3 again, last)
        for sk in () if stages_only else sorted({_sk_for(c, tiles, K // BK) for c in (2, 3, 4, 5, 6, 8)}):
            out.append((f"mma_sk{sk}", {"tiles": (BM, BN, BK, GM, sk, nw, ns)}))
        if stages_only:
            return out + [(f"mma_sk{SK}_ns3", {"tiles": (BM, BN, BK, GM, SK, nw, 3)}), ("default_again", {}),
                          (f"mma_sk{SK}_ns3_again", {"tiles": (BM, BN, BK, GM, SK, nw, 3)})]
        for ns2 in (2, 3, 5, 6):  # the k loop's cp.async pipeline depth at the default split
            out.append((f"mma_sk{SK}_ns{ns2}", {"tiles": (BM, BN, BK, GM, SK, nw, ns2)}))
        if os.environ.get("TUNE_BN128") and N % 128 == 0:  # wider weight tiles (slower: tune_fp8_bn128.json)
            tiles = triton.cdiv(N, 128) * triton.cdiv(M, BM)
            for nw2 in (4, 8):
                for sk in sorted({_sk_for(c, tiles, K // BK) for c in (2, 3, 4)}):
                    out.append((f"mma_bn128_w{nw2}_sk{sk}", {"tiles": (BM, 128, BK, GM, sk, nw2, ns)}))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ceil = measure_ceilings()
    doc = {**env_info(), "ceilings": ceil, "rows": []}
    only_m = int(os.environ.get("TUNE_M", "0"))
    only_shapes = {n for n in os.environ.get("TUNE_SHAPES", "").split(",") if n}
    for name, N, K, M, gated in SHAPES:
        if (only_m and M != only_m) or (only_shapes and name not in only_shapes):
            continue

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
            ref = x.float() @ formats.dequant_fp8_weight(w, s, dtype=torch.bfloat16).float().T
        wbytes = N * K * (1 + 1 / 1024) * (2 if gated else 1)
        floor = (wbytes + M * K * 2 + M * N * 2) / (ceil["copy_TBps"] * 1e12) * 1e3
        for label, kw in _variants(N, K, M, gated):
            row = {"shape": name, "M": M, "N": N, "K": K, "gated": gated, "variant": label,
                   "kwargs": {k: v for k, v in kw.items()}}
            try:
                f = lambda kw=kw: fg._gemm(x, w, s, w3, s3, 10.0, False, None, name, **kw)  # noqa: E731
                row["rel_err"] = rel_err(f(), ref)
                row["graph_ms"] = ms_graph(f)
                row["graph_cold_ms"] = getattr(row["graph_ms"], "cold", None)  # L2 flushed before each replay
                row["over_floor"] = row["graph_ms"] / floor if isinstance(row["graph_ms"], float) else None
                cold = row["graph_cold_ms"]
                row["cold_over_floor"] = cold / floor if isinstance(cold, float) else None
            except Exception as ex:  # noqa: BLE001 - one variant failing must not lose the rest
                row["error"] = f"{type(ex).__name__}: {ex}"[:300]
            doc["rows"].append(row)
            print(json.dumps(row), flush=True)
        write_json(args.out, doc)
    print(f"\nbest variant per shape (L2-cold graph replay; floor = bytes / {ceil['copy_TBps']:.2f} TB/s):")
    for name, N, K, M, gated in SHAPES:
        ok = [r for r in doc["rows"] if (r["shape"], r["M"]) == (name, M) and isinstance(r.get("graph_cold_ms"), float)]
        if ok:
            b = min(ok, key=lambda r: r["graph_cold_ms"])
            base = next((r for r in ok if r["variant"] == "default"), None)
            print(f"  {name:11s} M={M}: best {b['variant']:18s} cold {b['graph_cold_ms'] * 1e3:6.1f} us "
                  f"({b['cold_over_floor']:.2f}x floor); default "
                  f"{base['graph_cold_ms'] * 1e3 if base else float('nan'):6.1f} us")
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
