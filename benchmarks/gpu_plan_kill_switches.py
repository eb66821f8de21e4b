"""A pass changes speed, never the answer: the float32 GPU plan, interpreted, against the cpu plan with each pass switched off.

    python3 benchmarks/gpu_plan_kill_switches.py [--preset mini] [--target cuda:sm90] [--out FILE]

For the pipeline's passes that rewrite a GPU plan (`DSV41C_DISABLE_<PASS>=1` is each one's kill switch,
passes/manager.py), the `--target` verification build (float32 activations, kv-quant off, no binaries)
is compiled with that pass off and run with every kernel call in Triton's interpreter; its prefill
logits and greedy tokens are compared with the cpu plan's (the goal: logits rel-L2 <= 1e-4, the same
tokens), and with no pass off as the baseline row. Runs on a machine without a GPU. Writes JSON
(default benchmarks/results/gpu_plan_kill_switches_<preset>_<target>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PASSES = ("", "share-csa2-state", "fuse-compressor", "lower-kv-fp4", "lower-indexer-int8", "schedule-streams",
          "plan-memory")

_CHILD = r"""
import json, sys, torch
import dsv41c
from dsv41c.driver import build_artifact
preset, target, path, cpu = sys.argv[1:5]
build_artifact(path, preset=preset, target=target, kv_quant=False, activation_dtype="float32", kernels=False)
gpu = dsv41c.load(path, interpret=True)
ref = dsv41c.load(cpu)
prompt = list(range(3, 19))
a, b = gpu.prefill(gpu.new_session(), prompt), ref.prefill(ref.new_session(), prompt)
rel = float((a.double() - b.double()).norm() / b.double().norm())
kc = {}
for op in gpu.program["decode"].ops:
    k = op.rec.get("kernel")
    if k:
        kc[k["template"]] = kc.get(k["template"], 0) + 1
print(json.dumps({"prefill_rel_l2": rel, "tokens_equal": gpu.generate(prompt, 8) == ref.generate(prompt, 8),
                  "decode_kernel_calls": kc}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--target", default="cuda:sm90")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"gpu_plan_kill_switches_{args.preset}_{args.target.replace(':', '_')}.json")
    res = {"what": "float32 GPU plan interpreted vs the cpu plan, kv-quant off, each pass switched off",
           "preset": args.preset, "target": args.target, "rows": []}
    with tempfile.TemporaryDirectory() as work:
        cpu = os.path.join(work, "cpu.dsv41c")
        from dsv41c.driver import build_artifact

        build_artifact(cpu, preset=args.preset, target="cpu", kv_quant=False)
        for p in PASSES:
            env = dict(os.environ)
            if p:
                env["DSV41C_DISABLE_" + p.upper().replace("-", "_")] = "1"
            path = os.path.join(work, f"gpu-{p or 'all'}.dsv41c")
            r = subprocess.run([sys.executable, "-c", _CHILD, args.preset, args.target, path, cpu], env=env,
                               capture_output=True, text=True)
            row = {"disabled": p or None}
            if r.returncode == 0:
                row.update(json.loads(r.stdout.strip().splitlines()[-1]))
            else:
                row["error"] = (r.stderr.strip().splitlines() or ["?"])[-1][:500]
            res["rows"].append(row)
            print(f"{p or '(none off)':20s} " + (f"rel-L2 {row['prefill_rel_l2']:.2e} tokens equal {row['tokens_equal']}"
                                                 if "error" not in row else f"error: {row['error']}"), flush=True)
            with open(out, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
