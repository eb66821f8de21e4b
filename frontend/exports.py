"""`dsv41c compile ... --emit FORMAT PATH`: the exports a compile can write beside its artifact.

`check_emits(emits, kv_quant, dtype)` runs before the compile (an unknown format, an unusable path, or
an export the options cannot give fails before any work); `run_emits(emits, cfg, kv_quant, ...)`
after it, in the order given:
    mlir DIR    each distinct traced segment as a torch-dialect MLIR module (export_mlir.py)
    onnx FILE   the target-independent IR of @prefill as one ONNX model, the domain ops as ONNX
                functions (export_onnx.py; float32 activations)
Known gap: an export runs after the artifact is written, so a failed export leaves the
artifact in place (it is complete and valid; only the export is missing).
"""
from __future__ import annotations

import os

from dsv41c.frontend.export_mlir import ExportError, emit_mlir

FORMATS = ("mlir", "onnx")


def check_emits(emits, kv_quant: bool = False, dtype: str = "float32") -> None:
    """Raise ExportError for an export that cannot be written as asked (every format takes kv_quant on or off)."""
    for fmt, path in emits or ():
        if fmt not in FORMATS:
            raise ExportError(f"--emit {fmt}: unknown format (formats: {', '.join(FORMATS)})")
        if fmt == "mlir" and os.path.exists(path) and not os.path.isdir(path):
            raise ExportError(f"--emit mlir {path}: exists and is not a directory")
        if fmt == "onnx":
            from dsv41c.frontend.export_onnx import check_onnx_path

            check_onnx_path(path)
            if dtype != "float32":
                raise ExportError(f"--emit onnx {path}: {dtype} activations are not exported (opset 21's Einsum "
                                  "takes no bfloat16); add --activation-dtype float32")


def run_emits(emits, cfg, kv_quant: bool = True, log=None, dtype: str = "float32", max_context=None) -> list:
    done = []
    for fmt, path in emits or ():
        if fmt == "mlir":
            index = emit_mlir(cfg, path, kv_quant=kv_quant, log=log)
            done.append(path)
            if log is not None:
                print(f"compile: wrote {len(index['files'])} MLIR modules into {path}", file=log, flush=True)
        elif fmt == "onnx":
            from dsv41c.frontend.export_onnx import emit_onnx

            report = emit_onnx(cfg, path, kv_quant=kv_quant, dtype=dtype, max_context=max_context, log=log)
            done.append(path)
            if log is not None:
                print(f"compile: wrote the ONNX model {path} ({report['nodes']} nodes, "
                      f"{sum(len(v) for v in report['functions'].values())} functions)", file=log, flush=True)
    return done
