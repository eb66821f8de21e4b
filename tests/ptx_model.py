"""A model of the few PTX instructions the kernels' inline asm uses, run on the asm text itself (CPU tests).

Why: inline PTX cannot run in Triton's interpreter, so these tests check an asm string instruction by
instruction on every input that matters (every code in every byte position, each element with its own
scale), without a GPU. Modelled: mov.b32, prmt.b32 (default mode, two source registers), shl.b32,
and.b32, or.b32, mul.lo.u32 and fma.rn.bf16x2 (per 16-bit half: a·b + c rounded once to nearest even,
subnormals kept). Anything else raises, so a new instruction cannot slip through unmodelled.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def prmt(a: int, b: int, sel: int) -> int:
    """prmt.b32 d, a, b, sel (default mode): output byte i <- byte (sel >> 4i) & 7 of {a (bytes 0-3), b (4-7)};
    with bit 3 of that selector nibble set, the byte's sign replicated instead."""
    src = [(a >> (8 * j)) & 0xFF for j in range(4)] + [(b >> (8 * j)) & 0xFF for j in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        v = src[nib & 7]
        out |= ((0xFF if v & 0x80 else 0) if nib & 8 else v) << (8 * i)
    return out


def bf16_value(h: int) -> float:
    """The low 16 bits of h read as bf16 -> float."""
    return torch.tensor([h & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double().item()


def bf16_bits(v: float) -> int:
    """float64 -> bf16 bits, one rounding to nearest even (v is an exact product of two bf16 values: float32 holds it
    exactly, so torch's float64 -> float32 -> bf16 rounds once)."""
    return int(torch.tensor([v], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def run_ptx(asm: str, regs: dict) -> dict:
    """Run an inline-asm string ("{ .reg ...; op a, b, ...; ... }") on the registers `regs` ({"$0": int, ...});
    returns every register after the last instruction."""
    regs = dict(regs)
    val = lambda t: regs[t] if t in regs else int(t, 0)  # noqa: E731
    for ins in asm.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        a = [t.strip() for t in args.split(",")]
        if op == "mov.b32":
            regs[a[0]] = val(a[1]) & _M32
        elif op == "prmt.b32":
            regs[a[0]] = prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "shl.b32":
            regs[a[0]] = (val(a[1]) << val(a[2])) & _M32
        elif op == "and.b32":
            regs[a[0]] = val(a[1]) & val(a[2])
        elif op == "or.b32":
            regs[a[0]] = val(a[1]) | val(a[2])
        elif op == "mul.lo.u32":
            regs[a[0]] = (val(a[1]) * val(a[2])) & _M32
        elif op == "fma.rn.bf16x2":
            x, y, z = val(a[1]), val(a[2]), val(a[3])
            out = 0
            for sh in (0, 16):
                r = bf16_value(x >> sh) * bf16_value(y >> sh) + bf16_value(z >> sh)
                out |= bf16_bits(r) << sh
            regs[a[0]] = out
        else:
            raise AssertionError(f"unmodelled PTX {op}")
    return regs
