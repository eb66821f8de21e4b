"""KV-cache codes -> bf16 operands two at a time (bf16x2): the sparse attention kernel's tile decoders.

What: the attention kernel dequantizes every key tile once into the bf16 operand of both its MMAs
(K = V). The per-element decoder (`sparse_attention._kv_tile`, the reference form) moves a code's
fields into an fp16 bit pattern, converts it to float32, multiplies by the group scale and packs
pairs to bf16: ~5.5 SASS instructions a value, and on the H200 the compressed-key loop of the
64-query batch ran 2,133 instructions a key block per warp. These decoders build the bf16 bits of
two codes in one 32-bit register and scale both with one `fma.rn.bf16x2` (x·s + -0.0):

- compressed cache, packed E2M1 + one E4M3 scale per 16 channels (`e2m1_tile_pairs`). For a byte
  b (low nibble = even channel) the bf16 with bits (s << 15) | (e << 7) | (m << 6), from the nibble
  s·8 + e·2 + m, is exactly value·2^-126 (e >= 1: 2^(e-127)·(1 + m/2) = 2^(e-1)·(1 + m/2)·2^-126;
  e = 0: the bf16 subnormal (m·64/128)·2^-126 = (m/2)·2^-126; the algebra of the MoE decoders'
  `fp4_unpack.e2m1_bf16x2_bits`). A byte b alone in a register, times
  4097 (= b | b << 12), has its low nibble at bits 0..3 and its high nibble at bits 16..19, so
      ((p << 6) & 0x01C001C0) | ((p << 12) & 0x80008000)
  is the bf16x2 of the byte's two channels in channel order (low nibble in bits 0..15; bits 12..15 of
  p, a copy of the low nibble, land on masked-out bits). The factor is the scale times 2^118
  in bf16 (E4M3 values 2^-9..448 -> 2^109..1.75·2^126: normal, exact), so the product is
  value·scale·2^-8 — the kernel's tile unit (`_kv_tile`: K in units of 2^-8). It is exact: an E2M1
  value has 2 significant bits and an E4M3 scale 4, so the product has at most 6 (bf16 holds 8), and
  its smallest magnitude 0.5·2^-9·2^-8 is a bf16 normal. The bf16 fma has no flush-to-zero form,
  so the subnormal inputs (the ±0.5 codes) survive; ±0 codes give ±0 as the float path does.
  A byte (2 values): prmt, mul, 2 shifts, 2 masks, or, a prmt copying its own factor into both
  halves, fma. Its output keeps the byte's own place in the [rows, bytes] tile, so the tile's
  register layout follows the row-contiguous load (an earlier form paired the low nibbles of two
  bytes, and regrouping them into channel pairs cost a PRMT a value).
- window ring, E4M3 + one UE8M0 byte per 32 channels: `fp8_gemm.e4m3_pairs_to_bf16` (prmt, shl,
  and, then fma.rn.bf16x2 by two exact powers of two), given the exponent e - 8 so that its
  value·2^(e-127) becomes the tile unit's value·2^(e-135): the per-element decoder's bits for every scale
  byte 1..254 (values below bf16's normal range round once, as they do there; bytes 0 and 255 are not
  decoded specially by either).

Both are CUDA inline PTX (`PTX`). `e2m1_tile_pairs` also has an emulation in plain Triton (the same
fields and masks, the multiply in float32, exact) that the interpreter tests run; the PTX itself
is run instruction by instruction on its own text by a model of its PTX instructions (`tests/ptx_model.py`,
`tests/test_kernels_attention.py::test_e2m1_pairs_asm_every_byte_every_position`, CPU) and checked on a GPU
(`test_gpu_kv_tile_pairs_every_code`: the register order of the packed operands).

Known gaps: no ROCm form (the kernel keeps the per-element decoder there). E4M3 scale code 0x7F
(NaN) is not decoded specially, as in the per-element decoder (the quantizer never writes it).
"""
from __future__ import annotations

import triton
import triton.language as tl

