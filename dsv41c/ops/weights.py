"""The weight dequantization op: a checkpoint tensor as stored -> the compute dtype.

`dsv41::dequant_weight(w, scale, fmt, dtype, bf16_round, block)` runs `formats.dequant_stored`,
the one rule set the checkpoint reader and the runtime's weight map also use. The IR binds
weights as the checkpoint stores them (FP8 E4M3 + E8M0 32x32 block scales, packed FP4 E2M1 +
E8M0 per 32, BF16, F32) and states every dequantization as this op, so a plan that still holds
one after kernel selection reads as what it is: a dequantized copy a kernel could have avoided.
Known gaps: none of its own; it is a reference op (a cpu plan runs it once per weight per call).
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
