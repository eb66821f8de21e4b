"""Static sm90 SASS of the FP8 decode tiles with the per-element (DECODE_W 0) and the byte-pair (2) weight decoders.

For the decode variants of wq_a, wo_b, shared w2 and the (stacked) shared w1/w3, as `fp8_gemm._gemm_variants` builds
them, compiled ahead of time for sm90 (no GPU needed) with DECODE_W set to 0 and to 2: per k loop (a backward branch
whose body holds MMAs; DECODE_W 2 has two, the two-factor loop and the one-factor one) its instruction count, MMAs,
PRMTs, F2FP / HADD2.F32 packs, HFMA2s and local-memory operations, and the kernel's registers and stack.

    python benchmarks/fp8_decode_sass.py [OUT.json]    # under each Triton version to compare

Known gaps: static counts only (no timing); the loops are found by their backward branches, which assumes Triton's
usual loop shape.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402

from dsv41c.codegen.aot_compat import compile_spec  # noqa: E402
from dsv41c.codegen.matrix import TARGETS  # noqa: E402
from dsv41c.codegen.triton import fp8_gemm as fg  # noqa: E402
LINEARS = ("wq_a_decode", "wo_b_decode", "shared_w2_decode", "shared_w13_decode")


def _sass(spec, target, cuobjdump) -> tuple:
    """(SASS text, resource usage text) of one spec compiled ahead of time."""
    res = compile_spec(spec, target)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(res["asm"]["cubin"])
        text = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True).stdout
    return text, usage


def _k_loops(text: str) -> list:
    """Per backward branch whose body holds MMAs: the body's instruction count and a few opcode counts."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = []
    for j, (addr, op) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", op)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = next((i for i, (a, _) in enumerate(ins) if a == int(m.group(1), 16)), None)
        body = [o for _, o in ins[start:j + 1]]
        count = lambda pat: sum(1 for o in body if re.search(pat, o))  # noqa: E731
        if count(r"HG?MMA"):
            loops.append({"instructions": len(body), "mma": count(r"HG?MMA"), "prmt": count(r"PRMT"),
                          "f2fp": count(r"F2FP|HADD2\.F32"), "hfma2": count(r"HFMA2"),
                          "local": count(r"\b(LDL|STL)")})
    return loops


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    target = TARGETS["cuda:sm90"]
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    rows = []
    for gated in (False, True):
        for sp in fg._gemm_variants("cuda:sm90", gated):
            ce = sp.constexprs
            if not sp.variant.startswith(LINEARS) or ce.get("DECODE_W"):
                continue
            for dw in (0, 2):
                text, usage = _sass(dataclasses.replace(sp, constexprs=dict(ce, DECODE_W=dw)), target, cuobjdump)
                m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
                r = {"variant": sp.variant, "DECODE_W": dw, "GATED": ce["GATED"], "BN": ce["BN"], "BK": ce["BK"],
                     "warps": sp.num_warps, "registers": int(m.group(1)), "stack": int(m.group(2)),
                     "k_loops": _k_loops(text)}
                rows.append(r)
                print(triton.__version__, r["variant"], "DECODE_W", dw, "GATED", r["GATED"], "registers",
                      r["registers"], "stack", r["stack"], r["k_loops"], flush=True)
    if argv:
        with open(argv[0], "w") as f:
            json.dump({"kind": "fp8_decode_pairs_sass", "triton": triton.__version__, "target": "cuda:sm90",
                       "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
