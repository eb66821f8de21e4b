"""Engram in Triton: FP8 table gather + dequantize, and the gated stream update.

What (spec §3.9, §6.7, §4.1):
- `engram_gather`: row ids [T, 24] into the table `embed.weight` E4M3 [rows, 256] with
  `embed.scale` UE8M0 [rows, 8] (one scale per 32 columns of a row) -> e [T, 24·256], each row
  dequantized as code × 2^(s-127). The result is exact in bf16 (an E4M3 value times a power of
  two), so bf16 output loses nothing; fp32 output is also offered.
- `engram_gate` (after kv = wkv(e), the FP8 GEMM): key = kv[:, :4·D] as [4, D] (one per stream),
  value = kv[:, 4·D:] [D]; per token and stream k
      dot_k = Σ_d H_k,d·(q_weight_k,d·k_weight_k,d)·key_k,d · rsqrt(mean(H_k²)+eps)
              · rsqrt(mean(key_k²)+eps) · D^-0.5
      gate_k = sigmoid(copysign(sqrt(max(|dot_k|, 1e-6)), dot_k)),  0 where token_mask is False
      H_k += gate_k · value        (fp32 math, result in H's dtype)

Algorithm: gather: one program per BR (token, column) rows; the int64 row id addresses the
table (rows × 256 exceeds 2^31 bytes in the real tables). Gate: one program per (token, stream); at decode
(few programs) one pass with the whole row in registers (all its loads in flight at once, 16 warps), otherwise
two passes over 1024-wide chunks of D (sums and dot, then the update; the second re-reads only H_k and the
shared value). Writing into H itself (out=H) is safe: a program reads its own row before writing.

Specialization keys: D (hidden_size, 5120), HEAD_DIM (engram_head_dim, 256), N_COLS ((max_ngram - 1) · n_heads, 24), BR,
BD, dtypes.

Against torch.compile of the reference (H200, L2-cold graph replay, results/compiled_baseline.json run 3): 4.82 vs
4.89 µs at one token (a tie), 5.02 vs 5.45 at eight. Inductor generates one looped-reduction kernel per (token,
stream) row, 16 warps, the sums in one loop and the update in a second (tuning/inductor_code_engram_attn_S1.txt):
the two-pass form. The launcher reads the bool token mask in place; converting it to uint8 was a launch of its own
(Nsight Compute 2.7 µs beside the gate's 4.7): 6.6 -> 4.8 µs at one token without it (results/kernels_ffn.json).

Known gaps: the sign at dot == 0 follows the eager
model's copysign (gate = sigmoid(+1e-3)),
where the spec's literal `sign(0)` would give 0.5; no prefetch of table rows from host memory
(the gather assumes the table is device-addressable: HBM, or mapped host memory).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c.codegen.triton.codecs import e4m3_to_f32, e8m0_to_f32, expand_cols
from dsv41c.codegen.triton.targets import as_u8, interpreting, native_fp8_for, target_traits
from dsv41c import formats

HC = 4


# ============================================================================ kernels


@triton.jit
def engram_gather_kernel(ids_ptr, table_ptr, scale_ptr, out_ptr, n,
                         DH: tl.constexpr, BR: tl.constexpr, NATIVE_FP8: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = r < n
    rid = tl.load(ids_ptr + r, mask=ok, other=0).to(tl.int64)
    cols = tl.arange(0, DH)
    q = tl.load(table_ptr + rid[:, None] * DH + cols[None, :], mask=ok[:, None], other=0)
    s = tl.load(scale_ptr + rid[:, None] * (DH // 32) + tl.arange(0, DH // 32)[None, :], mask=ok[:, None], other=127)
    v = e4m3_to_f32(q, NATIVE_FP8) * expand_cols(e8m0_to_f32(s), BR, DH // 32, 32)
    tl.store(out_ptr + r[:, None].to(tl.int64) * DH + cols[None, :], v.to(out_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _gate(ssh, ssk, ssd, eps, mask_ptr, t, D: tl.constexpr, HAS_MASK: tl.constexpr):
    """The stream's gate from Σh², Σkey², Σh·w·key (0 for a masked token)."""
    Df = tl.full((), D, tl.float32)
    rs_h = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(ssh, Df) + eps))
    rs_k = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(ssk, Df) + eps))
    dot = ssd * (rs_h * rs_k) * tl.div_rn(1.0, tl.sqrt_rn(Df))
    mag = tl.sqrt_rn(tl.maximum(tl.abs(dot), 1e-6))
    z = tl.where(dot < 0, -mag, mag)  # copysign (dot is never -0.0 here unless the sum is)
    gate = tl.div_rn(1.0, 1.0 + tl.exp(-z))
    if HAS_MASK:
        gate = tl.where(tl.load(mask_ptr + t) != 0, gate, 0.0)
    return gate


