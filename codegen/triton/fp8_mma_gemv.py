"""Block-scaled FP8 GEMM for 2-8 tokens on the tensor cores with the weights decoded in registers: `fp8_gemm`'s
path "regs" (explicit; the default decode tile is fp8_gemm_kernel's `tl.dot` one).

Why: the decode tile (`fp8_gemm_kernel` at M <= 16) decodes its E4M3 weight tile in registers and hands it to
`tl.dot`, which takes it through shared memory into the MMA operand layout (cp.async -> LDS -> decode -> STS ->
LDSM -> MMA); Nsight Compute put those kernels at ~32 % of issue slots and ~34 % of DRAM, latency-bound (session
12). Here each thread loads its own weight bytes (inline-PTX `ld.global.nc.v2`) into the registers an inline-PTX
`mma.sync.m16n8k16` (bf16 × bf16 -> fp32) reads, as `fp4_mma_gemv.py` does for the MoE's FP4 weights.

Layout (every tensor [NT] = one element a thread, t = 32·warp + lane): a warp owns 16 weight rows (lane g = lane //
4: rows g and g + 8), the tokens are the MMA's 8 columns (lane g also loads token g's x; tokens past M read token
M - 1, their outputs are dropped), a 32-k block is two MMAs: lane c = lane % 4 loads 8 bytes of each of its rows
at k0 + 8c (word q feeds MMA q: bytes 0, 1 as A's k-slots (2c, 2c + 1), bytes 2, 3 as (2c + 8, 2c + 9)) and the
matching 8 bf16 of x (16 bytes: B's registers need no shuffle). The UE8M0 scale is one per 32 rows × 32 k, so one
per warp and block: D of the block's two MMAs is scaled after them. GATED: the first half of the warps run W1's
rows, the second half the same rows of W3; the epilogue pairs them for the SwiGLU.

E4M3 -> bf16 (`e4m3_pair_bf16x2`): bytes (b0, b1) spread to the two halves (b0 at bits 0..7, b1 at 16..23), each
sign moved 4 bits up (+15·sign·2^7, exact), then the word shifted left 4: sign at 15, e3..e0 m2..m0 at 10..4, which
is the bf16 of value·2^-120 exactly (E4M3 subnormals land on bf16 subnormals). D·2^120 then gets the scale.

Split-K, fold and epilogue as fp8_gemm_kernel's (`split_bounds` in 128-wide k tiles, `_fold_splits`): the same
partial buffer layout, so its reduce kernel would sum these too.

Known gaps: CUDA sm80+ only (and the interpreter's EMU form, whose MMA is written out as the fragment's data
movement); M <= 8 (one MMA column tile); bf16 activations (fp32 ones would round: refused); K a multiple of 128;
E4M3 NaN codes (0x7F / 0xFF) decode as finite numbers (checkpoints carry none); not a default anywhere until measured.
"""
from __future__ import annotations

import triton
import triton.language as tl

from dsv41c.codegen.triton.arrival import arrive_last, reset_counter
from dsv41c.codegen.triton.fp4_mma_gemv import load1, load2, load4, mma_f16
from dsv41c.codegen.triton.fp8_gemm import _fold_splits, _swiglu, split_bounds
from dsv41c.codegen.triton.pdl import grid_release, grid_wait

TWO_120 = tl.constexpr(1.329227995784916e36)  # 2^120: the bf16 decode's bias back


@triton.jit
def e4m3_pair_bf16x2(u):
    """u: two E4M3 bytes at bits 0..7 and 16..23 (all else zero) -> bf16x2 of value·2^-120 each (exact)."""
    u = u + (u & 0x00800080) * 15  # each sign from bit 7 to bit 11 (bits 8..10 are zero)
    return u << 4


@triton.jit
def e4m3_word_bf16x2(w):
    """E4M3 bytes b0..b3 of int32 w -> (b0, b1) and (b2, b3) as bf16x2 (value·2^-120)."""
    lo = e4m3_pair_bf16x2((w & 0xFF) | ((w & 0xFF00) << 8))
    hi = e4m3_pair_bf16x2(((w >> 16) & 0xFF) | ((w >> 8) & 0x00FF0000))
    return lo, hi


