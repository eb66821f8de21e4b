"""`dsv41c compile ... --emit FORMAT PATH`: the exports a compile can write beside its artifact.

`check_emits(emits)` runs before the compile (an unknown format or an unusable path fails
before any work); `run_emits(emits, cfg, kv_quant)` after it, in the order given:
    mlir DIR    each distinct traced segment as a torch-dialect MLIR module (export_mlir.py)
Known gap: an export runs after the artifact is written, so a failed export leaves the
artifact in place (it is complete and valid; only the export is missing).
"""
from __future__ import annotations

import os

from dsv41c.frontend.export_mlir import ExportError, emit_mlir

FORMATS = ("mlir",)


def check_emits(emits) -> None:
    for fmt, path in emits or ():
        if fmt not in FORMATS:
            raise ExportError(f"--emit {fmt}: unknown format (formats: {', '.join(FORMATS)})")
        if fmt == "mlir" and os.path.exists(path) and not os.path.isdir(path):
            raise ExportError(f"--emit mlir {path}: exists and is not a directory")


def run_emits(emits, cfg, kv_quant: bool = True, log=None) -> list:
    done = []
    for fmt, path in emits or ():
        if fmt == "mlir":
            index = emit_mlir(cfg, path, kv_quant=kv_quant, log=log)
            done.append(path)
            if log is not None:
                print(f"compile: wrote {len(index['files'])} MLIR modules into {path}", file=log, flush=True)
    return done
