"""Lazy weight mapping for the runtime: a checkpoint is opened, not copied.

The manifest names the checkpoint (location + sha256 of `model.safetensors.index.json`,
or of the sorted header listing for a single-file checkpoint) and its tensor inventory hash
(sha256 of the sorted `name dtype shape` lines of every shard header). `WeightMap` opens
the shards with `safetensors.safe_open` and reads a tensor only when the plan first asks for
it, as the checkpoint stores it (FP8 E4M3 codes, E8M0 scales, packed FP4 bytes, BF16, F32): the
plan binds stored tensors and dequantizes them itself (`dsv41.dequant_weight`), or hands them to
kernels that read the packed form, so no dequantized copy of the checkpoint is ever made here.

Stacked experts: a GPU plan's MoE kernel reads a layer's routed experts as one tensor per matrix
(`[E, ...]`); the plan names it `<head>.experts.<tail>` (e.g. `layers.3.ffn.experts.w1.weight`,
argument attributes `stack_of` / `stack_count`), a name the checkpoint does not hold. `get` binds
such a name to `<head>.experts.<e>.<tail>` for e = 0, 1, ... (every index the checkpoint has, in
order) stacked along a new first dim, once, as stored (codes and scales; nothing dequantized).

Binding rules (`bind_checkpoint`): the recorded location must hold a checkpoint whose index
hash equals the recorded one; a checkpoint given explicitly may differ in index hash (other
values, other sharding) but must have the same tensor inventory.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import torch
from safetensors import safe_open

from dsv41c.runtime.manifest import ArtifactError

INDEX = "model.safetensors.index.json"
_STACKED = re.compile(r"^(?P<head>.+)\.experts\.(?P<tail>[^\d].*)$")
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
    """name -> the tensor as stored, read lazily from the shards on first use and kept on `device`."""

    def __init__(self, ckpt_dir: str, device="cpu"):
        self.dir = ckpt_dir
        self.device = device
        self._map = _weight_map(ckpt_dir)
        self._files: dict = {}
        self._cache: dict = {}

    def _raw(self, name: str) -> torch.Tensor:
        shard = self._map.get(name)
        if shard is None and (m := _STACKED.match(name)):
            members = []
            while (member := f"{m['head']}.experts.{len(members)}.{m['tail']}") in self._map:
                members.append(member)
            if members:  # the stacked experts of a MoE kernel: read member by member, kept only stacked
                return torch.stack([self._raw(n) for n in members])
        if shard is None:
            raise ArtifactError(f"{self.dir}: tensor '{name}' needed by the plan is not in the checkpoint")
        f = self._files.get(shard)
        if f is None:
            f = self._files[shard] = safe_open(os.path.join(self.dir, shard), framework="pt")
        return f.get_tensor(name)

    def __contains__(self, name: str) -> bool:
        return name in self._map

    def get(self, name: str, dtype: str | None = None) -> torch.Tensor:
        """The stored tensor `name`; `dtype` (a torch dtype name from the plan) reinterprets its bytes where the
        plan's storage type differs only in name (packed FP4 pairs are int8 in the checkpoint, uint8 in the plan)."""
        t = self._cache.get(name)
        if t is None:
            t = self._raw(name)
            if dtype is not None and str(t.dtype) != "torch." + dtype:
                want = getattr(torch, dtype)
                if t.element_size() != torch.empty((), dtype=want).element_size():
                    raise ArtifactError(f"{self.dir}: tensor '{name}' is {t.dtype} in the checkpoint; the plan binds "
                                        f"it as {dtype}")
                t = t.view(want)
            t = self._cache[name] = t.to(self.device)
        return t
