"""FFN-side kernels against their references: RMSNorm, FP8 GEMM, MoE, mHC, Engram.

On a machine without CUDA every kernel runs in Triton's interpreter (conftest sets
TRITON_INTERPRET) on small, ragged shapes: token counts that are not tile multiples, experts
with no tokens, a single token. fp32 paths are held to fp32 tolerances; bf16 outputs to a
couple of bf16 ulps, because the interpreter truncates where the GPU rounds to nearest.
Router indices must equal the reference exactly, exact ties included. The FP4 grouped GEMM is
also checked against a float64 evaluation. `gpu`-marked tests repeat the checks at the
published widths on CUDA (hidden 5120, 384 experts top-6, inter 2304).
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch
import triton
import triton.language as tl

from dsv41c.codegen import templates
from dsv41c.codegen.triton import engram as en
from dsv41c.codegen.triton import fp4_unpack as fu
from dsv41c.codegen.triton import fp8_gemm as fg
from dsv41c.codegen.triton import fp8_warp_split as ws
from dsv41c.codegen.triton import mhc
from dsv41c.codegen.triton import moe
from dsv41c.codegen.triton import rmsnorm as rn
from dsv41c.codegen.triton import fp8_tiles as ft
from dsv41c.codegen.triton import targets as tgt
from dsv41c.codegen.triton import widths
from dsv41c import formats

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16_ULP = 2.0 ** -7


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def randn(g, *shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def assert_ulps(out, ref, ulps=2, floor=1e-6):
    """|out - ref| <= ulps · bf16_ulp · |ref| (+ a small absolute floor near zero)."""
    o, r = out.double(), ref.double()
    bound = ulps * BF16_ULP * r.abs() + floor
    bad = (o - r).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} elements beyond {ulps} bf16 ulps; worst {(o - r).abs().max().item()}"


def fp4_experts(g, E, N, K, scale=0.1):
    ws = [formats.quant_fp4_weight(torch.randn(N, K, generator=g) * scale) for _ in range(E)]
    return torch.stack([w for w, _ in ws]).to(DEV), torch.stack([s for _, s in ws]).to(DEV)


def fp8_weight(g, N, K, scale=0.05):
    w, s = formats.quant_fp8_weight(torch.randn(N, K, generator=g) * scale)
    return w.to(DEV), s.to(DEV)


# ============================================================================ RMSNorm


@pytest.mark.parametrize("N", [128, 300])  # one tile; two-pass (interpreter tiles are 256 wide)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [True, False])
def test_rmsnorm(N, dtype, weighted):
    g = gen(1)
    x = randn(g, 5, N, scale=3.0, dtype=dtype)
    w = randn(g, N, dtype=torch.bfloat16) if weighted else None
    y = rn.rmsnorm(x, w, 1e-20)
    ref = rn.rmsnorm_reference(x, w, 1e-20)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=2e-6, atol=1e-6)
    else:
        assert_ulps(y, ref, ulps=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rmsnorm(dtype):
    g = gen(2)
    x, r = randn(g, 3, 300, dtype=dtype), randn(g, 3, 300, dtype=dtype)
    w = randn(g, 300, dtype=torch.bfloat16)
    y, s = rn.add_rmsnorm(x, r, w, 1e-6)
    ref_y, ref_s = rn.add_rmsnorm_reference(x, r, w, 1e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(s, ref_s, rtol=0, atol=0)
        torch.testing.assert_close(y, ref_y, rtol=2e-6, atol=1e-6)
    else:
        assert_ulps(s, ref_s, ulps=1)
        assert_ulps(y, ref_y, ulps=4)


def test_rmsnorm_zero_row_is_finite():
    x = torch.zeros(2, 128, device=DEV)
    assert torch.equal(rn.rmsnorm(x, None, 1e-20), x)


# ============================================================================ FP8 GEMM


@pytest.mark.parametrize("M", [1, 19])
def test_fp8_gemm_fp32_exact_path(M):
    g = gen(3)
    x = randn(g, M, 160)  # K=160: not a multiple of the 64-wide K tile
    w, s = fp8_weight(g, 70, 160)  # N=70: ragged N tile and a partial 32-row scale block
    y = fg.fp8_gemm(x, w, s)
    ref = fg.fp8_gemm_reference(x, w, s)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_fp8_gemm_bf16_and_float64():
    g = gen(4)
    x = randn(g, 7, 128, dtype=torch.bfloat16)
    w, s = fp8_weight(g, 64, 128)
    y = fg.fp8_gemm(x, w, s)
    assert y.dtype == torch.bfloat16
    exact = x.double() @ formats.dequant_fp8_weight(w, s).double().T
    assert_ulps(y, exact, ulps=2, floor=1e-4)


def test_act_quant_matches_numerics_bit_for_bit():
    g = gen(5)
    x = torch.randn(24, 96, generator=g) * torch.logspace(-9, 9, 96)  # amax floor, subnormal E4M3, big values
    x[3] = 0.0
    # values exactly halfway between E4M3 neighbours (ties go to the even code)
    x[4, :32] = torch.tensor([1.0625, 1.1875, 1.3125, 1.4375, 17.0, 19.0, 0.0029296875, -1.0625] * 4) * 448 / 480
    x[4, 31] = 448.0
    x = x.to(DEV)
    assert torch.equal(fg.act_quant_fp8(x), fg.act_quant_fp8_reference(x))
    xb = x.to(torch.bfloat16)
    assert torch.equal(fg.act_quant_fp8(xb), fg.act_quant_fp8_reference(xb))


def test_fp8_gemm_act_quant_and_swiglu():
    g = gen(6)
    x = randn(g, 5, 128, scale=2.0)
    w1, s1 = fp8_weight(g, 96, 128)
    w3, s3 = fp8_weight(g, 96, 128)
    torch.testing.assert_close(fg.fp8_gemm(x, w1, s1, act_quant=True), fg.fp8_gemm_reference(x, w1, s1, True),
                               rtol=1e-5, atol=1e-5)
    h = fg.fp8_gemm_swiglu(x, w1, s1, w3, s3, 0.5)
    ref = fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, 0.5)
    torch.testing.assert_close(h, ref, rtol=1e-5, atol=1e-6)
    assert ref.abs().max() > 0.1  # the clamp is exercised
    with pytest.raises(ValueError, match="scale"):
        fg.fp8_gemm(x, w1, s1[:1])


@pytest.mark.parametrize("gated", [False, True])
def test_fp8_decode_paths_agree(gated):
    """One token: the CUDA-core gemv path, the tensor-core path with the split-K epilogue folded into
    the launch (last arriver) and with a separate reduce kernel all match the reference; the two
    tensor-core epilogues add the partials in the same order (same bits); the arrival counters are
    left at zero (CUDA-graph replays start clean)."""
    from dsv41c.codegen.triton import arrival

    g = gen(7)
    N, K = 70, 256  # ragged N (partial 32-row scale group), K = 2 splits of the interpreter's 64/128 tiles
    x = randn(g, 1, K)
    w1, s1 = fp8_weight(g, N, K)
    w3, s3 = (fp8_weight(g, N, K) if gated else (None, None))
    lim = 0.5
    ref = (fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, lim) if gated else fg.fp8_gemm_reference(x, w1, s1))
    run = lambda **kw: fg._gemm(x, w1, s1, w3, s3, lim, False, None, "t", **kw)  # noqa: E731
    gemv = run(path="gemv")
    folded = run(path="mma", fold=True)
    separate = run(path="mma", fold=False)
    for y in (gemv, folded, separate):
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(folded, separate)
    assert torch.equal(run(path="gemv"), gemv)  # a second launch reuses the (reset) counters
    # the gemv k loop with or without Triton's load pipeline (PIPE 1..3) adds the same products in the
    # same order here (the interpreter has one layout; on a GPU see test_gpu_fp8_pdl_chain_keeps_the_bits):
    # the same bits, whatever the steps per split (4, 2, 1, and 3 uneven splits of 1/1/2 k tiles)
    for sk in (1, 2, 3, 4):
        y1 = run(path="gemv", tiles=(32, 64, sk, 4, 1))
        torch.testing.assert_close(y1, ref, rtol=1e-5, atol=1e-6)
        for pipe in (2, 3):
            assert torch.equal(run(path="gemv", tiles=(32, 64, sk, 4, pipe)), y1), (sk, pipe)
        # EARLY_W: the split's first tile loaded before the (PDL) wait, the loop from the second: the same bits,
        # also where a split has one tile (sk 4) and the loop runs no step
        for seg in (0, 16):
            t = (32, 64, sk, 4, 1, seg)
            assert torch.equal(run(path="gemv", tiles=t, early_w=True), run(path="gemv", tiles=t)), (sk, seg)
    # the accumulator per tile element (SEG 0) or per run of SEG consecutive products (the default, GEMV_SEG 16):
    # different fp32 sum orders, each within the reference's rounding
    assert fg.GEMV_SEG == 16
    for seg in (0, 4, 16):
        torch.testing.assert_close(run(path="gemv", tiles=(32, 64, 2, 4, 1, seg)), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="SEG=3"):
        run(path="gemv", tiles=(32, 64, 2, 4, 1, 3))
    # tensor cores with a K split that does not divide the 4 k tiles (split_bounds: 1, 1, 2 tiles)
    uneven = run(path="mma", tiles=(16, 32, 64, 1, 3, 4, 1), fold=True)
    torch.testing.assert_close(uneven, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(uneven, run(path="mma", tiles=(16, 32, 64, 1, 3, 4, 1), fold=False))
    assert int(arrival.counters(x.device, 1).abs().sum()) == 0
    with pytest.raises(ValueError, match="SPLIT_K"):
        run(path="mma", tiles=(16, 32, 64, 1, 5, 4, 1))  # more splits than k tiles
    with pytest.raises(ValueError, match="gemv"):
        fg._gemm(randn(g, 2, K), w1, s1, None, None, 0.0, False, None, "t", path="gemv")


@pytest.mark.parametrize("gated", [False, True])
def test_fp8_scale_prefetch_keeps_the_bits(gated):
    """The tensor-core k loop with its scale bytes loaded one k tile ahead (SPF) or in the step that uses them:
    the same bits, for both weight decoders, whole and uneven K splits, a K that BK does not tile (the last
    scale block partly outside K), 8 tokens and a prefill-sized M; and `_spf`'s defaults (off only in the gated
    decode tile)."""
    g = gen(11)
    lim = 0.5
    for N, K, M, dws, tiles in ((70, 256, 8, (0, 1), (None, (16, 32, 64, 1, 3, 4, 1))),
                                (40, 200, 8, (0,), (None,)), (70, 256, 40, (0,), (None,))):
        x = randn(g, M, K)
        w1, s1 = fp8_weight(g, N, K)
        w3, s3 = (fp8_weight(g, N, K) if gated else (None, None))
        ref = (fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, lim) if gated else fg.fp8_gemm_reference(x, w1, s1))
        for dw in dws:
            for t in tiles:
                run = lambda spf: fg._gemm(x, w1, s1, w3, s3, lim, False, None, "t", path="mma",  # noqa: E731
                                           decode_w=dw, tiles=t, spf=spf)
                on = run(True)
                torch.testing.assert_close(on, ref, rtol=1e-5, atol=1e-6)
                assert torch.equal(on, run(False)), (N, K, M, dw, t)
    assert fg._spf(None, True, gated) is (not gated) and fg._spf(None, False, gated) is True
    assert fg._spf(False, False, gated) is False and fg._spf(True, True, gated) is True


def test_fp8_stacked_gated_tile():
    """The gated linear's stacked tensor-core tile (GATED 2: half its rows from w1, the same rows of w3 below them, one
    dot; W3 addressed by its byte distance from W1): the reference's numbers at 8, 3 and 40 tokens, a ragged N
    (a tile half outside N), a K that BK does not tile, uneven and folded / separate K splits (same bits); the default
    picks it only where the 2-warp tile runs; bad requests are refused with the linear's name."""
    g = gen(13)
    lim = 0.5
    for N, K, M, tiles in ((70, 256, 8, None), (70, 256, 8, (16, 32, 64, 1, 3, 4, 1)), (40, 200, 3, None),
                           (64, 256, 40, None)):
        x = randn(g, M, K)
        w1, s1 = fp8_weight(g, N, K)
        w3, s3 = fp8_weight(g, N, K)
        ref = fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, lim)
        run = lambda **kw: fg._gemm(x, w1, s1, w3, s3, lim, False, None, "t", path="mma", stack=True,  # noqa: E731
                                    tiles=tiles, **kw)
        y = run()
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
        assert ref.abs().max() > 0.1
        if tiles:
            assert torch.equal(y, run(fold=False)), (N, K, M)
    assert fg._stack(None, True, 8, False, True) and not fg._stack(None, True, 8, False, False)  # sm90 only
    assert not fg._stack(None, True, 64, False, True) and not fg._stack(None, False, 8, False, True)
    assert not fg._stack(None, True, 8, True, True)  # the word decoder keeps the paired tile
    x = randn(g, 8, 256)
    w1, s1 = fp8_weight(g, 64, 256)
    with pytest.raises(ValueError, match="lin: stack=True needs the gated linear"):
        fg._gemm(x, w1, s1, None, None, 0.0, False, None, "lin", path="mma", stack=True)
    big = torch.zeros(2 * 64 * 256 + 16, dtype=torch.uint8, device=DEV)
    big[:64 * 256] = w1.view(torch.uint8).flatten()
    w3 = big[64 * 256 + 1: 2 * 64 * 256 + 1].view(64, 256)  # 16385 bytes after w1: not a multiple of 16
    with pytest.raises(ValueError, match="lin: w1 and w3 start 16385 bytes apart"):
        fg._gemm(x, big[:64 * 256].view(64, 256), s1, w3, s1, 0.5, False, None, "lin", path="mma", stack=True)


