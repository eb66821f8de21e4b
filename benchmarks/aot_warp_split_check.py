"""Ahead-of-time check of the warp-split FP8 decode GEMM (codegen/triton/fp8_warp_split.py) on this GPU-less machine.

Builds its two templates for cuda:sm80 / sm90 / sm100 with `codegen/aot.py` (the variants the matrix lists) and
records each kernel's build status and the matrix instructions found in its assembly; then compiles the shared
w1/w3 variant for the ROCm targets (which get no variant: `fp8_warp_split._NO_ROCM`) and counts `v_mfma` / `v_wmma`
in the AMDGCN, to show why.

    python benchmarks/aot_warp_split_check.py benchmarks/results/aot_warp_split.json

Known gaps: compile-only (nothing here runs a kernel); the ROCm check uses the per-element decoder (PAIRS is inline
PTX, CUDA only) and NATIVE_FP8 off.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402

from dsv41c.codegen import aot, templates  # noqa: E402
from dsv41c.codegen.aot_compat import compile_spec  # noqa: E402
from dsv41c.codegen.matrix import TARGETS  # noqa: E402
from dsv41c.codegen.triton import fp8_warp_split as ws  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    names = ("fp8_gemm_warp_split", "fp8_gemm_swiglu_warp_split")
    tm = {n: templates._REGISTRY[n] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        m = aot.build("cuda:sm80,cuda:sm90,cuda:sm100", tmp, templates=tm, log=None)
    cuda = [{"target": k["target"], "template": k["template"], "variant": k.get("variant"), "status": k.get("status"),
             "matrix_instructions": k.get("matrix_instructions")} for k in m["kernels"]]
    sp = ws._variants("cuda:sm90", True)[0]
    rocm = []
    for t in ("rocm:gfx942", "rocm:gfx950", "rocm:gfx1100"):
        ce = dict(sp.constexprs, NATIVE_FP8=False, PAIRS=False)
        c = compile_spec(dataclasses.replace(sp, constexprs=ce), TARGETS[t])
        asm = c["asm"].get("amdgcn", "")
        fma = len(re.findall(r"\bv_(?:pk_fma|fmac?|dot\d)\w*", asm))  # the FMA-loop fallback's instructions
        rocm.append({"target": t, "variant": sp.variant, "v_mfma": len(re.findall(r"v_mfma", asm)),
                     "v_wmma": len(re.findall(r"v_wmma", asm)), "v_fma_fmac_pk_fma_dot": fma})
    doc = {"kind": "aot_warp_split_check", "triton": triton.__version__, "summary": m["summary"], "cuda": cuda,
           "rocm_compile_only": rocm}
    for r in cuda:
        print(r["target"], r["template"], r["variant"], r["status"], (r["matrix_instructions"] or {}).get("found"))
    for r in rocm:
        print(r)
    if argv:
        with open(argv[0], "w") as f:
            json.dump(doc, f, indent=1)
    return doc


if __name__ == "__main__":
    main()
