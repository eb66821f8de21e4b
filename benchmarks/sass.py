"""Static SASS of a kernel compiled ahead of time: the text, its resource usage and its loops (no GPU needed).

`triton.compile` output (`aot_compat.compile_spec`'s result) -> cuobjdump from the installed Triton wheel ->
`sass_of` (SASS text, register / stack line); `instructions` parses the text into (address, instruction);
`loop_bodies` returns the body of each backward branch (Triton's loops), for scripts that count what a k loop
issues (`fp8_decode_sass.py`, `tune_sparse_attention.py --sass`).

Known gaps: loops are found by backward branches, which assumes Triton's usual loop shape; CUDA only.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile


def cuobjdump() -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sass_of(compiled: dict) -> tuple:
    """(SASS text, `cuobjdump -res-usage` text) of a compiled kernel (its asm["cubin"])."""
    tool = cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled["asm"]["cubin"])
        text = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    return text, usage


def registers_stack(usage: str):
    """(registers, stack bytes) from the resource-usage text, or None."""
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return (int(m.group(1)), int(m.group(2))) if m else None


def instructions(text: str) -> list:
    """[(address, instruction text)] in order."""
    return [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]


def loop_bodies(text: str) -> list:
    """The instructions of each backward branch's body (from its target to the branch), in program order."""
    ins = instructions(text)
    out = []
    for j, (addr, op) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", op)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = next((i for i, (a, _) in enumerate(ins) if a == int(m.group(1), 16)), None)
        if start is not None:
            out.append([o for _, o in ins[start:j + 1]])
    return out