def test_decode_split_fills_one_wave():
    """The decode K splits (fp8_gemm._split_k, the router's _gemv_split): the largest grid that fits ONE
    wave of resident programs on an H200-class GPU, at least MIN_SPLIT_STEPS k tiles a split (a split need
    not divide the tile count)."""
    per, sms = fg.DECODE_PROGRAMS_PER_SM, tgt.N_SMS_HINT
    cases = [  # (M, N, K, BN, kind, expected split)
        (1, 5120, 8192, 64, "gemv", 13),  # wo_b: 80 tiles x 13 = 1040 <= 1056 programs (8 an SM)
        (8, 5120, 8192, 32, "mma", 8),  # 2-warp tiles: 160 x 8 = 1280 <= 1320 (planned for 10 an SM)
        (1, 2304, 5120, 32, "gemv", 14),  # shared w13 (gated gemv, BN 32): 1008
        (8, 2304, 5120, 32, "mma_gated", 11),  # 72 x 11 = 792 = 6 per SM
        (8, 2 * 2304, 5120, 32, "mma_stacked", 7),  # the stacked gated tile: 144 x 7 = 1008 <= 1056 (8 per SM)
        (8, 25600, 6144, 64, "mma_4w", 1),  # engram wkv (word decoder, 4 warps): 400 tiles
        (1, 1280, 5120, 64, "gemv", 20),  # wq_a: capped at 2 k tiles a split
        (1, 25600, 6144, 64, "gemv", 2),  # engram wkv: 400 tiles x 2 = 800
    ]
    assert fg._decode_tile(False, False, True) == (32, 2, "mma")  # sm90, per-element decoder
    assert fg._decode_tile(True, False, True) == (32, 2, "mma_gated")
    assert fg._decode_tile(True, False, True, stacked=True) == (32, 2, "mma_stacked")
    assert fg._decode_tile(False, True, True) == (64, 4, "mma_4w")  # the word decoder (engram wkv)
    assert fg._decode_tile(False, False, False) == (64, 4, "mma_4w")  # other targets: not measured, 4 warps
    for M, N, K, BN, kind, want in cases:
        sk = fg._split_k(M, N, K, BN, 128, per[kind])
        assert sk == want, (N, K, kind, sk)
        assert sk == 1 or (triton.cdiv(N, BN) * sk <= per[kind] * sms and K // 128 // sk >= ft.MIN_SPLIT_STEPS)
    assert fg._split_k(32, 5120, 8192, 64, 128, 5) == 1  # prefill shapes never split
    assert fg._split_k(1, 64, 200, 64, 128, 4) == 1  # K does not tile
    from dsv41c.codegen.triton import moe_router as mr
    for T, E, want in ((1, 384, 10), (8, 384, 2), (1, 128, 10), (4, 384, 5)):
        split, k_per = mr._gemv_split(T, E, 5120, 512, interp=False)
        assert split == want and (split - 1) * k_per < 5120 <= split * k_per, (T, E, split, k_per)


def test_fp8_gemm_picks_gemv_for_one_token():
    assert fg._gemv_tiles(5120, 8192) is not None and fg.GEMV_MAX_M == 1
    assert fg._gemv_tiles(70, 160) is None  # K does not tile: the tensor-core path runs


# ============================================================================ MoE router


def _router_inputs(g, T, E, D):
    x = randn(g, T, D, dtype=torch.bfloat16)
    gw = randn(g, E, D, scale=0.1, dtype=torch.bfloat16)
    bias = randn(g, E, scale=0.05)
    return x, gw, bias


def test_router_matches_reference():
    g = gen(7)
    x, gw, bias = _router_inputs(g, 7, 24, 128)
    bias_vl = randn(g, 24, scale=0.5)
    img = torch.tensor([0, 1, 1, 0, 0, 1, 0], dtype=torch.bool, device=DEV)
    for kw in ({}, {"bias_vl": bias_vl, "image_mask": img}):
        w, i = moe.router(x, gw, bias, 6, 1.5, 1.0, **kw)
        rw, ri = moe.router_reference(x, gw, bias, 6, 1.5, 1.0, **kw)
        assert i.dtype == torch.int32 and torch.equal(i, ri)
        torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(w.sum(-1), torch.full((7,), 1.5, device=DEV), rtol=1e-6, atol=0)
    # the image rows really route differently
    _, i_txt = moe.router(x, gw, bias, 6)
    _, i_img = moe.router(x, gw, bias, 6, bias_vl=bias_vl, image_mask=img)
    assert not torch.equal(i_txt[img], i_img[img]) and torch.equal(i_txt[~img], i_img[~img])


@pytest.mark.parametrize("T,E,D", [(20, 24, 128), (3, 20, 96), (8, 24, 1280)])
def test_router_paths(T, E, D):
    """The MMA path (T > GEMV_MAX_T) and the decode GEMV path (ragged experts and channels, several k blocks)."""
    from dsv41c.codegen.triton import moe_router

    g = gen(11)
    x, gw, bias = _router_inputs(g, T, E, D)
    assert (T <= moe_router.GEMV_MAX_T) == (T != 20)
    w, i = moe.router(x, gw, bias, 4)
    rw, ri = moe.router_reference(x, gw, bias, 4)
    assert torch.equal(i, ri)
    torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("T", [1, 3, 8])
def test_router_fused_decode_matches_two_launches(T):
    """The one-launch decode router (last arriver runs the top-k) gives the two-launch path's bits, with and
    without the image bias, and leaves its counters at zero (a CUDA-graph replay starts clean)."""
    from dsv41c.codegen.triton import arrival, moe_router

    g = gen(13)
    x, gw, bias = _router_inputs(g, T, 44, 1280)  # ragged experts (44 = 5.5 tiles of 8), 3 k blocks (the last
    img = (torch.arange(T, device=DEV) % 2 == 1)  # ragged), 2 K splits in the interpreter
    for kw in ({}, {"bias_vl": randn(g, 44, scale=0.5), "image_mask": img}):
        wf, i_f = moe_router.router(x, gw, bias, 6, fused=True, **kw)
        w2, i2 = moe_router.router(x, gw, bias, 6, fused=False, **kw)
        assert torch.equal(i_f, i2) and torch.equal(wf, w2)
        rw, ri = moe.router_reference(x, gw, bias, 6, **kw)
        assert torch.equal(i_f, ri)
        torch.testing.assert_close(wf, rw, rtol=1e-6, atol=1e-7)
    assert int(arrival.counters(x.device, T, pool="router")[:T].abs().sum()) == 0
    with pytest.raises(ValueError, match="fused=True is the decode path"):
        moe_router.router(randn(g, moe_router.GEMV_MAX_T + 1, 1280, dtype=torch.bfloat16), gw, bias, 6, fused=True)


@pytest.mark.parametrize("T,tiles", [(1, None), (3, (16, 512)), (8, None), (8, (32, 512))])
def test_router_gate_once_matches_reference(T, tiles):
    """The decode router that reads the gate once for every token (one MMA a program, the last arriver's top-k):
    the reference's experts and weights, with and without the image bias, ragged experts (44 = 2.75 tiles of 16)
    and ragged K slices (1280 = 2.5 slices of 512), and its one counter left at zero."""
    from dsv41c.codegen.triton import arrival, moe_router

    g = gen(17)
    x, gw, bias = _router_inputs(g, T, 44, 1280)
    img = (torch.arange(T, device=DEV) % 2 == 0)
    for kw in ({}, {"bias_vl": randn(g, 44, scale=0.5), "image_mask": img}):
        w, i = moe_router.router(x, gw, bias, 6, gate_once=True, tiles=tiles, **kw)
        rw, ri = moe.router_reference(x, gw, bias, 6, **kw)
        assert torch.equal(i, ri)
        torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-7)
    assert int(arrival.counters(x.device, 2, pool="router_gate_once")[:2].abs().sum()) == 0
    with pytest.raises(ValueError, match="gate_once=True needs bf16"):
        moe_router.router(x.float(), gw, bias, 6, gate_once=True)


