"""Weights of the reference model: dtype policy, expert stacking, random state dicts.

Input: a float state dict keyed by the official names (spec §4/§4.1) — what
`checkpoint.open_checkpoint(dir).state_dict(dtype)` returns (quantized pairs already
dequantized into `X.weight`, wo_a rounded through BF16, engram tables with their scales
applied) or `random_state_dict(cfg, seed)`.

Dtype policy (`Weights`), as the reference / HF `_keep_in_fp32_modules_strict`:
- fp32-critical tensors (mHC `hc_*`, `attn_sink`, router `bias` / `bias_vl`) are kept in
  the accumulation dtype (float32; float64 in the float64 mode);
- everything else is cast to the model dtype. The ratio-2 compressor's wkv/wgate and the
  router weight are promoted to fp32 where they are used (exact: BF16 ⊂ FP32).
Routed experts are stacked per layer into w1/w3 [E, I, D] and w2 [E, D, I].

`random_state_dict(cfg, seed)`: every text tensor of `inventory.expected_tensors(cfg)`,
as float32 with unit-variance linears and norms near 1 (a 40-layer stack keeps O(1)
activations), for tests that do not need a checkpoint on disk. It is NOT bit-identical
to `write_random_checkpoint` (no FP8/FP4 rounding) — the model does not care.
"""
from __future__ import annotations

import torch

from dsv41c.frontend.inventory import expected_tensors
from dsv41c.prims.norms import acc_dtype
from dsv41c.seeded_weights import init_values

_FP32_LEAVES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
                "attn_sink")


def is_fp32_critical(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf in _FP32_LEAVES or name.endswith((".gate.bias", ".gate.bias_vl"))


class Weights:
    """Name -> tensor in the model's dtype policy, plus stacked experts per block prefix."""

    def __init__(self, state_dict: dict, dtype: torch.dtype, device=None):
        self.dtype = dtype
        self.acc = acc_dtype(dtype)
        self.t = {}
        for name, v in state_dict.items():
            if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in state_dict:
                continue  # a reader that left scales beside dequantized weights
            self.t[name] = v.to(device=device, dtype=self.acc if is_fp32_critical(name) else dtype)
        self._experts = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.t[name]
        except KeyError:
            raise KeyError(f"reference model: checkpoint has no tensor '{name}'") from None

    def __contains__(self, name: str) -> bool:
        return name in self.t

    def get(self, name: str):
        return self.t.get(name)

    def experts(self, prefix: str, n: int):
        """Stacked routed experts of `prefix` ('layers.3.ffn'): (w1, w2, w3)."""
        if prefix not in self._experts:
            stack = [torch.stack([self[f"{prefix}.experts.{e}.{w}.weight"] for e in range(n)])
                     for w in ("w1", "w2", "w3")]
            for e in range(n):  # keep one copy only
                for w in ("w1", "w2", "w3"):
                    self.t.pop(f"{prefix}.experts.{e}.{w}.weight")
            self._experts[prefix] = tuple(stack)
        return self._experts[prefix]


def _init(name: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
    return init_values(name, shape, g)  # one value rule for file-backed and seeded-on-device weights


def random_state_dict(cfg, seed: int = 0) -> dict:
    """A float32 state dict with every text tensor of `cfg` (dequantized shapes, no scales)."""
    specs = expected_tensors(cfg)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in specs.items():
        if name.endswith(".scale"):
            continue
        shape = tuple(spec.shape)
        if spec.dtype == "I8":  # packed FP4: two values per byte along `in`
            shape = (shape[0], shape[1] * 2)
        out[name] = _init(name, shape, g)
    return out


def stored_state_dict(cfg, seed: int = 0) -> dict:
    """`random_state_dict(cfg, seed)` quantized into the checkpoint's stored formats, with the plan's storage
    dtypes: FP8 E4M3 codes, E8M0 scales (float8_e8m0fnu), packed FP4 pairs (uint8), BF16, F32. What a compiled
    plan binds; `dequantize_stored` gives the matching float dict for the reference model."""
    from dsv41c import formats

    specs = expected_tensors(cfg)
    blk = cfg.weight_block_size[0]
    out = {}
    for name, x in random_state_dict(cfg, seed).items():
        dt = specs[name].dtype
        if dt == "I8":
            q, s = formats.quant_fp4_weight(x, 32)
            q = q.view(torch.uint8)
        elif dt == "F8_E4M3" and name.endswith("engram.embed.weight"):
            q, s = formats.quant_fp8_ue8m0(x, 32)
        elif dt == "F8_E4M3":
            q, s = formats.quant_fp8_weight(x, blk)
        else:
            q, s = x.to(torch.bfloat16 if dt == "BF16" else torch.float32), None
        out[name] = q
        if s is not None:
            out[name[: -len(".weight")] + ".scale"] = s.view(torch.float8_e8m0fnu)
    return out


def dequantize_stored(cfg, stored: dict, dtype=torch.float32, specs=None) -> dict:
    """A stored dict (`stored_state_dict`, or a checkpoint's raw tensors) -> the float dict the reader's
    `state_dict(dtype)` gives: the same rules (`formats.stored_format` / `dequant_stored`). `specs`:
    `expected_tensors(cfg)`, for a caller that goes tensor by tensor (building it takes ~0.1 s at full widths)."""
    from dsv41c import formats

    specs = specs or expected_tensors(cfg)
    out = {}
    for name, w in stored.items():
        if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in stored:
            continue
        sname = name[: -len(".weight")] + ".scale"
        scale = stored.get(sname) if name.endswith(".weight") else None
        fmt = formats.stored_format(name, specs[name].dtype, scale is not None)
        out[name] = formats.dequant_stored(w, scale, fmt, torch.float32, formats.rounds_through_bf16(name),
                                           cfg.weight_block_size[0]).to(dtype)
    return out


def seeded_stored_dict(cfg, seed: int = 0, device=None, names=None, specs=None) -> dict:
    """Every text tensor of `cfg` (or of `names`) in its stored format, generated on `device` tensor by tensor
    from (seed, name) (`dsv41c/seeded_weights.py`): the same bytes a compiled artifact loaded with
    `seeded_weights=seed` binds, so the reference built from `dequantize_stored` of this runs the same model."""
    from dsv41c.seeded_weights import seeded_stored, stored_kind

    specs = specs or expected_tensors(cfg)
    out = {}
    for name in (names if names is not None else specs):
        if name.endswith(".scale"):
            continue
        spec = specs[name]
        sname = name[: -len(".weight")] + ".scale"
        has_scale = name.endswith(".weight") and sname in specs
        kind = stored_kind(name, spec.dtype, has_scale)
        shape = tuple(spec.shape)
        if kind == "fp4_row":  # the inventory gives the packed shape
            shape = (shape[0], shape[1] * 2)
        w, s = seeded_stored(name, kind, shape, seed, device, cfg.weight_block_size[0])
        out[name] = w
        if s is not None:
            out[sname] = s
    return out
