"""What a kernel may assume of its target (ahead of time) and of the device it runs on (just in time).

Targets: `TARGETS` are the Triton targets the kernel library builds for; `parse_target` splits their names,
`target_traits` gives what a variant built for one may assume (FP8 conversion units, fp32 dot precision, large
tiles, warp width). The hardware facts the kernel matrix shows beside them live in `codegen/targets.py`, which takes
this list.

Device: `interpreting()` (kernels run in Triton's CPU interpreter: no faithful bf16 tl.dot, float casts that
truncate), and the JIT launchers' questions about a torch device: `native_fp8_for`, `fp32_dot_precision`,
`ptx_for` (inline PTX compiles), `mma_sync_decode_for` (the 2-warp FP8 decode tile), `sm_count`; `N_SMS_HINT` is
what ahead-of-time variants assume instead. `as_u8`: FP8 / E8M0 / packed FP4 tensors travel to kernels as bytes.
"""
from __future__ import annotations

import os

import torch

TARGETS = ("cuda:sm80", "cuda:sm90", "cuda:sm100", "rocm:gfx942", "rocm:gfx950", "rocm:gfx1100")
N_SMS_HINT = 132  # SMs of an H100/H200-class GPU: what the ahead-of-time variants' split-K assumes (the JIT


# launcher reads the running device's count, sm_count)


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (no faithful bf16 tl.dot there)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_rocm(target: str) -> bool:
    return target.startswith("rocm:")


def dot_f32_for(*tensors) -> bool:
    """Upcast dot operands to fp32 inside the kernel: interpreter, or fp32 inputs (exact path)."""
    return interpreting() or any(t is not None and t.dtype == torch.float32 for t in tensors)


def native_fp8_for(device) -> bool:
    """Use the hardware E4M3 -> fp32 cvt (sm89+ CUDA); bit arithmetic elsewhere."""
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp32_dot_precision(device) -> str:
    """tl.dot input_precision for fp32 operands that must keep ~fp32 accuracy."""
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return "ieee"
    return "tf32x3"


def parse_target(target: str):
    """'cuda:sm90' -> ('cuda', 90); 'rocm:gfx942' -> ('rocm', 'gfx942'); else (None, None)."""
    kind, _, arch = target.partition(":")
    if kind == "cuda" and arch.startswith("sm") and arch[2:].isdigit():
        return "cuda", int(arch[2:])
    if kind == "rocm" and arch.startswith("gfx"):
        return "rocm", arch
    return None, None


def target_traits(target: str) -> dict | None:
    """What a kernel variant may assume on a target; None for targets without Triton."""
    kind, arch = parse_target(target)
    if kind is None:
        return None
    if kind == "cuda":
        return {"kind": kind, "arch": arch, "native_fp8": arch >= 90, "fp32_prec": "tf32x3",
                "big_tiles": arch >= 90, "warp": 32}
    return {"kind": kind, "arch": arch, "native_fp8": arch == "gfx950", "fp32_prec": "ieee",
            "big_tiles": arch in ("gfx942", "gfx950"), "warp": 32 if arch == "gfx1100" else 64}


def as_u8(t: torch.Tensor) -> torch.Tensor:
    """FP8 / E8M0 / packed-FP4 tensors travel to kernels as raw bytes."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def ptx_for(device) -> bool:
    """Inline PTX (the bf16x2 fma of DECODE_W 1) compiles on CUDA only, not in the interpreter."""
    return not interpreting() and device.type == "cuda" and torch.version.hip is None


def mma_sync_decode_for(device) -> bool:
    """Whether the 2-warp decode tile (mma.sync) is the one to run: CUDA sm90, the only chip it was measured on."""
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


_SM_COUNT: dict = {}


def sm_count(dev) -> int:
    """Streaming multiprocessors of the device (132 on an H200; the interpreter plans as for one): the
    decode grids of sparse_attention.py and indexer_score.py size their key splits by it."""
    if dev.type != "cuda":
        return 132
    i = dev.index if dev.index is not None else torch.cuda.current_device()
    if i not in _SM_COUNT:
        _SM_COUNT[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SM_COUNT[i]
