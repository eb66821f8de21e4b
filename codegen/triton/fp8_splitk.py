"""What the FP8 linears' kernels share around their k loops: the split-K bounds and the epilogue.

`split_bounds` gives a program its run of whole k tiles (splits need not divide K/BK); `swiglu` is the shared
expert's gate/up epilogue; `fold_splits` is the last-arriving program's sum of the fp32 partials in split order
(inside the GEMM launch, arrival.py), and `splitk_reduce_kernel` the same sum in a second launch, with the same
bits. Used by fp8_gemm.py (tile GEMM), fp8_gemv.py (one token) and fp8_warp_split.py.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split_bounds(split, K: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_lo, k_hi) of split `split` of K: split s takes the BK tiles [s·T // S, (s+1)·T // S), T = K / BK,
    S = SPLIT_K, so the runs differ by at most one tile and S need not divide T (the launcher picks S to fill
    the GPU's resident program slots, not to divide T). SPLIT_K == 1: the whole K (any K; the tail masked)."""
    if SPLIT_K == 1:
        return 0, K
    T: tl.constexpr = K // BK
    return (split * T // SPLIT_K) * BK, ((split + 1) * T // SPLIT_K) * BK


@triton.jit
def swiglu(g, u, limit):
    """silu(min(g, L))·clamp(u, ±L). Known gap: a NaN g or u (only from a NaN scale byte, UE8M0 255, which real
    checkpoints do not hold) may come out finite on the GPU, where min / max lower to fmin / fmax that drop NaN;
    the torch reference (torch.clamp) keeps it."""
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def fold_splits(part_ptr, y_ptr, rm, rn, M, limit, N: tl.constexpr, SPLIT_K: tl.constexpr, GATED: tl.constexpr):
    """Last arriver of a split-K tile: y[rm, rn] = epilogue(Σ_split part[split, rm, rn]) in split order
    (the order `splitk_reduce_kernel` uses, so both paths give the same bits). `.cg` loads read L2,
    where the other programs' partials are, not this SM's L1."""
    W2 = N * (1 + GATED)
    omask = (rm < M)[:, None] & (rn < N)[None, :]
    acc = tl.zeros((rm.shape[0], rn.shape[0]), dtype=tl.float32)
    acc3 = tl.zeros((rm.shape[0], rn.shape[0]), dtype=tl.float32)
    for sp in tl.static_range(SPLIT_K):
        row = part_ptr + (sp * M + rm.to(tl.int64))[:, None] * W2 + rn[None, :]
        acc += tl.load(row, mask=omask, other=0.0, cache_modifier=".cg")
        if GATED:
            acc3 += tl.load(row + N, mask=omask, other=0.0, cache_modifier=".cg")
    if GATED:
        acc = swiglu(acc, acc3, limit)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=omask)


@triton.jit
def splitk_reduce_kernel(part_ptr, y_ptr, M, limit, N: tl.constexpr, SPLIT_K: tl.constexpr, GATED: tl.constexpr,
                         BLOCK: tl.constexpr):
    """y[m, n] = epilogue(Σ_split part[split, m, n]) in split order (deterministic)."""
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = rn < N
    W2 = N * (1 + GATED)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK,), dtype=tl.float32)
    for sp in tl.static_range(SPLIT_K):
        row = part_ptr + (sp * M + m) * W2
        acc += tl.load(row + rn, mask=ok, other=0.0)
        if GATED:
            acc3 += tl.load(row + N + rn, mask=ok, other=0.0)
    if GATED:
        acc = swiglu(acc, acc3, limit)
    tl.store(y_ptr + m * N + rn, acc.to(y_ptr.dtype.element_ty), mask=ok)