from dsv41c.codegen.triton.bf16x2 import bits_f32, e4m3_pairs_to_bf16
from dsv41c.codegen.triton.codecs import e4m3_decode

# 2^118: moves an E4M3 scale so that (value·2^-126) x factor = value·scale·2^-8 (module docstring)
_E2M1_FACTOR = tl.constexpr(2.0 ** 118)


def _e2m1_pairs_asm() -> tl.constexpr:
    """The PTX of `e2m1_tile_pairs` for 4 bytes in one register ($4) and their 4 scale factors as two bf16 pairs ($5:
    bytes 0-1, $6: bytes 2-3): output $j is byte j's bf16x2 (low nibble in bits 0..15, high nibble in 16..31). Byte
    j is moved alone to the low byte (prmt with a zero register), multiplied by 4097 so that its high nibble also
    sits at bits 16..19, then both halves take the low-nibble bit moves; byte j's own factor is copied into both
    halves (prmt) for its fma, so the result does not depend on which 4 elements Triton packs into a register."""
    body = ""
    for j in range(4):
        f = "$5" if j < 2 else "$6"
        dup = "0x1010" if j % 2 == 0 else "0x3232"  # the pair's low / high factor in both halves
        body += (f"prmt.b32 p, $4, z0, 0x444{j}; mul.lo.u32 p, p, 4097; "
                 f"shl.b32 a, p, 6; and.b32 a, a, 0x01C001C0; shl.b32 b, p, 12; and.b32 b, b, 0x80008000; "
                 f"or.b32 a, a, b; prmt.b32 s, {f}, {f}, {dup}; fma.rn.bf16x2 ${j}, a, s, z; ")
    return tl.constexpr("{ .reg .b32 p, a, b, s, z, z0; mov.b32 z, 0x80008000; mov.b32 z0, 0; " + body + "}")


_E2M1_PAIRS = _e2m1_pairs_asm()


@triton.jit
def e2m1_tile_pairs(b, s, R: tl.constexpr, C: tl.constexpr, PTX: tl.constexpr):
    """Packed E2M1 bytes b [R, C/2] (uint8; low nibble = even channel) and their E4M3 scale bytes s [R, C/16] -> the
    tile [R, C] in channel order, worth value·scale·2^-8: bf16 (PTX: one inline bf16x2 fma a byte, the byte's two
    channels in one register) or float32 (the emulation: the same bit fields, multiplied in float32; exact, so the
    same values)."""
    f = e4m3_decode(s) * _E2M1_FACTOR  # exact: 2^109..1.75·2^126
    f = tl.reshape(tl.broadcast_to(f[:, :, None], (R, C // 16, 8)), (R, C // 2))  # per byte
    if PTX:
        w = tl.inline_asm_elementwise(_E2M1_PAIRS, "=r,=r,=r,=r,r,r,r", [b, f.to(tl.bfloat16)], dtype=tl.int32,
                                      is_pure=True, pack=4)
        lo = (w & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = ((w >> 16) & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        bi = b.to(tl.int32)
        lo = bits_f32((((bi & 7) << 6) | ((bi & 8) << 12)) << 16) * f  # bf16 bits -> float32
        hi = bits_f32((((bi & 0x70) << 2) | ((bi & 0x80) << 8)) << 16) * f
    return tl.reshape(tl.join(lo, hi), (R, C))


@triton.jit
def e4m3_tile_pairs(c, e, R: tl.constexpr, C: tl.constexpr):
    """E4M3 codes c [R, C] (uint8, natural channel order) + UE8M0 bytes e [R, C/32] -> bf16 [R, C] worth
    value·2^(e-127)·2^-8 (the tile unit), by `fp8_gemm.e4m3_pairs_to_bf16` at exponent e - 8 with both of its
    factors (for every byte 1..254 the per-element decoder's bits). CUDA inline PTX only."""
    return e4m3_pairs_to_bf16(c, e.to(tl.int32) - 8, R, C, True)
