"""What straight-line code costs when its instructions are fetched cold (the L2 flushed before the kernel).

Why: a first form of the gate-once router ran the top-k of all eight tokens in its last program: 4,800 more SASS
instructions than one token's (sm90), executed once, straight through. That cost 8 µs more than one token's in
warm graph replay and 28 µs more with the L2 flushed, though the data it touches is a few KB. The reading tested
here: a GPU fetches instructions through the L2 like data, so a kernel timed L2-cold (as the tables' decode
verdicts are) also fetches its code from DRAM, and a long stretch of code run once pays those fetches one cache
line after another.

What: one program of one warp runs 4·N fused multiply-adds over four dependent chains (32 lanes, no memory
traffic but one load and one store), either unrolled (`static_range`: 4·N instructions of code) or as a runtime
loop of the same count (a few lines of code). Times: warm graph replay and L2-cold (`common.ms_graph`), for several
N; the unrolled minus the loop form at the same N is the cost of the code's size, warm and cold.

    python benchmarks/icache_cold.py --out benchmarks/results/icache_cold.json

Known gaps: one warp of one program (a kernel whose programs all run the same code fetches it once an SM, not once a
program: what is measured is the single-program tail's case); the ~0.5 µs noise of a cold time.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import DEV, env_info, ms_graph, write_json  # noqa: E402


@triton.jit
def _fma_chains(x_ptr, y_ptr, n, N: tl.constexpr, UNROLL: tl.constexpr):
    offs = tl.arange(0, 32)
    a = tl.load(x_ptr + offs)
    b = a + 1.0
    c = a * 0.5
    d = a - 3.0
    if UNROLL:
        for _ in tl.static_range(N):
            a = a * b + c
            b = b * c + d
            c = c * d + a
            d = d * a + b
    else:
        for _ in range(0, n):
            a = a * b + c
            b = b * c + d
            c = c * d + a
            d = d * a + b
    tl.store(y_ptr + offs, a + b + c + d)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("icache_cold.py: needs a CUDA GPU (it times CUDA-graph replays)")
    x = torch.rand(32, device=DEV) * 1e-3
    y = torch.empty_like(x)
    doc = {**env_info(), "rows": []}
    for N in (64, 256, 1024, 2048):
        for unroll in (True, False):
            k = _fma_chains[(1,)](x, y, N, N=N if unroll else 1, UNROLL=unroll, num_warps=1)
            t = ms_graph(lambda: _fma_chains[(1,)](x, y, N, N=N if unroll else 1, UNROLL=unroll, num_warps=1))
            row = {"fmas": 4 * N, "unrolled": unroll, "cubin_bytes": len(getattr(k, "asm", {}).get("cubin", b"")),
                   "warm_ms": float(t) if not isinstance(t, str) else t, "cold_ms": getattr(t, "cold", None)}
            doc["rows"].append(row)
            print(row, flush=True)
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
