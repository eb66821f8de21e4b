"""Artifact manifest validation: everything is checked before anything else is touched.

`read_manifest(path)` returns the manifest dict of a `NAME.dsv41c/` directory, or raises
`ArtifactError` with a one-line reason:
- not an artifact (no manifest.json), or a manifest that is not JSON / lacks a field;
- a format version this runtime does not read;
- a file listed in the manifest that is missing (truncated) or whose sha256 differs
  (corrupt), or a file in the artifact the manifest does not list;
- an embedded config whose hash differs from the recorded `config_hash`.
`check_target(manifest, device)` rejects an artifact built for another target.

The runtime imports nothing from the compiler: the canonical config hash is recomputed
here from the embedded config dict with the same rule the compiler uses (sha256 of the
sorted-key JSON, first 16 hex digits).
"""
from __future__ import annotations

import hashlib
import json
import os

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REQUIRED = ("format_version", "dsv41c_version", "torch_version", "target", "config", "config_hash",
            "checkpoint", "pipeline", "options", "files")


class ArtifactError(Exception):
    """An artifact that cannot be loaded; the message is one line naming what and where."""


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(path: str, verify_files: bool = True) -> dict:
    if not os.path.isdir(path):
        raise ArtifactError(f"{path}: not a dsv41c artifact (not a directory)")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise ArtifactError(f"{path}: not a dsv41c artifact (no {MANIFEST})")
    try:
        with open(mpath) as f:
            m = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{mpath}: corrupt manifest ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(m, dict):
        raise ArtifactError(f"{mpath}: corrupt manifest (not a JSON object)")
    for k in REQUIRED:
        if k not in m:
            raise ArtifactError(f"{mpath}: manifest lacks field '{k}'")
    if m["format_version"] != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {m['format_version']!r}, this runtime reads "
                            f"version {FORMAT_VERSION}: recompile with this dsv41c")
    if config_hash(m["config"]) != m["config_hash"]:
        raise ArtifactError(f"{mpath}: embedded config does not match config_hash {m['config_hash']} (edited or corrupt)")
    if verify_files:
        _verify_files(path, m)
    return m


def _verify_files(path: str, m: dict) -> None:
    listed = m["files"]
    if not isinstance(listed, dict):
        raise ArtifactError(f"{path}/{MANIFEST}: field 'files' must be an object")
    for rel, digest in sorted(listed.items()):
        p = os.path.join(path, rel)
        if not os.path.isfile(p):
            raise ArtifactError(f"{path}: truncated artifact: '{rel}' is missing")
        if _sha256(p) != digest:
            raise ArtifactError(f"{path}: corrupt artifact: '{rel}' does not match its sha256 in the manifest")
    for root, _dirs, names in os.walk(path):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), path).replace(os.sep, "/")
            if rel != MANIFEST and rel not in listed:
                raise ArtifactError(f"{path}: unexpected file '{rel}' not listed in the manifest")


def check_target(m: dict, device: str) -> None:
    """The artifact's target must be runnable on `device` ('cpu' or 'cuda[:N]')."""
    target = m["target"]
    kind = device.split(":")[0]
    if target == "cpu":
        return  # the CPU plan runs anywhere torch runs
    if target.startswith("cuda:") and kind == "cuda":
        return
    if target.startswith("rocm:") and kind == "cuda":  # torch exposes ROCm devices as 'cuda'
        return
    raise ArtifactError(f"artifact target '{target}' cannot run on device '{device}'")
