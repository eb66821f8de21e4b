"""Seeded weights made where they are used: every tensor of a checkpoint generated on the device, in its stored format.

A model at the official widths has tens of gigabytes of weights; for benchmarks they need not
exist on disk or travel: `seeded_stored(name, kind, shape, seed, device)` makes one tensor's
stored form (FP8 E4M3 codes + E8M0 32×32 block scales, packed FP4 E2M1 pairs + E8M0 per 32, the
Engram tables' FP8 per 32 columns, BF16 or F32) directly on `device`, from a generator seeded by
(seed, the tensor's name), so every process that asks for a tensor gets the same bytes whatever
order it asks in: the compiled artifact (through the runtime's `SeededWeights`) and the eager
reference (which dequantizes them) run the same model.

`init_values(name, shape, generator)` is the value rule per kind of tensor (norm weights near 1,
mHC parameters, sinks, linears scaled by 1/sqrt(fan-in)); the file-backed random checkpoints of
the small presets use it too, with one generator for the whole checkpoint.
Kinds (`KINDS`): "fp8_block" / "fp4_row" / "fp8_row" / "bf16" / "f32" — what `formats.stored_format`
names for a checkpoint tensor, with the two float casts told apart.
Leaf module: imports only torch and `dsv41c.formats`, so the runtime may use it.
Known gaps: the bytes differ from the file-backed random checkpoints of the same seed (those draw
from one generator in inventory order); the values are random, not a trained model's.
"""
from __future__ import annotations

import math
import zlib

import torch

KINDS = ("fp8_block", "fp4_row", "fp8_row", "bf16", "f32")


def init_values(name: str, shape: tuple, g: torch.Generator, device=None) -> torch.Tensor:
    """The float32 values of tensor `name` (dequantized shape), drawn from `g` on `device`."""
    def randn():
        return torch.randn(shape, generator=g, device=device)

    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight") or name.endswith(("engram.q_weight", "engram.k_weight")):
        return 1.0 + 0.1 * randn()
    if leaf.startswith("hc_") and leaf.endswith("_fn"):
        return randn() / math.sqrt(shape[1])
    if leaf.startswith("hc_") and leaf.endswith("_base"):
        return 0.1 * randn()
    if leaf.startswith("hc_") and leaf.endswith("_scale"):
        return 0.1 + 0.9 * torch.rand(shape, generator=g, device=device)
    if leaf == "attn_sink" or name == "embed.weight" or name.endswith("engram.embed.weight"):
        return randn()
    if leaf in ("bias", "bias_vl") or name.endswith("markov_head.embed.weight"):
        return 0.1 * randn()
    small = 0.1 if name.endswith("confidence_head.proj.weight") else 1.0
    return randn() * (small / math.sqrt(shape[-1]))


_TAGS = {"uint8": "I8", "int8": "I8", "float8_e4m3fn": "F8_E4M3", "bfloat16": "BF16", "float32": "F32"}


def stored_kind(name: str, dtype: str, has_scale: bool) -> str:
    """The kind of tensor `name` stored as `dtype` (a safetensors tag such as 'F8_E4M3', or a torch dtype name
    such as 'float8_e4m3fn'), with or without a '.scale' beside it."""
    from dsv41c import formats

    tag = _TAGS.get(dtype, dtype)
    fmt = formats.stored_format(name, tag, has_scale)
    if fmt != "cast":
        return fmt
    if tag not in ("BF16", "F32"):
        raise ValueError(f"tensor '{name}': stored as {dtype}, which a seeded checkpoint does not make")
    return "bf16" if tag == "BF16" else "f32"


def tensor_seed(seed: int, name: str) -> int:
    return (int(seed) * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 62)


def seeded_stored(name: str, kind: str, shape: tuple, seed: int, device, block: int = 32):
    """(stored tensor, scale or None) of `name`; `shape` is the dequantized [out, in] (or any shape for the
    float kinds). Codes: float8_e4m3fn / uint8 packed FP4 pairs; scales: float8_e8m0fnu."""
    from dsv41c import formats

    if kind not in KINDS:
        raise ValueError(f"tensor '{name}': unknown stored kind '{kind}' (kinds: {', '.join(KINDS)})")
    g = torch.Generator(device=device).manual_seed(tensor_seed(seed, name))
    x = init_values(name, tuple(shape), g, device)
    if kind == "bf16":
        return x.to(torch.bfloat16), None
    if kind == "f32":
        return x, None
    if kind == "fp4_row":
        q, s = formats.quant_fp4_weight(x, 32)
        q = q.view(torch.uint8)
    elif kind == "fp8_row":
        q, s = formats.quant_fp8_ue8m0(x, 32)
    else:
        q, s = formats.quant_fp8_weight(x, block)
    return q, s.view(torch.float8_e8m0fnu)
