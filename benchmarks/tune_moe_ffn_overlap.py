"""Time the MoE FFN's decode chain under CUDA-graph replay, warm and L2-cold: the router in one launch
(`moe_router.router(fused=True)`, the default) vs two (logits, then top-k), alone and inside the whole FFN,
with the shared expert on the main stream or on a side stream (moe_forward's `overlap_shared`); check that
every variant gives the same bits. Each FFN variant is timed --repeat times, interleaved (the run-to-run
spread is ~1 µs), each row kept.

At 1 and 8 tokens (hidden 5120, 384 experts top-6, inter 2304, the FP8 shared expert), with the same random
weights and router as benchmarks/kernels_ffn.py. The floor is the bytes of the unique routed experts, the
gate and the shared expert over the copy bandwidth measured here.

    python benchmarks/tune_moe_ffn_overlap.py --out tune_moe_ffn_chain.json

Earlier runs (tuning/tune_moe_ffn_chain_fused_router.json is the last of four; the others in git history) also timed the side stream at the highest priority (run 1:
no difference at one token, slower at eight) and, with code since reverted (git history: "router + MoE prep in one launch"), the router and
the experts' prep kernel in one launch with the fused router's PDL release at its start or exit (runs 2-4):
no better than the best configuration without it at either token count (run 4, L2-cold: one token 72.5 vs
72.9 µs, eight tokens 400.6 vs 399.8 µs), and 7 µs worse at one token with the early release.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, measure_ceilings, ms_graph, write_json  # noqa: E402
from benchmarks.kernels_ffn import D, E, I, K_TOP, _expert_bytes, fp4_experts, fp8_w, rnd  # noqa: E402
from dsv41c.codegen.triton import moe, moe_router  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=2, help="times each FFN variant is timed, interleaved")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ceil = measure_ceilings()
    doc = {**env_info(), "ceilings": ceil, "rows": []}
    w1, s1 = fp4_experts(E, I, D)
    w3, s3 = fp4_experts(E, I, D)
    w2, s2 = fp4_experts(E, D, I)
    gw, bias = rnd(E, D, scale=0.02), rnd(E, dtype=torch.float32, scale=0.01)
    shared = (*fp8_w(I, D), *fp8_w(I, D), *fp8_w(D, I))
    kw = dict(top_k=K_TOP, route_scale=1.5, limit=10.0)
    fused_router = moe.router  # moe_forward calls moe.router: swapped below for the two-launch form
    two_launch = functools.partial(moe_router.router, fused=False)

    def timed(name, f, floor, **meta):
        t = ms_graph(f)
        cold = getattr(t, "cold", None)
        row = {"case": name, **meta, "graph_ms": t if isinstance(t, float) else str(t), "graph_cold_ms": cold,
               "floor_ms": floor, "cold_over_floor": cold / floor if isinstance(cold, float) and floor else None}
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)

    per_sm0 = moe_router.GEMV_PROGRAMS_PER_SM
    for T in (1, 2, 4, 8):  # the fused router's K split: ~c programs per SM for c = 4, 8, 16
        x = rnd(T, D)
        rfloor = (E * D * 2 + T * D * 2) / (ceil["copy_TBps"] * 1e12) * 1e3
        for c in (4, 8, 16):
            moe_router.GEMV_PROGRAMS_PER_SM = c
            try:
                split = moe_router._gemv_split(T, E, D, moe_router.GEMV_BK)[0]
                timed("router_split", lambda: moe_router.router(x, gw, bias, K_TOP), rfloor, T=T, programs_per_sm=c,
                      split=split)
            finally:
                moe_router.GEMV_PROGRAMS_PER_SM = per_sm0
    for T in (1, 8):
        x = rnd(T, D)
        _, ti = moe.router(x, gw, bias, K_TOP)
        rfloor = (E * D * 2 + T * D * 2) / (ceil["copy_TBps"] * 1e12) * 1e3
        outs = {}
        for fused in (True, False):
            outs[fused] = moe_router.router(x, gw, bias, K_TOP, fused=fused)
            timed("router", lambda fused=fused: moe_router.router(x, gw, bias, K_TOP, fused=fused), rfloor, T=T,
                  fused_router=fused)
        doc["rows"].append({"case": "router", "T": T, "same_bits": all(
            torch.equal(a, b) for a, b in zip(outs[True], outs[False]))})
        floor = (_expert_bytes(ti) + E * D * 2 + 3 * I * D * (1 + 1 / 1024)) / (ceil["copy_TBps"] * 1e12) * 1e3
        outs = {}
        variants = [(f"router {'one launch' if fused else 'two launches'}, {'overlap' if ov else 'one stream'}",
                     fused, ov) for fused in (True, False) for ov in (True, False)]
        for rep, (label, fused, ov) in [(r, v) for r in range(args.repeat) for v in variants]:
            moe.router = fused_router if fused else two_launch
            try:
                f = lambda ov=ov: moe.moe_forward(x, gw, bias, w1, s1, w3, s3, w2, s2, shared, overlap_shared=ov, **kw)  # noqa: E731
                outs[label] = f()
                timed("ffn", f, floor, T=T, variant=label, fused_router=fused, overlap_shared=ov, repeat=rep)
            finally:
                moe.router = fused_router
        torch.cuda.synchronize()
        ref = next(iter(outs.values()))
        same = all(torch.equal(ref, o) for o in outs.values())
        doc["rows"].append({"case": "ffn", "T": T, "same_bits": same})
        print(json.dumps({"case": "ffn", "T": T, "same_bits": same}), flush=True)
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
