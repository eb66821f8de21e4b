"""Run the CPU-tier kernel tests on a GPU, compiled (no interpreter), one test file a process.

Why: the CPU tier checks every kernel at small widths in Triton's interpreter, which runs programs one after another
and multiplies in fp32; the `gpu` tier checks the model's widths. Compiled kernels at small widths fall between the
two. Their first run on the H200 found two kernels wrong there (FP8/FP4 attention under 64
heads; the gate-once router with fewer programs than tokens, whose stuck counters then caused an illegal address that
failed every later test of the same process). So each file runs in its own process (a fresh CUDA context), with
TRITON_INTERPRET unset, and the summary names each file's failures and its first error line. The latest run, all nine
files on the H200, passed every test (results/cpu_tier_on_gpu.json; the FFN file re-run after its fix:
results/cpu_tier_on_gpu_ffn.json). A cold Triton
cache makes the FFN file's compiles take over 200 s.

`python3 benchmarks/cpu_tier_on_gpu.py --out benchmarks/results/cpu_tier_on_gpu.json [FILE ...]` (a CUDA GPU;
default: every tests/test_kernels_*.py). Tests whose small shapes a compiled kernel cannot take skip themselves there
(e.g. key blocks below 16).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_file(path: str, timeout: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:warnings", "-o", "addopts=", "-q", "-rfE", "-m", "not gpu", path]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), None
    tail = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|error|deselected).*?)\s*=*$", out, flags=re.M)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    first = next((ln for ln in out.splitlines() if ln.startswith("E ")), "")
    return {"file": path, "rc": rc, "summary": tail[-1] if tail else "timed out" if rc is None else "",
            "failed": failed, "first_error": first[:300], "wall_s": round(time.time() - t0, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="test files (default: tests/test_kernels_*.py)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a file (default 600)")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_kernels_*.py"))
    rows = []
    for f in files:
        r = run_file(f, args.timeout)
        rows.append(r)
        print(f"{f}: {r['summary']} ({r['wall_s']} s){'  ' + r['first_error'] if r['failed'] else ''}", flush=True)
        if args.out:  # after each file, so a call cut short still keeps what ran
            Path(args.out).write_text(json.dumps({"kind": "cpu_tier_on_gpu", "files": rows}, indent=1))
    return 0 if all(r["rc"] in (0, 5) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
