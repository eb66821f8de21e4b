"""Lazy weight mapping for the runtime: a checkpoint is opened, not copied.

The manifest names the checkpoint (location + sha256 of `model.safetensors.index.json`,
or of the sorted header listing for a single-file checkpoint) and its tensor inventory hash
(sha256 of the sorted `name dtype shape` lines of every shard header). `WeightMap` opens
the shards with `safetensors.safe_open` and reads a tensor only when the plan first asks for
it; FP8/FP4 tensors are dequantized with the shared codecs in `dsv41c.formats` and cached
in the plan's compute dtype.

Binding rules (`bind_checkpoint`): the recorded location must hold a checkpoint whose index
hash equals the recorded one; a checkpoint given explicitly may differ in index hash (other
values, other sharding) but must have the same tensor inventory.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch
from safetensors import safe_open

from dsv41c import formats
from dsv41c.runtime.manifest import ArtifactError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _weight_map(ckpt_dir: str) -> dict:
    ipath = os.path.join(ckpt_dir, INDEX)
    if os.path.isfile(ipath):
        try:
            with open(ipath) as f:
                return json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ArtifactError(f"{ipath}: malformed checkpoint index ({type(e).__name__})") from None
    if os.path.isfile(os.path.join(ckpt_dir, SINGLE)):
        with safe_open(os.path.join(ckpt_dir, SINGLE), framework="pt") as f:
            return {k: SINGLE for k in f.keys()}
    raise ArtifactError(f"{ckpt_dir}: no checkpoint there (neither {INDEX} nor {SINGLE})")


def inventory_lines(ckpt_dir: str) -> list[str]:
    wm = _weight_map(ckpt_dir)
    lines = []
    for shard in sorted(set(wm.values())):
        p = os.path.join(ckpt_dir, shard)
        if not os.path.isfile(p):
            raise ArtifactError(f"{ckpt_dir}: shard '{shard}' named by the index is missing")
        with open(p, "rb") as f:  # the header alone: 8-byte length + JSON
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                lines.append(f"{name} {meta['dtype']} {meta['shape']}")
    return sorted(lines)


def index_hash(ckpt_dir: str) -> str:
    ipath = os.path.join(ckpt_dir, INDEX)
    if os.path.isfile(ipath):
        with open(ipath, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    return hashlib.sha256("\n".join(inventory_lines(ckpt_dir)).encode()).hexdigest()


def inventory_hash(ckpt_dir: str) -> str:
    return hashlib.sha256("\n".join(inventory_lines(ckpt_dir)).encode()).hexdigest()


def bind_checkpoint(artifact_dir: str, manifest: dict, checkpoint: str | None) -> str:
    """Resolve and validate the checkpoint directory for an artifact (see module docstring)."""
    rec = manifest["checkpoint"]
    if checkpoint is None:
        loc = rec.get("location")
        if not loc:
            raise ArtifactError(f"{artifact_dir}: the artifact names no checkpoint; pass checkpoint=DIR "
                                f"(--checkpoint DIR)")
        path = loc if os.path.isabs(loc) else os.path.join(artifact_dir, loc)
        if not os.path.isdir(path):
            raise ArtifactError(f"{artifact_dir}: its checkpoint '{loc}' is not there; pass checkpoint=DIR")
        got = index_hash(path)
        if got != rec["index_hash"]:
            raise ArtifactError(f"{path}: checkpoint index hash {got[:12]} differs from the artifact's "
                                f"{rec['index_hash'][:12]}; bind it explicitly with checkpoint=DIR if it is "
                                f"the same model")
        return path
    if not os.path.isdir(checkpoint):
        raise ArtifactError(f"{checkpoint}: checkpoint directory does not exist")
    got = inventory_hash(checkpoint)
    if got != rec["inventory_hash"]:
        raise ArtifactError(f"{checkpoint}: tensor inventory differs from the one the artifact was compiled "
                            f"for (names, dtypes or shapes)")
    return checkpoint


class WeightMap:
    """name -> dequantized tensor, read lazily from the shards on first use."""

    def __init__(self, ckpt_dir: str, dtype=torch.float32, device="cpu"):
        self.dir = ckpt_dir
        self.dtype = dtype
        self.device = device
        self._map = _weight_map(ckpt_dir)
        self._files: dict = {}
        self._cache: dict = {}

    def _raw(self, name: str) -> torch.Tensor:
        shard = self._map.get(name)
        if shard is None:
            raise ArtifactError(f"{self.dir}: tensor '{name}' needed by the plan is not in the checkpoint")
        f = self._files.get(shard)
        if f is None:
            f = self._files[shard] = safe_open(os.path.join(self.dir, shard), framework="pt")
        return f.get_tensor(name)

    def __contains__(self, name: str) -> bool:
        return name in self._map or (name.endswith(".weight") and name in self._map)

    def get(self, name: str) -> torch.Tensor:
        """Dequantized value of `name` (for a quantized linear: `X.weight`, scales applied)."""
        t = self._cache.get(name)
        if t is not None:
            return t
        raw = self._raw(name)
        scale_name = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
        if scale_name and scale_name in self._map:
            s = self._raw(scale_name)
            if raw.dtype == torch.int8:  # packed FP4 experts
                t = formats.dequant_fp4_weight(raw, s)
            elif name.endswith("engram.embed.weight"):  # per-row, per-32-column scales (spec §6.7)
                t = formats.dequant_fp8_ue8m0(raw, s.view(torch.uint8))
            else:
                t = formats.dequant_fp8_weight(raw, s)
            if name.endswith("attn.wo_a.weight"):  # the reference keeps wo_a in BF16 (spec §3.13)
                t = t.to(torch.bfloat16)
        else:
            t = raw
        t = t.to(device=self.device, dtype=self.dtype if t.is_floating_point() else t.dtype)
        self._cache[name] = t
        return t
