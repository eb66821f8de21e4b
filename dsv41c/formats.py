"""Number formats of DeepSeek-V4.1-Flash: FP8 E4M3, UE8M0 (E8M0) scales, FP4 E2M1 (leaf module: compiler and runtime both import it).

Everything the checkpoint, the reference model, the kernels' references and the runtime
need to encode, decode or fake-quantize lives here, in plain PyTorch (spec §3.2–3.4, §3.12,
§3.13, §4):

- E4M3 (`torch.float8_e4m3fn`): finite max 448, RNE casts; we always clamp before casting
  because torch's cast does not saturate.
- UE8M0: a byte `e`, value 2^(e-127), 255 = NaN. Power-of-two scales are computed with
  `torch.frexp`, which is exact, rather than `ceil(log2(x))`, which can be off by one ulp
  near powers of two.
- E2M1: 16 codes, LUT [0, .5, 1, 1.5, 2, 3, 4, 6] with bit 3 the sign. Rounding is to
  nearest with ties to even code (thresholds 0.25↓ 0.75↑ 1.25↓ 1.75↑ 2.5↓ 3.5↑ 5↓).
  Packed two per byte, LOW nibble = even (lower-indexed) element.

Fake quantization (QAT semantics, spec §3.2/3.3/3.4):
- `fake_quant_fp8_ue8m0(x, 32)`: window KV, one power-of-two scale per 32 channels,
  s = 2^ceil(log2(max(amax, 1e-4)/448)).
- `fake_quant_fp4_e4m3(x, 16)`: compressed KV, one E4M3 scale per 16 channels,
  s = e4m3(max(amax, 6·2^-9)/6).
- `fake_quant_fp4_ue8m0(x, 32)`: indexer keys/queries, s = 2^ceil(log2(max(amax, 6·2^-126)/6)).

Known gaps: the in-cache packing order of FP4 KV is not pinned by any public source
(spec §3.12); we use the checkpoint's convention (low nibble first) everywhere.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# The ties-to-even thresholds on |x|: codes 0..7 change at these magnitudes. `le` marks a
# threshold where the tie rounds DOWN (the lower code is even), `lt` one where it rounds up.
_E2M1_STEPS = ((0.25, "le"), (0.75, "lt"), (1.25, "le"), (1.75, "lt"), (2.5, "le"), (3.5, "lt"), (5.0, "le"))


_CONSTANTS: dict = {}


def device_constant(values: tuple, dtype, device) -> torch.Tensor:
    """torch.tensor(values, dtype, device), made once per device: a table copied to a GPU on every call would
    be a host-to-device copy in each decode step, which a CUDA graph cannot capture (the first, uncaptured
    step makes it). Read-only by contract."""
    key = (values, dtype, str(torch.device(device) if device is not None else "cpu"))
    t = _CONSTANTS.get(key)
    if t is None:
        t = _CONSTANTS[key] = torch.tensor(values, dtype=dtype, device=device)
    return t


def e2m1_lut(device=None) -> torch.Tensor:
    return device_constant(E2M1_LUT, torch.float32, device)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round float x (already scaled, |x| ≤ 6 after clamp) to E2M1 codes (uint8 0..15), RNE.

    The magnitude code is the number of thresholds |x| passes; a round-up threshold t
    ("lt": ties go up) is passed at |x| >= t, i.e. strictly above the float32 just below t,
    so one `bucketize` (count of boundaries strictly below |x|) does all seven compares.
    """
    x = x.float()
    a = x.abs().clamp(max=E2M1_MAX)
    code = torch.bucketize(a, _e2m1_boundaries(a.device), right=False).to(torch.uint8)
    sign = (x < 0).to(torch.uint8) << 3
    return code | sign


