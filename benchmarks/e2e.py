"""The end-to-end benchmark: eager PyTorch, torch.compile and a dsv41c artifact on one GPU, the same inputs.

    python3 benchmarks/e2e.py --artifact bench-sm90.dsv41c [dsv41c bench options...]

A thin front of `dsv41c bench` (dsv41c/bench_e2e.py holds the method: a process per system, seeded
weights generated on the device, cold prefill TTFT and tok/s, decode p50/p99, peak memory, the
per-kernel profile of one decode step and one prefill chunk, the copy and matmul ceilings and the
decode bytes roofline). Without `--out` the results go to benchmarks/results/e2e_<preset>_<gpu>.json.
Compile the artifact on the machine that runs it, so its kernel binaries match the installed Triton:
    dsv41c compile --preset bench --target cuda:sm90 -o bench-sm90.dsv41c
"""
from __future__ import annotations

import os
import re
import sys

from dsv41c.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--out" not in argv:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        preset = argv[argv.index("--preset") + 1] if "--preset" in argv else "bench"
        name = f"e2e_{preset}_{re.sub(r'[^A-Za-z0-9]+', '_', gpu).strip('_').lower()}.json"
        argv += ["--out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)]
    sys.exit(main(["bench"] + argv))
