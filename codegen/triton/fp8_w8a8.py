"""FP8 × FP8 decode GEMM (W8A8): the dense linears with the activation quantized, on FP8 tensor cores.

What (spec §3.13): the checkpoint's `quantization_config` says `activation_scheme: dynamic`: before an FP8
linear, x is quantized per 32 along K to E4M3 with a power-of-two (UE8M0) scale,
s = 2^ceil(log2(max(amax, 1e-4) / 448)) (formats.quant_fp8_ue8m0). fp8_gemm's `act_quant=True` computes that
reading as fake quant (x -> E4M3 -> x's dtype) followed by the bf16 GEMM, so its weight tile is still decoded
to bf16 element by element (6 SASS instructions a pair on sm90) before each MMA. Here both operands stay E4M3
and the tensor cores multiply them directly, so no weight decode is left in the k loop:

    y[m, n] = Σ_kb (Σ_{k in kb} Wq[n, k] · xq[m, k]) · sw[n/32, kb] · sx[m, kb]      (kb: 32-column blocks)

1. `act_quant_e4m3_kernel`: x [M, K] -> E4M3 codes xq [M, K] (uint8) and UE8M0 scale bytes sx [M, K/32], bit
   for bit formats.quant_fp8_ue8m0 (the same integer rounding as fake_quant_e4m3_pow2; the codes are assembled
   from the rounded value's fp32 bits, so no float -> fp8 cast, which the interpreter truncates).
2. `w8a8_decode_kernel` ("swap AB", as fp8_gemm's decode tile): the weight tile [BN, 32] is the dot's left
   operand and xqᵀ [32, BM] its right one (BM = 16, the tokens padded), one E4M3 × E4M3 -> fp32 dot per 32
   columns (the UE8M0 blocks are 32 wide, so the scales cannot move outside a 32-deep product), and each
   partial is added into the fp32 accumulator times sw · sx. With BN = 32 (one scale row) sw is one scalar a
   block and the add is one FMA per accumulator element. K is split over program_id(1) into runs of whole
   BK tiles (fp8_gemm.split_bounds) sized to fill one wave; the last arriving split sums the partials in split
   order and runs the epilogue (fp8_gemm._fold_splits), GATED the shared expert's SwiGLU.

Exactness: E4M3 × E4M3 products are exact in fp32 (4 × 4 significant bits) and sw · sx is a power of two, so
the only differences from the float32 reference (fp8_gemm_reference(act_quant=True)) are the order of the fp32
sums and whatever the tensor core does inside one 32-deep product (on Hopper its FP8 accumulation keeps fewer
bits than fp32; DeepSeek-V3's report measured ~14 over 4096-deep chains; 32-deep chains promoted to fp32 after
each block, as here, bound that). Under TRITON_INTERPRET (DOT_F32) both operands are decoded to fp32 by bit
arithmetic and multiplied in fp32.

Where it runs: `fp8_gemm(..., act_quant=True)` takes it for 1..W8A8_MAX_M tokens on CUDA devices with FP8 tensor
cores (sm89+: `w8a8_for`); elsewhere (sm80, ROCm, prefill shapes) act_quant stays fake quant + the bf16 GEMM.
`path="w8a8"` forces it (the interpreter tests). On sm90 the tile has 2 warps, so Triton emits `mma.sync`
(m16n8k32 e4m3) rather than wgmma, as fp8_gemm's decode tile does and for the same reason (its measured
speed at 8 tokens).

Known gaps: the activation quant is its own launch (M·K bytes: ~1 µs of a decode chain under PDL), because
quantizing x inside every weight tile's program costs more than the weight decode it removes; ROCm's FP8 MFMA
(gfx942: the FNUZ encoding, not E4M3 fn) is not used; the prefill GEMM still takes the fake-quant path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, aot_spec, register
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter
from dsv41c.codegen.triton.fp8_gemm import (
    DENSE_LINEARS, GATED_LINEARS, N_SMS_HINT, _check_w, _fold_splits, _split_k, _swiglu, as_u8, e4m3_to_f32,
    e8m0_to_f32, fp8_gemm_reference, fp8_gemm_swiglu_reference, interpreting, pow2_ceil_f32, pow2_inv_f32,
    round_e4m3_f32, split_bounds, target_traits,
)
from dsv41c.codegen.triton.kv_quant import sm_count
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for

W8A8_MAX_M = 16  # tokens of the decode tile (BM); more take the prefill path
W8A8_BK = 128  # k tile of the loop (4 scale blocks)
W8A8_BN = 32  # weight rows a program: one UE8M0 scale row, so sw is a scalar per 32-column block
W8A8_WARPS = 2  # < 4 warps: mma.sync on sm90 (fp8_gemm._decode_tile's reason)
W8A8_STAGES = 3
# resident programs an SM the K split is planned for (as fp8_gemm.DECODE_PROGRAMS_PER_SM; not yet tuned on the H200)
W8A8_PROGRAMS_PER_SM = {"plain": 10, "gated": 6}


# ============================================================================ jit


@triton.jit
def e4m3_code_bits(q):
    """float32 values on the E4M3 grid (|q| <= 448, as round_e4m3_f32 returns) -> their E4M3 fn codes (int32).
    Normal (|q| >= 2^-6): exponent field - 120, the top 3 mantissa bits; subnormal: q · 2^9 (an integer 0..7)."""
    a = tl.abs(q)
    u = a.to(tl.int32, bitcast=True)
    normal = (((u >> 23) - 120) << 3) | ((u >> 20) & 7)
    code = tl.where(a >= 0.015625, normal, (a * 512.0).to(tl.int32))
    return tl.where(q < 0, code | 0x80, code)


@triton.jit
def act_quant_e4m3_kernel(x_ptr, q_ptr, s_ptr, M, K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                          PDL: tl.constexpr = False):
    """x [M, K] -> E4M3 codes q [MP, K] (uint8) and power-of-two scales s [MP, K/32] (float32) for a [BR, BK]
    tile (K % BK == 0); rows M..MP-1 of the padded buffers get code 0 (their x reads as 0), so the GEMM reads
    whole tiles without masks."""
    rm = tl.program_id(0) * BR + tl.arange(0, BR)
    rk = tl.program_id(1) * BK + tl.arange(0, BK)
    grid_wait(PDL)
    grid_release(PDL)
    offs = rm[:, None].to(tl.int64) * K + rk[None, :]
    x = tl.load(x_ptr + offs, mask=(rm[:, None] < M), other=0.0).to(tl.float32)
    xb = tl.reshape(x, (BR, BK // 32, 32))
    amax = tl.maximum(tl.max(tl.abs(xb), axis=2), 1e-4)
    s = pow2_ceil_f32(tl.div_rn(amax, 448.0))
    q = round_e4m3_f32(tl.minimum(tl.maximum(xb * pow2_inv_f32(s)[:, :, None], -448.0), 448.0))
    tl.store(q_ptr + offs, tl.reshape(e4m3_code_bits(q), (BR, BK)).to(tl.uint8))
    rb = tl.program_id(1) * (BK // 32) + tl.arange(0, BK // 32)
    tl.store(s_ptr + rm[:, None].to(tl.int64) * (K // 32) + rb[None, :], s)


@triton.jit
def _row_scales(ws_ptr, pid, kb, N: tl.constexpr, KS: tl.constexpr, BN: tl.constexpr):
    """The UE8M0 weight scales of the tile's BN rows for 32-column block kb, as float32 [BN]: one byte per 32-row
    group (BN/32 loads), expanded to the rows (BN % 32 == 0, the launcher checks)."""
    RG: tl.constexpr = BN // 32
    g = pid * RG + tl.arange(0, RG)
    sg = e8m0_to_f32(tl.load(ws_ptr + g * KS + kb, mask=g < (N + 31) // 32, other=127))
    return tl.reshape(tl.broadcast_to(sg[:, None], (RG, 32)), (BN,))


@triton.jit
def w8a8_decode_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, y_ptr, part_ptr, cnt_ptr, M, limit,
                       N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       SPLIT_K: tl.constexpr, GATED: tl.constexpr, DOT_F32: tl.constexpr,
                       PDL: tl.constexpr = False):
    """y = Σ_kb (Wq·xqᵀ)_kb · sw · sx (module docstring); GATED: y = silu(min(g, limit)) · clamp(u, ±limit).

    xq [BM, K] E4M3 codes and xs [BM, K/32] float32 scales (act_quant_e4m3_kernel, rows padded to BM); W / W3
    [N, K] E4M3 with UE8M0 [N/32, K/32]; y [M, N]. Needs K % BK == 0, BK % 32 == 0 and BN % 32 == 0 (the
    launcher checks). SPLIT_K > 1: fp32 partials part[split, M, N (GATED: 2N)] and arrival counters cnt[pid], as
    fp8_gemm_kernel."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    KS: tl.constexpr = K // 32
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    n_ok = rn < N
    k_lo, k_hi = split_bounds(split, K, BK, SPLIT_K)
    w_rows = tl.minimum(rn, N - 1).to(tl.int64)[:, None] * K  # rows past N re-read row N-1 (never stored)
    x_rows = rm[:, None] * K
    kk = tl.arange(0, 32)
    grid_wait(PDL)
    grid_release(PDL)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    acc3 = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        for j in tl.static_range(BK // 32):
            kc = k0 + 32 * j
            xq = tl.load(xq_ptr + x_rows + kc + kk[None, :])
            sx = tl.load(xs_ptr + rm * KS + kc // 32)
            wq = tl.load(w_ptr + w_rows + kc + kk[None, :])
            sw = _row_scales(ws_ptr, pid, kc // 32, N, KS, BN)
            if DOT_F32:
                xo = tl.trans(e4m3_to_f32(xq, False))
                part = tl.dot(e4m3_to_f32(wq, False), xo, input_precision="ieee")
            else:
                xo = tl.trans(xq.to(tl.float8e4nv, bitcast=True))
                part = tl.dot(wq.to(tl.float8e4nv, bitcast=True), xo)
            acc += part * (sw[:, None] * sx[None, :])
            if GATED:
                wq3 = tl.load(w3_ptr + w_rows + kc + kk[None, :])
                sw3 = _row_scales(ws3_ptr, pid, kc // 32, N, KS, BN)
                if DOT_F32:
                    part3 = tl.dot(e4m3_to_f32(wq3, False), xo, input_precision="ieee")
                else:
                    part3 = tl.dot(wq3.to(tl.float8e4nv, bitcast=True), xo)
                acc3 += part3 * (sw3[:, None] * sx[None, :])
    m_ok = rm < M
    omask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:
        W2 = N * (1 + GATED)
        base = part_ptr + (split * M + rm.to(tl.int64))[:, None] * W2 + rn[None, :]
        tl.store(base, tl.trans(acc), mask=omask)
        if GATED:
            tl.store(base + N, tl.trans(acc3), mask=omask)
        if arrive_last(cnt_ptr + pid, SPLIT_K):
            _fold_splits(part_ptr, y_ptr, rm, rn, M, limit, N, SPLIT_K, GATED)
            reset_counter(cnt_ptr + pid)
    else:
        if GATED:
            acc = _swiglu(acc, acc3, limit)
        tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], tl.trans(acc).to(y_ptr.dtype.element_ty),
                 mask=omask)


# ============================================================================ host


def w8a8_for(device) -> bool:
    """Whether `device` multiplies E4M3 × E4M3 on its tensor cores (CUDA sm89+; not ROCm, not the interpreter)."""
    device = torch.device(device)
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return False
    i = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(i) >= (8, 9)


def act_quant_e4m3(x: torch.Tensor, rows: int = 0, pdl=None):
    """x [..., K] -> (codes uint8 [MP, K], scales float32 [MP, K/32]) with M = x.numel() / K rows quantized and
    MP = max(M, rows) rounded up to the kernel's row tile (the padding rows: code 0). The first M rows are the
    bytes formats.quant_fp8_ue8m0(x, 32) gives (its UE8M0 exponents as the powers of two themselves)."""
    K = x.shape[-1]
    if K % 128:
        raise ValueError(f"act_quant_e4m3: K={K} is not a multiple of 128")
    x2 = x.reshape(-1, K).contiguous()
    M = x2.shape[0]
    BR, BK = (16, 128) if not interpreting() else (8, 64)
    MP = triton.cdiv(max(M, rows, 1), BR) * BR
    q = torch.empty((MP, K), dtype=torch.uint8, device=x.device)
    s = torch.empty((MP, K // 32), dtype=torch.float32, device=x.device)
    pdl = pdl_for(x.device) and (pdl is None or bool(pdl))
    act_quant_e4m3_kernel[(MP // BR, K // BK)](x2, q, s, M, K=K, BR=BR, BK=BK, PDL=pdl, **launch_kw(pdl))
    return q, s


def w8a8_tiles(M: int, N: int, K: int, gated: bool, sms: int = N_SMS_HINT):
    """(BM, BN, BK, SPLIT_K, num_warps, num_stages) of the decode tile, or None where K does not tile."""
    BK = 64 if interpreting() else W8A8_BK
    if M > W8A8_MAX_M or K % BK:
        return None
    if interpreting():
        return 16, 32, BK, (2 if K % (2 * BK) == 0 else 1), 4, 1
    per_sm = W8A8_PROGRAMS_PER_SM["gated" if gated else "plain"]
    return 16, W8A8_BN, BK, _split_k(M, N, K, W8A8_BN, BK, per_sm, sms), W8A8_WARPS, W8A8_STAGES


def w8a8_gemm(x, w, s, w3=None, s3=None, limit: float = 0.0, out_dtype=None, name="fp8_gemm", tiles=None, pdl=None):
    """act_quant(x) · dequant(W)ᵀ (GATED with w3: the shared expert's SwiGLU) -> [..., N] for 1..16 tokens.

    tiles overrides (BM, BN, BK, SPLIT_K, num_warps, num_stages) (sweeps)."""
    K = x.shape[-1]
    _check_w(w, s, K, name)
    gated = w3 is not None
    if gated:
        _check_w(w3, s3, K, name)
        if w3.shape != w.shape:
            raise ValueError(f"{name}: w1 {tuple(w.shape)} and w3 {tuple(w3.shape)} differ")
    M, N = x.numel() // K if K else 0, w.shape[0]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    BM, BN, BK, SK, nw, ns = tiles or w8a8_tiles(M, N, K, gated, sm_count(x.device)) or (0,) * 6
    if not BK or M > BM or K % BK or BK % 32 or BN % 32 or not 1 <= SK <= K // BK:
        raise ValueError(f"{name}: the W8A8 decode tile takes up to {W8A8_MAX_M} tokens with K % {W8A8_BK} == 0 "
                         f"(got M={M}, K={K}, tiles={(BM, BN, BK, SK, nw, ns)})")
    xq, xs = act_quant_e4m3(x, BM, pdl)
    wu, su = as_u8(w), as_u8(s)
    w3u, s3u = (as_u8(w3), as_u8(s3)) if gated else (wu, su)
    part = y if SK == 1 else torch.empty((SK, M, (2 if gated else 1) * N), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, BN), SK)
    cnt = counters(x.device, grid[0]) if SK > 1 else y
    pdl = pdl_for(x.device) and (pdl is None or bool(pdl))
    w8a8_decode_kernel[grid](xq, xs, wu, su, w3u, s3u, y, part, cnt, M, float(limit), N=N, K=K, BM=BM, BN=BN, BK=BK,
                             SPLIT_K=SK, GATED=gated, DOT_F32=interpreting(), PDL=pdl, num_warps=nw, num_stages=ns,
                             **launch_kw(pdl))
    return y.reshape(*x.shape[:-1], N)


def w8a8_reference(x, w, s, w3=None, s3=None, limit: float = 0.0, out_dtype=None):
    """fp8_gemm's act_quant=True reference (fake quant of x, float32 product), gated or not."""
    if w3 is not None:
        return fp8_gemm_swiglu_reference(x, w, s, w3, s3, limit, act_quant=True, out_dtype=out_dtype)
    return fp8_gemm_reference(x, w, s, act_quant=True, out_dtype=out_dtype)


# ============================================================================ ahead-of-time variants


def _variants(target: str) -> list:
    """One decode variant per dense and gated linear on targets with E4M3 tensor cores (CUDA sm89+)."""
    tr = target_traits(target)
    if tr is None or tr["kind"] != "cuda" or tr["arch"] < 89:
        return []
    out = []
    types = {"xq_ptr": "*u8", "xs_ptr": "*fp32", "w_ptr": "*u8", "ws_ptr": "*u8", "w3_ptr": "*u8", "ws3_ptr": "*u8",
             "y_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "limit": "fp32"}
    for gated, shapes in ((False, DENSE_LINEARS), (True, GATED_LINEARS)):
        for name, (N, K) in shapes.items():
            if K % W8A8_BK:
                continue
            SK = _split_k(1, N, K, W8A8_BN, W8A8_BK, W8A8_PROGRAMS_PER_SM["gated" if gated else "plain"])
            ce = {"N": N, "K": K, "BM": 16, "BN": W8A8_BN, "BK": W8A8_BK, "SPLIT_K": SK, "GATED": gated,
                  "DOT_F32": False, "PDL": False}
            mx = "mma.sync" if W8A8_WARPS < 4 else None
            out.append(aot_spec(w8a8_decode_kernel, f"{name}_decode", types, ce, W8A8_WARPS, W8A8_STAGES,
                                {"linear": name, "act": "e4m3", **ce}, matrix=mx))
    for K in sorted({k for _, k in DENSE_LINEARS.values()} | {k for _, k in GATED_LINEARS.values()}):
        ce = {"K": K, "BR": 16, "BK": 128, "PDL": False}
        out.append(aot_spec(act_quant_e4m3_kernel, f"quant_k{K}", {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*fp32",
                                                                     "M": "i32"}, ce, 4, 1,
                            {"linear": "act_quant", "act": "bf16", **ce}))
    return out


register(KernelTemplate(
    name="fp8_gemm_w8a8", module=__name__,
    summary="decode linears with dynamic E4M3 activations: E4M3 × E4M3 tensor-core dots per 32-column block",
    keys=("linear", "act", "N", "K", "BM", "BN", "BK", "BR", "SPLIT_K", "GATED", "DOT_F32", "PDL"),
    reference=w8a8_reference, launch=w8a8_gemm, specializations=_variants,
    missing_on={"cuda:sm80": "no E4M3 tensor cores before sm89 (act_quant runs fake quant + the bf16 fp8_gemm)",
                "rocm:gfx942": "FP8 MFMA takes the FNUZ encoding, not the checkpoint's E4M3 fn (not written)",
                "rocm:gfx950": "OCP FP8 MFMA exists; not written (act_quant runs fake quant + the bf16 fp8_gemm)",
                "rocm:gfx1100": "no FP8 WMMA on RDNA3 (act_quant runs fake quant + the bf16 fp8_gemm)"}))
