"""What a decode kernel adds to a decode step: its L2-cold time behind its real predecessor, with and without PDL.

Why: the kernel tables time each decode kernel alone, replayed from a CUDA graph with the L2 flushed. Alone, a
kernel pays its launch, its first DRAM round trip and the ramp of its request stream before any bytes flow; for
a few MB of weights that fixed cost is most of the time (read_floor.py measures it: ~2.75 µs). In a decode step
every kernel has a predecessor, and under programmatic dependent launch (codegen/triton/pdl.py) a kernel may be
scheduled while its predecessor still runs and read its *weights* (static data) before its grid-dependency wait.
This script measures that: for each case, a two-kernel chain (predecessor P, then the kernel K on P's output),

- `pred_ms`: P alone, L2-cold graph replay (`common.ms_graph(...).cold`: flush + graph minus flush alone),
- `chain_ms`: P then K in one graph, L2-cold the same way,
- `step_ms` = chain_ms - pred_ms: what K adds to the step (~0.5 µs noise a median, so ~0.7 µs on the difference),
- `alone_ms`: K alone, L2-cold (what the tables report),

for each variant of the launch: `serial` (PDL off everywhere: plain stream order), `pdl` (P releases its dependents
at its start, K is PDL-launched and issues only address math before its wait: the kernels' defaults), and, where
the kernel can request its weights before the wait, `pdl_early` (the one-token gemv's first weight tile loaded before
the wait: EARLY_W), or
`pdl` itself (the decode compressor loads its weights before the wait when PDL is on).
Every variant's output must equal the serial one's bits (checked; recorded as `same_bits`). Variants are timed
`--repeat` times, interleaved.

Cases (published widths, the same random weights as kernels_ffn.py / compressor_inputs.py):
- `wq_a_M1`, `wq_a_M8`: RMSNorm(h) [T, 5120] -> the FP8 wq_a GEMM (1280 x 5120) on it; `shared_w13_M1`: the same
  norm -> the shared expert's gated w1/w3 (2 x 2304 x 5120), also at 8 tokens; `wo_b_M1`, `wo_b_M8`: a norm of
  width 8192 (standing in for wo_a, its real predecessor) -> wo_b (5120 x 8192),
- `shared_w2_M8`: the shared expert's gated w1/w3 GEMM [8, 5120] -> [8, 2304] -> the FP8 w2 GEMM (5120 x 2304),
- `router_T8`, `router_T1` (and `router_T2`, `router_T4`): RMSNorm(h) [T, 5120] -> the gate-once decode router (384 x 5120 bf16 gate; variants: its
  default tile and two others, whose sums and so bits differ from the serial row's); `router_T8_gemv`,
  `router_T1_gemv`: the same behind the norm on the per-token GEMV router (`router_decode_kernel`; `pdl_early`: its
  first gate tile and the biases loaded before the wait, EARLY),
- `compressor_r1_T1`, `compressor_r2_T2`: RMSNorm(h) -> the one-launch decode compressor (wkv 512 x 5120 bf16,
  + wgate at ratio 2, + the indexer key).
The bytes floor of each case is K's bytes (as in the kernel tables) over the copy bandwidth measured in the run;
`budget_ms` = 2x that floor (the decode goal).

    python benchmarks/step_chain.py --out benchmarks/results/step_chain.json [--only wq_a] [--repeat 2]

Known gaps: one predecessor per case (the kernel that produces K's input in the decode step; the step's other
neighbours, e.g. a side stream, are not modelled); P's own time moves a little with K behind it (an SM K occupies
early is not P's), which the difference charges to K; the one-query indexer is not here (its keys are written by
the compressor just before it, so nothing it reads is static).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks import compressor_inputs as ci  # noqa: E402
from benchmarks.common import DEV, env_info, measure_ceilings, ms_graph, write_json  # noqa: E402
from benchmarks.kernels_ffn import fp8_w, rnd  # noqa: E402  (the kernel tables' random weights)
from dsv41c.codegen.triton import compressor as cm  # noqa: E402
from dsv41c.codegen.triton import fp8_gemm as fg  # noqa: E402
from dsv41c.codegen.triton import moe_router  # noqa: E402
from dsv41c.codegen.triton import rmsnorm as rn  # noqa: E402

D, I, E, K_TOP = 5120, 2304, 384, 6
EPS = 1e-20


def _fp8_bytes(M, N, K):
    return N * K * (1 + 1 / 1024) + M * K * 2 + M * N * 2


class Case:
    """A chain: pred(pdl) -> its output; kernel(out, variant) -> K's output. `variants` maps a name to the launch
    options K takes; `pdl` says whether the variant runs with PDL."""

    def __init__(self, name, bytes_, pred, kernel, variants):
        self.name, self.bytes, self.pred, self.kernel, self.variants = name, bytes_, pred, kernel, variants


def _fp8_variants(M):
    """serial / pdl / at one token the gemv's EARLY_W (the warp split's, measured in tuning/step_chain_m8_early_w.json,
    was removed, as was the L2 bulk prefetch of the weight rows: slower). EARLY_W is the gemv's default, so the other
    variants pin it off: each adds one thing to the serialized launch."""
    out = {"serial": {"pdl": False}, "pdl": {"pdl": True}}
    for v in out.values():
        v["early_w"] = False
    if M == 1:
        out["pdl_early"] = {"pdl": True, "early_w": True}
    return out


def _fp8_kw(v):
    """The _gemm options of a variant (None: the launcher's default)."""
    return {"pdl": v["pdl"], "early_w": v.get("early_w")}


def case_norm_linear(name, M, N, K, gated=False):
    """RMSNorm(h) [M, K] -> the FP8 linear (N x K; gated: the shared expert's w1/w3 with SwiGLU) on it. For wq_a and
    shared w1/w3 the norm is the real predecessor; for wo_b (whose real one is wo_a) a norm of its input width
    stands in: a short kernel producing its input."""
    h, nw = rnd(M, K), (1 + 0.1 * torch.randn(K, device=DEV)).to(torch.bfloat16)
    w, s = fp8_w(N, K)
    w3, s3 = fp8_w(N, K) if gated else (None, None)

    def kernel(x, v):
        return fg._gemm(x, w, s, w3, s3, 10.0 if gated else 0.0, False, None, "fp8_gemm", **_fp8_kw(v))
    return Case(f"{name}_M{M}", _fp8_bytes(M, N, K) + (N * K * (1 + 1 / 1024) if gated else 0),
                lambda pdl: rn.rmsnorm(h, nw, EPS, pdl=pdl), kernel, _fp8_variants(M))


def case_shared_w2(M):
    x = rnd(M, D)
    w1, s1 = fp8_w(I, D)
    w3, s3 = fp8_w(I, D)
    w2, s2 = fp8_w(D, I)

    def pred(pdl):
        return fg._gemm(x, w1, s1, w3, s3, 10.0, False, None, "fp8_gemm_swiglu", pdl=pdl)

    def kernel(hid, v):
        return fg._gemm(hid, w2, s2, None, None, 0.0, False, None, "fp8_gemm", **_fp8_kw(v))
    return Case(f"shared_w2_M{M}", _fp8_bytes(M, D, I), pred, kernel, _fp8_variants(M))


def case_router(T, gate_once=True):
    h, nw = rnd(T, D), (1 + 0.1 * torch.randn(D, device=DEV)).to(torch.bfloat16)
    gw, bias = rnd(E, D, scale=0.02), (torch.randn(E, device=DEV) * 0.01).float()

    def kernel(x, v):
        return moe_router.router(x, gw, bias, K_TOP, pdl=v["pdl"], gate_once=gate_once, fused=True,
                                 tiles=v.get("tiles"), early=v.get("early", False))
    # gate_once: the kernel that reads the gate once for every token (its sums are MMA sums: its own bits), else
    # the per-token GEMV (router_decode_kernel)
    variants = {"serial": {"pdl": False}, "pdl": {"pdl": True}}
    if gate_once:
        for be, ks in ((16, 1024), (32, 256)):
            variants[f"pdl_{be}x{ks}"] = {"pdl": True, "tiles": (be, ks)}
    else:  # the GEMV's first gate tile and the biases before its wait (EARLY; the same bits)
        variants["pdl_early"] = {"pdl": True, "early": True}
    return Case(f"router_T{T}{'' if gate_once else '_gemv'}", E * D * 2 + T * D * 2 + T * K_TOP * 8,
                lambda pdl: rn.rmsnorm(h, nw, EPS, pdl=pdl), kernel, variants)


def case_compressor(ratio):
    T = ratio
    cos, sin = ci.rope_table(1 << 16)
    a = ci.inputs(ratio, T)
    nw = (1 + 0.1 * torch.randn(ci.D, device=DEV)).to(torch.bfloat16)
    out = ci.bufs(ratio, a["J"])
    h = a["x"]

    def kernel(x, v):
        b = dict(a, x=x)
        ci.call(cm.compress, ratio, b, cos, sin, out, decode_cfg={"pdl": v["pdl"]})()
        return out  # the caches it wrote (no copy inside the timed graph)
    J = a["J"]
    bytes_ = T * ci.D * 2 + ratio * ci.C * ci.D * 2 + J * (ci.C // 2 + ci.C // 16 + ci.CI // 2 + ci.CI // 32
                                                          + ci.C * (2 if ratio == 1 else 4))
    return Case(f"compressor_r{ratio}_T{T}", bytes_, lambda pdl: rn.rmsnorm(h, nw, EPS, pdl=pdl), kernel,
                {"serial": {"pdl": False}, "pdl": {"pdl": True}})


CASES = {"wq_a_M1": lambda: case_norm_linear("wq_a", 1, 1280, D), "wq_a_M8": lambda: case_norm_linear("wq_a", 8, 1280, D),
         "wo_b_M1": lambda: case_norm_linear("wo_b", 1, D, 8192), "wo_b_M8": lambda: case_norm_linear("wo_b", 8, D, 8192),
         "shared_w13_M8": lambda: case_norm_linear("shared_w13", 8, I, D, gated=True),
         "shared_w13_M1": lambda: case_norm_linear("shared_w13", 1, I, D, gated=True),
         "shared_w2_M8": lambda: case_shared_w2(8),
         "router_T8": lambda: case_router(8), "router_T1": lambda: case_router(1),
         "router_T8_gemv": lambda: case_router(8, False), "router_T1_gemv": lambda: case_router(1, False),
         "router_T2": lambda: case_router(2), "router_T4": lambda: case_router(4),
         "router_T2_gemv": lambda: case_router(2, False), "router_T4_gemv": lambda: case_router(4, False),
         "compressor_r1_T1": lambda: case_compressor(1),
         "compressor_r2_T2": lambda: case_compressor(2)}


def _cold(fn):
    t = ms_graph(fn)
    return getattr(t, "cold", None) if isinstance(t, float) else None


def _bits(out) -> torch.Tensor:
    """A kernel's output(s) as one byte tensor (a copy), for the bit comparison outside the timed graphs."""
    ts = out if isinstance(out, (tuple, list)) else (out,)
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in ts])


