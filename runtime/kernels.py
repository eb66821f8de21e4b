"""The kernels a plan's `kernel.call` records launch: template -> its launcher in the kernel library.

The kernel library (`dsv41c.codegen.triton`, with its registry `codegen/templates.py`) is a leaf the
compiler and the runtime share: the compiler builds its variants ahead of time, the runtime calls
its launchers. It imports nothing of the compiler (frontend, ir, passes, the rest of codegen), which
the import-layering test checks, so the runtime may import it.

Modes:
- `interpret`: every call runs its launcher with Triton's interpreter on the CPU (TRITON_INTERPRET=1
  is set before the library is first imported; a process that imported it compiled is refused), which
  is how a GPU plan is checked on a machine without a GPU (`dsv41c run X --interpret`);
- `device`: the launcher runs on the tensors' GPU, compiling its kernel with Triton's JIT on first use.
Each call passes the operands in the order of the template's kernel contract and the call's
specialization keys (what specialize-kernels decided: variant keys, path, tiles) as keyword
arguments; the launcher reads the shapes and dtypes it needs from the operands.
Known gaps: the artifact's ahead-of-time binaries (kernels/<target>/) are listed and checked by the
manifest but not yet loaded: device mode JIT-compiles the same sources; launchers still choose their
split and workspace from the shapes rather than from the plan.
"""
from __future__ import annotations

import importlib
import os
import sys

from dsv41c.runtime.manifest import ArtifactError

# template -> (module, launcher): the functions the kernel.call records name
LAUNCHERS = {
    "fp8_gemm": ("dsv41c.codegen.triton.fp8_gemm", "fp8_gemm_call"),
    "indexer_score": ("dsv41c.codegen.triton.indexer_call", "index_scores_call"),
    "moe_ffn": ("dsv41c.codegen.triton.moe_ffn", "moe_ffn"),
    "rmsnorm": ("dsv41c.codegen.triton.rmsnorm", "rmsnorm_call"),
    "mhc_pre": ("dsv41c.codegen.triton.mhc", "mhc_pre_call"),
}
_LIBRARY = "dsv41c.codegen.triton"


def use_interpreter() -> None:
    """Make the kernel library run in Triton's interpreter (before its first import)."""
    loaded = [m for m in sys.modules if m.startswith(_LIBRARY + ".")]
    if os.environ.get("TRITON_INTERPRET") != "1" and loaded:
        raise ArtifactError("--interpret: this process already imported the kernel library compiled for a GPU; "
                            "run the interpreted plan in a fresh process")
    os.environ["TRITON_INTERPRET"] = "1"


def launcher(template: str):
    """The launcher of `template`, imported on first use."""
    where = LAUNCHERS.get(template)
    if where is None:
        raise ArtifactError(f"program.json: kernel template '{template}' has no launcher in this runtime "
                            f"(launchers: {', '.join(sorted(LAUNCHERS))})")
    mod, fn = where
    return getattr(importlib.import_module(mod), fn)