@triton.jit
def _ue8m0(e):
    b = tl.maximum(e << 23, 0x00400000)
    return tl.where(e == 255, float("nan"), b.to(tl.float32, bitcast=True))


@triton.jit
def _load_step(wp0, wp1, sp, st, EMU: tl.constexpr):
    """A lane's weights of 128-k step st: per block (4) its rows' 8 bytes (2 words each, row g then g + 8), then the
    warp's 4 scale bytes as one word (the same for every lane)."""
    t = ()
    for b in tl.static_range(4):
        o = st * 32 + b * 8  # words: 128 bytes a step, 32 a block
        t = t + load2(wp0 + o, EMU, True) + load2(wp1 + o, EMU, True)
    return t + (load1(sp + st, EMU, True),)


@triton.jit
def _step(d0, d1, d2, d3, W, st, xw, zero, NW: tl.constexpr, EMU: tl.constexpr):
    """The 4 blocks of step st: per block 2 MMAs (D from zero), then D·2^120·scale into the accumulators."""
    for b in tl.static_range(4):
        xb = load4(xw + (st * 4 + b) * 16, EMU, False)  # token g's x[k0 + 8c .. + 8) as 4 bf16 pairs
        ea = zero
        eb = zero
        ec = zero
        ed = zero
        for q in tl.static_range(2):
            g0, g2 = e4m3_word_bf16x2(W[4 * b + q])  # row g: bytes (0, 1) and (2, 3) of word q
            h0, h2 = e4m3_word_bf16x2(W[4 * b + 2 + q])  # row g + 8
            ea, eb, ec, ed = mma_f16(g0, h0, g2, h2, xb[2 * q], xb[2 * q + 1], ea, eb, ec, ed, NW, EMU, True)
        s = _ue8m0((W[16] >> (8 * b)) & 0xFF)
        d0 += (ea * TWO_120) * s
        d1 += (eb * TWO_120) * s
        d2 += (ec * TWO_120) * s
        d3 += (ed * TWO_120) * s
    return d0, d1, d2, d3


@triton.jit
def _pair_matrices(v, WPM: tl.constexpr):
    """[NT] per lane of 2·WPM warps -> (W1's, W3's) [WPM·32], lane-aligned (the same rows and tokens)."""
    a, b = tl.split(tl.permute(tl.reshape(v, (2, WPM * 32)), (1, 0)))
    return a, b