@triton.jit
def engram_gate_kernel(h_ptr, kv_ptr, qw_ptr, kw_ptr, mask_ptr, out_ptr, eps, D: tl.constexpr, BD: tl.constexpr,
                       HAS_MASK: tl.constexpr):
    """One (token, stream) of contiguous H [T, 4, D] / kv [T, 5·D] / out [T, 4, D]. BD >= D: one pass, the row's
    loads all issued at once and H_k kept in registers for the update; BD < D: two passes over BD-wide chunks."""
    t = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    h_row = h_ptr + t * (4 * D) + k * D
    key_row = kv_ptr + t * (5 * D) + k * D
    val_row = kv_ptr + t * (5 * D) + 4 * D
    o_row = out_ptr + t * (4 * D) + k * D
    if BD >= D:
        rd = tl.arange(0, BD)
        ok = rd < D
        h = tl.load(h_row + rd, mask=ok, other=0.0).to(tl.float32)
        key = tl.load(key_row + rd, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(qw_ptr + k * D + rd, mask=ok, other=0.0).to(tl.float32) * \
            tl.load(kw_ptr + k * D + rd, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(val_row + rd, mask=ok, other=0.0).to(tl.float32)
        gate = _gate(tl.sum(h * h, axis=0), tl.sum(key * key, axis=0), tl.sum(h * w * key, axis=0), eps, mask_ptr, t,
                     D, HAS_MASK)
        tl.store(o_row + rd, (h + gate * v).to(out_ptr.dtype.element_ty), mask=ok)
        return
    sh = tl.zeros((BD,), dtype=tl.float32)
    sk = tl.zeros((BD,), dtype=tl.float32)
    sd = tl.zeros((BD,), dtype=tl.float32)
    for d0 in range(0, D, BD):
        rd = d0 + tl.arange(0, BD)
        ok = rd < D
        h = tl.load(h_row + rd, mask=ok, other=0.0).to(tl.float32)
        key = tl.load(key_row + rd, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(qw_ptr + k * D + rd, mask=ok, other=0.0).to(tl.float32) * \
            tl.load(kw_ptr + k * D + rd, mask=ok, other=0.0).to(tl.float32)
        sh += h * h
        sk += key * key
        sd += h * w * key
    gate = _gate(tl.sum(sh, axis=0), tl.sum(sk, axis=0), tl.sum(sd, axis=0), eps, mask_ptr, t, D, HAS_MASK)
    for d0 in range(0, D, BD):
        rd = d0 + tl.arange(0, BD)
        ok = rd < D
        h = tl.load(h_row + rd, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(val_row + rd, mask=ok, other=0.0).to(tl.float32)
        tl.store(o_row + rd, (h + gate * v).to(out_ptr.dtype.element_ty), mask=ok)


# ============================================================================ references


def engram_gather_reference(ids, table, scale, out_dtype=torch.bfloat16):
    """ids [T, C] -> [T, C·256] dequantized rows (table E4M3 [rows, 256], scale UE8M0 [rows, 8])."""
    q = as_u8(table)[ids.long()].view(torch.float8_e4m3fn)
    e = as_u8(scale)[ids.long()]
    return formats.dequant_fp8_ue8m0(q, e, 32).flatten(-2).to(out_dtype)


def engram_gate_reference(H, kv, q_weight, k_weight, eps: float, token_mask=None):
    """H [T, 4, D], kv [T, 5·D] -> H + gate·value (fp32 math, H's dtype)."""
    T, hc, D = H.shape
    h = H.float()
    key = kv[:, :hc * D].float().unflatten(-1, (hc, D))
    value = kv[:, hc * D:].float()
    w = q_weight.float() * k_weight.float()
    rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (h * w * key).sum(-1) * rstd * D ** -0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
    if token_mask is not None:
        gate = gate.masked_fill(~token_mask.bool()[:, None], 0.0)
    return (h + gate.unsqueeze(-1) * value.unsqueeze(1)).to(H.dtype)


# ============================================================================ launchers


def engram_gather(ids, table, scale, out_dtype=torch.bfloat16):
    T, C = ids.shape
    DH = table.shape[1]
    if scale.shape[0] != table.shape[0] or scale.shape[1] * 32 != DH or DH & (DH - 1):
        raise ValueError(f"engram_gather: table {tuple(table.shape)} / scale {tuple(scale.shape)} are not "
                         f"[rows, D] E4M3 + [rows, D/32] UE8M0 with D a power of two")
    out = torch.empty(T, C * DH, dtype=out_dtype, device=ids.device)
    n = T * C
    if n == 0:
        return out
    BR = 8 if interpreting() else 16
    ids_c = ids.reshape(-1).contiguous()
    engram_gather_kernel[(triton.cdiv(n, BR),)](ids_c, as_u8(table), as_u8(scale), out, n, DH=DH, BR=BR,
                                                NATIVE_FP8=native_fp8_for(ids.device), num_warps=4)
    return out


# Few tokens (T·4 programs at most GATE_ONE_PASS_PROGRAMS): the one-pass tile (BD >= D, 16 warps), whose loads are all
# in flight at once. H200, L2-cold graph replay (tuning/kernels_ffn_engram_gate_tile.json): T = 1 9.7 -> 6.7 µs, T = 8 10.1 -> 6.7
# against the two-pass 1024-wide loop; 4.6 / 5.0 µs with the mask read in place (results/kernels_ffn.json).
# Prefill keeps BD 1024 (1.31x its bytes floor at 8192 tokens).
GATE_ONE_PASS_PROGRAMS = 256


def _gate_tile(T: int, D: int, block_d=None):
    """(BD, num_warps) of the gate kernel: explicit block_d, else one pass for few tokens, else 1024-wide chunks."""
    if block_d is not None:
        return int(block_d), (16 if block_d >= 4096 else 4)
    interp = interpreting()  # small chunks and 4 warps: the interpreter's cost grows with the block
    if T * HC <= GATE_ONE_PASS_PROGRAMS:
        return triton.next_power_of_2(D), (4 if interp else 16)
    return (256 if interp else 1024), 4


def _mask_bytes(token_mask):
    """The token mask as one byte a token, without a copy for bool / uint8 / int8 masks: at decode a conversion is a
    launch of its own (H200, ncu: 2.7 µs, more than half of the gate's 4.7 µs kernel at one token)."""
    m = token_mask.reshape(-1)
    if m.dtype in (torch.bool, torch.uint8, torch.int8):
        return m.contiguous().view(torch.uint8)
    return (m != 0).view(torch.uint8)


def engram_gate(H, kv, q_weight, k_weight, eps: float, token_mask=None, out=None, block_d=None):
    """Triton: H + gate·value; `out` may be H itself (in-place update). block_d: the kernel's BD (>= D: one pass;
    None: `_gate_tile`'s choice)."""
    T, hc, D = H.shape
    if hc != HC or tuple(kv.shape) != (T, (HC + 1) * D) or tuple(q_weight.shape) != (HC, D) \
            or tuple(k_weight.shape) != (HC, D):
        raise ValueError(f"engram_gate: H {tuple(H.shape)}, kv {tuple(kv.shape)}, q/k weight "
                         f"{tuple(q_weight.shape)}/{tuple(k_weight.shape)} do not fit 4 streams of D={D}")
    H = H.contiguous()
    kv = kv.contiguous()
    out = torch.empty_like(H) if out is None else out
    if not out.is_contiguous() or out.shape != H.shape:
        raise ValueError("engram_gate: out must be a contiguous tensor shaped like H")
    if T == 0:
        return out
    if token_mask is not None and token_mask.numel() != T:
        raise ValueError(f"engram_gate: token_mask has {token_mask.numel()} entries for {T} tokens")
    m = _mask_bytes(token_mask) if token_mask is not None else H
    BD, nw = _gate_tile(T, D, block_d)
    engram_gate_kernel[(T, HC)](H, kv, q_weight.contiguous(), k_weight.contiguous(), m, out, float(eps), D=D, BD=BD,
                                HAS_MASK=token_mask is not None, num_warps=nw)
    return out


# ============================================================================ ahead-of-time variants


def _gather_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    types = {"ids_ptr": "*i64", "table_ptr": "*u8", "scale_ptr": "*u8", "out_ptr": "*bf16", "n": "i32"}
    ce = {"DH": widths.engram_head_dim, "BR": 16, "NATIVE_FP8": tr["native_fp8"]}
    return [aot_spec(engram_gather_kernel, "dh256_br16", types, ce, 4, 1, {"HEAD_DIM": widths.engram_head_dim, "N_COLS": widths.engram_cols,
                                                                           "out": "bf16", **ce})]


def _gate_variants(target: str, widths=PUBLISHED) -> list:
    if target_traits(target) is None:
        return []
    out = []
    for sdt in ("*fp32", "*bf16"):
        types = {"h_ptr": sdt, "kv_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "mask_ptr": "*u8",
                 "out_ptr": sdt, "eps": "fp32"}
        for phase, bd, nw in (("prefill", 1024, 4), ("decode", triton.next_power_of_2(widths.hidden_size), 16)):
            ce = {"D": widths.hidden_size, "BD": bd, "HAS_MASK": True}
            out.append(aot_spec(engram_gate_kernel, f"d{widths.hidden_size}_{sdt[1:]}_{phase}", types, ce, nw, 2,
                                {"streams": sdt[1:], **ce}))
    return out


register(KernelTemplate(
    name="engram_gather", module=__name__,
    summary="gather 24 E4M3 table rows per token and dequantize with per-32-column UE8M0 scales",
    keys=("HEAD_DIM", "N_COLS", "DH", "BR", "NATIVE_FP8", "out"), reference=engram_gather_reference, launch=engram_gather,
    specializations=_gather_variants))
register(KernelTemplate(
    name="engram_gate", module=__name__,
    summary="per-stream sigmoid gate from normalized H·(q∘k)·key, H_k += gate·value (masked tokens: 0)",
    keys=("D", "streams", "BD", "HAS_MASK"), reference=engram_gate_reference, launch=engram_gate,
    specializations=_gate_variants))