@pytest.mark.gpu
@pytest.mark.parametrize("T,E,D", [(7, 24, 128), (3, 20, 96), (8, 44, 1280)])
def test_gpu_router_gate_once_with_fewer_programs_than_tokens(T, E, D):
    """Small presets' gates make a gate-once grid of fewer programs than tokens (24 x 128: 2 programs for 7 tokens).
    Compiled for a GPU, each row program then selects several tokens, every token gets the reference's experts, and
    both counters are back at zero, so the next launch is right too (an earlier form left tokens past the grid
    unwritten and the counters stuck, so the next launch's rows went negative: an illegal address)."""
    from dsv41c.codegen.triton import arrival, moe_router

    g = gen(23)
    x, gw, bias = _router_inputs(g, T, E, D)
    for _ in range(2):
        w, i = moe_router.router(x, gw, bias, 4, gate_once=True)
        rw, ri = moe.router_reference(x, gw, bias, 4)
        assert torch.equal(i, ri)
        torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)  # MMA sums: fp32 rounding, as at real widths
        assert int(arrival.counters(x.device, 2, pool="router_gate_once")[:2].abs().sum()) == 0


def test_router_gate_once_is_the_decode_default():
    from dsv41c.codegen.triton import moe_router

    assert moe_router._gate_once_tiles(384, 5120, 132) == (32, 512)  # 12 x 10 programs on an H200
    assert moe_router._gate_once_tiles(128, 5120, 132) == (32, 256)  # the DSpark router: 4 x 20
    g = gen(19)
    x, gw, bias = _router_inputs(g, 4, 44, 1280)
    w, i = moe_router.router(x, gw, bias, 6)
    w1, i1 = moe_router.router(x, gw, bias, 6, gate_once=True)
    assert torch.equal(i, i1) and torch.equal(w, w1)
    for t in (1, 2):  # 1-2 tokens: the per-token GEMV's bits
        w, i = moe_router.router(x[:t], gw, bias, 6)
        w1, i1 = moe_router.router(x[:t], gw, bias, 6, fused=True)
        assert torch.equal(i, i1) and torch.equal(w, w1)


