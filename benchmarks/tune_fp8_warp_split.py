"""Time the warp-split FP8 decode GEMM (codegen/triton/fp8_warp_split.py) against fp8_gemm's default decode path.

For the decode linears at 8 tokens (shared w1/w3 gated 2304×5120, shared w2 5120×2304, wq_a 1280×5120, wo_b
5120×8192): fp8_gemm's default (the 2-warp mma.sync tile, split-K folded by the last arriver; the stacked tile for
the gated one), then the warp-split kernel over S (warps = K slices) 4 / 8 / 16, BK 32 / 64 / 128 and 2-4 stages
where K tiles, then the default again and the best three warp-split tiles again (interleaved, so drift shows);
`--grid pairs`: the default path (the warp-split kernel itself), the warp-split kernel at `tiles_for`'s tile
with the per-element decoder and with the byte-pair one (inline PTX), twice, interleaved; `--grid spf`: the
scale prefetch (the next k step's UE8M0 bytes loaded an iteration ahead) off and on, at 128- and 256-wide k tiles
where K tiles, against the default, twice, interleaved (tuning/tune_fp8_warp_split_spf.json was recorded at commit
25d49a8, before SPF was the default: the default, then SPF at `tiles_for`'s tile of then, at 4 stages and at twice
BK); `--grid two`: the byte-pair decoder's second bf16x2 scale factor (needed only for UE8M0 bytes above 134)
always, and one factor made in the k loop or where the scale bytes are loaded (`early`), twice, interleaved (its first
run, tuning/tune_fp8_warp_split_two.json, had a per-program check of the scale rows instead of `early`: 1.04-1.7x
slower, removed). The 8-row grid (`rows8`, tuning/tune_fp8_warp_split_rows8.json, as of commit da01be4) and x-through-L1
grid (`xe`, x loaded 4 / 2 elements a thread by cp.async.ca, tuning/tune_fp8_warp_split_xe.json, as of 8d5f947)
timed options since removed: both slower on every linear (8 rows 27-65 %; xe from level on shared w2 at 4 elements,
8.02-8.24 against 7.84-8.02 µs, to 62 %). `--grid ragged` (tuning/tune_fp8_warp_split_ragged.json):
`RAGGED_TILES`, more warps or wider k tiles than divide K evenly and more stages, twice, interleaved with the default;
a `words` grid (the scale bytes as int32 words staged by the pipeline, as of commit 6c89b06) is removed with its
kernel option (1.35-2.2x slower). Each
row: the relative error against x·dequant(W)ᵀ (the gated one against fp8_gemm_swiglu_reference), the graph-replay
median warm and L2-cold (`common.ms_graph`), and the cold time over the bytes floor.

    python benchmarks/tune_fp8_warp_split.py --out tune_fp8_warp_split.json [--shapes shared_w13,shared_w2]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import triton  # noqa: E402

from benchmarks.common import env_info, measure_ceilings, ms_graph, rel_err, write_json  # noqa: E402
from dsv41c.codegen.triton import fp8_gemm as fg  # noqa: E402
from dsv41c.codegen.triton import fp8_warp_split as ws  # noqa: E402
from dsv41c import formats  # noqa: E402

DEV = "cuda"
SHAPES = {"shared_w13": (2304, 5120, True), "shared_w2": (5120, 2304, False), "wq_a": (1280, 5120, False),
          "wo_b": (5120, 8192, False)}
M = 8
# `--grid ragged`: (S, RB, BK, stages); for shared w2 (K 2304 = 18 tiles of 128) S 4 at BK 128 is 5, 5,
# 5, 3 steps a warp, S 2 at BK 256 5, 4, S 4 at BK 256 3, 3, 3, 0, S 8 at BK 64 five steps (the last warp one)
RAGGED_TILES = [(2, 16, 128, 4), (2, 16, 128, 5), (4, 16, 64, 3), (4, 16, 64, 4), (4, 16, 128, 3), (4, 16, 128, 4),
                (2, 16, 256, 3), (4, 16, 256, 2), (4, 16, 256, 3), (8, 16, 64, 3), (8, 16, 128, 2), (8, 16, 128, 3)]


def _weights(N, K):
    w = torch.randint(-126, 127, (N, K), device=DEV, dtype=torch.int8).view(torch.uint8)
    w = torch.where((w & 0x7F) == 0x7F, w ^ 1, w).view(torch.float8_e4m3fn)
    s = torch.randint(112, 118, (triton.cdiv(N, 32), triton.cdiv(K, 32)), device=DEV, dtype=torch.uint8)
    return w, s


def _tiles(K, grid: str = "first"):
    """(S, RB, BK, stages) to time. "first" (run 1): S 4 / 8 / 16 × BK 32 / 64 / 128 × 2-4 stages at RB 16. "second"
    (run 2, after run 1 favoured few warps and wide k tiles): S 2 / 4 / 8 × BK 64 / 128 / 256 × 3-4 stages at RB 16,
    and RB 32 (two M tiles a warp: half the x bytes a weight byte, half the programs) at S 4 / 8 × BK 64 / 128."""
    out = []
    if grid == "first":
        cands = [(S, 16, BK, ns) for S in (4, 8, 16) for BK in (32, 64, 128) for ns in (2, 3, 4)]
    else:
        cands = [(S, 16, BK, ns) for S in (2, 4, 8) for BK in (64, 128, 256) for ns in (3, 4)]
        cands += [(S, 32, BK, ns) for S in (4, 8) for BK in (64, 128) for ns in (3, 4)]
    return [t for t in cands if K % (t[0] * t[2]) == 0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--grid", choices=("first", "second", "pairs", "spf", "two", "ragged"), default="second",
                    help="the tiles to time (`_tiles`); pairs: `tiles_for`'s tile with both weight decoders; spf: "
                         "the scale prefetch against the default; two: the byte-pair decoder's second scale factor "
                         "always, or one made in the loop or at the load; ragged: more warps or wider k tiles "
                         "than divide K evenly (the last slices masked), more stages, against the default")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ceil = measure_ceilings()
    doc = {**env_info(), "ceilings": ceil, "M": M, "rows": []}
    for name in args.shapes.split(","):
        N, K, gated = SHAPES[name]
        w, s = _weights(N, K)
        w3, s3 = _weights(N, K) if gated else (None, None)
        x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
        lim = 10.0
        if gated:
            ref = fg.fp8_gemm_swiglu_reference(x, w, s, w3, s3, lim).float()
        else:
            ref = x.float() @ formats.dequant_fp8_weight(w, s, dtype=torch.bfloat16).float().T
        wbytes = N * K * (1 + 1 / 1024) * (2 if gated else 1)
        floor = (wbytes + M * K * 2 + M * N * 2) / (ceil["copy_TBps"] * 1e12) * 1e3

        def default():
            return fg._gemm(x, w, s, w3, s3, lim, False, None, name)

        def split(t, **kw):  # the warp-split kernel at tiles t (kw: pairs, spf)
            return lambda: ws.fp8_gemm_warp_split(x, w, s, w3, s3, lim, tiles=t, name=name, **kw)

        def timed(label, fn, tiles=None):
            row = {"shape": name, "M": M, "N": N, "K": K, "gated": gated, "variant": label, "tiles": tiles}
            try:
                row["rel_err"] = rel_err(fn(), ref)
                t = ms_graph(fn)
                row["warm_ms"] = t if isinstance(t, str) else float(t)
                row["cold_ms"] = None if isinstance(t, str) else t.cold
                if row["cold_ms"]:
                    row["cold_over_floor"] = row["cold_ms"] / floor
            except Exception as e:  # noqa: BLE001 - a tile that does not compile is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            row["floor_ms"] = floor
            doc["rows"].append(row)
            print(name, label, {k: (round(v * 1e3, 2) if isinstance(v, float) and k.endswith("ms") else v)
                                for k, v in row.items() if k in ("rel_err", "warm_ms", "cold_ms", "error")}, flush=True)
            write_json(args.out, doc)
            return row

        if args.grid == "spf":  # the scale prefetch off / on at 128- and 256-wide k tiles (where K tiles), twice
            S_, RB_, _, ns_ = ws.tiles_for(N, K, gated)
            cands = [((S_, RB_, bk, ns_), on) for bk in (128, 256) if K % (S_ * bk) == 0 for on in (False, True)]
            for rep in ("", "_again"):
                timed("default" + rep, default)
                for t, on in cands:
                    timed(f"ws_spf{int(on)}_S{t[0]}_bk{t[2]}_ns{t[3]}" + rep, split(t, spf=on), list(t))
            continue
        if args.grid == "two":  # the second scale factor always (the loop before TWO), or one factor made in the loop or
            # where the bytes load (early), twice
            t = ws.tiles_for(N, K, gated)
            for rep in ("", "_again"):
                timed("default" + rep, default)
                timed("ws_two" + rep, split(t, two=True), t)
                for early in (False, True):
                    timed(f"ws_one_early{int(early)}" + rep, split(t, two=False, early=early), t)
            continue
        if args.grid == "ragged":  # tiles whose k tiles do not split evenly over the warps (the last
            # slices' extra steps masked), and more stages (more weight bytes in flight a program), twice, interleaved
            cands = [t for t in RAGGED_TILES if K % t[2] == 0 and t != ws.tiles_for(N, K, gated)]
            for rep in ("", "_again"):
                timed("default" + rep, default, list(ws.tiles_for(N, K, gated)))
                for t in cands:
                    ragged = (K // t[2]) % t[0] != 0
                    timed(f"ws_S{t[0]}_bk{t[2]}_ns{t[3]}{'_ragged' if ragged else ''}" + rep, split(t), list(t))
            continue
        if args.grid == "pairs":  # the default tile with the per-element and the byte-pair decoder, interleaved, twice
            t = ws.tiles_for(N, K, gated)
            for rep in ("", "_again"):
                timed("default" + rep, default)
                timed("ws_elements" + rep, split(t, pairs=False), t)
                timed("ws_pairs" + rep, split(t, pairs=True), t)
            continue
        timed("default", default)
        rows = [timed(f"ws_S{t[0]}_rb{t[1]}_bk{t[2]}_ns{t[3]}", split(t), t) for t in _tiles(K, args.grid)]
        timed("default_again", default)
        best = sorted((r for r in rows if r.get("cold_ms")), key=lambda r: r["cold_ms"])[:3]
        for r in best:
            timed(r["variant"] + "_again", split(tuple(r["tiles"])), r["tiles"])
        timed("default_third", default)
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
