"""Static sm90 SASS of the FP8 decode tiles with the per-element (DECODE_W 0) and the byte-pair (2) weight decoders.

For the decode variants of wq_a, wo_b, shared w2 and the (stacked) shared w1/w3, as `fp8_gemm._gemm_variants` builds
them, compiled ahead of time for sm90 (no GPU needed) with DECODE_W set to 0 and to 2: per k loop (a backward branch
whose body holds MMAs; DECODE_W 2 has two, the two-factor loop and the one-factor one) its instruction count, MMAs,
PRMTs, F2FP / HADD2.F32 packs, HFMA2s and local-memory operations, and the kernel's registers and stack.

    python benchmarks/fp8_decode_sass.py [OUT.json]    # under each Triton version to compare

Also the warp-split decode kernel (fp8_warp_split.py) at its default tiles with the per-element and the byte-pair
decoder (PAIRS): rows named warp_split_*, with the weights a thread decodes per k step; the byte-pair rows with the
scale prefetch (SPF) the other way round from its default: warp_split_*_nospf (each row says its SPF); the
one-factor variants (`*_decode_one`: no UE8M0 byte above 134) and, for those, the factor made in the other place
(`_early` / `_late`: the kernel's EARLY), and each loop's opcode histogram (`opcodes`). Latest run:
results/fp8_decode_sass_triton36.json.

Known gaps: static counts only (no timing); the loops are found by their backward branches, which assumes Triton's
usual loop shape.
"""
import collections
import dataclasses
import json
import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402

from benchmarks.sass import loop_bodies, registers_stack, sass_of  # noqa: E402
from dsv41c.codegen.aot_compat import compile_spec  # noqa: E402
from dsv41c.codegen.matrix import TARGETS  # noqa: E402
from dsv41c.codegen.triton import fp8_gemm as fg  # noqa: E402
from dsv41c.codegen.triton import fp8_warp_split as ws  # noqa: E402
LINEARS = ("wq_a_decode", "wo_b_decode", "shared_w2_decode", "shared_w13_decode")


def _k_loops(text: str) -> list:
    """Per loop whose body holds MMAs: the body's instruction count, a few opcode counts and every opcode's."""
    loops = []
    for body in loop_bodies(text):
        count = lambda pat: sum(1 for o in body if re.search(pat, o))  # noqa: E731
        if count(r"HG?MMA"):
            loops.append({"instructions": len(body), "mma": count(r"HG?MMA"), "prmt": count(r"PRMT"),
                          "f2fp": count(r"F2FP|HADD2\.F32"), "hfma2": count(r"HFMA2"),
                          "local": count(r"\b(LDL|STL)"), "opcodes": dict(collections.Counter(
                              o.split()[1 if o.startswith("@") else 0] for o in body).most_common())})
    return loops


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    target = TARGETS["cuda:sm90"]
    rows = []
    for gated in (False, True):
        for sp in fg._gemm_variants("cuda:sm90", gated):
            ce = sp.constexprs
            if not sp.variant.startswith(LINEARS) or ce.get("DECODE_W"):
                continue
            for dw in (0, 2):
                text, usage = sass_of(compile_spec(dataclasses.replace(sp, constexprs=dict(ce, DECODE_W=dw)), target))
                regs, stack = registers_stack(usage)
                r = {"variant": sp.variant, "DECODE_W": dw, "GATED": ce["GATED"], "BN": ce["BN"], "BK": ce["BK"],
                     "warps": sp.num_warps, "registers": regs, "stack": stack,
                     "k_loops": _k_loops(text)}
                rows.append(r)
                print(triton.__version__, r["variant"], "DECODE_W", dw, "GATED", r["GATED"], "registers",
                      r["registers"], "stack", r["stack"], r["k_loops"], flush=True)
    # the warp-split decode kernel (fp8_warp_split.py) at its default tiles, both decoders, and byte pairs with the
    # scale prefetch the other way round from SPF_DEFAULT (suffix _spf / _nospf)
    for gated in (False, True):
        for sp in ws._variants("cuda:sm90", gated):
            flip = not ws.SPF_DEFAULT
            c0 = sp.constexprs
            cases = [(False, c0["SPF"], c0["EARLY"], ""), (True, c0["SPF"], c0["EARLY"], ""),
                     (True, flip, c0["EARLY"], "_spf" if flip else "_nospf")]
            if not c0["TWO"]:  # the one-factor variant with the factor made the other way (EARLY)
                cases.append((True, c0["SPF"], not c0["EARLY"], "_early" if not c0["EARLY"] else "_late"))
            for pairs, spf, early, suffix in cases:
                ce = dict(c0, PAIRS=pairs, SPF=spf, EARLY=early)
                text, usage = sass_of(compile_spec(dataclasses.replace(sp, constexprs=ce), target))
                regs, stack = registers_stack(usage)
                rows.append({"variant": "warp_split_" + sp.variant + suffix, "PAIRS": pairs, "SPF": spf,
                             "TWO": ce["TWO"], "EARLY": early, "GATED": ce["GATED"], "RB": ce["RB"], "S": ce["S"], "BK": ce["BK"],
                             "warps": sp.num_warps, "registers": regs, "stack": stack,
                             "weights_a_thread_a_step": ce["RB"] * ce["BK"] // 32, "k_loops": _k_loops(text)})
                print(triton.__version__, rows[-1]["variant"], "PAIRS", pairs, "SPF", spf, "TWO", ce["TWO"], "EARLY",
                      early, "registers", regs, "stack", stack, rows[-1]["k_loops"], flush=True)
    if argv:
        with open(argv[0], "w") as f:
            json.dump({"kind": "fp8_decode_pairs_sass", "triton": triton.__version__, "target": "cuda:sm90",
                       "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