def _e2m1_boundaries(device) -> torch.Tensor:
    t = device_constant(tuple(thr for thr, _ in _E2M1_STEPS), torch.float32, device)
    down = torch.nextafter(t, torch.full_like(t, -1.0))
    up_ties = device_constant(tuple(kind == "lt" for _, kind in _E2M1_STEPS), torch.bool, device)
    return torch.where(up_ties, down, t)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    return e2m1_lut(code.device)[code.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes [..., 2n] into bytes [..., n]: low nibble = even element."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4: last dim {codes.shape[-1]} is odd")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., n] (uint8 or int8) -> E2M1 codes [..., 2n]."""
    p = packed.view(torch.uint8) if packed.dtype == torch.int8 else packed.to(torch.uint8)
    lo = p & 0x0F
    hi = p >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def e8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8, or torch.float8_e8m0fnu) -> float32 2^(e-127); 255 -> NaN."""
    if e.dtype in (torch.int8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        e = e.view(torch.uint8)
    elif e.dtype != torch.uint8:  # a wider integer would be reinterpreted byte by byte
        raise TypeError(f"E8M0 scales must be uint8 bytes or float8_e8m0fnu, got {e.dtype}")
    out = torch.ldexp(torch.ones(e.shape, dtype=torch.float32, device=e.device), e.to(torch.int32) - 127)
    return torch.where(e == 255, torch.full_like(out, float("nan")), out)


def pow2_ceil_exponent(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(x)) for x > 0, exactly (int32)."""
    m, e = torch.frexp(x.float())
    # x = m·2^e with m in [0.5, 1): x is a power of two iff m == 0.5, then log2 x = e-1.
    return torch.where(m == 0.5, e - 1, e).to(torch.int32)


def float_to_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two float scales -> UE8M0 bytes (uint8). Non powers of two round up."""
    return (pow2_ceil_exponent(scale) + 127).clamp(0, 254).to(torch.uint8)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating RNE cast to float8_e4m3fn."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the quantization block {block}")
    return x.float().unflatten(-1, (x.shape[-1] // block, block))


# ----------------------------------------------------------------------------- real encodings


def quant_fp8_ue8m0(x: torch.Tensor, block: int = 32, amax_floor: float = 1e-4):
    """x [..., C] -> (fp8 e4m3 [..., C], UE8M0 exponents uint8 [..., C/block])."""
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=amax_floor)
    exp = pow2_ceil_exponent(amax / E4M3_MAX)
    s = torch.ldexp(torch.ones_like(amax), exp)
    q = to_e4m3(xb / s)
    return q.flatten(-2), (exp.squeeze(-1) + 127).to(torch.uint8)


def _as_e4m3(q: torch.Tensor) -> torch.Tensor:
    """Raw bytes are E4M3 codes: reinterpret them (a `.float()` of uint8 would read integers)."""
    if q.dtype in (torch.uint8, torch.int8):
        return q.view(torch.float8_e4m3fn)
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"expected float8_e4m3fn codes (or their raw bytes), got {q.dtype}")
    return q