@triton.jit
def fp8_mma_gemv_kernel(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, y_ptr, part_ptr, cnt_ptr, M, limit,
                        N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr,
                        GATED: tl.constexpr, FOLD: tl.constexpr, EMU: tl.constexpr, PDL: tl.constexpr = False):
    """y [M, N] = x·dequant(W)ᵀ (GATED: silu(min(x·W1ᵀ, limit))·clamp(x·W3ᵀ, ±limit)) for M <= 8 tokens; program
    (n, split): BN output columns over split `split` of K (`split_bounds`, 128-wide tiles). SPLIT_K > 1: fp32
    partials to part [split, M, N] ([split, M, 2N] gated, g then u), the last arriving program (FOLD) sums them."""
    tl.static_assert(K % 128 == 0 and BN % 16 == 0, "fp8_mma_gemv: K a multiple of 128, BN of 16")
    WPM: tl.constexpr = BN // 16
    NW: tl.constexpr = WPM * (1 + GATED)
    NT: tl.constexpr = 32 * NW
    KS: tl.constexpr = K // 32
    W2: tl.constexpr = N * (1 + GATED)  # a split's partial row: g then u when gated
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    k_lo, k_hi = split_bounds(split, K, 128, SPLIT_K)
    t = tl.arange(0, NT)
    lane = t % 32
    warp = t // 32
    g = lane // 4
    c = lane % 4
    row_g = pid_n * BN + (warp % WPM) * 16 + g
    r0 = tl.minimum(row_g, N - 1).to(tl.int64)  # rows past N read row N - 1; their outputs are dropped
    r1 = tl.minimum(row_g + 8, N - 1).to(tl.int64)
    if GATED:
        on3 = warp >= WPM
        wbase = tl.where(on3, w3_ptr, w_ptr)
        sbase = tl.where(on3, ws3_ptr, ws_ptr)
    else:
        wbase = w_ptr + t * 0
        sbase = ws_ptr + t * 0
    w32 = wbase.to(tl.pointer_type(tl.int32))
    wp0 = w32 + (r0 * K + k_lo + 8 * c) // 4
    wp1 = w32 + (r1 * K + k_lo + 8 * c) // 4
    srow = (pid_n * BN + (warp % WPM) * 16) // 32  # the warp's 16 rows share one 32-row scale block
    sp = sbase.to(tl.pointer_type(tl.int32)) + (srow * KS + k_lo // 32) // 4  # 4 scale bytes a step: one word
    tok = tl.minimum(g, M - 1).to(tl.int64)
    xw = x_ptr.to(tl.pointer_type(tl.int32)) + (tok * K + k_lo + 8 * c) // 2
    NS = (k_hi - k_lo) // 128
    zero = tl.zeros((NT,), dtype=tl.float32)
    d0 = zero
    d1 = zero
    d2 = zero
    d3 = zero
    wa = _load_step(wp0, wp1, sp, 0, EMU)
    wb = _load_step(wp0, wp1, sp, tl.minimum(1, NS - 1), EMU)
    grid_wait(PDL)
    grid_release(PDL)
    for s in range(0, NS - 1, 2):  # two buffers, each refilled two steps ahead (past the end: the last step again)
        d0, d1, d2, d3 = _step(d0, d1, d2, d3, wa, s, xw, zero, NW, EMU)
        wa = _load_step(wp0, wp1, sp, tl.minimum(s + 2, NS - 1), EMU)
        d0, d1, d2, d3 = _step(d0, d1, d2, d3, wb, s + 1, xw, zero, NW, EMU)
        wb = _load_step(wp0, wp1, sp, tl.minimum(s + 3, NS - 1), EMU)
    if NS % 2 == 1:
        d0, d1, d2, d3 = _step(d0, d1, d2, d3, wa, NS - 1, xw, zero, NW, EMU)
    # lane (g, c) holds rows g (d0, d1) and g + 8 (d2, d3) for tokens 2c (d0, d2) and 2c + 1 (d1, d3)
    tk0 = 2 * c
    if GATED:
        g0, u0 = _pair_matrices(d0, WPM)
        g1, u1 = _pair_matrices(d1, WPM)
        g2, u2 = _pair_matrices(d2, WPM)
        g3, u3 = _pair_matrices(d3, WPM)
        rg, _ = _pair_matrices(row_g, WPM)
        tk, _ = _pair_matrices(tk0, WPM)
    else:
        g0, g1, g2, g3, u0, u1, u2, u3 = d0, d1, d2, d3, d0, d1, d2, d3
        rg = row_g
        tk = tk0
    for h in tl.static_range(4):  # (row, token) of each accumulator
        if h == 0:
            gv, uv, rr, tt = g0, u0, rg, tk
        elif h == 1:
            gv, uv, rr, tt = g1, u1, rg, tk + 1
        elif h == 2:
            gv, uv, rr, tt = g2, u2, rg + 8, tk
        else:
            gv, uv, rr, tt = g3, u3, rg + 8, tk + 1
        ok = (rr < N) & (tt < M)
        if SPLIT_K > 1:
            base = part_ptr + (split * M + tt.to(tl.int64)) * W2 + rr
            tl.store(base, gv, mask=ok)
            if GATED:
                tl.store(base + N, uv, mask=ok)
        else:
            if GATED:
                gv = _swiglu(gv, uv, limit)
            tl.store(y_ptr + tt.to(tl.int64) * N + rr, gv.to(y_ptr.dtype.element_ty), mask=ok)
    if SPLIT_K > 1:
        if FOLD:
            if arrive_last(cnt_ptr + pid_n, SPLIT_K):
                _fold_splits(part_ptr, y_ptr, tl.arange(0, 8), pid_n * BN + tl.arange(0, BN), M, limit, N, SPLIT_K,
                             GATED)
                reset_counter(cnt_ptr + pid_n)


# ============================================================================ launcher

PROGRAMS_PER_SM = {"plain": 16, "gated": 8}  # the K split's plan: resident programs an SM (sm90 guess; tune)


def gemm_regs(x2, wu, su, w3u, s3u, y, limit: float, tiles=None, fold=True, pdl=None, name="fp8_gemm"):
    """Launch for x2 [M, K] bf16 (M <= 8), the E4M3 weights / UE8M0 scales as bytes (w3u None: not gated), into
    y [M, N]. tiles: (BN, SPLIT_K); default BN 32 and the K split of `fp8_gemm._split_k` for PROGRAMS_PER_SM."""
    import torch

    from dsv41c.codegen.triton.arrival import counters
    from dsv41c.codegen.triton.fp8_gemm import _split_k, interpreting
    from dsv41c.codegen.triton.kv_quant import sm_count
    from dsv41c.codegen.triton.pdl import launch_kw, pdl_for
    M, K = x2.shape
    N = wu.shape[0]
    gated = w3u is not None
    emu = interpreting()
    why = []
    if not emu and (x2.device.type != "cuda" or torch.version.hip is not None
                    or torch.cuda.get_device_capability(x2.device) < (8, 0)):
        why.append("a CUDA sm80+ device (mma.sync)")
    if M > 8:
        why.append(f"at most 8 tokens (got {M})")
    if x2.dtype != torch.bfloat16:
        why.append(f"bf16 activations (got {x2.dtype}: the MMA's B is bf16)")
    if K % 128:
        why.append(f"K a multiple of 128 (got {K})")
    for nm, t_, a in (("w", wu, 8), ("w3", w3u, 8), ("w_scale", su, 4), ("w3_scale", s3u, 4), ("x", x2, 16)):
        if t_ is not None and t_.data_ptr() % a:
            why.append(f"{nm} {a}-byte aligned")
    if why:
        raise ValueError(f"{name}: path 'regs' needs " + "; ".join(why))
    BN, SK = tiles or (32, None)
    if BN % 16 or BN & (BN - 1):
        raise ValueError(f"{name}: path 'regs' BN={BN} must be a power of two, at least 16")
    if SK is None:
        SK = 2 if emu and K % 256 == 0 else (
            1 if emu else _split_k(M, N, K, BN, 128, PROGRAMS_PER_SM["gated" if gated else "plain"],
                                   sm_count(x2.device)))
    if not 1 <= SK <= K // 128:
        raise ValueError(f"{name}: path 'regs' SPLIT_K={SK} must be 1..K/128={K // 128}")
    grid = (triton.cdiv(N, BN), SK)
    part = y if SK == 1 else torch.empty((SK, M, (2 if gated else 1) * N), dtype=torch.float32, device=x2.device)
    cnt = counters(x2.device, grid[0]) if fold and SK > 1 else y
    pdl = pdl_for(x2.device) and (fold or SK == 1) and (pdl is None or bool(pdl))
    fp8_mma_gemv_kernel[grid](x2, wu, su, w3u if gated else wu, s3u if gated else su, y, part, cnt, M, float(limit),
                              N=N, K=K, BN=BN, SPLIT_K=SK, GATED=gated, FOLD=fold and SK > 1, EMU=emu, PDL=pdl,
                              num_warps=(BN // 16) * (1 + gated), num_stages=1, **launch_kw(pdl))
    if SK > 1 and not fold:
        from dsv41c.codegen.triton.fp8_gemm import splitk_reduce_kernel
        RB = 256 if emu else 1024
        splitk_reduce_kernel[(M, triton.cdiv(N, RB))](part, y, M, float(limit), N=N, SPLIT_K=SK, GATED=gated,
                                                      BLOCK=RB, num_warps=4)
    return y
