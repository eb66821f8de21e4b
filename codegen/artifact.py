"""The artifact writer: one self-describing directory `NAME.dsv41c/`.

Layout (DESIGN.md "Artifact"):
    manifest.json        format version, versions, target, config + its hash, checkpoint
                         location + index hash + inventory hash, pipeline with options,
                         and a sha256 of every other file (so truncation and corruption are
                         caught at load time)
    plan.ir              the compiled module as IR text
    reports/             pass timings, statistics, kernel matrix, memory/stream plans
    kernels/<target>/    ahead-of-time kernel binaries, where the target has any
    checkpoint/          only for `tiny`/`mini` compiled without a checkpoint: a seeded
                         random checkpoint in the official format, so the artifact runs as is

Determinism: the same inputs give byte-identical files — JSON is written with sorted keys
and fixed separators, no timestamps or absolute temp paths are recorded, and files are
hashed in sorted order. The directory is written under a temporary name beside the target
and renamed into place at the end, so a failure never leaves half an artifact.

Known gaps: no zip form yet; absolute checkpoint locations make an artifact
machine-specific (the loader accepts `checkpoint=` to rebind one).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def dumps_json(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_artifact(out_dir: str, manifest: dict, files: dict, copy_dirs: dict | None = None,
                   force: bool = False) -> str:
    """Write `files` ({relpath: str | bytes}) and `copy_dirs` ({relpath: source dir}) plus the
    manifest (with `format_version` and the `files` hash table added) atomically to out_dir."""
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{out_dir}: already exists (pass --force to replace it)")
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(out_dir) + "-", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the artifact is an ordinary directory
    try:
        for rel, data in sorted(files.items()):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
        for rel, src in sorted((copy_dirs or {}).items()):
            shutil.copytree(src, os.path.join(tmp, rel))
        hashes = {}
        for root, _dirs, names in os.walk(tmp):
            for n in names:
                p = os.path.join(root, n)
                hashes[os.path.relpath(p, tmp).replace(os.sep, "/")] = sha256_file(p)
        full = dict(manifest)
        full["format_version"] = FORMAT_VERSION
        full["files"] = dict(sorted(hashes.items()))
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            f.write(dumps_json(full))
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
