"""The artifact format: manifest schema, hashing rules, and which device runs which target.

A leaf module (standard library only): the writer (`codegen/artifact.py`) and the runtime
(`runtime/manifest.py`, which imports nothing from the compiler) both import it, so the two
sides cannot disagree about what a manifest holds or how a file is hashed.

- `FORMAT_VERSION`, `MANIFEST`, `REQUIRED`: the manifest's version, file name and the fields
  every manifest has (the writer adds `format_version` and `files`).
- `dumps_json(obj)`: the one JSON spelling of every JSON file in an artifact (sorted keys,
  fixed indent, ASCII), so the same inputs give byte-identical files.
- `sha256_file(path)`, `hash_tree(root)`: the `files` table, {posix relpath: sha256 hex} of
  every file under the artifact except the manifest itself, in sorted order.
- `config_hash(config)`: sha256 of the sorted-key JSON of the embedded config, first 16 hex
  digits (the same rule as `ModelConfig.hash()`).
- `is_artifact(path)`: a directory holding a manifest that names this format (what
  `--force` may replace).
- `TARGET_DEVICES`, `device_kinds(target)`: the torch device kinds a target's artifact runs
  on, by the target's family (`cpu`, `cuda:sm90` -> `cuda`, ...), so the loader's device
  check follows the manifest's `target` field, not a list of special cases.

Known gaps: no zip form; no schema for the reports' contents (they are for people).
"""
from __future__ import annotations

import hashlib
import json
import os

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REQUIRED = ("format_version", "dsv41c_version", "torch_version", "target", "config", "config_hash",
            "checkpoint", "pipeline", "options", "files")

# target family -> the torch device kinds that run its plan. A cpu plan runs on the cpu only:
# its program calls reference implementations on host tensors. ROCm builds of torch name
# their devices 'cuda'.
TARGET_DEVICES = {
    "cpu": ("cpu",),
    "cuda": ("cuda",),
    "rocm": ("cuda",),
    "ascend": ("npu",),
}


def dumps_json(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(root: str) -> dict:
    """{relpath: sha256} of every file under `root` but the manifest, sorted by relpath."""
    out = {}
    for d, _dirs, names in os.walk(root):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")
            if rel != MANIFEST:
                out[rel] = sha256_file(os.path.join(d, n))
    return dict(sorted(out.items()))


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def is_artifact(path: str) -> bool:
    """A real directory (not a link) whose manifest.json is a JSON object with a format_version."""
    mpath = os.path.join(path, MANIFEST)
    if os.path.islink(path) or not os.path.isdir(path) or not os.path.isfile(mpath):
        return False
    try:
        with open(mpath, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and "format_version" in m


def target_family(target: str) -> str:
    return str(target).split(":", 1)[0]


def known_device_kinds() -> list:
    """Every device kind some target runs on."""
    return sorted({k for kinds in TARGET_DEVICES.values() for k in kinds})


def device_kinds(target: str) -> tuple:
    """The torch device kinds an artifact built for `target` runs on (empty: an unknown family)."""
    return TARGET_DEVICES.get(target_family(target), ())
