"""The hardware targets the compiler knows: what each one is and which matrix instructions and number formats its
matrix unit takes (the public ISA facts as of writing), and the parser of a user's `--targets` list.

The Triton targets among them are the kernel library's list (`codegen/triton/targets.py`): a target's `triton`
flag says whether Triton builds for it here.
"""
from __future__ import annotations

from dataclasses import dataclass

from dsv41c.codegen.triton.targets import TARGETS as TRITON_TARGETS


class KernelBuildError(Exception):
    """Bad input to `dsv41c kernels` (unknown target, bad output directory, ...)."""


@dataclass(frozen=True)
class Target:
    name: str  # "cuda:sm90"
    backend: str  # "cuda" | "rocm" | "ascend"
    arch: str  # "sm90" | "gfx942" | "a5"
    hardware: str
    warp_size: int  # threads per warp / wavefront (0: not a SIMT target)
    matrix_unit: str  # the matrix instruction family Triton (or the cube) uses there
    fp8_matrix: bool  # FP8 inputs to the matrix unit
    fp4_matrix: bool  # FP4 (E2M1) inputs to the matrix unit
    triton: bool  # Triton compiles for it ahead of time on this machine (codegen/triton/targets.py's list)
    note: str = ""

_ROWS = (
    Target("cuda:sm80", "cuda", "sm80", "A100 (Ampere)", 32, "mma.sync", False, False, True,
           "no FP8/FP4 tensor-core inputs: FP8/FP4 operands are upcast to bf16/fp16"),
    Target("cuda:sm90", "cuda", "sm90", "H100/H200 (Hopper)", 32, "wgmma", True, False, True,
           "FP8 wgmma; FP4 operands are upcast"),
    Target("cuda:sm100", "cuda", "sm100", "B200/GB200 (Blackwell)", 32, "tcgen05.mma", True, True, True,
           "FP8 and block-scaled FP4 (tcgen05.mma kind::mxf4)"),
    Target("rocm:gfx942", "rocm", "gfx942", "MI300X/MI325X (CDNA3)", 64, "v_mfma", True, False, True,
           "FP8 MFMA uses the FNUZ encodings (OCP E4M3 inputs are converted); no FP4 MFMA"),
    Target("rocm:gfx950", "rocm", "gfx950", "MI350X/MI355X (CDNA4)", 64, "v_mfma", True, True, True,
           "OCP FP8 and scaled FP4/FP6 MFMA (v_mfma_scale_f32_*_f8f6f4)"),
    Target("rocm:gfx1100", "rocm", "gfx1100", "W7900 / RX 7900 (RDNA3)", 32, "v_wmma", False, False, True,
           "WMMA takes fp16/bf16/iu8/iu4 only: no FP8/FP4 matrix instructions"),
    Target("ascend:a2", "ascend", "a2", "Atlas A2 (Ascend 910B)", 0, "cube (fp16/bf16/int8)", False, False, False,
           "no Triton backend here; cube has no FP8/FP4 inputs"),
    Target("ascend:a3", "ascend", "a3", "Atlas A3 (Ascend 910C)", 0, "cube (fp16/bf16/int8)", False, False, False,
           "no Triton backend here; same AI-core ISA as A2 (two A2 dies)"),
    Target("ascend:a5", "ascend", "a5", "Ascend 950PR/950DT", 0, "cube (+ MXFP8/MXFP4, HiF8)", True, True, False,
           "no Triton backend here; cube takes MX-scaled FP8/FP4 (E8M0 per 32)"),
)
TARGETS: dict[str, Target] = {t.name: t for t in _ROWS}
assert {n for n, t in TARGETS.items() if t.triton} == set(TRITON_TARGETS), "codegen/triton/targets.py and this table differ"


def parse_targets(text) -> list[Target]:
    """'cuda:sm90,rocm:gfx942' (or a list) -> [Target]; unknown names are a KernelBuildError."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t and t.strip()]
    if not names:
        raise KernelBuildError(f"no targets given (choose from {', '.join(TARGETS)})")
    bad = [n for n in names if n not in TARGETS]
    if bad:
        raise KernelBuildError(f"unknown target {', '.join(map(repr, bad))} (choose from {', '.join(TARGETS)})")
    return [TARGETS[n] for n in dict.fromkeys(names)]
