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

The manifest's schema and the hashing rule live in `dsv41c/artifact_format.py`, which the
runtime's validation imports too.

Determinism: the same inputs give byte-identical files — JSON is written with sorted keys
and fixed separators, no timestamps or absolute temp paths are recorded, and files are
hashed in sorted order. The directory is written under a temporary name beside the target
and renamed into place at the end, so a failure never leaves half an artifact; `force`
replaces only an existing artifact (`is_artifact`), and the old one is removed only once
the new one is in place. A write that fails (disk full, read-only, ...) raises
`OutputError` naming `out_dir`, never the temporary name.

Known gaps: no zip form yet; absolute checkpoint locations make an artifact
machine-specific (the loader accepts `checkpoint=` to rebind one).
"""
from __future__ import annotations

import os
import shutil
import tempfile

from dsv41c.artifact_format import FORMAT_VERSION, MANIFEST, dumps_json, hash_tree, is_artifact, sha256_file
from dsv41c.outputs import OutputError, check_output_dir, note_kept, reason

__all__ = ["FORMAT_VERSION", "MANIFEST", "dumps_json", "sha256_file", "write_artifact"]


def write_artifact(out_dir: str, manifest: dict, files: dict, copy_dirs: dict | None = None,
                   force: bool = False) -> str:
    """Write `files` ({relpath: str | bytes}) and `copy_dirs` ({relpath: source dir}) plus the
    manifest (with `format_version` and the `files` hash table added) atomically to out_dir."""
    out_dir = check_output_dir(out_dir, None, force=force, replaceable=is_artifact)
    parent = os.path.dirname(out_dir)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(out_dir) + "-", dir=parent)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the artifact is an ordinary directory
        for rel, data in sorted(files.items()):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
        for rel, src in sorted((copy_dirs or {}).items()):
            shutil.copytree(src, os.path.join(tmp, rel))
        full = dict(manifest)
        full["format_version"] = FORMAT_VERSION
        full["files"] = hash_tree(tmp)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            f.write(dumps_json(full))
        _swap_into_place(tmp, out_dir)
        tmp = None
    except OSError as e:
        raise OutputError(f"{out_dir}: cannot write the artifact ({reason(e)}); nothing written") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    note_kept(out_dir)
    return out_dir


def _swap_into_place(tmp: str, out: str) -> None:
    """Rename the finished `tmp` to `out`; an old artifact at `out` is removed only after that."""
    if not os.path.lexists(out) or (os.path.isdir(out) and not os.listdir(out)):
        os.replace(tmp, out)  # rename(2) replaces an empty directory
        return
    old = tempfile.mkdtemp(prefix=".old-" + os.path.basename(out) + "-", dir=os.path.dirname(out))
    os.rmdir(old)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
