"""`dsv41c compile ... --emit mlir DIR`: each distinct traced segment as an MLIR module (torch dialect).

Algorithm: the tracer exports each distinct piece of the serving step once with torch.export
(`frontend/trace.py`, keyed by config hash, kv_quant, dtype and the segment's key); this
module takes those ExportedPrograms as they are (tracing only when the process holds none
for the config) and hands each to torch-mlir's FX importer (`torch_mlir.fx.export_and_import`,
raw torch dialect, no lowering). ATen ops become `torch.aten.*`; the domain ops, registered as
torch.library custom ops, stay whole as `torch.operator "torch.dsv41.<op>"`.

Output (written under a temporary name beside DIR and renamed into place; an earlier MLIR
export at DIR is replaced, any other non-empty DIR is refused):
    DIR/<Segment>[_<key>].mlir   one per distinct segment, its function named after the file,
                                 e.g. AttnIn.mlir, Index_1_produces.mlir, Ffn_2.mlir
    DIR/index.json               per file: the segment key, its inputs and outputs by name, the
                                 dsv41 ops it holds, import seconds
The MoE segment is the stand-in the tracer exports (2 experts; the IR stamps all of them).
Known gaps: a segment's weights are function arguments (positional `%argN`; index.json names
them), nothing is lowered below the torch dialect (the domain ops have no torch-mlir lowering);
torch-mlir is an optional dependency (the `mlir` extra).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

import torch

from dsv41c.frontend.segments import Ffn, StepModel

KIND = "dsv41c-mlir"
_DSV41_OP = re.compile(r'torch\.operator "torch\.dsv41\.([A-Za-z0-9_]+)"')


class ExportError(Exception):
    """The export cannot be done as asked (missing package, unusable output path)."""


def segment_file_stem(key: tuple) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9]+", "", str(k)) or "x" for k in key)


def traced_segments(cfg, kv_quant: bool = True, dtype=torch.float32) -> list:
    """[(segment key, ExportedProgram, input names, output names)] of cfg, in a fixed order."""
    from dsv41c.frontend import trace as tr

    def mine():
        return {k: v for k, v in tr._EXPORTS.items() if k[:3] == (cfg.hash(), kv_quant, str(dtype))}

    if not mine():
        tr.trace(cfg, kv_quant=kv_quant, dtype=dtype, progress=None)
    model = StepModel(cfg, kv_quant=kv_quant, dtype=dtype)
    out, seen = [], set()
    # the cache key ends with the segment key (trace.py's _EXPORTS); a segment traced for several
    # --max-context capacities is exported once
    for k, (ep, _syms) in sorted(mine().items(), key=lambda kv: segment_file_stem(kv[0][-1])):
        if k[-1] in seen:
            continue
        seen.add(k[-1])
        seg = _segment(model, k[-1])
        out.append((k[-1], ep, list(seg.input_names), list(seg.out_names)))
    return out


def _segment(m: StepModel, key: tuple):
    """The segment of `m` whose key() is `key` (its input and output names; the graph is the export's)."""
    kind, rest = key[0], key[1:]
    if kind == "Compress":
        return m.compress(*rest)
    if kind == "Index":
        return m.index(*rest)
    if kind == "Ffn":
        return Ffn(m, *rest)
    for seg in [m.prologue, m.epilogue, m.attn_in, m.ffn, *m.engram, *m.attend.values()]:
        if seg.key() == key:
            return seg
    raise ExportError(f"no segment of the step has the key {key!r}")


def _import_mlir(ep, func_name: str) -> str:
    try:
        from torch_mlir import fx
    except ImportError as e:
        raise ExportError(f"--emit mlir needs torch-mlir ({e}); install it with: python3 -m pip install -e '.[mlir]'") \
            from None
    return str(fx.export_and_import(ep, func_name=func_name))


def _prepare(out_dir: str) -> tuple[str, str]:
    out = os.path.abspath(out_dir)
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise ExportError(f"--emit mlir {out_dir}: exists and is not a directory")
        if os.listdir(out) and not _is_export(out):
            raise ExportError(f"--emit mlir {out_dir}: exists, is not empty and is not an MLIR export; "
                              "remove it or choose another directory")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    return out, tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=os.path.dirname(out))


def _is_export(path: str) -> bool:
    try:
        with open(os.path.join(path, "index.json")) as f:
            return json.load(f).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def emit_mlir(cfg, out_dir: str, kv_quant: bool = True, log=None) -> dict:
    """Write every distinct segment of cfg's serving step as MLIR into out_dir; returns the index."""
    out, tmp = _prepare(out_dir)
    try:
        files = []
        for key, ep, ins, outs in traced_segments(cfg, kv_quant):
            stem = segment_file_stem(key)
            t0 = time.perf_counter()
            text = _import_mlir(ep, stem)
            with open(os.path.join(tmp, stem + ".mlir"), "w") as f:
                f.write(text)
            ops = sorted(set(_DSV41_OP.findall(text)))
            files.append({"file": stem + ".mlir", "segment": list(key), "inputs": ins, "outputs": outs,
                          "dsv41_ops": ops, "seconds": round(time.perf_counter() - t0, 2)})
            if log is not None:
                print(f"  mlir: {stem}.mlir ({len(text.splitlines())} lines; dsv41 ops: {', '.join(ops) or '-'})",
                      file=log, flush=True)
        index = {"kind": KIND, "config_hash": cfg.hash(), "kv_quant": bool(kv_quant), "torch": torch.__version__,
                 "files": files}
        with open(os.path.join(tmp, "index.json"), "w") as f:
            json.dump({**index, "files": [{k: v for k, v in e.items() if k != "seconds"} for e in files]}, f,
                      indent=1, sort_keys=True)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return index
