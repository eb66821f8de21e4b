"""mHC (manifold hyper-connections) sites in Triton: coefficients + collapse, and expand.

What (spec §3.8, single-pass order), per token with streams H [hc=4, D]:
    f    = H_flat · rsqrt(mean(H_flat²) + rms_norm_eps)         (unweighted RMSNorm, fp32)
    m    = f · fnᵀ                                               (fn [24, 4·D] fp32)
    pre  = sigmoid(m[0:4]·scale0 + base[0:4]) + hc_eps           (collapses the NEXT site's input)
    post = 2·sigmoid(m[4:8]·scale1 + base[4:8])
    comb = softmax_row(m[8:24]·scale2 + base[8:24] as 4×4) + hc_eps, then column-normalize,
           then (iters-1) × {row-normalize, column-normalize}, each x / (sum + hc_eps)
    x_in = Σ_k pre_prev_k · H_k           (pre_prev: the previous site's `pre`; one-hot stream 0
                                           at layer 0's attention site)
    H'_k = post_k · y + Σ_j comb[j, k] · H_j   (after the sublayer produced y from x_in)
The math is fp32 whatever the stream dtype; x_in and H' come back in H's dtype.

Algorithm: `mhc_pre` makes ONE pass over H: for each chunk of D it loads the 4 stream chunks,
adds their squares, accumulates the 24 projections with a tl.dot against fn (two N=16 halves:
rows 0..7 = pre/post, rows 8..23 = comb) and writes the collapse x_in for that chunk. The norm
is a per-token scalar, so it is applied to the 24 dot products at the end (m = (H·fnᵀ)·rstd).
Prefill runs one program per token block and finishes the coefficients in the same kernel;
at 9..64 tokens D is split across programs (partial projections + sums of squares, fixed-order
reduction in `mhc_coeff_kernel`) so the 2 MB fn is streamed by many SMs. Decode (<= 8 tokens)
uses `mhc_pre_gemv_kernel` instead: one program per (token, 128 channels), plain multiply-and-sum
against the [24, 128] fn slices (no 16-row MMA padding, no operand shuffles), then the same
coefficient kernel with a [T, 4, 4] tile in one or two warps. (H200, before the GEMV form:
32 µs per site at one token under a CUDA graph, 0.5 µs bytes floor.) The Sinkhorn runs on a
[BT, 4, 4] register tile. `mhc_post` is elementwise over (token block, D chunk).
Divisions in the coefficient math are IEEE (div_rn) so all targets agree with the reference.

Specialization keys: HC (4), D (5120), ITERS (20), mode (decode_gemv / decode: split D / prefill: fused),
BT, BD, PREC (fp32 dot: tf32x3 on CUDA, ieee on ROCm), stream dtype.

Known gaps: the expand of one site and the coefficient pass of the next are separate kernels
(fusing them saves one read of H per site boundary); the fp32 projection on ROCm runs at the
ieee (FMA / fp32 MFMA) rate.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c.codegen.triton.targets import fp32_dot_precision, interpreting, target_traits

HC = 4


# ============================================================================ kernels


@triton.jit
def _mhc_coeffs(mpp, mc, sumsq, rt, t_ok, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, n_elem, norm_eps, hc_eps,
                ITERS: tl.constexpr, BT: tl.constexpr):
    """From raw projections (H·fnᵀ, [BT,16] ×2) and Σ H² -> pre/post [T,4], comb [T,16] (row-major j,k)."""
    rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(sumsq, n_elem) + norm_eps))
    c16 = tl.arange(0, 16)
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    z = (mpp * rstd[:, None]) * tl.where(c16 < 4, s0, s1)[None, :] + tl.load(base_ptr + c16, mask=c16 < 8, other=0.0)[None, :]
    sg = tl.div_rn(tl.full(z.shape, 1.0, tl.float32), 1.0 + tl.exp(-z))
    pp = tl.where(c16[None, :] < 4, sg + hc_eps, 2.0 * sg)
    tl.store(pre_ptr + rt[:, None] * 4 + c16[None, :], pp, mask=t_ok[:, None] & (c16[None, :] < 4))
    tl.store(post_ptr + rt[:, None] * 4 + (c16[None, :] - 4), pp,
             mask=t_ok[:, None] & (c16[None, :] >= 4) & (c16[None, :] < 8))
    lg = (mc * rstd[:, None]) * s2 + tl.load(base_ptr + 8 + c16)[None, :]
    l3 = tl.reshape(lg, (BT, 4, 4))  # [t, j, k]
    p = tl.exp(l3 - tl.max(l3, axis=2)[:, :, None])
    c = tl.div_rn(p, tl.sum(p, axis=2)[:, :, None]) + hc_eps
    c = tl.div_rn(c, tl.sum(c, axis=1)[:, None, :] + hc_eps)
    for _ in range(ITERS - 1):
        c = tl.div_rn(c, tl.sum(c, axis=2)[:, :, None] + hc_eps)
        c = tl.div_rn(c, tl.sum(c, axis=1)[:, None, :] + hc_eps)
    tl.store(comb_ptr + rt[:, None] * 16 + c16[None, :], tl.reshape(c, (BT, 16)), mask=t_ok[:, None])


@triton.jit
def mhc_pre_kernel(h_ptr, pre_prev_ptr, fn_ptr, x_ptr, part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr,
                   comb_ptr, T, norm_eps, hc_eps, D: tl.constexpr, D_PER_SPLIT: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, ITERS: tl.constexpr, PREC: tl.constexpr,
                   FINALIZE: tl.constexpr):
    """One pass over contiguous H [T, 4, D]: collapse with pre_prev, Σ H², H·fnᵀ; coefficients when FINALIZE."""
    pid_t = tl.program_id(0)
    split = tl.program_id(1)
    rt = pid_t * BT + tl.arange(0, BT)
    t_ok = rt < T
    r16 = tl.arange(0, 16)
    pp_rows = r16 < 8
    p0 = tl.load(pre_prev_ptr + rt * 4 + 0, mask=t_ok, other=0.0)
    p1 = tl.load(pre_prev_ptr + rt * 4 + 1, mask=t_ok, other=0.0)
    p2 = tl.load(pre_prev_ptr + rt * 4 + 2, mask=t_ok, other=0.0)
    p3 = tl.load(pre_prev_ptr + rt * 4 + 3, mask=t_ok, other=0.0)
    h_rows = h_ptr + rt[:, None].to(tl.int64) * (4 * D)
    x_rows = x_ptr + rt[:, None].to(tl.int64) * D
    KD = 4 * D
    acc_pp = tl.zeros((BT, 16), dtype=tl.float32)
    acc_c = tl.zeros((BT, 16), dtype=tl.float32)
    sq = tl.zeros((BT, BD), dtype=tl.float32)
    d_lo = split * D_PER_SPLIT
    d_hi = tl.minimum(d_lo + D_PER_SPLIT, D)
    for d0 in range(d_lo, d_hi, BD):
        rd = d0 + tl.arange(0, BD)
        d_ok = rd < d_hi
        m2 = t_ok[:, None] & d_ok[None, :]
        xacc = tl.zeros((BT, BD), dtype=tl.float32)
        for k in tl.static_range(4):
            hk = tl.load(h_rows + k * D + rd[None, :], mask=m2, other=0.0).to(tl.float32)
            sq += hk * hk
            fpp = tl.load(fn_ptr + r16[:, None] * KD + k * D + rd[None, :], mask=pp_rows[:, None] & d_ok[None, :],
                          other=0.0)
            fc = tl.load(fn_ptr + (8 + r16[:, None]) * KD + k * D + rd[None, :], mask=d_ok[None, :], other=0.0)
            acc_pp = tl.dot(hk, tl.trans(fpp), acc_pp, input_precision=PREC)
            acc_c = tl.dot(hk, tl.trans(fc), acc_c, input_precision=PREC)
            if k == 0:
                xacc += p0[:, None] * hk
            elif k == 1:
                xacc += p1[:, None] * hk
            elif k == 2:
                xacc += p2[:, None] * hk
            else:
                xacc += p3[:, None] * hk
        tl.store(x_rows + rd[None, :], xacc.to(x_ptr.dtype.element_ty), mask=m2)
    sumsq = tl.sum(sq, axis=1)
    if FINALIZE:
        _mhc_coeffs(acc_pp, acc_c, sumsq, rt, t_ok, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
                    4.0 * D, norm_eps, hc_eps, ITERS, BT)
    else:
        base = part_ptr + (split * T + rt[:, None]).to(tl.int64) * 32 + r16[None, :]
        tl.store(base, acc_pp, mask=t_ok[:, None])
        tl.store(base + 16, acc_c, mask=t_ok[:, None])
        tl.store(sq_ptr + split * T + rt, sumsq, mask=t_ok)


@triton.jit
def mhc_pre_gemv_kernel(h_ptr, pre_prev_ptr, fn_ptr, x_ptr, part_ptr, sq_ptr, T, D: tl.constexpr,
                        D_PER_SPLIT: tl.constexpr, BD: tl.constexpr):
    """Decode form of mhc_pre_kernel: one token × one D range per program, FMA reductions, no MMA.

    part[split, t] = Σ_d H[t]·fn[:, d] over the range, sq[split, t] = Σ H², x_in[t, range]. At a few tokens
    the [16-token, BD]·[BD, 16] MMAs of mhc_pre_kernel are mostly padding and their operand shuffles
    serialize each program; plain multiply-and-sum over a [32, BD] fn tile keeps every lane busy."""
    t = tl.program_id(0)
    split = tl.program_id(1)
    # Column c of the partial holds the layout mhc_coeff_kernel sums: m[0:8] (pre, post) in 0..7,
    # zeros in 8..15, m[8:24] (comb logits) in 16..31.
    r32 = tl.arange(0, 32)
    f_ok = (r32 < 8) | (r32 >= 16)
    frow = tl.where(r32 < 8, r32, r32 - 8)
    KD = 4 * D
    acc = tl.zeros((32,), dtype=tl.float32)
    sq = tl.zeros((BD,), dtype=tl.float32)
    h_row = h_ptr + t.to(tl.int64) * KD
    d_lo = split * D_PER_SPLIT
    for d0 in range(d_lo, d_lo + D_PER_SPLIT, BD):
        rd = d0 + tl.arange(0, BD)
        d_ok = rd < D
        xacc = tl.zeros((BD,), dtype=tl.float32)
        for k in tl.static_range(4):
            hk = tl.load(h_row + k * D + rd, mask=d_ok, other=0.0).to(tl.float32)
            sq += hk * hk
            xacc += tl.load(pre_prev_ptr + t * 4 + k) * hk
            f = tl.load(fn_ptr + frow[:, None] * KD + k * D + rd[None, :], mask=f_ok[:, None] & d_ok[None, :],
                        other=0.0)
            acc += tl.sum(f * hk[None, :], axis=1)
        tl.store(x_ptr + t.to(tl.int64) * D + rd, xacc.to(x_ptr.dtype.element_ty), mask=d_ok)
    base = part_ptr + (split * T + t).to(tl.int64) * 32
    tl.store(base + r32, acc)
    tl.store(sq_ptr + split * T + t, tl.sum(sq, axis=0))


@triton.jit
def mhc_coeff_kernel(part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, n_split, norm_eps,
                     hc_eps, D: tl.constexpr, BT: tl.constexpr, ITERS: tl.constexpr):
    """Sum the D-split partials in split order, then the coefficients."""
    rt = tl.program_id(0) * BT + tl.arange(0, BT)
    t_ok = rt < T
    r16 = tl.arange(0, 16)
    acc_pp = tl.zeros((BT, 16), dtype=tl.float32)
    acc_c = tl.zeros((BT, 16), dtype=tl.float32)
    sumsq = tl.zeros((BT,), dtype=tl.float32)
    for sp in range(0, n_split):
        base = part_ptr + (sp * T + rt[:, None]).to(tl.int64) * 32 + r16[None, :]
        acc_pp += tl.load(base, mask=t_ok[:, None], other=0.0)
        acc_c += tl.load(base + 16, mask=t_ok[:, None], other=0.0)
        sumsq += tl.load(sq_ptr + sp * T + rt, mask=t_ok, other=0.0)
    _mhc_coeffs(acc_pp, acc_c, sumsq, rt, t_ok, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
                4.0 * D, norm_eps, hc_eps, ITERS, BT)


@triton.jit
def mhc_post_kernel(h_ptr, y_ptr, post_ptr, comb_ptr, out_ptr, T, D: tl.constexpr, BT: tl.constexpr,
                    BD: tl.constexpr):
    """H'_k = post_k·y + Σ_j comb[j,k]·H_j for a [BT tokens, BD channels] tile of all 4 streams."""
    rt = tl.program_id(0) * BT + tl.arange(0, BT)
    rd = tl.program_id(1) * BD + tl.arange(0, BD)
    t_ok = rt < T
    m2 = t_ok[:, None] & (rd[None, :] < D)
    h_rows = h_ptr + rt[:, None].to(tl.int64) * (4 * D) + rd[None, :]
    o_rows = out_ptr + rt[:, None].to(tl.int64) * (4 * D) + rd[None, :]
    y = tl.load(y_ptr + rt[:, None].to(tl.int64) * D + rd[None, :], mask=m2, other=0.0).to(tl.float32)
    h0 = tl.load(h_rows, mask=m2, other=0.0).to(tl.float32)
    h1 = tl.load(h_rows + D, mask=m2, other=0.0).to(tl.float32)
    h2 = tl.load(h_rows + 2 * D, mask=m2, other=0.0).to(tl.float32)
    h3 = tl.load(h_rows + 3 * D, mask=m2, other=0.0).to(tl.float32)
    for k in tl.static_range(4):
        pk = tl.load(post_ptr + rt * 4 + k, mask=t_ok, other=0.0)
        c0 = tl.load(comb_ptr + rt * 16 + 0 * 4 + k, mask=t_ok, other=0.0)
        c1 = tl.load(comb_ptr + rt * 16 + 1 * 4 + k, mask=t_ok, other=0.0)
        c2 = tl.load(comb_ptr + rt * 16 + 2 * 4 + k, mask=t_ok, other=0.0)
        c3 = tl.load(comb_ptr + rt * 16 + 3 * 4 + k, mask=t_ok, other=0.0)
        o = pk[:, None] * y + (c0[:, None] * h0 + c1[:, None] * h1 + c2[:, None] * h2 + c3[:, None] * h3)
        tl.store(o_rows + k * D, o.to(out_ptr.dtype.element_ty), mask=m2)