def test_router_exact_ties_break_toward_lower_index():
    # integer-valued inputs: every logit is exact in fp32 whatever the summation order
    g = gen(8)
    T, E, D = 5, 16, 64
    x = torch.randint(-2, 3, (T, D), generator=g).to(torch.bfloat16)
    base = torch.randint(-1, 2, (4, D), generator=g).float() / 8
    gw = base[torch.tensor([0, 1, 2, 3, 1, 0, 2, 3, 3, 1, 0, 2, 1, 1, 0, 3])].to(torch.bfloat16)  # rows repeat
    bias = torch.zeros(E)
    bias[[5, 9]] = 0.25  # equal biases on tied rows too
    x, gw, bias = x.to(DEV), gw.to(DEV), bias.to(DEV)
    w, i = moe.router(x, gw, bias, 6)
    rw, ri = moe.router_reference(x, gw, bias, 6)
    assert torch.equal(i, ri)
    torch.testing.assert_close(w, rw, rtol=1e-6, atol=0)
    sel = torch.nn.functional.softplus(x.float() @ gw.float().T).sqrt() + bias
    for t in range(T):  # spelled out: descending score, equal scores in ascending expert order
        want = sorted(range(E), key=lambda e: (-sel[t, e].item(), e))[:6]
        assert i[t].tolist() == want
    assert any(len(set(sel[t].tolist())) < E for t in range(T))  # ties are really there


def test_router_underflow_is_finite():
    g = gen(9)
    x, gw, bias = _router_inputs(g, 3, 8, 64)
    x = x * 0 + 1
    gw = torch.full_like(gw, -4.0)  # logits = -256: softplus underflows to 0 in fp32
    gw[0] = -0.5  # a moderately negative logit keeps a tiny but nonzero weight
    w, i = moe.router(x, gw, bias, 3)
    rw, ri = moe.router_reference(x, gw, bias, 3)
    assert torch.isfinite(w).all() and torch.equal(i, ri)
    torch.testing.assert_close(w, rw, rtol=1e-6, atol=0)


# ============================================================================ MoE experts

E_T, D_T, I_T = 8, 128, 64


@pytest.fixture(scope="module")
def experts():
    g = gen(10)
    w1, s1 = fp4_experts(g, E_T, I_T, D_T)
    w3, s3 = fp4_experts(g, E_T, I_T, D_T)
    w2, s2 = fp4_experts(g, E_T, D_T, I_T)
    return w1, s1, w3, s3, w2, s2


def _routing(g, T, k=3, E=E_T, skip=(2, 5)):
    """Random distinct experts per token, never using `skip` (experts with zero tokens)."""
    allowed = torch.tensor([e for e in range(E) if e not in skip])
    idx = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:k]] for _ in range(T)]).int()
    w = torch.rand(T, k, generator=g) + 0.1
    return idx.to(DEV), (w / w.sum(-1, keepdim=True) * 1.5).to(DEV)


def test_moe_align_plan():
    idx = torch.tensor([[1, 3], [3, 1], [3, 0], [1, 3]], device=DEV)
    plan = moe.moe_align(idx, 5, 2)
    assert plan["offsets"].tolist() == [0, 1, 4, 4, 8, 8]
    # stable: within an expert, slots keep token order
    assert plan["sorted_slots"].tolist() == [5, 0, 3, 6, 1, 2, 4, 7]
    te, tr = plan["tile_expert"].tolist(), plan["tile_row"].tolist()
    real = [(e, r) for e, r in zip(te, tr) if e >= 0]
    assert real == [(0, 0), (1, 1), (1, 3), (3, 4), (3, 6)]  # experts 2 and 4: no tiles
    assert all(e == -1 for e in te[len(real):])


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("dot_scaled", [False, True])
def test_moe_experts_bf16(experts, T, dot_scaled):
    g = gen(11 + T)
    x = randn(g, T, D_T, dtype=torch.bfloat16)
    idx, w = _routing(g, T)
    y = moe.moe_experts(x, idx, w, *experts, limit=10.0, dot_scaled=dot_scaled)
    ref = moe.moe_experts_reference(x, idx, w, *experts, limit=10.0)
    # h and the slot outputs are rounded to bf16 (truncated in the interpreter)
    assert y.dtype == torch.float32 and rel_err(y, ref) < 4 * BF16_ULP
    torch.testing.assert_close(y, ref, rtol=0, atol=4 * BF16_ULP * ref.abs().max().item())


def test_moe_experts_float64(experts):
    g = gen(12)
    T = 9
    x = randn(g, T, D_T)
    idx, w = _routing(g, T)
    y = moe.moe_experts(x, idx, w, *experts, limit=10.0, inter_dtype=torch.float32, partial_dtype=torch.float32)
    ref64 = moe.moe_experts_reference(x.double(), idx, w.double(), *experts, limit=10.0, inter_dtype=torch.float64,
                                      partial_dtype=torch.float64, compute_dtype=torch.float64)
    assert rel_err(y, ref64) < 1e-6


def test_moe_swiglu_clamp_is_applied(experts):
    g = gen(13)
    x = randn(g, 4, D_T, scale=30.0)  # g, u far beyond ±limit
    idx, w = _routing(g, 4)
    y = moe.moe_experts(x, idx, w, *experts, limit=1.0, inter_dtype=torch.float32, partial_dtype=torch.float32)
    ref = moe.moe_experts_reference(x, idx, w, *experts, limit=1.0, inter_dtype=torch.float32,
                                    partial_dtype=torch.float32)
    unclamped = moe.moe_experts_reference(x, idx, w, *experts, limit=1e9, inter_dtype=torch.float32,
                                          partial_dtype=torch.float32)
    assert rel_err(y, ref) < 1e-5 and rel_err(unclamped, ref) > 0.1


def test_moe_experts_act_quant(experts):
    g = gen(14)
    x = randn(g, 6, D_T)
    idx, w = _routing(g, 6)
    kw = dict(limit=10.0, act_quant=True, inter_dtype=torch.float32, partial_dtype=torch.float32)
    y = moe.moe_experts(x, idx, w, *experts, **kw)
    ref = moe.moe_experts_reference(x, idx, w, *experts, **kw)
    plain = moe.moe_experts_reference(x, idx, w, *experts, limit=10.0, inter_dtype=torch.float32,
                                      partial_dtype=torch.float32)
    assert rel_err(y, ref) < 1e-5 < rel_err(plain, ref)


