"""Static SASS size of every ahead-of-time kernel variant for one CUDA target (no GPU needed).

Why: code run once by one program is fetched from DRAM when the L2 is cold, and past ~64 KB (~4,000 SASS
instructions) that costs tens of µs (`benchmarks/icache_cold.py`). This lists each variant's instruction count, its
longest loop body (code a loop re-runs is fetched once) and its registers / stack, so long straight-line code shows.

    python benchmarks/sass_sizes.py --out benchmarks/results/sass_sizes.json [--target cuda:sm90]

Known gaps: static counts (what a program executes depends on its branches); the AOT constexprs, not every
runtime specialization; needs the installed Triton's cuobjdump (benchmarks/sass.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.sass import instructions, loop_bodies, registers_stack, sass_of  # noqa: E402
from dsv41c.codegen.aot_compat import compile_spec  # noqa: E402
from dsv41c.codegen.matrix import TARGETS  # noqa: E402
from dsv41c.codegen.templates import all_templates  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="cuda:sm90")
    args = ap.parse_args(argv)
    import triton
    rows = []
    for name, t in all_templates().items():
        for spec in t.specializations(args.target):
            try:
                text, usage = sass_of(compile_spec(spec, TARGETS[args.target]))
                loops = loop_bodies(text)
                row = {"template": name, "variant": spec.variant, "sass": len(instructions(text)),
                       "loop_body_max": max((len(b) for b in loops), default=0), "regs_stack": registers_stack(usage)}
            except Exception as e:  # noqa: BLE001 - recorded, the other variants go on
                row = {"template": name, "variant": spec.variant, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump({"target": args.target, "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