# ============================================================================ references


def mhc_pre_reference(H, pre_prev, fn, base, scale, norm_eps: float, hc_eps: float, iters: int = PUBLISHED.hc_sinkhorn_iters):
    """H [T, 4, D] -> (x_in [T, D] (H's dtype), pre [T, 4], post [T, 4], comb [T, 4, 4]) fp32.

    pre_prev [T, 4] (None: one-hot stream 0, layer 0's attention site)."""
    T, hc, D = H.shape
    hf = H.float()
    flat = hf.flatten(1)
    f = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    m = f @ fn.float().T
    scale, base = scale.float(), base.float()
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = torch.softmax(logits, dim=-1) + hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    if pre_prev is None:
        pre_prev = _one_hot(T, hc, H.device)
    x_in = (pre_prev.float().unsqueeze(-1) * hf).sum(1).to(H.dtype)
    return x_in, pre, post, comb


def mhc_post_reference(H, y, post, comb):
    """H'_k = post_k·y + Σ_j comb[j,k]·H_j -> [T, 4, D] in H's dtype."""
    mixed = torch.einsum("tjk,tjd->tkd", comb.float(), H.float())
    return (post.float().unsqueeze(-1) * y.float().unsqueeze(1) + mixed).to(H.dtype)


def _one_hot(T, hc, device):
    p = torch.zeros(T, hc, dtype=torch.float32, device=device)
    p[:, 0] = 1.0
    return p


