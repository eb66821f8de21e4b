"""Artifact manifest validation: everything is checked before anything else is touched.

`read_manifest(path)` returns the manifest dict of a `NAME.dsv41c/` directory, or raises
`ArtifactError` with a one-line reason:
- not an artifact (no manifest.json), or a manifest that is not JSON / lacks a field / has
  a field of the wrong type (`options.max_context` a positive integer);
- a format version this runtime does not read;
- a file listed in the manifest that is missing (truncated) or whose sha256 differs
  (corrupt), or a file in the artifact the manifest does not list;
- an embedded config whose hash differs from the recorded `config_hash`.
`check_device(device)` rejects a device name this runtime does not know (`banana`);
`check_target(manifest, device)` rejects a device the artifact's target cannot run on (a
cpu artifact on `cuda`), naming both; which device kinds run which target is data in
`dsv41c/artifact_format.py` (`TARGET_DEVICES`), read from the manifest's `target`.

The runtime imports nothing from the compiler: the manifest schema, the hashing rule and
the config hash (sha256 of the sorted-key JSON, first 16 hex digits) come from the leaf
module `dsv41c/artifact_format.py`, which the writer imports too.
"""
from __future__ import annotations

import json
import os
import re

from dsv41c.artifact_format import (FORMAT_VERSION, MANIFEST, REQUIRED, TARGET_DEVICES, config_hash, device_kinds,
                                    known_device_kinds, sha256_file)

__all__ = ["ArtifactError", "FORMAT_VERSION", "MANIFEST", "REQUIRED", "check_device", "check_target", "config_hash",
           "default_device", "read_manifest"]


class ArtifactError(Exception):
    """An artifact that cannot be loaded; the message is one line naming what and where."""


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
    _check_field_types(mpath, m)
    if config_hash(m["config"]) != m["config_hash"]:
        raise ArtifactError(f"{mpath}: embedded config does not match config_hash {m['config_hash']} (edited or corrupt)")
    if verify_files:
        _verify_files(path, m)
    return m


# fields the runtime reads -> the JSON type each must have (the writer's schema)
_FIELD_TYPES = {"target": (str, "a string"), "config": (dict, "an object"), "checkpoint": (dict, "an object"),
                "options": (dict, "an object"), "files": (dict, "an object"), "kernels": (list, "a list")}


def _check_field_types(mpath: str, m: dict) -> None:
    """An edited manifest whose fields have the wrong JSON type fails here, naming the field,
    not later as a TypeError or ValueError deep in the loader."""
    for k, (t, what) in _FIELD_TYPES.items():
        if m.get(k) is not None and not isinstance(m[k], t):
            raise ArtifactError(f"{mpath}: manifest field '{k}' must be {what}, got {type(m[k]).__name__}")
    mc = m["options"].get("max_context")
    if mc is not None and (type(mc) is not int or mc < 1):
        raise ArtifactError(f"{mpath}: manifest field 'options.max_context' must be a positive integer, got {mc!r}")
    for i, e in enumerate(m.get("kernels") or ()):
        if not isinstance(e, dict):
            raise ArtifactError(f"{mpath}: manifest field 'kernels' item {i} must be an object, got {type(e).__name__}")


def _verify_files(path: str, m: dict) -> None:
    listed = m["files"]
    if not isinstance(listed, dict):
        raise ArtifactError(f"{path}/{MANIFEST}: field 'files' must be an object")
    for rel, digest in sorted(listed.items()):
        p = os.path.join(path, rel)
        if not os.path.isfile(p):
            raise ArtifactError(f"{path}: truncated artifact: '{rel}' is missing")
        if sha256_file(p) != digest:
            raise ArtifactError(f"{path}: corrupt artifact: '{rel}' does not match its sha256 in the manifest")
    for root, _dirs, names in os.walk(path):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), path).replace(os.sep, "/")
            if rel != MANIFEST and rel not in listed:
                raise ArtifactError(f"{path}: unexpected file '{rel}' not listed in the manifest")


_DEVICE_RE = re.compile(r"([a-z]+)(?::(\d+))?\Z")


def check_device(device: str) -> str:
    """`device` if it names a device kind some target runs on ('cpu', 'cuda', 'cuda:1', ...)."""
    m = _DEVICE_RE.match(str(device))
    if not m or m.group(1) not in known_device_kinds():
        kinds = ", ".join(f"{k}[:N]" if k != "cpu" else k for k in known_device_kinds())
        raise ArtifactError(f"unknown device {str(device)!r} (devices: {kinds})")
    return str(device)


def default_device(m: dict) -> str:
    """The device an artifact runs on when none is asked for: the first its target runs on."""
    kinds = device_kinds(m["target"])
    return kinds[0] if kinds else "cpu"


def check_target(m: dict, device: str | None) -> str:
    """The device to run `m` on: `device` (default: the target's own) if the target runs there."""
    target = m["target"]
    kinds = device_kinds(target)
    if not kinds:
        raise ArtifactError(f"artifact target '{target}' is unknown to this runtime (targets: "
                            f"{', '.join(sorted(TARGET_DEVICES))})")
    if device is None:
        return kinds[0]
    device = check_device(device)
    if device.split(":")[0] not in kinds:
        raise ArtifactError(f"artifact target '{target}' cannot run on device '{device}' "
                            f"(it runs on: {', '.join(kinds)})")
    return device