def timed(case: Case, vname: str, ref_out, floor_ms: float) -> tuple:
    """One variant of one case: alone / pred / chain, L2-cold; -> (its JSON row, the output's bits)."""
    v = case.variants[vname]
    x = case.pred(v["pdl"])
    out = _bits(case.kernel(x, v))
    torch.cuda.synchronize()
    same = ref_out is None or torch.equal(out, ref_out)
    alone = _cold(lambda: case.kernel(x, v))
    pred = _cold(lambda: case.pred(v["pdl"]))
    chain = _cold(lambda: case.kernel(case.pred(v["pdl"]), v))
    step = chain - pred if chain is not None and pred is not None else None
    row = {"case": case.name, "variant": vname, **{k: (v2 if isinstance(v2, (bool, int, float, str)) else str(v2))
                                                   for k, v2 in v.items()},
           "alone_ms": alone, "pred_ms": pred, "chain_ms": chain, "step_ms": step, "floor_ms": floor_ms,
           "budget_ms": 2 * floor_ms, "same_bits": bool(same),
           "step_over_floor": step / floor_ms if step is not None else None,
           "alone_over_floor": alone / floor_ms if alone is not None else None}
    return row, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file (written after each case)")
    ap.add_argument("--only", default=None, help="regex over case names")
    ap.add_argument("--variants", default=None, help="regex over variant names")
    ap.add_argument("--repeat", type=int, default=2, help="times each variant is timed, interleaved")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("step_chain.py: needs a CUDA GPU (it times CUDA-graph replays)")
    torch.manual_seed(0)
    ceil = measure_ceilings()
    bw = ceil["copy_TBps"] * 1e12
    doc = {**env_info(), "ceilings": ceil, "rows": []}
    for name, make in CASES.items():
        if args.only and not re.search(args.only, name):
            continue
        t0 = time.time()
        case = make()
        floor_ms = case.bytes / bw * 1e3
        names = [n for n in case.variants if not args.variants or n == "serial" or re.search(args.variants, n)]
        ref = None
        for r in range(args.repeat):
            for vn in names:
                try:
                    row, out = timed(case, vn, ref, floor_ms)
                except Exception as e:  # noqa: BLE001 - recorded, the other cases go on
                    row, out = {"case": case.name, "variant": vn, "error": f"{type(e).__name__}: {e}"[:300]}, None
                if ref is None and vn == "serial" and out is not None:
                    ref = out.clone()
                row["repeat"] = r
                doc["rows"].append(row)
                st = row.get("step_ms")
                print(f"{case.name:18s} {vn:14s} alone {row.get('alone_ms') or math.nan:8.4f}  step "
                      f"{st if st is not None else math.nan:8.4f}  budget {2 * floor_ms:.4f}  "
                      f"bits {'ok' if row.get('same_bits') else row.get('error', 'DIFFER')}", flush=True)
        print(f"  ({case.name}: {time.time() - t0:.0f} s)", flush=True)
        write_json(args.out, doc)
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