# ============================================================================ launchers


def mhc_pre(H, pre_prev, fn, base, scale, norm_eps: float, hc_eps: float, iters: int = PUBLISHED.hc_sinkhorn_iters, split=None):
    """Triton: -> (x_in [T, D], pre [T, 4], post [T, 4], comb [T, 4, 4])."""
    T, hc, D = H.shape
    if hc != HC or tuple(fn.shape) != ((2 + HC) * HC, HC * D) or base.numel() != 24 or scale.numel() != 3:
        raise ValueError(f"mhc_pre: H {tuple(H.shape)}, fn {tuple(fn.shape)}, base {tuple(base.shape)}, "
                         f"scale {tuple(scale.shape)} do not describe a 4-stream site over D={D}")
    dev = H.device
    H = H if H.is_contiguous() else H.contiguous()
    pre_prev = (_one_hot(T, hc, dev) if pre_prev is None else pre_prev.float()).contiguous()
    x = torch.empty(T, D, dtype=H.dtype, device=dev)
    pre = torch.empty(T, 4, dtype=torch.float32, device=dev)
    post = torch.empty(T, 4, dtype=torch.float32, device=dev)
    comb = torch.empty(T, 4, 4, dtype=torch.float32, device=dev)
    if T == 0:
        return x, pre, post, comb
    fn32, base32, scale32 = fn.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    if T <= GEMV_MAX_T:
        return _mhc_pre_gemv(H, pre_prev, fn32, base32, scale32, x, pre, post, comb, norm_eps, hc_eps, iters, split)
    if interpreting():
        BT, BD = 16, 32
        nsplit = 1 if split is None else split
    elif T <= 64:
        BT, BD = 16, 64
        nsplit = max(1, D // 256) if split is None else split
    else:
        BT, BD = 32, 64
        nsplit = 1 if split is None else split
    d_per = triton.cdiv(triton.cdiv(D, nsplit), BD) * BD
    nsplit = triton.cdiv(D, d_per)
    prec = fp32_dot_precision(dev)
    if nsplit == 1:
        mhc_pre_kernel[(triton.cdiv(T, BT), 1)](H, pre_prev, fn32, x, pre, pre, base32, scale32, pre, post, comb, T,
                                                 float(norm_eps), float(hc_eps), D=D, D_PER_SPLIT=d_per, BT=BT, BD=BD,
                                                 ITERS=iters, PREC=prec, FINALIZE=True, num_warps=4)
    else:
        part = torch.empty(nsplit, T, 32, dtype=torch.float32, device=dev)
        sq = torch.empty(nsplit, T, dtype=torch.float32, device=dev)
        mhc_pre_kernel[(triton.cdiv(T, BT), nsplit)](H, pre_prev, fn32, x, part, sq, base32, scale32, pre, post, comb,
                                                      T, float(norm_eps), float(hc_eps), D=D, D_PER_SPLIT=d_per,
                                                      BT=BT, BD=BD, ITERS=iters, PREC=prec, FINALIZE=False,
                                                      num_warps=4)
        BT2 = 16
        mhc_coeff_kernel[(triton.cdiv(T, BT2),)](part, sq, base32, scale32, pre, post, comb, T, nsplit,
                                                 float(norm_eps), float(hc_eps), D=D, BT=BT2, ITERS=iters, num_warps=4)
    return x, pre, post, comb


def mhc_pre_call(H, pre_prev, fn, base, scale, *, iters: int, hc_eps: float, norm_eps: float, **_):
    """A plan's `kernel.call @mhc_pre`: one site's mixes and the collapse of its input with the previous site's
    `pre_prev` -> (x_in, pre, post, comb). The form (GEMV / split / fused) is still chosen here from T."""
    return mhc_pre(H, pre_prev, fn, base, scale, norm_eps, hc_eps, int(iters))


GEMV_MAX_T = 8  # decode: tokens up to which mhc_pre runs the per-token GEMV form
GEMV_BD = 128  # channels per program of the GEMV form (D = 5120 -> 40 programs per token)


def _mhc_pre_gemv(H, pre_prev, fn32, base32, scale32, x, pre, post, comb, norm_eps, hc_eps, iters, split):
    T, _, D = H.shape
    nsplit = triton.cdiv(D, GEMV_BD) if split is None else split
    d_per = triton.cdiv(triton.cdiv(D, nsplit), GEMV_BD) * GEMV_BD
    nsplit = triton.cdiv(D, d_per)
    part = torch.empty(nsplit, T, 32, dtype=torch.float32, device=H.device)
    sq = torch.empty(nsplit, T, dtype=torch.float32, device=H.device)
    mhc_pre_gemv_kernel[(T, nsplit)](H, pre_prev, fn32, x, part, sq, T, D=D, D_PER_SPLIT=d_per, BD=GEMV_BD,
                                     num_warps=4)
    BT2 = triton.next_power_of_2(T)  # one token: a [1, 4, 4] Sinkhorn tile in one warp
    mhc_coeff_kernel[(1,)](part, sq, base32, scale32, pre, post, comb, T, nsplit, float(norm_eps), float(hc_eps),
                           D=D, BT=BT2, ITERS=iters, num_warps=1 if BT2 <= 2 else 2)
    return x, pre, post, comb


def mhc_post(H, y, post, comb):
    """Triton: H' [T, 4, D] = post_k·y + Σ_j comb[j,k]·H_j, in H's dtype."""
    T, hc, D = H.shape
    if hc != HC or tuple(y.shape) != (T, D) or tuple(post.shape) != (T, 4) or tuple(comb.shape) != (T, 4, 4):
        raise ValueError(f"mhc_post: H {tuple(H.shape)}, y {tuple(y.shape)}, post {tuple(post.shape)}, "
                         f"comb {tuple(comb.shape)} do not fit")
    H = H.contiguous()
    y = y.contiguous()
    out = torch.empty_like(H)
    if T == 0:
        return out
    BT, BD = (4, 64) if interpreting() else (4, 512)
    mhc_post_kernel[(triton.cdiv(T, BT), triton.cdiv(D, BD))](H, y, post.float().contiguous(),
                                                            comb.float().contiguous(), out, T, D=D, BT=BT, BD=BD,
                                                            num_warps=4)
    return out


# ============================================================================ ahead-of-time variants


def _pre_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    out = []
    for sdt in ("*bf16", "*fp32"):
        types = {"h_ptr": sdt, "pre_prev_ptr": "*fp32", "fn_ptr": "*fp32", "x_ptr": sdt, "part_ptr": "*fp32",
                 "sq_ptr": "*fp32", "base_ptr": "*fp32", "scale_ptr": "*fp32", "pre_ptr": "*fp32",
                 "post_ptr": "*fp32", "comb_ptr": "*fp32", "T": "i32", "norm_eps": "fp32", "hc_eps": "fp32"}
        for mode, (BT, BD, fin) in {"decode": (16, 64, False), "prefill": (32, 64, True)}.items():
            dper = 256 if mode == "decode" else widths.hidden_size
            ce = {"D": widths.hidden_size, "D_PER_SPLIT": dper, "BT": BT, "BD": BD, "ITERS": widths.hc_sinkhorn_iters, "PREC": tr["fp32_prec"],
                  "FINALIZE": fin}
            out.append(aot_spec(mhc_pre_kernel, f"{mode}_{sdt[1:]}", types, ce, 4, 2,
                                {"HC": HC, "mode": mode, "streams": sdt[1:], **ce}))
        gt = {"h_ptr": sdt, "pre_prev_ptr": "*fp32", "fn_ptr": "*fp32", "x_ptr": sdt, "part_ptr": "*fp32",
              "sq_ptr": "*fp32", "T": "i32"}
        ce = {"D": widths.hidden_size, "D_PER_SPLIT": GEMV_BD, "BD": GEMV_BD}
        out.append(aot_spec(mhc_pre_gemv_kernel, f"decode_gemv_{sdt[1:]}", gt, ce, 4, 1,
                            {"HC": HC, "mode": "decode_gemv", "streams": sdt[1:], **ce}))
    ct = {"part_ptr": "*fp32", "sq_ptr": "*fp32", "base_ptr": "*fp32", "scale_ptr": "*fp32", "pre_ptr": "*fp32",
          "post_ptr": "*fp32", "comb_ptr": "*fp32", "T": "i32", "n_split": "i32", "norm_eps": "fp32", "hc_eps": "fp32"}
    for bt, nw in ((1, 1), (8, 2), (16, 4)):
        out.append(aot_spec(mhc_coeff_kernel, f"coeff_bt{bt}", ct, {"D": widths.hidden_size, "BT": bt, "ITERS": widths.hc_sinkhorn_iters},
                            nw, 1, {"HC": HC, "mode": "decode", "D": widths.hidden_size, "BT": bt, "ITERS": widths.hc_sinkhorn_iters}))
    return out


def _post_variants(target: str, widths=PUBLISHED) -> list:
    if target_traits(target) is None:
        return []
    out = []
    for sdt in ("*bf16", "*fp32"):
        types = {"h_ptr": sdt, "y_ptr": "*bf16", "post_ptr": "*fp32", "comb_ptr": "*fp32", "out_ptr": sdt, "T": "i32"}
        ce = {"D": widths.hidden_size, "BT": 4, "BD": 512}
        out.append(aot_spec(mhc_post_kernel, f"bt4_bd512_{sdt[1:]}", types, ce, 4, 1,
                            {"HC": HC, "streams": sdt[1:], **ce}))
    return out


register(KernelTemplate(
    name="mhc_pre", module=__name__,
    summary="mHC site: unweighted RMSNorm + 24 projections + pre/post/Sinkhorn comb + collapse with pre_prev",
    keys=("HC", "D", "mode", "streams", "BT", "BD", "ITERS", "PREC", "D_PER_SPLIT", "FINALIZE"), reference=mhc_pre_reference, launch=mhc_pre,
    specializations=_pre_variants))
register(KernelTemplate(
    name="mhc_post", module=__name__, summary="mHC expand: H'_k = post_k·y + Σ_j comb[j,k]·H_j",
    keys=("HC", "D", "streams", "BT", "BD"), reference=mhc_post_reference, launch=mhc_post,
    specializations=_post_variants))