def test_moe_forward_with_shared_expert(experts):
    g = gen(15)
    T, E = 5, E_T
    x = randn(g, T, D_T, dtype=torch.bfloat16)
    gw = randn(g, E, D_T, scale=0.1, dtype=torch.bfloat16)
    bias = randn(g, E, scale=0.05)
    shared = (*fp8_weight(g, I_T, D_T), *fp8_weight(g, I_T, D_T), *fp8_weight(g, D_T, I_T))
    kw = dict(top_k=3, route_scale=1.5, limit=10.0)
    y = moe.moe_forward(x, gw, bias, *experts, shared, **kw)
    ref = moe.moe_forward_reference(x, gw, bias, *experts, shared, **kw)
    assert y.dtype == torch.bfloat16
    assert rel_err(y, ref) < 4 * BF16_ULP


@triton.jit
def _fp4_tile_kernel(w_ptr, s_ptr, o_ptr, R: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr,
                     PTX: tl.constexpr, F32: tl.constexpr):
    """o [R, BK] = fp4_unpack.fp4_tile of packed rows w [R, BK/2] (bytes) and scales s [R, BK/32]."""
    r = tl.arange(0, R)[:, None]
    sc = tl.load(s_ptr + r * (BK // 32) + tl.arange(0, BK // 32)[None, :])
    if DECODE == 2:
        wp = tl.load(w_ptr.to(tl.pointer_type(tl.uint32)) + r * (BK // 8) + tl.arange(0, BK // 8)[None, :])
    else:
        wp = tl.load(w_ptr + r * (BK // 2) + tl.arange(0, BK // 2)[None, :])
    tl.store(o_ptr + r * BK + tl.arange(0, BK)[None, :], fu.fp4_tile(wp, sc, R, BK, DECODE, PTX, F32))


@triton.jit
def _permute_cols_kernel(x_ptr, o_ptr, R: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr):
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(o_ptr + offs, fu.permute_cols_tile(tl.load(x_ptr + offs), R, C, BK, DECODE))


@pytest.mark.parametrize("decode", [0, 1, 2])
@pytest.mark.parametrize("BK", [64, 128])
def test_fp4_decoder_every_code_and_extreme_scale(decode, BK):
    """Each decoder is exact: all 16 E2M1 codes at every k position, UE8M0 e = 0, 1, 127, 128, 129, 254, 255
    (inf past 2^128 and NaN at e = 255, as the float32 reference). On CUDA the inline-PTX multiply too."""
    R = 16
    codes = (torch.arange(R)[:, None] + torch.arange(BK)[None, :]) % 16
    w = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    e = torch.tensor([0, 1, 127, 128, 129, 254, 255, 110, 125, 3, 200, 64, 126, 130, 2, 253], dtype=torch.uint8)
    s = e[(torch.arange(R)[:, None] * 3 + torch.arange(BK // 32)[None, :]) % 16]
    ref = fu.permute_k(formats.dequant_fp4_weight(w.view(torch.int8), s), BK, decode)
    for f32 in (True, False):
        if decode == 0 and not f32 and DEV == "cpu":
            continue  # the interpreter's fp32 -> bf16 cvt mangles subnormals (e = 0); decoders 1/2 move bits
        out = torch.empty(R, BK, dtype=torch.float32 if f32 else torch.bfloat16, device=DEV)
        _fp4_tile_kernel[(1,)](w.to(DEV), s.to(DEV), out, R=R, BK=BK, DECODE=decode, PTX=DEV == "cuda", F32=f32)
        torch.testing.assert_close(out.float().cpu(), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("decode", [1, 2])
def test_k_order_host_and_in_kernel_agree(decode):
    g = gen(16)
    R, C, BK = 16, 256, 128
    x = randn(g, R, C)
    assert sorted(fu.k_order(BK, decode).tolist()) == list(range(BK))
    assert torch.equal(fu.unpermute_k(fu.permute_k(x, BK, decode), BK, decode), x)
    out = torch.empty_like(x)
    _permute_cols_kernel[(1,)](x, out, R=R, C=C, BK=BK, DECODE=decode)
    assert torch.equal(out, fu.permute_k(x, BK, decode))


@pytest.mark.parametrize("decode", [0, 1, 2])
@pytest.mark.parametrize("h_in_kernel", [True, False])
def test_moe_gate_up_down_decoders_ragged_n(decode, h_in_kernel):
    """Each decoder end to end against float64, with N not a multiple of BN in both GEMMs; h stored in the
    down kernel's k order by gate/up (h_in_kernel) or reordered by moe_down."""
    g = gen(17)
    E, D, I, T, k = 4, 192, 192, 5, 2
    w1, s1 = fp4_experts(g, E, I, D)
    w3, s3 = fp4_experts(g, E, I, D)
    w2, s2 = fp4_experts(g, E, D, I)
    x = randn(g, T, D)
    idx, w = _routing(g, T, k=k, E=E, skip=(1,))
    tiles = (16, 128, 64, 4, 1)  # 192 = 128 + a half-masked tile
    plan = moe.moe_align(idx, E, 16)
    h_order = (decode, 64) if decode and h_in_kernel else None
    kw = dict(dot_scaled=False, tiles=tiles, decode=decode, h_order=h_order)
    h = moe.moe_gate_up(x, plan, w, w1, s1, w3, s3, 10.0, inter_dtype=torch.float32, **kw)
    y = moe.moe_combine(moe.moe_down(h, plan, w2, s2, torch.float32, **kw), k)
    ref64 = moe.moe_experts_reference(x.double(), idx, w.double(), w1, s1, w3, s3, w2, s2, limit=10.0,
                                      inter_dtype=torch.float64, partial_dtype=torch.float64,
                                      compute_dtype=torch.float64)
    assert rel_err(y, ref64) < 1e-6


# ============================================================================ mHC


def _mhc_inputs(g, T, D, dtype):
    H = randn(g, T, 4, D, dtype=dtype)
    fn = randn(g, 24, 4 * D, scale=0.05)
    base = randn(g, 24, scale=0.5)
    scale = (torch.rand(3, generator=g) + 0.5).to(DEV)
    pre_prev = torch.softmax(torch.randn(T, 4, generator=g), -1).to(DEV) + 1e-6
    return H, fn, base, scale, pre_prev


@pytest.mark.parametrize("T,split", [(1, None), (17, None), (5, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_pre(T, split, dtype):
    g = gen(16)
    H, fn, base, scale, pre_prev = _mhc_inputs(g, T, 96, dtype)
    x, pre, post, comb = mhc.mhc_pre(H, pre_prev, fn, base, scale, 1e-20, 1e-6, split=split)
    rx, rpre, rpost, rcomb = mhc.mhc_pre_reference(H, pre_prev, fn, base, scale, 1e-20, 1e-6)
    for a, b in ((pre, rpre), (post, rpost), (comb, rcomb)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert x.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(x, rx, rtol=1e-6, atol=1e-6)
    else:
        assert_ulps(x, rx, ulps=1, floor=1e-2 * BF16_ULP)
    # Sinkhorn result: close to doubly stochastic
    torch.testing.assert_close(comb.sum(-2), torch.ones(T, 4, device=DEV), rtol=0, atol=1e-4)
    torch.testing.assert_close(comb.sum(-1), torch.ones(T, 4, device=DEV), rtol=0, atol=2e-2)


@pytest.mark.parametrize("T,split", [(1, None), (3, 2), (8, None)])
def test_mhc_pre_decode_gemv_splits(T, split):
    """The decode (GEMV) form over several D ranges, the last one ragged (D = 320 = 2.5 × 128)."""
    g = gen(18)
    H, fn, base, scale, pre_prev = _mhc_inputs(g, T, 320, torch.float32)
    assert T <= mhc.GEMV_MAX_T
    out = mhc.mhc_pre(H, pre_prev, fn, base, scale, 1e-20, 1e-6, split=split)
    ref = mhc.mhc_pre_reference(H, pre_prev, fn, base, scale, 1e-20, 1e-6)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_mhc_pre_first_site_takes_stream_zero():
    g = gen(17)
    H, fn, base, scale, _ = _mhc_inputs(g, 3, 64, torch.bfloat16)
    x, *_ = mhc.mhc_pre(H, None, fn, base, scale, 1e-20, 1e-6)
    assert torch.equal(x, H[:, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_post(dtype):
    g = gen(18)
    T, D = 6, 200  # 200: a ragged channel tile
    H, fn, base, scale, pre_prev = _mhc_inputs(g, T, D, dtype)
    _, _, post, comb = mhc.mhc_pre_reference(H, pre_prev, fn, base, scale, 1e-20, 1e-6)
    y = randn(g, T, D, dtype=torch.bfloat16)
    out = mhc.mhc_post(H, y, post, comb)
    ref = mhc.mhc_post_reference(H, y, post, comb)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    else:
        assert_ulps(out, ref, ulps=1, floor=1e-2)


# ============================================================================ Engram


def test_engram_gather_bit_exact():
    g = gen(19)
    rows = 40
    table, scale = formats.quant_fp8_ue8m0(torch.randn(rows, 256, generator=g) * torch.logspace(-4, 4, rows)[:, None])
    ids = torch.randint(0, rows, (3, 5), generator=g)
    ids[0, 0], ids[2, 4] = 0, rows - 1
    table, scale, ids = table.to(DEV), scale.to(DEV), ids.to(DEV)
    for dt in (torch.bfloat16, torch.float32):
        out = en.engram_gather(ids, table, scale, dt)
        assert out.shape == (3, 5 * 256) and torch.equal(out, en.engram_gather_reference(ids, table, scale, dt))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engram_gate(dtype):
    g = gen(20)
    T, D = 4, 300
    H = randn(g, T, 4, D, dtype=dtype)
    kv = randn(g, T, 5 * D, dtype=torch.bfloat16)
    qw, kw = randn(g, 4, D, dtype=torch.bfloat16), randn(g, 4, D, dtype=torch.bfloat16)
    mask = torch.tensor([True, False, True, True], device=DEV)
    ref = en.engram_gate_reference(H, kv, qw, kw, 1e-20, mask)
    out = en.engram_gate(H.clone(), kv, qw, kw, 1e-20, mask)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        assert_ulps(out, ref, ulps=1, floor=1e-2)
    assert torch.equal(out[1], H[1])  # masked token: gate 0, streams untouched
    Hc = H.clone()
    en.engram_gate(Hc, kv, qw, kw, 1e-20, mask, out=Hc)  # in place
    assert torch.equal(Hc, out)
    nomask = en.engram_gate(H, kv, qw, kw, 1e-20)
    assert not torch.equal(nomask[1], H[1])
    # the mask is read as one byte a token, with no copy for bool / uint8 / int8; other dtypes and strided masks
    # give the same gate
    strided = torch.stack([mask, ~mask], 1)[:, 0]
    for m in (mask.to(torch.uint8), mask.to(torch.int32), strided):
        assert torch.equal(en.engram_gate(H, kv, qw, kw, 1e-20, m), out)
    with pytest.raises(ValueError, match="token_mask"):
        en.engram_gate(H, kv, qw, kw, 1e-20, mask[:3])
    # the two-pass chunked loop (prefill's) and the one-pass row (decode's) compute the same gate
    two = en.engram_gate(H, kv, qw, kw, 1e-20, mask, block_d=128)
    one = en.engram_gate(H, kv, qw, kw, 1e-20, mask, block_d=512)
    for y in (two, one):
        if dtype == torch.float32:
            torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        else:
            assert_ulps(y, ref, ulps=1, floor=1e-2)
    assert en._gate_tile(1, 5120)[0] == 8192 and en._gate_tile(8192, 5120)[0] < 5120  # decode: one pass; prefill: chunks


# ============================================================================ registry and AOT


MY_TEMPLATES = ("rmsnorm", "add_rmsnorm", "fp8_gemm", "fp8_gemm_swiglu", "act_quant_fp8", "moe_router",
                "moe_gate_up_fp4", "moe_down_fp4", "moe_combine", "mhc_pre", "mhc_post", "engram_gather",
                "engram_gate")


def test_templates_registered_with_variants_for_every_target():
    reg = templates._REGISTRY
    for name in MY_TEMPLATES:
        t = reg[name]
        assert callable(t.reference) and callable(t.launch) and t.keys
        for target in tgt.TARGETS:
            specs = t.specializations(target)
            assert specs, f"{name}: no variant for {target}"
            for s in specs:
                assert list(s.signature) == list(s.kernel.arg_names)
                assert all(s.signature[k] == "constexpr" for k in s.constexprs)
                assert set(s.keys) >= set(s.constexprs), f"{name}/{s.variant}: keys miss constexprs"
                assert set(s.keys) <= set(t.keys), f"{name}/{s.variant}: keys {set(s.keys) - set(t.keys)} undeclared"
        variants = [s.variant for s in t.specializations("cuda:sm90")]
        assert len(variants) == len(set(variants)), f"{name}: duplicate variant names"
        assert t.specializations("cpu") == [] and t.specializations("ascend:a3") == []


def _have_ptxas():
    import triton
    return os.path.isfile(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")) \
        or shutil.which("ptxas") is not None


AOT_CASES = (
    ("cuda:sm90", "moe_gate_up_fp4", "backbone_decode", "wgmma.mma_async"),
    ("cuda:sm90", "moe_gate_up_fp4", "backbone_prefill", "wgmma.mma_async"),  # decoder 2, register A operand
    ("cuda:sm90", "fp8_gemm", "wq_a_prefill", "wgmma.mma_async"),
    ("rocm:gfx942", "moe_down_fp4", "prefill", "v_mfma"),
)

# Compiled in a child process: under TRITON_INTERPRET the kernels are interpreter objects.
_AOT_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib
from dsv41c.codegen import templates
for m in ("fp8_gemm", "rmsnorm", "moe", "mhc", "engram"):
    importlib.import_module("dsv41c.codegen.triton." + m)
out = {}
for target, template, variant, insn in json.loads(sys.argv[1]):
    spec = next(s for s in templates._REGISTRY[template].specializations(target) if s.variant == variant)
    kind, arch = target.split(":")
    gt = GPUTarget("cuda", int(arch[2:]), 32) if kind == "cuda" else GPUTarget("hip", arch, 64)
    k = triton.compile(ASTSource(spec.kernel, signature=spec.signature, constexprs=spec.constexprs), target=gt,
                       options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    asm = k.asm.get("ptx") or k.asm.get("amdgcn")
    out["/".join((target, template, variant))] = asm.count(insn)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def aot_counts():
    import json
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, json.dumps(AOT_CASES)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _have_ptxas(), reason="Triton's ptxas is not installed")
@pytest.mark.parametrize("target,template,variant,insn", AOT_CASES)
def test_aot_gemms_use_tensor_cores(aot_counts, target, template, variant, insn):
    assert aot_counts["/".join((target, template, variant))] > 0, f"no {insn} in {template}/{variant} for {target}"


# ============================================================================ GPU tier: published widths


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 300])
def test_gpu_fp8_gemm_real_widths(M):
    g = gen(30)
    x = randn(g, M, 5120, dtype=torch.bfloat16)
    for N, K in ((1280, 5120), (5120, 2304)):
        w, s = fp8_weight(g, N, K)
        xx = x[:, :K].contiguous()
        exact = xx.double() @ formats.dequant_fp8_weight(w, s).double().T
        assert rel_err(fg.fp8_gemm(xx, w, s), exact) < BF16_ULP
        assert rel_err(fg.fp8_gemm(xx, w, s, act_quant=True), fg.fp8_gemm_reference(xx, w, s, True)) < BF16_ULP
    w1, s1 = fp8_weight(g, 2304, 5120)
    w3, s3 = fp8_weight(g, 2304, 5120)
    h = fg.fp8_gemm_swiglu(x, w1, s1, w3, s3, 10.0)
    assert rel_err(h, fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, 10.0)) < 2 * BF16_ULP


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8])
def test_gpu_fp8_decode_paths_under_graph_replay(M):
    """wo_b at decode: every path matches float64; the folded split-K epilogue gives the separate reduce
    kernel's bits; a CUDA graph replayed three times gives the same bits each time, for the default path (at 8 tokens
    on sm90 the warp-split kernel) and for the split-K tile (its arrival counters reset)."""
    g = gen(31)
    x = randn(g, M, 8192, dtype=torch.bfloat16)
    w, s = fp8_weight(g, 5120, 8192)
    exact = x.double() @ formats.dequant_fp8_weight(w, s).double().T
    run = lambda **kw: fg._gemm(x, w, s, None, None, 0.0, False, None, "wo_b", **kw)  # noqa: E731
    folded, separate = run(path="mma", fold=True), run(path="mma", fold=False)
    assert torch.equal(folded, separate)
    assert rel_err(folded, exact) < BF16_ULP
    if M == 1:
        assert rel_err(run(path="gemv"), exact) < BF16_ULP
    for kw in ({}, {"path": "mma", "fold": True}):
        y = run(**kw)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yg = run(**kw)
        outs = []
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            outs.append(yg.clone())
        assert all(torch.equal(o, y) for o in outs), kw


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8])
def test_gpu_fp8_pdl_chain_keeps_the_bits(M):
    """Programmatic dependent launch changes no bit: the shared expert's w1/w3 -> w2 chain in one CUDA graph,
    each GEMM reading its predecessor's output (an early read before the grid wait would show), equals the
    serialized chain. The gemv's Triton load pipeline (PIPE 3) stages the tile through shared
    memory and loads it back in another register layout, so its per-row sum over K runs in another order:
    last-bit differences (seen on the H200: 1-2 of 2304 bf16 outputs, at dividing and uneven K splits alike),
    so it is held to the rounding of its bf16 output instead."""
    from dsv41c.codegen.triton.pdl import pdl_for
    g = gen(33)
    x = randn(g, M, 5120, dtype=torch.bfloat16)
    w1, s1 = fp8_weight(g, 2304, 5120)
    w3, s3 = fp8_weight(g, 2304, 5120)
    w2, s2 = fp8_weight(g, 5120, 2304)

    def chain(xx, **kw):
        h = fg._gemm(xx, w1, s1, w3, s3, 10.0, False, None, "shared_w13", **kw)
        return fg._gemm(h, w2, s2, None, None, 0.0, False, None, "shared_w2", **kw)
    if M == 1:
        h = fg._gemm(x, w1, s1, w3, s3, 10.0, False, None, "shared_w13", pdl=False)
        t = fg._gemv_tiles(2304, 5120, True)
        piped = fg._gemm(x, w1, s1, w3, s3, 10.0, False, None, "shared_w13", path="gemv", tiles=(*t[:4], 3))
        torch.testing.assert_close(piped.float(), h.float(), rtol=2.0 ** -7, atol=1e-6)
    if not pdl_for(x.device):
        return
    # the default path (at 8 tokens on sm90 the warp-split kernel) and, with fold=True
    # (an mma option), the split-K tile; each compared with itself without PDL (the two sum in different orders)
    for kw in ({}, {"fold": True}):
        xs = x.clone()
        chain(xs, pdl=True, **kw)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            xs.copy_(x)
            yg = chain(xs, pdl=True, **kw)
        for i in range(3):
            x.copy_(randn(g, M, 5120, dtype=torch.bfloat16))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(yg, chain(x, pdl=False, **kw)), f"replay {i} {kw}"


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8])
def test_gpu_norm_then_linear_pdl_chain_keeps_the_bits(M):
    """The decode norm launched with PDL (it releases its successor at its start) in front of wq_a (PDL; at one token
    also with the gemv's first weight tile loaded before its wait, EARLY_W) and the router, all in one CUDA graph whose first kernel rewrites the norm's input:
    each replay equals the serialized chain on the new input (a read of the norm's output before the grid wait
    would show)."""
    from dsv41c.codegen.triton import moe_router
    from dsv41c.codegen.triton.pdl import pdl_for
    g = gen(35)
    h = randn(g, M, 5120, dtype=torch.bfloat16)
    nw = (1 + 0.1 * randn(g, 5120)).to(torch.bfloat16)
    w, s = fp8_weight(g, 1280, 5120)
    gw = randn(g, 384, 5120, scale=0.02, dtype=torch.bfloat16)
    bias = randn(g, 384, scale=0.01)

    def chain(x, pdl, **kw):
        y = rn.rmsnorm(x, nw, 1e-20, pdl=pdl)
        q = fg._gemm(y, w, s, None, None, 0.0, False, None, "wq_a", pdl=pdl, **kw)
        return (q, *moe_router.router(y, gw, bias, 6, pdl=pdl))
    if not pdl_for(h.device):
        pytest.skip("needs programmatic dependent launch (sm90+)")
    opts = [{}] + ([{"early_w": True}] if M == 1 else [])
    for kw in opts:
        xs = h.clone()
        chain(xs, True, **kw)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            xs.copy_(h)
            outs = chain(xs, True, **kw)
        for i in range(3):
            h.copy_(randn(g, M, 5120, dtype=torch.bfloat16))
            graph.replay()
            torch.cuda.synchronize()
            for o, r in zip(outs, chain(h, False, **{k: v for k, v in kw.items() if k != "early_w"})):
                assert torch.equal(o, r), f"{kw} replay {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
def test_gpu_router_fused_decode_under_graph_replay(T):
    """The one-launch decode router at real widths (384 experts, 5120 channels, 480 programs a token) gives
    the two-launch path's bits, also replayed from a CUDA graph in which the kernel just before it rewrites x
    (a read of x before its PDL grid wait would show) and with its counters reset between replays."""
    from dsv41c.codegen.triton import moe_router
    g = gen(34)
    x, gw, bias = _router_real_inputs(g, T)
    wf, i_f = moe_router.router(x, gw, bias, 6, fused=True)
    w2, i2 = moe_router.router(x, gw, bias, 6, fused=False)
    assert torch.equal(i_f, i2) and torch.equal(wf, w2)
    _check_router_graph_replays(g, x, gw, bias, {"fused": True}, {"fused": False})


def _router_real_inputs(g, T):
    """x [T, 5120] bf16, the gate [384, 5120] bf16 and its biases [384] fp32 at the router's published widths."""
    return (randn(g, T, 5120, dtype=torch.bfloat16), randn(g, 384, 5120, scale=0.02, dtype=torch.bfloat16),
            randn(g, 384, scale=0.01))


def _check_router_graph_replays(g, x, gw, bias, graph_kw, eager_kw):
    """router(**graph_kw) captured in a CUDA graph whose first kernel rewrites x (a read of x before a PDL wait
    would show), replayed three times on new x: each replay's bits are router(x, **eager_kw)'s (the counters are
    back at zero between replays, or the next replay would differ)."""
    from dsv41c.codegen.triton import moe_router
    xs = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        xs.copy_(x)
        wg, ig = moe_router.router(xs, gw, bias, 6, **graph_kw)
    for r in range(3):
        x.copy_(randn(g, *x.shape, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        w2, i2 = moe_router.router(x, gw, bias, 6, **eager_kw)
        assert torch.equal(ig, i2) and torch.equal(wg, w2), f"replay {r}"


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
def test_gpu_router_gate_once_under_graph_replay(T):
    """The gate-once decode router at real widths (384 experts, 5120 channels, 120 programs): the reference's
    experts (weights to fp32 rounding: its sums are MMA sums), and under a CUDA graph whose first kernel rewrites x
    (a read of x before the PDL wait would show) the bits of an eager call on the same x, replay after replay."""
    from dsv41c.codegen.triton import moe_router
    g = gen(35)
    x, gw, bias = _router_real_inputs(g, T)
    w, i = moe_router.router(x, gw, bias, 6, gate_once=True)
    rw, ri = moe.router_reference(x, gw, bias, 6)
    assert torch.equal(i, ri)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)
    _check_router_graph_replays(g, x, gw, bias, {"gate_once": True}, {"gate_once": True})


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 300])
def test_gpu_moe_real_widths(T, sparse_fp4_experts):
    g = gen(31)
    E, k, D, I = 384, 6, 5120, 2304
    x = randn(g, T, D, dtype=torch.bfloat16)
    gw = randn(g, E, D, scale=0.02, dtype=torch.bfloat16)
    bias = randn(g, E, scale=0.01)
    w, i = moe.router(x, gw, bias, k)
    rw, ri = moe.router_reference(x, gw, bias, k)
    # tf32x3 vs fp32 sums: an index may differ only where two scores are within rounding
    s = torch.nn.functional.softplus(x.float() @ gw.float().T).sqrt() + bias
    diff = (i != ri).any(-1)
    for t in diff.nonzero().flatten().tolist():
        a, b = s[t, i[t].long()].sort().values, s[t, ri[t].long()].sort().values
        assert torch.allclose(a, b, rtol=1e-5)
    torch.testing.assert_close(w[~diff], rw[~diff], rtol=1e-5, atol=1e-6)
    gk = torch.Generator(device=DEV).manual_seed(5)
    used = torch.unique(ri).tolist()
    w1, s1, w3, s3, w2, s2 = sparse_fp4_experts(E, D, I, used, gk, DEV, random_scales=False)
    ref = moe.moe_experts_reference(x, ri, rw, w1, s1, w3, s3, w2, s2, 10.0)
    for ds, dec in ((False, 0), (False, 1), (False, 2), (True, 0)):
        y = moe.moe_experts(x, ri, rw, w1, s1, w3, s3, w2, s2, 10.0, dot_scaled=ds, decode=dec)
        assert rel_err(y, ref) < 2 * BF16_ULP, (ds, dec)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 300])
def test_gpu_mhc_engram_norm_real_widths(T):
    g = gen(32)
    D = 5120
    H, fn, base, scale, pre_prev = _mhc_inputs(g, T, D, torch.float32)
    out = mhc.mhc_pre(H, pre_prev, fn, base, scale, 1e-20, 1e-6)
    ref = mhc.mhc_pre_reference(H, pre_prev, fn, base, scale, 1e-20, 1e-6)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    y = randn(g, T, D, dtype=torch.bfloat16)
    torch.testing.assert_close(mhc.mhc_post(H, y, ref[2], ref[3]), mhc.mhc_post_reference(H, y, ref[2], ref[3]),
                               rtol=1e-5, atol=1e-5)
    table, tscale = formats.quant_fp8_ue8m0(torch.randn(4096, 256, generator=g))
    ids = torch.randint(0, 4096, (T, 24), generator=g)
    table, tscale, ids = table.to(DEV), tscale.to(DEV), ids.to(DEV)
    assert torch.equal(en.engram_gather(ids, table, tscale), en.engram_gather_reference(ids, table, tscale))
    kv = randn(g, T, 5 * D, dtype=torch.bfloat16)
    qw, kw = randn(g, 4, D, dtype=torch.bfloat16), randn(g, 4, D, dtype=torch.bfloat16)
    torch.testing.assert_close(en.engram_gate(H, kv, qw, kw, 1e-20), en.engram_gate_reference(H, kv, qw, kw, 1e-20),
                               rtol=1e-5, atol=1e-5)
    xb = randn(g, T, D, dtype=torch.bfloat16)
    wn = randn(g, D, dtype=torch.bfloat16)
    assert_ulps(rn.rmsnorm(xb, wn, 1e-20), rn.rmsnorm_reference(xb, wn, 1e-20), ulps=1, floor=1e-6)


@pytest.mark.gpu
def test_gpu_fp8_scale_prefetch_keeps_the_bits():
    """On the GPU, at every published dense and gated linear's width: the tensor-core k loop with its scale
    bytes loaded a k tile ahead (SPF) gives the same bits as loading them in the step that uses them (decode
    tiles at 2-16 tokens, the prefill tile at 64; the word decoder at engram wkv's width)."""
    g = gen(12)
    for name, (N, K) in list(widths.dense_linears().items()) + list(widths.gated_linears().items()):
        w, s = fp8_weight(g, N, K)
        w3, s3 = fp8_weight(g, N, K) if name in widths.gated_linears() else (None, None)
        for M in (2, 8, 16, 64):
            x = randn(g, M, K, dtype=torch.bfloat16)
            run = lambda spf: fg._gemm(x, w, s, w3, s3, 10.0, False, None, name, path="mma", spf=spf)  # noqa: E731
            assert torch.equal(run(True), run(False)), (name, M)


@pytest.mark.gpu
def test_gpu_fp8_stacked_gated_tile():
    """On the GPU at the shared w1/w3's width (2304 x 5120): the stacked gated tile (the sm90 default at 9-16 tokens;
    2-8 take fp8_warp_split.py, checked here against the reference too) and the paired one both match the float32 reference to the bf16 output's rounding, and the stacked tile's folded
    and separate split-K epilogues give the same bits."""
    g = gen(14)
    N, K = widths.gated_linears()["shared_w13"]
    w1, s1 = fp8_weight(g, N, K)
    w3, s3 = fp8_weight(g, N, K)
    for M in (2, 8, 16):
        x = randn(g, M, K, dtype=torch.bfloat16)
        ref = fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, 10.0)
        run = lambda **kw: fg._gemm(x, w1, s1, w3, s3, 10.0, False, None, "shared_w13", path="mma", **kw)  # noqa: E731
        stacked, paired = run(stack=True), run(stack=False)
        assert rel_err(stacked, ref) < 2 * BF16_ULP and rel_err(paired, ref) < 2 * BF16_ULP, M
        assert torch.equal(stacked, run(stack=True, fold=False)), M
        default = fg.fp8_gemm_swiglu(x, w1, s1, w3, s3, 10.0)
        if ws.default_for(x.device, M, N, K, True):  # 2-8 tokens on sm90: the warp-split kernel (fp8_warp_split.py)
            assert torch.equal(default, ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, 10.0)), M
            assert rel_err(default, ref) < 2 * BF16_ULP, M
        elif fg.mma_sync_decode_for(x.device):  # the stacked tile is the default there
            assert torch.equal(stacked, default), M
