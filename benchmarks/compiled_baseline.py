"""The kernels against torch.compile of their eager PyTorch references, same run, same GPU.

For each case (the decode shapes that carry the 2x-of-the-bytes-floor goal, and the main prefill ones, at the published
widths, on the same random inputs as benchmarks/kernels_ffn.py and kernels_attention.py):
- ours: the Triton kernel's do_bench median and, at decode shapes, its CUDA-graph replay (L2 warm and cold);
- eager: the reference's do_bench median;
- compiled: `torch.compile(reference)` (Inductor, default mode, dynamic=False): its compile seconds, its do_bench
  median, at decode shapes its CUDA-graph replay (warm and cold) where the compiled code can be captured (a
  reference that synchronizes with the host, `.tolist()` or `torch.unique`, cannot), and its output's relative
  difference from the eager reference (the compiled code must compute the same function).
The ratio `ours_vs_compiled` compares like with like: graph replay L2-cold at decode shapes where both have one,
else do_bench medians. Every case runs in its own try/except; compiling stops (recorded as skipped) once the
compile seconds exceed --compile-budget.

    python benchmarks/compiled_baseline.py --out compiled_baseline.json [--only fp8,attention] [--cases REGEX]
        [--compile-budget 420]

Known gaps: the baseline is Inductor on OUR references, written for clarity and exactness, not for speed (the
MoE reference loops over the routed experts in Python; every reference dequantizes whole weight matrices before
its matmul); a faster hand-written PyTorch formulation would be a stronger baseline. Default mode only (no
max-autotune: its tuning runs would not fit a device call).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, measure_ceilings, ms, ms_graph, rel_err, write_json  # noqa: E402

DEV = "cuda"
# why a compiled reference is not replayed from a CUDA graph: the MoE reference loops over torch.unique(ids).tolist()
# (a host sync), and a failed capture leaves the CUDA RNG in capture mode, which breaks every later torch.randn
NO_CAPTURE = "the reference synchronizes with the host (torch.unique(...).tolist()): no CUDA-graph capture"
NO_CAPTURE_COMPRESS = ("not captured: the compiled compress_ref's capture failed on the H200 (cudaErrorStreamCapture"
                       "Invalidated, results/compiled_baseline.json run of 2026-11-30) and left the RNG in capture mode")


# ============================================================================ cases: (name, decode, ours, ref, args, kwargs)


def cases_fp8():
    from benchmarks.kernels_ffn import D, I, fp8_w, rnd
    from dsv41c.codegen.triton import fp8_gemm as fg
    for name, N, K, M in (("wq_a", 1280, 5120, 1), ("wq_a", 1280, 5120, 8), ("wo_b", 5120, 8192, 1),
                          ("wo_b", 5120, 8192, 8), ("shared_w2", 5120, 2304, 8), ("engram_wkv", 25600, 6144, 8),
                          ("wo_b", 5120, 8192, 8192)):
        def make(N=N, K=K, M=M):
            w, s = fp8_w(N, K)
            x = rnd(M, K)
            return lambda: fg.fp8_gemm(x, w, s), fg.fp8_gemm_reference, (x, w, s), {}
        yield f"fp8_gemm_{name}_M{M}", M <= 16, make
    for M in (1, 8, 8192):
        def make(M=M):
            w1, s1 = fp8_w(I, D)
            w3, s3 = fp8_w(I, D)
            x = rnd(M, D)
            return (lambda: fg.fp8_gemm_swiglu(x, w1, s1, w3, s3, 10.0), fg.fp8_gemm_swiglu_reference,
                    (x, w1, s1, w3, s3, 10.0), {})
        yield f"fp8_gemm_swiglu_shared_w13_M{M}", M <= 16, make


def cases_moe():
    from benchmarks.kernels_ffn import D, E, I, K_TOP, fp4_experts, fp8_w, rnd
    from dsv41c.codegen.triton import moe
    state = {}

    def weights():
        if not state:
            state["w"] = (*fp4_experts(E, I, D), *fp4_experts(E, I, D), *fp4_experts(E, D, I))
            state["gw"], state["bias"] = rnd(E, D, scale=0.02), rnd(E, dtype=torch.float32, scale=0.01)
        return state["w"], state["gw"], state["bias"]
    for T in (1, 8):
        def router(T=T):
            _, gw, bias = weights()
            x = rnd(T, D)
            return lambda: moe.router(x, gw, bias, K_TOP), moe.router_reference, (x, gw, bias, K_TOP), {}
        yield f"moe_router_T{T}", True, router

        def experts(T=T):
            (w1, s1, w3, s3, w2, s2), gw, bias = weights()
            x = rnd(T, D)
            tw, ti = moe.router(x, gw, bias, K_TOP)
            return (lambda: moe.moe_experts(x, ti, tw, w1, s1, w3, s3, w2, s2, 10.0), moe.moe_experts_reference,
                    (x, ti, tw, w1, s1, w3, s3, w2, s2, 10.0), {}, NO_CAPTURE)
        yield f"moe_fp4_experts_decode_T{T}", True, experts

        def ffn(T=T):
            (w1, s1, w3, s3, w2, s2), gw, bias = weights()
            shared = state.setdefault("shared", (*fp8_w(I, D), *fp8_w(I, D), *fp8_w(D, I)))
            x = rnd(T, D)
            kw = dict(top_k=K_TOP, route_scale=1.5, limit=10.0)
            return (lambda: moe.moe_forward(x, gw, bias, w1, s1, w3, s3, w2, s2, shared, **kw),
                    moe.moe_forward_reference, (x, gw, bias, w1, s1, w3, s3, w2, s2, shared), kw, NO_CAPTURE)
        yield f"moe_ffn_forward_T{T}", True, ffn


def cases_small():
    """mHC, Engram, RMSNorm at decode shapes (launch-bound: the comparison is launches against launches)."""
    from benchmarks.kernels_ffn import D, rnd
    from dsv41c.codegen.triton import engram as en
    from dsv41c.codegen.triton import mhc
    from dsv41c.codegen.triton import rmsnorm as rn
    for T in (1, 8):
        def pre(T=T):
            fn = rnd(24, 4 * D, dtype=torch.float32, scale=0.01)
            base = rnd(24, dtype=torch.float32, scale=0.5)
            scale = torch.rand(3, device=DEV) + 0.5
            H = rnd(T, 4, D, dtype=torch.float32)
            pp = torch.softmax(torch.randn(T, 4, device=DEV), -1)
            return (lambda: mhc.mhc_pre(H, pp, fn, base, scale, 1e-20, 1e-6), mhc.mhc_pre_reference,
                    (H, pp, fn, base, scale, 1e-20, 1e-6), {})
        yield f"mhc_pre_T{T}_float32", True, pre

        def gate(T=T):
            qw, kw = rnd(4, D), rnd(4, D)
            H = rnd(T, 4, D, dtype=torch.float32)
            kv = rnd(T, 5 * D)
            mask = torch.rand(T, device=DEV) > 0.1
            return (lambda: en.engram_gate(H, kv, qw, kw, 1e-20, mask), en.engram_gate_reference,
                    (H, kv, qw, kw, 1e-20, mask), {})
        yield f"engram_gate_T{T}", True, gate

    def norm():
        x, w = rnd(1, D), rnd(D)
        return lambda: rn.rmsnorm(x, w, 1e-20), rn.rmsnorm_reference, (x, w, 1e-20), {}
    yield "rmsnorm_T1", True, norm


def cases_attention():
    from benchmarks import compressor_inputs as ci
    from benchmarks.kernels_attention import _attn_data, _indexer_data, rope_table
    from dsv41c.codegen.triton import compressor as cm
    from dsv41c.codegen.triton import indexer as ix
    from dsv41c.codegen.triton import sparse_attention as sa
    cos, sin = rope_table(1 << 16)
    for S, batched in ((1, False), (64, True), (1024, False)):
        def attn(S=S, batched=batched):
            q, qpos, wkv, ckv, idx, sink, kw = _attn_data(S, True, batched=batched)
            args = (q, qpos, wkv, ckv, idx, sink, cos, sin)
            return lambda: sa.sparse_attention(*args, **kw), sa.sparse_attention_ref, args, kw
        label = "decode" if S == 1 else ("decode_batch" if batched else "prefill")
        yield f"sparse_attention_{label}_S{S}_fp8fp4", S <= 64, attn
    for ratio, T in ((1, 1), (2, 2)):
        def comp(ratio=ratio, T=T):
            a = ci.inputs(ratio, T)
            A, B = ci.bufs(ratio, a["J"]), ci.bufs(ratio, a["J"])
            ours = ci.call(cm.compress, ratio, a, cos, sin, A)
            args = (a["x"], a["wkv"], a["nw"], cos, sin, a["pos"], a["rows"], B[0], B[1])
            kw = dict(ratio=ratio, wgate=a["wg"] if ratio == 2 else None, latent_out=B[4], wk=a["wk"],
                      k_norm_w=a["knw"], idx_cache=B[2], idx_scale=B[3])
            return ours, cm.compress_ref, args, kw, NO_CAPTURE_COMPRESS
        yield f"compressor_r{ratio}_T{T}", True, comp
    H, T = 32, 131072
    for S in (1, 32):
        def score(S=S):
            qp, qe, w, kp, ke = _indexer_data(S, H, T, spread=S > 1)
            qpos = torch.full((S,), T + 5, dtype=torch.int32, device=DEV) - torch.arange(S, device=DEV,
                                                                                         dtype=torch.int32)
            nvis = ix.visible_counts(qpos, 1, T)
            wq = w.float() * 128 ** -0.5
            args = (qp, qe, wq, kp, ke, nvis)
            return lambda: ix.index_scores(*args), ix.index_scores_ref, args, {}
        yield f"indexer_score_S{S}_T{T}", S == 1, score


GROUPS = {"fp8": cases_fp8, "moe": cases_moe, "small": cases_small, "attention": cases_attention}


# ============================================================================ measurement


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [t for t in vars(out).values() if isinstance(t, torch.Tensor)] if hasattr(out, "__dict__") else []


def _rel(c: torch.Tensor, e: torch.Tensor) -> float:
    """Relative difference of a compiled output from the eager one: over the finite entries (masked scores are
    -inf in both; a position finite in one and not the other counts as 1.0); integer outputs: the mismatch share."""
    if not e.is_floating_point():
        return float((c != e).float().mean())
    c, e = c.float(), e.float()
    fin = torch.isfinite(e)
    if not torch.equal(fin, torch.isfinite(c)):
        return 1.0
    return rel_err(c[fin], e[fin]) if bool(fin.any()) else 0.0


def _graph(fn, rec, prefix):
    g = ms_graph(fn)
    if isinstance(g, float):
        rec[f"{prefix}_graph_ms"], rec[f"{prefix}_graph_cold_ms"] = float(g), g.cold
    else:
        rec[f"{prefix}_graph_error"] = g


def measure(name, decode, make, budget: dict) -> dict:
    rec = {"name": name, "decode": decode}
    ours, ref, args, kwargs, *no_capture = make()
    rec["ours_ms"] = ms(ours)
    if decode:
        _graph(ours, rec, "ours")
    eager = lambda: ref(*args, **kwargs)  # noqa: E731
    out_e = eager()
    rec["eager_ms"] = ms(eager, rep=50)
    rec["ours_vs_eager"] = rec["eager_ms"] / rec["ours_ms"]
    if budget["used"] >= budget["limit"]:
        rec["compile_skipped"] = f"compile budget of {budget['limit']:.0f} s used up"
        return rec
    torch._dynamo.reset()
    t0 = time.time()
    try:
        cfn = torch.compile(ref, dynamic=False)
        comp = lambda: cfn(*args, **kwargs)  # noqa: E731
        out_c = comp()
        torch.cuda.synchronize()
        rec["compile_s"] = time.time() - t0
        te, tc = _tensors(out_e), _tensors(out_c)
        if te and len(te) == len(tc):
            rec["compiled_vs_eager_rel"] = max(_rel(c, e) for c, e in zip(tc, te))
        rec["compiled_ms"] = ms(comp, rep=50)
        if decode and no_capture:
            rec["compiled_graph_error"] = no_capture[0]
        elif decode:
            _graph(comp, rec, "compiled")
    except Exception as ex:  # noqa: BLE001 - recorded; the eager numbers stand
        rec["compile_error"] = f"{type(ex).__name__}: {ex}"[:400]
    finally:
        budget["used"] += time.time() - t0
    # like with like: L2-cold graph replay at decode shapes where both have one, else do_bench medians
    if decode and rec.get("compiled_graph_cold_ms") is not None and rec.get("ours_graph_cold_ms") is not None:
        rec["ratio_basis"] = "graph_cold"
        rec["ours_vs_compiled"] = rec["compiled_graph_cold_ms"] / max(rec["ours_graph_cold_ms"], 1e-6)
    elif rec.get("compiled_ms"):
        rec["ratio_basis"] = "do_bench"
        rec["ours_vs_compiled"] = rec["compiled_ms"] / rec["ours_ms"]
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--only", default="", help="comma-separated groups: " + ", ".join(GROUPS))
    ap.add_argument("--compile-budget", type=float, default=420.0, help="seconds of torch.compile in all")
    ap.add_argument("--cases", default="", help="a regular expression: only the cases whose names match it")
    args = ap.parse_args(argv)
    groups = [g for g in args.only.split(",") if g] or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {unknown}; known: {', '.join(GROUPS)}")
    torch.manual_seed(0)
    doc = {"kind": "compiled_baseline", "env": env_info(), "ceilings": measure_ceilings(), "results": []}
    budget = {"used": 0.0, "limit": args.compile_budget}
    for g in groups:
        for name, decode, make in GROUPS[g]():
            if args.cases and not re.search(args.cases, name):
                continue
            try:
                rec = measure(name, decode, make, budget)
            except Exception as ex:  # noqa: BLE001 - one failing case keeps the rest
                rec = {"name": name, "error": f"{type(ex).__name__}: {ex}"[:400],
                       "traceback": traceback.format_exc()[-2000:]}
            doc["results"].append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "traceback"}, default=str), flush=True)
            write_json(args.out, doc)
            torch.cuda.empty_cache()
    print(f"\n{'case':40s} {'ours µs':>9s} {'eager µs':>9s} {'compiled µs':>11s} {'x compiled':>10s} basis")
    for r in doc["results"]:
        o = r.get("ours_graph_cold_ms") if r.get("ratio_basis") == "graph_cold" else r.get("ours_ms")
        c = r.get("compiled_graph_cold_ms") if r.get("ratio_basis") == "graph_cold" else r.get("compiled_ms")
        f = lambda v: f"{v * 1e3:9.1f}" if isinstance(v, float) else f"{'-':>9s}"  # noqa: E731
        print(f"{r['name']:40s} {f(o)} {f(r.get('eager_ms'))} {f(c):>11s} "
              f"{r.get('ours_vs_compiled', float('nan')):9.1f}x {r.get('ratio_basis', r.get('error', r.get('compile_error', r.get('compile_skipped', ''))))[:40]}")
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
