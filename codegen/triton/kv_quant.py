"""KV-cache number formats in Triton: FP8 window-KV quantize + ring append, FP4/FP8 codecs.

What (spec §3.2, §3.3, §3.4, §3.12; the conventions of `dsv41c/formats.py` = frontend.numerics):
- `kv_fp8_ring_append`: window KV rows [S, C] (post-RoPE, bf16/fp32) -> FP8 E4M3 codes with one
  UE8M0 (power-of-two) scale per 32 channels, written into a ring [R, C] at slot pos % R.
- `fp8_ue8m0_dequant`, `fp4_e4m3_quant`/`fp4_e4m3_dequant` (compressed KV: E2M1 + one E4M3 scale
  per 16 channels), `fp4_ue8m0_quant`/`fp4_ue8m0_dequant` (indexer keys/queries: E2M1 + UE8M0/32).

Algorithm: every codec is integer bit arithmetic, not a hardware cast, so the same kernel
gives the same bytes on sm80 (no FP8 units), sm90/sm100, ROCm and the interpreter (whose float
casts truncate): E4M3 round-to-nearest-even is done on the float32 bit pattern (rebias the exponent,
round away 20 mantissa bits with the carry flowing into the exponent; subnormals by a 2^23
magic-number add); ceil(log2 y) of a power-of-two scale is read off the exponent field plus
"mantissa != 0" (the exact frexp rule of numerics.pow2_ceil_exponent); every division that decides
a rounding uses `div_rn` (IEEE), because the approximate `/` of the GPU backends can move a value
that lies exactly on an E2M1/E4M3 tie. E2M1 codes come from the seven ties-to-even thresholds.
Packed FP4: low nibble = even channel. Kernels that quantize to FP4 work on (even, odd) channel
halves, which is exactly the nibble pairing, so packing is `even | odd << 4`.

The @triton.jit helpers here (`e4m3_encode`, `e4m3_decode`, `e2m1_encode`, `e2m1_decode`,
`e2m1_decode_x2`, `quant_fp4_e4m3_pairs`, `quant_fp4_ue8m0_pairs`, `ue8m0_to_float`, ...) are
shared by compressor.py, indexer.py and sparse_attention.py.

Specialization keys: channel count C (512 window/compressed KV, 128 indexer keys), rows per
program BR.  Decode appends one row (BR=1 is wasteful: BR=4, masked); prefill uses BR=16.

Known gaps: E4M3 NaN (0x7F) and UE8M0 NaN (255) are not produced or decoded specially (inputs
are finite by construction); UE8M0 byte 0 (2^-127) decodes only via the subnormal branch and is
never produced (scale floors keep every exponent >= -126). The ring append assumes the rows of
one call have increasing positions (rows older than the last position - R + 1 are skipped so
two rows of one call never race for a slot).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, aot_spec, register
from dsv41c.codegen.triton.codecs import (e2m1_decode, e2m1_decode_x2, e2m1_encode, e4m3_decode, e4m3_encode,  # noqa: F401
                                          quant_fp4_e4m3_pairs, quant_fp4_ue8m0_pairs, quant_fp8_ue8m0_rows,
                                          ue8m0_to_float)
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c import formats


# ============================================================================ kernels


@triton.jit
def _fp8_ring_append_kernel(x_ptr, pos_ptr, q_ptr, e_ptr, n_rows, ring, stride_x,
                            C: tl.constexpr, BR: tl.constexpr):
    pid = tl.program_id(0)
    pos_hi = tl.load(pos_ptr + n_rows - 1)  # positions of one call increase
    rows = pid * BR + tl.arange(0, BR)
    rmask = rows < n_rows
    pos = tl.load(pos_ptr + rows, mask=rmask, other=0)
    # a row that a later row of the same call overwrites is skipped (no write-write race)
    rmask = rmask & (pos > pos_hi - ring)
    cols = tl.arange(0, C)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=rmask[:, None], other=0.0)
    codes, ex = quant_fp8_ue8m0_rows(x.to(tl.float32), BR, C)
    slot = (pos % ring).to(tl.int64)
    tl.store(q_ptr + slot[:, None] * C + cols[None, :], codes.to(tl.uint8), mask=rmask[:, None])
    ecols = tl.arange(0, C // 32)
    tl.store(e_ptr + slot[:, None] * (C // 32) + ecols[None, :], ex.to(tl.uint8), mask=rmask[:, None])


@triton.jit
def _fp8_dequant_kernel(q_ptr, e_ptr, o_ptr, n_rows, C: tl.constexpr, BR: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    cols = tl.arange(0, C)
    q = tl.load(q_ptr + r64[:, None] * C + cols[None, :], mask=rmask[:, None], other=0)
    ex = tl.load(e_ptr + r64[:, None] * (C // 32) + (cols // 32)[None, :], mask=rmask[:, None], other=127)
    v = e4m3_decode(q) * ue8m0_to_float(ex)
    tl.store(o_ptr + r64[:, None] * C + cols[None, :], v.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _fp4_quant_kernel(x_ptr, p_ptr, s_ptr, n_rows, stride_x, C: tl.constexpr, BR: tl.constexpr,
                      E8M0: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    half = tl.arange(0, C // 2)
    base = x_ptr + r64[:, None] * stride_x + 2 * half[None, :]
    E = tl.load(base, mask=rmask[:, None], other=0.0).to(tl.float32)
    O = tl.load(base + 1, mask=rmask[:, None], other=0.0).to(tl.float32)
    if E8M0:
        packed, sc = quant_fp4_ue8m0_pairs(E, O, BR, C // 2)
        NS: tl.constexpr = C // 32
    else:
        packed, sc = quant_fp4_e4m3_pairs(E, O, BR, C // 2)
        NS: tl.constexpr = C // 16
    tl.store(p_ptr + r64[:, None] * (C // 2) + half[None, :], packed.to(tl.uint8), mask=rmask[:, None])
    sc_cols = tl.arange(0, NS)
    tl.store(s_ptr + r64[:, None] * NS + sc_cols[None, :], sc.to(tl.uint8), mask=rmask[:, None])


@triton.jit
def _fp4_dequant_kernel(p_ptr, s_ptr, o_ptr, n_rows, C: tl.constexpr, BR: tl.constexpr, E8M0: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    half = tl.arange(0, C // 2)
    p = tl.load(p_ptr + r64[:, None] * (C // 2) + half[None, :], mask=rmask[:, None], other=0).to(tl.int32)
    if E8M0:
        sb = tl.load(s_ptr + r64[:, None] * (C // 32) + (half // 16)[None, :], mask=rmask[:, None], other=127)
        s = ue8m0_to_float(sb)
    else:
        sb = tl.load(s_ptr + r64[:, None] * (C // 16) + (half // 8)[None, :], mask=rmask[:, None], other=0)
        s = e4m3_decode(sb)
    ve = e2m1_decode(p & 15) * s
    vo = e2m1_decode(p >> 4) * s
    out = o_ptr + r64[:, None] * C + 2 * half[None, :]
    tl.store(out, ve.to(o_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(out + 1, vo.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


# ============================================================================ host wrappers


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _check_rows(x: torch.Tensor, C: int, what: str):
    if x.dim() != 2 or x.shape[1] != C or x.stride(1) != 1:
        raise ValueError(f"{what}: expected a row-major [rows, {C}] tensor, got {tuple(x.shape)} strides {x.stride()}")


def fp8_ring_append(x, pos, ring_q, ring_e, block_rows: int = 16):
    """Quantize window-KV rows x [S, C] to FP8 E4M3 + UE8M0/32 and write ring slot pos % R.

    ring_q [R, C] uint8 (E4M3 codes), ring_e [R, C/32] uint8 (UE8M0). pos [S] int32, increasing."""
    S, C = x.shape
    R = ring_q.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    _check_rows(ring_q, C, "fp8_ring_append ring_q")
    if S == 0:
        return ring_q, ring_e
    pos = pos.to(torch.int32).contiguous()
    BR = min(block_rows, triton.next_power_of_2(S))
    grid = (triton.cdiv(S, BR),)
    _fp8_ring_append_kernel[grid](x, pos, _u8(ring_q), _u8(ring_e), S, R, x.stride(0), C=C, BR=BR)
    return ring_q, ring_e


def fp8_ring_append_ref(x, pos, ring_q, ring_e, block_rows: int = 16):
    R = ring_q.shape[0]
    pos = pos.long()
    if pos.numel() == 0:
        return ring_q, ring_e
    keep = pos > pos[-1] - R
    q, e = formats.quant_fp8_ue8m0(x.float()[keep], 32)
    ring_q.view(torch.uint8)[pos[keep] % R] = q.view(torch.uint8)
    ring_e.view(torch.uint8)[pos[keep] % R] = e
    return ring_q, ring_e


def fp8_dequant(q, e, out_dtype=torch.bfloat16, block_rows: int = 16):
    """FP8 E4M3 codes [N, C] + UE8M0 [N, C/32] -> [N, C] out_dtype."""
    N, C = q.shape
    out = torch.empty((N, C), dtype=out_dtype, device=q.device)
    if N:
        BR = min(block_rows, triton.next_power_of_2(N))
        _fp8_dequant_kernel[(triton.cdiv(N, BR),)](_u8(q), _u8(e), out, N, C=C, BR=BR)
    return out


def fp8_dequant_ref(q, e, out_dtype=torch.bfloat16, block_rows: int = 16):
    return formats.dequant_fp8_ue8m0(q.view(torch.float8_e4m3fn), e.view(torch.uint8), 32).to(out_dtype)


def fp4_quant(x, scale_fmt: str = "e4m3", block_rows: int = 16):
    """x [N, C] -> (packed uint8 [N, C/2], scales uint8 [N, C/16] E4M3 codes | [N, C/32] UE8M0)."""
    N, C = x.shape
    e8 = _fmt(scale_fmt)
    if x.stride(1) != 1:
        x = x.contiguous()
    p = torch.empty((N, C // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty((N, C // (32 if e8 else 16)), dtype=torch.uint8, device=x.device)
    if N:
        BR = min(block_rows, triton.next_power_of_2(N))
        _fp4_quant_kernel[(triton.cdiv(N, BR),)](x, p, s, N, x.stride(0), C=C, BR=BR, E8M0=e8)
    return p, s


def fp4_quant_ref(x, scale_fmt: str = "e4m3", block_rows: int = 16):
    if _fmt(scale_fmt):
        return formats.quant_fp4_ue8m0(x.float(), 32)
    p, s = formats.quant_fp4_e4m3(x.float(), 16)
    return p, s.view(torch.uint8)


def fp4_dequant(p, s, scale_fmt: str = "e4m3", out_dtype=torch.bfloat16, block_rows: int = 16):
    """Packed FP4 [N, C/2] + scales -> [N, C] out_dtype."""
    N, C = p.shape[0], p.shape[1] * 2
    e8 = _fmt(scale_fmt)
    out = torch.empty((N, C), dtype=out_dtype, device=p.device)
    if N:
        BR = min(block_rows, triton.next_power_of_2(N))
        _fp4_dequant_kernel[(triton.cdiv(N, BR),)](_u8(p), _u8(s), out, N, C=C, BR=BR, E8M0=e8)
    return out


def fp4_dequant_ref(p, s, scale_fmt: str = "e4m3", out_dtype=torch.bfloat16, block_rows: int = 16):
    if _fmt(scale_fmt):
        return formats.dequant_fp4_ue8m0(_u8(p), _u8(s), 32).to(out_dtype)
    return formats.dequant_fp4_e4m3(_u8(p), _u8(s).view(torch.float8_e4m3fn), 16).to(out_dtype)


def _fmt(scale_fmt: str) -> bool:
    if scale_fmt not in ("e4m3", "ue8m0"):
        raise ValueError(f"FP4 scale format '{scale_fmt}': choose 'e4m3' (KV, per 16) or 'ue8m0' (indexer, per 32)")
    return scale_fmt == "ue8m0"


# ============================================================================ registration


def _ring_specs(target, widths=PUBLISHED):
    c = widths
    out = []
    for br, nm in ((4, "decode"), (16, "prefill")):
        out.append(aot_spec(_fp8_ring_append_kernel, f"c{c.head_dim}_{nm}",
                            {"x_ptr": "*bf16", "pos_ptr": "*i32", "q_ptr": "*u8", "e_ptr": "*u8", "n_rows": "i32",
                             "ring": "i32", "stride_x": "i32"},
                            {"C": c.head_dim, "BR": br}, num_warps=4))
    return out


def _fp8_deq_specs(target, widths=PUBLISHED):
    c = widths
    return [aot_spec(_fp8_dequant_kernel, f"c{c.head_dim}_bf16",
                     {"q_ptr": "*u8", "e_ptr": "*u8", "o_ptr": "*bf16", "n_rows": "i32"},
                     {"C": c.head_dim, "BR": 16})]


def _fp4_specs(kernel, quant: bool):
    def specs(target, widths=PUBLISHED):
        c = widths
        out = []
        # compressed KV (512 ch, E4M3/16) and indexer keys (128 ch, UE8M0/32)
        for C, e8 in ((c.head_dim, False), (c.index_head_dim, True)):
            name = f"c{C}_{'ue8m0' if e8 else 'e4m3'}"
            if quant:
                types = {"x_ptr": "*bf16", "p_ptr": "*u8", "s_ptr": "*u8", "n_rows": "i32", "stride_x": "i32"}
            else:
                types = {"p_ptr": "*u8", "s_ptr": "*u8", "o_ptr": "*bf16", "n_rows": "i32"}
            out.append(aot_spec(kernel, name, types, {"C": C, "BR": 16, "E8M0": e8}))
        return out

    return specs


register(KernelTemplate(
    name="kv_fp8_ring_append", module=__name__,
    summary="window KV -> FP8 E4M3 + UE8M0/32, written to ring slot pos % R",
    keys=("C", "BR"), reference=fp8_ring_append_ref, launch=fp8_ring_append, specializations=_ring_specs))
register(KernelTemplate(
    name="fp8_ue8m0_dequant", module=__name__, summary="FP8 E4M3 + UE8M0/32 -> bf16",
    keys=("C", "BR"), reference=fp8_dequant_ref, launch=fp8_dequant, specializations=_fp8_deq_specs))
register(KernelTemplate(
    name="fp4_quant", module=__name__, summary="-> packed E2M1 + E4M3/16 (KV) or UE8M0/32 (indexer) scales",
    keys=("C", "BR", "E8M0"), reference=fp4_quant_ref, launch=fp4_quant,
    specializations=_fp4_specs(_fp4_quant_kernel, True)))
register(KernelTemplate(
    name="fp4_dequant", module=__name__, summary="packed E2M1 + E4M3/16 or UE8M0/32 scales -> bf16",
    keys=("C", "BR", "E8M0"), reference=fp4_dequant_ref, launch=fp4_dequant,
    specializations=_fp4_specs(_fp4_dequant_kernel, False)))
