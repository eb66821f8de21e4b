"""Time the fused KV compressor's decode paths on a GPU under CUDA-graph replay.

For ratio 1 (1 token) and ratio 2 (one pair, 2 tokens) at the real widths (x [T, 5120], wkv/wgate
[512, 5120], the fused indexer key wk [128, 512]), built as benchmarks/kernels_attention.py's
compressor case builds them:
- `two_launch`: the previous decode path (`_compress_gemv_kernel`, then `_compressor_kernel` with
  FROM_PART), `compress(..., fused_tail=False)`;
- `fused`: one launch (`_compress_decode_kernel`: split-K FMA GEMV, the last program to arrive runs
  the tail), `compressor.DECODE_CFG` defaults;
- `fused_<override>`: the fused launch with one `decode_cfg` override each (grid / tile variants);
  TUNE_TAIL_PF=1, TUNE_NO_IDX=1, TUNE_IDX_MMA=1 time other sets instead (the switches below).
Each is checked against `compress_ref` (code mismatch fractions, latent max error) and timed with
`ms_graph` (CUDA-graph replay median); the bytes floor counts x, wkv (+ wgate), wk and the outputs
over the copy bandwidth measured here. Prints a table; `--out` writes JSON.

    python benchmarks/tune_compressor_decode.py --out tune_compressor_decode.json [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, floor_ms, max_rel, measure_ceilings, ms_graph, write_json  # noqa: E402
from benchmarks.compressor_inputs import C, CI, D, DEV, bufs, call, rope_table  # noqa: E402
from benchmarks.compressor_inputs import inputs as _inputs  # noqa: E402
from dsv41c.codegen.triton import arrival  # noqa: E402
from dsv41c.codegen.triton import compressor as cm  # noqa: E402



def inputs(ratio, T, seed=0):
    torch.manual_seed(seed)
    return _inputs(ratio, T, pos0=1000)


# one override of DECODE_CFG each (the default is timed as `fused`)
VARIANTS = [{"BN": 16}, {"IBK": 256}, {"num_warps": 4}, {"IBK": 256, "maxnreg": 128}, {"tail_pf": True}]
if os.environ.get("TUNE_TAIL_PF") == "1":  # the tail's L2 prefetch only: on, off, on again, interleaved
    VARIANTS = [{"tail_pf": True}, {"tail_pf": False}, {"tail_pf": True}]
# TUNE_NO_IDX=1 (tuning/tune_compressor_noidx.json): the default launch without the fused indexer key (wk None: no wk GEMV, key norm, RoPE
# and pack in the tail), interleaved with it twice: what the indexer key's part of the serial tail costs
NO_IDX = os.environ.get("TUNE_NO_IDX") == "1"
# TUNE_IDX_MMA=1 (tuning/tune_compressor_idx_mma.json): the indexer key's product on the tensor cores (`_idx_linear_mma`) at IBK 128 / 64 /
# 256 against the default (FMA), twice, interleaved
IDX_MMA = os.environ.get("TUNE_IDX_MMA") == "1"


def errors(o, r):
    e = {"kv_code_mismatch_frac": float((o[0] != r[0]).float().mean()),
         "kv_scale_mismatch_frac": float((o[1] != r[1]).float().mean()), "latent": max_rel(o[4], r[4])}
    if o[2] is not None:
        e["index_code_mismatch_frac"] = float((o[2] != r[2]).float().mean())
        e["index_scale_mismatch_frac"] = float((o[3] != r[3]).float().mean())
    return e


def case(ceil, ratio, T, label, kw, ref):
    a, cos, sin = ref["a"], ref["cos"], ref["sin"]
    o = bufs(ratio, a["J"])
    t0 = time.time()
    kw = dict(kw)
    if kw.pop("no_idx", False):  # the indexer key's outputs stay zero: their mismatch fractions are not errors
        a = {**a, "wk": None, "knw": None}
        o = o[:2] + (None, None) + o[4:]
    f = call(cm.compress, ratio, a, cos, sin, o, **kw)
    f()
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    err = errors(o, ref["out"])
    outs = [t for t in o if t is not None]
    first = [t.clone() for t in outs]
    t_graph = ms_graph(f)
    repeat_identical = all(torch.equal(x, y) for x, y in zip(outs, first))  # after many replays
    counter = int(arrival.counters(DEV, 1)[0])
    fl, fb, _ = floor_ms(ceil, ref["bytes"])
    e = {"name": f"r{ratio}_T{T}_{label}", "ratio": ratio, "T": T, "variant": label, "kwargs": kw,
         "graph_ms": t_graph, "graph_cold_ms": getattr(t_graph, "cold", None), "bytes": ref["bytes"],
         "bytes_floor_ms": fb,
         "over_floor": t_graph / fb if isinstance(t_graph, float) else None,
         "launch_floor_ms": ceil.get("launch_floor_ms"), "first_call_s": round(compile_s, 1),
         "repeat_identical": repeat_identical, "counter_after": counter, **err}
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="only the two-launch and the default fused path")
    args = ap.parse_args()
    t_start = time.time()
    ceil = measure_ceilings()
    cos, sin = rope_table()
    rows = []
    for ratio, T in ((1, 1), (2, 2)):
        a = inputs(ratio, T)
        r = bufs(ratio, a["J"])
        call(cm.compress_ref, ratio, a, cos, sin, r)()
        J = a["J"]
        bytes_ = (T * D * 2 + ratio * C * D * 2 + CI * C * 2
                  + J * (C // 2 + C // 16 + CI // 2 + CI // 32 + C * (2 if ratio == 1 else 4)))
        ref = {"a": a, "cos": cos, "sin": sin, "out": r, "bytes": bytes_}
        variants = [("two_launch", {"fused_tail": False}), ("fused", {"fused_tail": True})]
        if IDX_MMA:
            variants = [("fused", {"fused_tail": True})] + [
                (f"fused_idx_mma_IBK{ibk}", {"fused_tail": True, "decode_cfg": {"idx_mma": True, "IBK": ibk}})
                for ibk in (128, 64, 256)]
            variants = variants * 2
        elif NO_IDX:
            variants = [("fused", {"fused_tail": True}), ("fused_noidx", {"fused_tail": True, "no_idx": True})] * 2
        elif not args.quick:
            variants += [("fused_" + "_".join(f"{k}{v}" for k, v in o.items()), {"fused_tail": True, "decode_cfg": o})
                         for o in VARIANTS]
        for label, kw in variants:
            try:
                e = case(ceil, ratio, T, label, kw, ref)
            except Exception as ex:  # noqa: BLE001 - one failing variant must not lose the others
                e = {"name": f"r{ratio}_T{T}_{label}", "error": f"{type(ex).__name__}: {ex}"[:400],
                     "traceback": traceback.format_exc()[-2000:]}
            rows.append(e)
            print(json.dumps({k: v for k, v in e.items() if k != "traceback"}, default=str), flush=True)
    print(f"\n{'case':<36} {'graph us':>9} {'x floor':>8} {'kv mism':>8} {'idx mism':>9} {'same':>5} {'cnt':>4}")
    for e in rows:
        if "error" in e:
            print(f"{e['name']:<36} ERROR {e['error'][:80]}")
            continue
        g = e["graph_ms"]
        gs = f"{g * 1e3:9.2f}" if isinstance(g, float) else f"{'n/a':>9}"
        xs = f"{e['over_floor']:8.1f}" if e["over_floor"] else f"{'':>8}"
        print(f"{e['name']:<36} {gs} {xs} {e['kv_code_mismatch_frac']:8.4f} {e.get('index_code_mismatch_frac', -1):9.4f} "
              f"{str(e['repeat_identical']):>5} {e['counter_after']:>4}")
    write_json(args.out, {"env": env_info(), "ceilings": ceil, "decode_cfg": cm.DECODE_CFG, "rows": rows,
                          "seconds": round(time.time() - t_start, 1)})


if __name__ == "__main__":
    main()
