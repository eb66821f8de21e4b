"""Decode-shape kernels under Nsight Compute: one profiled call per case, for `ncu --profile-from-start off`.

Each case builds its inputs at the published widths (the same generators as kernels_ffn.py and
kernels_attention.py), runs the call twice outside the profiled range (compilation, autotuning-free
warm-up), then once between cudaProfilerStart / cudaProfilerStop, so ncu collects exactly that call's
kernels (its default cache control flushes the caches before each kernel: the L2-cold case). Run as

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \\
        ... python3 benchmarks/profile_decode.py [--only fp8_wo_b_M1,moe_T1]

Nothing is timed here; the report is ncu's (run_h200.sh step `profile` writes it as text).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks import compressor_inputs as ci  # noqa: E402
from benchmarks.kernels_ffn import D, E, I, K_TOP, fp4_experts, fp8_w, rnd  # noqa: E402
from dsv41c.codegen.triton import compressor as cm  # noqa: E402
from dsv41c.codegen.triton import fp8_gemm as fg  # noqa: E402
from dsv41c.codegen.triton import moe  # noqa: E402


def fp8_case(N, K, M, gated=False):
    w, s = fp8_w(N, K)
    x = rnd(M, K)
    if gated:
        w3, s3 = fp8_w(N, K)
        return lambda: fg.fp8_gemm_swiglu(x, w, s, w3, s3, 10.0)
    return lambda: fg.fp8_gemm(x, w, s)


def moe_case(T, whole=False):
    w1, s1 = fp4_experts(E, I, D)
    w3, s3 = fp4_experts(E, I, D)
    w2, s2 = fp4_experts(E, D, I)
    gw, bias = rnd(E, D, scale=0.02), rnd(E, dtype=torch.float32, scale=0.01)
    x = rnd(T, D)
    if whole:
        shared = (*fp8_w(I, D), *fp8_w(I, D), *fp8_w(D, I))
        return lambda: moe.moe_forward(x, gw, bias, w1, s1, w3, s3, w2, s2, shared, top_k=K_TOP, route_scale=1.5,
                                       limit=10.0)
    tw, ti = moe.router(x, gw, bias, K_TOP)
    return lambda: moe.moe_experts(x, ti, tw, w1, s1, w3, s3, w2, s2, 10.0)


def attention_case(S):
    """S decode queries at the published widths, each over its own FP8 ring and FP4 region (batched: S > 1),
    as kernels_attention.py's `sparse_attention_decode{,_batch}` cases."""
    from benchmarks.kernels_attention import _attn_data, rope_table
    from dsv41c.codegen.triton import sparse_attention as sa
    cos, sin = rope_table(1 << 16)
    q, qpos, wkv, ckv, idx, sink, kw = _attn_data(S, True, batched=S > 1)
    return lambda: sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)


def engram_gate_case(T, inductor=False):
    """The Engram gate at T tokens as compiled_baseline.py's case (fp32 H, bf16 kv and weights, a token mask); with
    inductor, torch.compile of its reference instead (compiled here, before the profiled range)."""
    from benchmarks.kernels_ffn import D as HID
    from dsv41c.codegen.triton import engram as en
    qw, kw = rnd(4, HID), rnd(4, HID)
    H = rnd(T, 4, HID, dtype=torch.float32)
    kv = rnd(T, 5 * HID)
    mask = torch.rand(T, device=H.device) > 0.1
    if inductor:
        f = torch.compile(en.engram_gate_reference, dynamic=False)
        return lambda: f(H, kv, qw, kw, 1e-20, mask)
    return lambda: en.engram_gate(H, kv, qw, kw, 1e-20, mask)


def attention_inductor_case(S):
    """torch.compile of sparse attention's eager reference on attention_case's inputs."""
    from benchmarks.kernels_attention import _attn_data, rope_table
    from dsv41c.codegen.triton import sparse_attention as sa
    cos, sin = rope_table(1 << 16)
    q, qpos, wkv, ckv, idx, sink, kw = _attn_data(S, True, batched=S > 1)
    f = torch.compile(sa.sparse_attention_ref, dynamic=False)
    return lambda: f(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)


def compressor_case(ratio, T):
    cos, sin = ci.rope_table()
    a = ci.inputs(ratio, T)
    return ci.call(cm.compress, ratio, a, cos, sin, ci.bufs(ratio, a["J"]))


def indexer_score_case(S):
    from benchmarks.kernels_attention import _indexer_data
    from dsv41c.codegen.triton import indexer_score as ix

    T = 131072
    qp, qe, w, kp, ke = _indexer_data(S, 32, T, spread=False)
    nvis = ix.visible_counts(torch.full((S,), T + 5, dtype=torch.int32, device="cuda"), 1, T)
    wq = w.float() * 128 ** -0.5
    return lambda: ix.index_scores(qp, qe, wq, kp, ke, nvis)


def router_case(T):
    gw = rnd(E, D, scale=0.02)
    bias = rnd(E, dtype=torch.float32, scale=0.01)
    x = rnd(T, D)
    return lambda: moe.router(x, gw, bias, K_TOP)


CASES = {
    "fp8_wo_b_M1": lambda: fp8_case(5120, 8192, 1),
    "fp8_shared_w13_M1": lambda: fp8_case(I, D, 1, gated=True),
    "fp8_wq_a_M1": lambda: fp8_case(1280, 5120, 1),
    "fp8_wo_b_M8": lambda: fp8_case(5120, 8192, 8),
    "fp8_shared_w2_M8": lambda: fp8_case(D, I, 8),
    "fp8_shared_w13_M8": lambda: fp8_case(I, D, 8, gated=True),
    "moe_T1": lambda: moe_case(1),
    "moe_ffn_T1": lambda: moe_case(1, whole=True),
    "compressor_r1_T1": lambda: compressor_case(1, 1),
    "attn_S1": lambda: attention_case(1),
    "attn_batch_S64": lambda: attention_case(64),
    "attn_S1_inductor": lambda: attention_inductor_case(1),
    "engram_gate_T1": lambda: engram_gate_case(1),
    "engram_gate_T1_inductor": lambda: engram_gate_case(1, inductor=True),
    "engram_gate_T8": lambda: engram_gate_case(8),
    "engram_gate_T8_inductor": lambda: engram_gate_case(8, inductor=True),
    "indexer_score_S1": lambda: indexer_score_case(1),
    "router_T8": lambda: router_case(8),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated case names (default: all): " + ", ".join(CASES))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    cudart = torch.cuda.cudart()
    for name in names:
        fn = CASES[name]()
        fn(), fn()
        torch.cuda.synchronize()
        print(f"== profiling {name}", flush=True)
        torch.cuda.nvtx.range_push(name)
        cudart.cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