def dequant_fp8_ue8m0(q: torch.Tensor, e: torch.Tensor, block: int = 32) -> torch.Tensor:
    q = _as_e4m3(q)
    s = e8m0_to_float(e).unsqueeze(-1)
    return (q.float().unflatten(-1, (q.shape[-1] // block, block)) * s).flatten(-2)


def quant_fp4_e4m3(x: torch.Tensor, block: int = 16):
    """x [..., C] -> (packed fp4 uint8 [..., C/2], e4m3 scales [..., C/block])."""
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=E2M1_MAX * 2.0**-9)
    s = to_e4m3(amax / E2M1_MAX)
    codes = e2m1_encode((xb / s.float()).clamp(-E2M1_MAX, E2M1_MAX))
    return pack_fp4(codes.flatten(-2)), s.squeeze(-1)


def dequant_fp4_e4m3(packed: torch.Tensor, s: torch.Tensor, block: int = 16) -> torch.Tensor:
    v = e2m1_decode(unpack_fp4(packed))
    return (v.unflatten(-1, (v.shape[-1] // block, block)) * s.float().unsqueeze(-1)).flatten(-2)


def quant_fp4_ue8m0(x: torch.Tensor, block: int = 32):
    """x [..., C] -> (packed fp4 uint8 [..., C/2], UE8M0 exponents uint8 [..., C/block])."""
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=E2M1_MAX * 2.0**-126)
    exp = pow2_ceil_exponent(amax / E2M1_MAX)
    s = torch.ldexp(torch.ones_like(amax), exp)
    codes = e2m1_encode((xb / s).clamp(-E2M1_MAX, E2M1_MAX))
    return pack_fp4(codes.flatten(-2)), (exp.squeeze(-1) + 127).to(torch.uint8)


def dequant_fp4_ue8m0(packed: torch.Tensor, e: torch.Tensor, block: int = 32) -> torch.Tensor:
    v = e2m1_decode(unpack_fp4(packed))
    return (v.unflatten(-1, (v.shape[-1] // block, block)) * e8m0_to_float(e).unsqueeze(-1)).flatten(-2)


# ----------------------------------------------------------------------------- fake quantization


def fake_quant_fp8_ue8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Window-KV QAT: quantize to E4M3 with a pow2 scale per `block` channels and back (x's dtype)."""
    q, e = quant_fp8_ue8m0(x, block)
    return dequant_fp8_ue8m0(q, e, block).to(x.dtype)


def fake_quant_fp4_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """Compressed-KV QAT: E2M1 with one E4M3 scale per `block` channels and back (x's dtype)."""
    p, s = quant_fp4_e4m3(x, block)
    return dequant_fp4_e4m3(p, s, block).to(x.dtype)


def fake_quant_fp4_ue8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Indexer QAT: E2M1 with one pow2 scale per `block` channels and back (x's dtype)."""
    p, e = quant_fp4_ue8m0(x, block)
    return dequant_fp4_ue8m0(p, e, block).to(x.dtype)


# ----------------------------------------------------------------------------- checkpoint weights


def dequant_fp8_weight(w: torch.Tensor, scale: torch.Tensor, block: int = 32, dtype=torch.float32) -> torch.Tensor:
    """FP8 E4M3 weight [out, in] with E8M0 scales [ceil(out/b), ceil(in/b)] on b×b blocks."""
    w = _as_e4m3(w)
    out_f, in_f = w.shape
    s = e8m0_to_float(scale)
    s = s.repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return (w.float() * s).to(dtype)


def quant_fp8_weight(w: torch.Tensor, block: int = 32):
    """float weight [out, in] -> (E4M3 [out, in], E8M0 uint8 [ceil(out/b), ceil(in/b)]), pow2 scales."""
    out_f, in_f = w.shape
    po, pi = -out_f % block, -in_f % block
    wp = torch.nn.functional.pad(w.float(), (0, pi, 0, po))
    blocks = wp.unflatten(0, (-1, block)).unflatten(2, (-1, block))  # [Bo, b, Bi, b]
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=2.0**-100)
    exp = pow2_ceil_exponent(amax / E4M3_MAX)
    s = torch.ldexp(torch.ones_like(amax), exp)
    full = s.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out_f, :in_f]
    return to_e4m3(w.float() / full), (exp + 127).to(torch.uint8)


def dequant_fp4_weight(packed: torch.Tensor, scale: torch.Tensor, block: int = 32, dtype=torch.float32) -> torch.Tensor:
    """Routed-expert MXFP4: I8 [out, in/2] (low nibble = even element) + E8M0 [out, in/32]."""
    if packed.dim() != 2:
        raise ValueError(f"dequant_fp4_weight takes one [out, in/2] matrix, got shape {tuple(packed.shape)}")
    v = e2m1_decode(unpack_fp4(packed))
    s = e8m0_to_float(scale).repeat_interleave(block, 1)[:, : v.shape[1]]
    return (v * s).to(dtype)


def quant_fp4_weight(w: torch.Tensor, block: int = 32):
    """float weight [out, in] -> (int8 packed [out, in/2], E8M0 uint8 [out, in/32])."""
    p, e = quant_fp4_ue8m0(w, block)
    return p.view(torch.int8), e


# ----------------------------------------------------------------------------- stored weights: one rule set
# How each checkpoint tensor is stored and what dequantizing it means. The checkpoint reader, the runtime's
# weight map and the IR's `dsv41.dequant_weight` op all go through these two functions, so the three cannot
# disagree about a format.
STORED_FORMATS = ("fp8_block", "fp4_row", "fp8_row", "cast")


def stored_format(name: str, dtype: str, has_scale: bool) -> str:
    """The dequantization rule of checkpoint tensor `name` (safetensors dtype string, scale present?)."""
    if not has_scale:
        if dtype in ("F8_E4M3", "I8"):
            raise ValueError(f"tensor '{name}' is {dtype} but its '.scale' is missing")
        return "cast"
    if dtype == "I8":
        return "fp4_row"  # routed experts: MXFP4, E8M0 per 32 along `in`
    if name.endswith("engram.embed.weight"):
        return "fp8_row"  # Engram tables: per row, per 32 columns (spec §6.7)
    return "fp8_block"  # dense linears: E8M0 per 32x32 block


def rounds_through_bf16(name: str) -> bool:
    """The reference keeps `attn.wo_a` in BF16 after dequantization (spec §3.13)."""
    return name.endswith("attn.wo_a.weight")


def dequant_stored(w: torch.Tensor, scale, fmt: str, dtype=torch.float32, bf16_round: bool = False,
                   block: int = 32) -> torch.Tensor:
    """A stored tensor (and its scale) -> `dtype`, by rule `fmt` (see `stored_format`); `block`: the dense
    linears' square scale block (the config's `weight_block_size`)."""
    if fmt == "fp4_row":
        out = dequant_fp4_weight(w.view(torch.int8) if w.dtype == torch.uint8 else w, scale)
    elif fmt == "fp8_row":
        out = dequant_fp8_ue8m0(w, scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale, 32)
    elif fmt == "fp8_block":
        out = dequant_fp8_weight(w, scale, block)
    elif fmt == "cast":
        out = w
    else:
        raise ValueError(f"unknown stored weight format {fmt!r} (known: {', '.join(STORED_FORMATS)})")
    if bf16_round:
        out = out.to(torch.bfloat16)
    return out.to(dtype)
