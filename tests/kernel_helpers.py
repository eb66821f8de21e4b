"""Input builders and comparisons shared by the kernel test files.

pytest runs in importlib mode (test modules cannot import each other), so tests/conftest.py puts
this folder on sys.path and the test files `from kernel_helpers import ...`.
"""
import math

import torch

from dsv41c import formats
from dsv41c.codegen.triton.targets import interpreting

DEV = "cuda" if torch.cuda.is_available() else "cpu"

# Sparse attention at the CPU tier's small widths. The interpreter runs the kernel's fp32 path: a couple of ulps of
# each value. Compiled for a GPU (these files run there without TRITON_INTERPRET: benchmarks/cpu_tier_on_gpu.py), P is
# rounded to bf16 for the P·V MMA, so the error scales with the values (|v| ~ 2), not with the cancelling output: the
# GPU tier's tolerance. Measured on the H200: max error 0.0156, inside 4 ulps of 2.
ATTN_TOL = dict(ulps=2, floor=1e-3) if interpreting() or DEV == "cpu" else dict(ulps=4, floor=2.0)


def rope_table(P, n_freq, theta=160000.0, device=DEV):
    inv = 1.0 / (theta ** (torch.arange(n_freq, dtype=torch.float64) / n_freq))
    ang = torch.arange(P, dtype=torch.float64)[:, None] * inv[None]
    return torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)


def bits(t):
    return t.contiguous().view(torch.uint8)


def assert_bf16_close(out, ref, ulps=4, floor=1e-6, atol=0.0):
    """|out - ref| <= ulps bf16 ulps of |ref| (floor for values near zero) + atol (a number or a tensor of ref's
    shape: what the inputs' summation order alone may move a value by, `fp32_dot_bound`)."""
    o, r = out.float(), ref.float()
    tol = ulps * torch.clamp(r.abs(), min=floor) * 2.0 ** -8 + atol
    bad = (o - r).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} values off by more than {ulps} ulps; " \
                          f"max abs diff {(o - r).abs().max().item():.3g}"


def fp32_dot_bound(a, b):
    """Elementwise bound on how far two fp32 evaluations of a · bᵀ, in any summation order, can differ:
    2 · γ(K+1) · (|a| · |b|ᵀ), γ(n) = n · 2^-24 to first order (Higham's bound for a rounded dot product, once for
    each side). torch's CPU matmul sums in an order that depends on the CPU's vector width (AVX2 or AVX-512 kernels),
    so a test that compares a kernel with it to a fixed absolute tolerance passes on one machine and fails on
    another where a value cancels to near zero."""
    K = a.shape[-1]
    return 2 * (K + 1) * 2.0 ** -24 * (a.float().abs() @ b.float().abs().T)


def swiglu_bound(g, u, dg, du, limit):
    """First-order bound on how far silu(min(g, L)) · clamp(u, ±L) moves when the gate and up products g, u move by
    at most dg, du (`fp32_dot_bound`): silu's slope is at most 1.1 in size, the clamps' at most 1."""
    gc, uc = g.clamp(max=limit), u.clamp(-limit, limit)
    return 1.1 * uc.abs() * dg + (torch.nn.functional.silu(gc).abs() + 1.1 * dg) * du


def compressor_latent_atol(t, ratio):
    """First-order bound on how far the compressor's latent (`compressor_weights`' inputs t) moves when only the
    summation order of its GEMMs changes: the wkv product's `fp32_dot_bound` (ratio 2: with the gate's, which moves
    a pair's softmax weight by at most a quarter of the change of the logits' difference) through the pair pooling
    and the RMSNorm's scale (w / rms)."""
    x = t["x"].float()
    kv, dkv = x @ t["wkv"].float().T, fp32_dot_bound(x, t["wkv"])
    if ratio == 2:
        g, dg = x @ t["wgate"].float().T, fp32_dot_bound(x, t["wgate"])
        kv, dkv, g, dg = (v.unflatten(0, (-1, 2)) for v in (kv, dkv, g, dg))
        dkv = dkv.amax(1) + (kv[:, 0] - kv[:, 1]).abs() * (dg[:, 0] + dg[:, 1]) / 4
        kv = (torch.softmax(g, dim=1) * kv).sum(1)
    rms = kv.pow(2).mean(-1, keepdim=True).sqrt()
    return dkv / rms * t["norm_w"].float().abs()


def compressor_weights(ratio, T, D, C, CI, rope, grid, g):
    """x, wkv, wgate, norms and the indexer key's wk (bf16 on DEV), the compress RoPE table and the
    entry positions of T tokens. grid: small dyadic values, so every GEMM and sum of squares is exact."""
    if grid:
        x = torch.randint(-2, 3, (T, D), generator=g).float() / 4
        wkv = torch.randint(-2, 3, (C, D), generator=g).float() / 8
    else:
        x = torch.randn(T, D, generator=g)
        wkv = torch.randn(C, D, generator=g) / math.sqrt(D)
    t = dict(x=x, wkv=wkv, wgate=torch.randn(C, D, generator=g) / math.sqrt(D),
             norm_w=1 + 0.1 * torch.randn(C, generator=g), wk=torch.randn(CI, C, generator=g) / math.sqrt(C),
             k_norm_w=1 + 0.1 * torch.randn(CI, generator=g))
    t = {k: v.to(torch.bfloat16).to(DEV) for k, v in t.items()}
    cos, sin = rope_table(4096, rope // 2)
    pos = (torch.arange(T // ratio, dtype=torch.int32) * ratio + 60).to(DEV)
    return t, cos, sin, pos


def assert_compressor_close(a, b, ratio, ulps, floor, rtol, atol, kv_frac, key_frac, lat_atol=0.0):
    """Two compressor outputs (kv codes, kv scales, index codes, index scales, latent) from differently
    ordered GEMMs: the latent within `ulps` bf16 ulps (ratio 1, bf16) or rtol/atol (ratio 2, fp32), plus
    lat_atol (`compressor_latent_atol`: what the summation order alone may move it by), the
    compressed KV within one FP4 step at most on a `kv_frac` fraction, and at most a `key_frac` fraction
    of the indexer key's dequantized values different."""
    if ratio == 1:
        assert_bf16_close(a[4], b[4], ulps=ulps, floor=floor, atol=lat_atol)
    else:
        err, tol = (a[4] - b[4]).abs(), atol + rtol * b[4].abs() + lat_atol
        assert (err <= tol).all(), f"{int((err > tol).sum())} of {err.numel()} latent values off; " \
                                   f"max abs diff {err.max().item():.3g}"
    fp4_e4m3_close(a[0], a[1], b[0], b[1], frac=kv_frac)
    ka = formats.dequant_fp4_ue8m0(a[2], a[3], 32)
    kb = formats.dequant_fp4_ue8m0(b[2], b[3], 32)
    assert (ka != kb).float().mean() <= key_frac


def fp4_e4m3_close(pa, sa_, pb, sb, frac=0.02):
    """Compressed-KV rows from differently-ordered GEMMs: same dequantized values up to rare
    one-step FP4 flips (a 1-ulp bf16 difference can cross an E2M1 tie)."""
    va = formats.dequant_fp4_e4m3(pa, sa_.view(torch.float8_e4m3fn), 16)
    vb = formats.dequant_fp4_e4m3(pb, sb.view(torch.float8_e4m3fn), 16)
    diff = (va - vb).abs()
    step = sb.view(torch.float8_e4m3fn).float().repeat_interleave(16, -1) * 2.0 + 1e-30
    assert (diff <= step * 1.01).all()
    assert (diff > 0).float().mean() <= frac
