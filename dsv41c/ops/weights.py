"""The weight dequantization op: a checkpoint tensor as stored -> the compute dtype.

`dsv41::dequant_weight(w, scale, fmt, dtype, bf16_round, block)` runs `formats.dequant_stored`,
the one rule set the checkpoint reader and the runtime's weight map also use. The IR binds
weights as the checkpoint stores them (FP8 E4M3 + E8M0 32x32 block scales, packed FP4 E2M1 +
E8M0 per 32, BF16, F32) and states every dequantization as this op, so a plan that still holds
one after kernel selection reads as what it is: a dequantized copy a kernel could have avoided.
`dsv41::dequant_rows(w, scale, rows, fmt, dtype, bf16_round, block)` is the same for the rows `rows` of a
row-scaled weight only (`fp8_row`, `fp4_row`, `cast`): `dequant_weight(w, scale, ...)[rows]` bit for bit,
reading and writing those rows alone (passes/gather_engram_rows.py uses it for the Engram tables).
Known gaps: none of their own; they are reference ops (a cpu plan runs dequant_weight once per weight per
call).
"""
from __future__ import annotations

from typing import Optional

import torch

from dsv41c import formats


@torch.library.custom_op("dsv41::dequant_weight", mutates_args=())
def dequant_weight(w: torch.Tensor, scale: Optional[torch.Tensor], fmt: str, dtype: torch.dtype,
                   bf16_round: bool, block: int) -> torch.Tensor:
    """Stored `w` (+ `scale`) -> `dtype`; `fmt` one of formats.STORED_FORMATS."""
    out = formats.dequant_stored(w, scale, fmt, dtype, bf16_round, block)
    return out.clone() if out is w else out  # a custom op may not return an alias of its input


@dequant_weight.register_fake
def _(w, scale, fmt, dtype, bf16_round, block):
    shape = list(w.shape)
    if fmt == "fp4_row":
        shape[-1] *= 2
    return w.new_empty(shape, dtype=dtype)


ROW_FORMATS = ("fp8_row", "fp4_row", "cast")  # a row's scales are that row's: gathering rows commutes


def _gather_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """t[rows] for any dtype: one-byte codes (FP8, E8M0, packed FP4) are gathered as bytes, which every
    backend's index kernel takes."""
    if t.element_size() == 1 and t.dtype not in (torch.uint8, torch.int8, torch.bool):
        return t.view(torch.uint8)[rows].view(t.dtype)
    return t[rows]


@torch.library.custom_op("dsv41::dequant_rows", mutates_args=())
def dequant_rows(w: torch.Tensor, scale: Optional[torch.Tensor], rows: torch.Tensor, fmt: str, dtype: torch.dtype,
                 bf16_round: bool, block: int) -> torch.Tensor:
    """Rows `rows` (int64, any shape) of the stored 2-D `w` -> [*rows.shape, columns] in `dtype`."""
    if fmt not in ROW_FORMATS or w.dim() != 2:
        raise ValueError(f"dequant_rows: a 2-D row-scaled weight ({', '.join(ROW_FORMATS)}), got {fmt} "
                         f"{tuple(w.shape)}")
    flat = rows.reshape(-1)
    codes = _gather_rows(w, flat)
    sc = None if scale is None else _gather_rows(scale, flat)
    out = formats.dequant_stored(codes, sc, fmt, dtype, bf16_round, block)
    out = out.clone() if out is codes else out
    return out.reshape(*rows.shape, out.shape[-1])


@dequant_rows.register_fake
def _(w, scale, rows, fmt, dtype, bf16_round, block):
    cols = w.shape[-1] * (2 if fmt == "fp4_row" else 1)
    return w.new_empty((*rows.shape, cols), dtype=dtype)
