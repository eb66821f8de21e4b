"""Static sm90 SASS of the decode MoE's ahead-of-time GEMV variants, both cores (no GPU needed).

For the backbone router's gate/up and down ("experts") variants of core 0 (fp4_gemv, CUDA-core FMAs) and core 1
(fp4_mma_gemv, mma.sync on registers): registers, stack, the main loop's length and its HMMA / FFMA / LDG / STS /
LDS counts, and the loop's SASS instructions per weight element a thread covers. Run it under each Triton
version (the device has 3.6, this machine 3.9):

    python benchmarks/moe_decode_sass.py benchmarks/results/moe_decode_sass.json

Known gaps: the loop is the longest backward branch (`benchmarks/sass.loop_bodies`); CUDA only.
"""
from __future__ import annotations

import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import triton  # noqa: E402

from benchmarks.sass import loop_bodies, registers_stack, sass_of  # noqa: E402
from dsv41c.codegen.aot_compat import compile_spec  # noqa: E402
from dsv41c.codegen.matrix import TARGETS  # noqa: E402
from dsv41c.codegen.triton import moe_decode as md  # noqa: E402

VARIANTS = ("backbone_k6", "backbone_k6_mma", "backbone_k6_experts", "backbone_k6_experts_mma")


def weights_per_loop(spec) -> float:
    """Weight elements one thread covers in one trip of the main loop (two steps / chunks)."""
    c = spec.constexprs
    if c["CORE"] == 1:  # a lane: 2 rows × 32 codes of one block per group of 4, SUB groups a step
        return 2 * 2 * 32 * c.get("SUB", 1)
    two = 2 if spec.kernel is md.moe_decode_gate_up_kernel else 1  # [BN·BKB, 4] words × 8 codes, both matrices
    return 2 * c["BN"] * c["BKB"] * 32 * two / (32 * spec.num_warps)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out = {"triton": triton.__version__, "target": "cuda:sm90", "variants": {}}
    for fn in (md._gate_up_variants, md._down_variants):
        for spec in fn("cuda:sm90"):
            if spec.variant not in VARIANTS:
                continue
            text, usage = sass_of(compile_spec(spec, TARGETS["cuda:sm90"]))
            loop = max(loop_bodies(text), key=len)
            ops = [(o.split()[1] if o.startswith("@") else o.split()[0]).split(".")[0] for o in loop]
            regs, stack = registers_stack(usage) or (None, None)
            out["variants"][f"{spec.kernel.__name__}/{spec.variant}"] = {
                "core": spec.constexprs["CORE"], "sub": spec.constexprs.get("SUB", 1), "registers": regs,
                "stack": stack, "loop_instrs": len(ops), **{k: ops.count(k) for k in ("HMMA", "FFMA", "LDG", "STS", "LDS")},
                "instrs_per_weight": round(len(ops) / weights_per_loop(spec), 2)}
    text = json.dumps(out, indent=1)
    if argv:
        with open(argv[0], "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
