"""Weights generated on the device from a seed, bound by the plan's own weight arguments (no checkpoint).

`SeededWeights(args, seed, device, block)` answers `get(name, dtype)` like `WeightMap` does, but
makes each tensor on `device` the first time the plan asks for it: the plan's weight arguments
(program.json: name, stored dtype, shape) say which tensors exist, how each is stored (a
`.scale` argument beside a weight means FP8 blocks, Engram FP8 rows or packed FP4 rows, by the
same rule as the checkpoint reader) and their shapes; `dsv41c/seeded_weights.py` makes the bytes,
seeded per tensor name, so the eager reference of a benchmark, generating the same names with
the same seed, runs the same model. A stacked-experts argument (`<head>.experts.<tail>`,
`[E, ...]`) is made member by member (`<head>.experts.<e>.<tail>`) and stacked, as the checkpoint
binding does. Nothing is dequantized.
Known gaps: only the plan's tensors exist (DSpark heads are not in the compiled step).
"""
from __future__ import annotations

import re

import torch

from dsv41c.runtime.manifest import ArtifactError
from dsv41c.seeded_weights import seeded_stored, stored_kind

_STACKED = re.compile(r"^(?P<head>.+)\.experts\.(?P<tail>[^\d].*)$")


class SeededWeights:
    def __init__(self, args: list, seed: int, device, block: int):
        self.args = {a["name"]: a for a in args}
        self.seed, self.device, self.block = int(seed), torch.device(device), int(block)
        self._cache: dict = {}

    def __contains__(self, name: str) -> bool:
        return name in self.args

    def _make(self, wname: str, shape: tuple, dtype: str, has_scale: bool):
        kind = stored_kind(wname, dtype, has_scale)
        full = (shape[0], shape[1] * 2) if kind == "fp4_row" else tuple(shape)
        return seeded_stored(wname, kind, full, self.seed, self.device, self.block)

    def _weight(self, wname: str):
        a = self.args.get(wname)
        if a is None:
            raise ArtifactError(f"seeded weights: the plan binds no tensor '{wname}'")
        sname = wname[: -len(".weight")] + ".scale" if wname.endswith(".weight") else None
        has_scale = sname in self.args
        shape = tuple(int(d) for d in a["shape"])
        m = _STACKED.match(wname)
        if m:  # the stacked experts of a MoE kernel
            parts = [self._make(f"{m['head']}.experts.{e}.{m['tail']}", shape[1:], a["dtype"], has_scale)
                     for e in range(shape[0])]
            w = torch.stack([p[0] for p in parts])
            s = torch.stack([p[1] for p in parts]) if has_scale else None
        else:
            w, s = self._make(wname, shape, a["dtype"], has_scale)
        self._cache[wname] = w
        if sname is not None and s is not None:
            self._cache[sname] = s
        return w

    def get(self, name: str, dtype: str | None = None) -> torch.Tensor:
        t = self._cache.get(name)
        if t is None:
            wname = name[: -len(".scale")] + ".weight" if name.endswith(".scale") else name
            self._weight(wname)
            t = self._cache.get(name)
            if t is None:
                raise ArtifactError(f"seeded weights: '{name}' has no weight beside it in the plan")
        if dtype is not None and str(t.dtype) != "torch." + dtype:
            want = getattr(torch, dtype)
            if t.element_size() != torch.empty((), dtype=want).element_size():
                raise ArtifactError(f"seeded weights: '{name}' is made as {t.dtype}; the plan binds it as {dtype}")
            t = t.view(want)
        want_shape = self.args[name]["shape"] if name in self.args else None
        if want_shape is not None and list(t.shape) != [int(d) for d in want_shape]:
            raise ArtifactError(f"seeded weights: '{name}' is made {list(t.shape)}, the plan binds {want_shape}")
        return t
