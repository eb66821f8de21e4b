"""The warp-split FP8 decode GEMM (codegen/triton/fp8_warp_split.py): the reference's numbers in the interpreter
(plain and gated, ragged N, 1-16 tokens, 1-8 slices, 16 / 32 rows a program, the scale prefetch on and off), bad requests refused by name, the
dispatch rule, and on a GPU the real widths against float64, the byte-pair decoder against the per-element one (ragged
shapes, scale bytes past 134 and 255 included), and CUDA-graph replay with PDL."""
from __future__ import annotations

import pytest
import torch

from dsv41c.codegen.triton import fp8_gemm as fg
from dsv41c.codegen.triton import fp8_warp_split as ws
from dsv41c import formats

from kernel_helpers import fp32_dot_bound, swiglu_bound  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16_ULP = 2.0 ** -7


def _w(g, N, K, scale=0.05):
    """E4M3 codes of a quantized Gaussian with RANDOM UE8M0 bytes per 32×32 block (112..122: a quantized Gaussian's
    are nearly all one value), so that a scale read from the wrong k step, row block or matrix changes the result."""
    w, s = formats.quant_fp8_weight(torch.randn(N, K, generator=g) * scale)
    s = torch.randint(112, 123, s.shape, generator=g, dtype=torch.uint8)
    return w.to(DEV), s.to(DEV)


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("N,K,M,tiles,spf", [(70, 256, 8, (4, 16, 32, 2), False), (64, 512, 1, (8, 16, 64, 3), False),
                                             (48, 256, 16, (2, 32, 64, 1), True), (33, 128, 3, (1, 16, 128, 2), False),
                                             (70, 256, 5, (4, 16, 32, 2), True),  # spf: scales a step ahead
                                             # ragged slices: 9 k tiles over 4 warps (3, 3, 3, 0), 5 over 2 (3, 2)
                                             (40, 288, 8, (4, 16, 32, 2), True), (33, 320, 3, (2, 16, 64, 3), False)])
def test_plain_matches_reference(N, K, M, tiles, spf):
    g = torch.Generator().manual_seed(N + K + M)
    x = (torch.randn(M, K, generator=g) * 2).to(DEV)
    w, s = _w(g, N, K)
    y = ws.fp8_gemm_warp_split(x, w, s, tiles=tiles, spf=spf)
    assert y.shape == (M, N) and y.dtype == x.dtype
    ref = fg.fp8_gemm_reference(x, w, s)
    # fp32 sums in another order: an absolute slack of a few ulps of the largest output (random block scales spread
    # the products over 2^10 in magnitude, so small outputs are differences of large terms)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=4e-6 * ref.abs().max().item())
    # the scale prefetch moves a load, not a product: the other setting gives the same bits
    assert torch.equal(ws.fp8_gemm_warp_split(x, w, s, tiles=tiles, spf=not spf), y)


@pytest.mark.parametrize("N,K,M,tiles,spf", [(70, 256, 8, (4, 16, 32, 2), False), (40, 512, 3, (8, 16, 64, 2), True),
                                             (64, 256, 16, (2, 32, 64, 3), False), (38, 512, 8, (4, 16, 64, 2), True),
                                             (36, 384, 8, (2, 16, 128, 2), True)])  # ragged: 3 k tiles over 2 warps
def test_gated_matches_reference(N, K, M, tiles, spf):
    """The stacked gated tile: RB/2 rows of w1 over the same rows of w3; the clamp is exercised."""
    g = torch.Generator().manual_seed(7 * N + K)
    x = (torch.randn(M, K, generator=g) * 2).to(DEV)
    w1, s1 = _w(g, N, K)
    w3, s3 = _w(g, N, K)
    gate, up = fg.fp8_gemm_reference(x, w1, s1), fg.fp8_gemm_reference(x, w3, s3)
    lim = up.abs().median().item()  # about half of each clamped, half passed through
    ref = fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, lim)
    y = ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, lim, tiles=tiles, spf=spf)
    # the products' sums in another fp32 order: a few ulps of the largest pre-activation, times the other factor
    mag = max(gate.abs().max().item(), up.abs().max().item())
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=4e-6 * mag * lim)
    assert (gate > lim).any() and (gate < lim).any() and (up.abs() > lim).any()  # both clamps are exercised


def test_bf16_against_float64():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 512, generator=g).to(torch.bfloat16).to(DEV)
    w, s = _w(g, 96, 512)
    y = ws.fp8_gemm_warp_split(x, w, s, tiles=(4, 16, 64, 2))
    assert y.dtype == torch.bfloat16
    exact = x.double() @ formats.dequant_fp8_weight(w, s).double().T
    assert _rel(y, exact) < BF16_ULP


def test_bad_requests_are_named():
    g = torch.Generator().manual_seed(4)
    w, s = _w(g, 32, 256)
    with pytest.raises(ValueError, match="lin: K=256 is not whole 512-wide k tiles"):
        ws.fp8_gemm_warp_split(torch.zeros(4, 256, device=DEV), w, s, tiles=(2, 16, 512, 2), name="lin")
    with pytest.raises(ValueError, match="lin: decode shapes only"):
        ws.fp8_gemm_warp_split(torch.zeros(17, 256, device=DEV), w, s, tiles=(4, 16, 64, 2), name="lin")
    with pytest.raises(ValueError, match="powers of two"):
        ws.fp8_gemm_warp_split(torch.zeros(4, 256, device=DEV), w, s, tiles=(3, 16, 64, 2), name="lin")
    with pytest.raises(ValueError, match="RB >= 16"):
        ws.fp8_gemm_warp_split(torch.zeros(4, 256, device=DEV), w, s, tiles=(4, 8, 64, 2), name="lin")
    with pytest.raises(ValueError, match="scale"):
        ws.fp8_gemm_warp_split(torch.zeros(4, 256, device=DEV), w, s[:, :1], tiles=(4, 16, 64, 2), name="lin")
    if DEV == "cpu":
        with pytest.raises(ValueError, match="lin: pairs=True is inline PTX"):
            ws.fp8_gemm_warp_split(torch.zeros(4, 256), w, s, tiles=(4, 16, 64, 2), name="lin", pairs=True)
    assert ws.fp8_gemm_warp_split(torch.zeros(0, 256, device=DEV), w, s, tiles=(4, 16, 64, 2)).shape == (0, 32)


@pytest.mark.gpu
def test_gpu_real_widths_and_graph_replay():
    """Shared w1/w3 (gated, 2304×5120) and w2 (5120×2304) at 8 tokens with the default tiles: within a bf16 ulp of
    float64 (the gated one of the float32 reference); the byte-pair decoder gives the per-element one's bits; on
    sm90 fp8_gemm_swiglu's default is this kernel; the w1/w3 -> w2 chain replayed from a CUDA graph (PDL on) gives
    the eager chain's bits every time."""
    g = torch.Generator().manual_seed(30)
    x = torch.randn(8, 5120, generator=g).to(torch.bfloat16).to(DEV)
    w1, s1 = _w(g, 2304, 5120)
    w3, s3 = _w(g, 2304, 5120)
    w2, s2 = _w(g, 5120, 2304)
    lim = 10.0
    h = ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, lim, pairs=False)
    assert _rel(h, fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, lim)) < BF16_ULP
    if ws.default_for(x.device, 8, 2304, 5120, True):  # sm90: fp8_gemm_swiglu's default is this kernel
        assert torch.equal(fg.fp8_gemm_swiglu(x, w1, s1, w3, s3, lim), ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, lim))
    else:
        assert _rel(fg.fp8_gemm_swiglu(x, w1, s1, w3, s3, lim), h) < BF16_ULP
    # the scale prefetch (spf) either way: the same bits
    assert torch.equal(ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, lim, pairs=False, spf=not ws.SPF_DEFAULT), h)
    # the byte-pair decoder (inline PTX) gives the per-element decoder's weights, so the same dots' bits
    assert torch.equal(ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, lim, pairs=True), h)
    tiles2 = (8, 16, 32, 3)  # K 2304 = 8 slices of 9 32-wide tiles
    y = ws.fp8_gemm_warp_split(h, w2, s2, tiles=tiles2, pairs=False)
    assert _rel(y, h.double() @ formats.dequant_fp8_weight(w2, s2).double().T) < BF16_ULP
    assert torch.equal(ws.fp8_gemm_warp_split(h, w2, s2, tiles=tiles2, pairs=True), y)
    assert torch.equal(ws.fp8_gemm_warp_split(h, w2, s2, pairs=True), ws.fp8_gemm_warp_split(h, w2, s2, pairs=False))
    chain = lambda: ws.fp8_gemm_warp_split(ws.fp8_gemm_warp_split(x, w1, s1, w3, s3, lim), w2, s2,  # noqa: E731
                                           tiles=tiles2)
    eager = chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("N,K,M,tiles", [(70, 256, 3, (1, 16, 128, 2)), (70, 512, 8, (2, 32, 64, 3)),
                                         (40, 1024, 5, (4, 16, 128, 3)), (64, 512, 8, None)])
def test_gpu_pairs_decoder_bits(N, K, M, tiles):
    """The byte-pair decoder (inline PTX) against the per-element one, bit for bit (NaN where both are NaN): ragged N,
    fewer than 8 tokens, 1-4 slices, 16 / 32 rows a program, and scale bytes past 134 (the second bf16x2 factor)
    and 255 (NaN), plain and gated."""
    g = torch.Generator().manual_seed(N * K + M)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(DEV)
    codes = torch.randint(0, 256, (2, N, K), generator=g, dtype=torch.uint8)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes)  # no NaN codes
    w1, w3 = (c.view(torch.float8_e4m3fn).to(DEV) for c in codes)
    scales = torch.randint(100, 141, (2, -(-N // 32), K // 32), generator=g, dtype=torch.uint8)
    scales[0, 0, 1] = 255
    s1, s3 = (c.to(DEV) for c in scales)
    for gated in (False, True):
        args = (x, w1, s1, w3, s3, 0.5) if gated else (x, w1, s1)
        b = ws.fp8_gemm_warp_split(*args, tiles=tiles, pairs=False)
        for two in (None, True):  # the host check sees the bytes past 134
            a = ws.fp8_gemm_warp_split(*args, tiles=tiles, pairs=True, two=two)
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        assert torch.isfinite(b).any()
        if not gated:  # the 255 byte's NaN reaches the output (gated: SwiGLU's min / max may drop it, see swiglu)
            assert torch.isnan(b).any()
    # bytes up to 134 only: the one-factor loop, however chosen, gives the same bits
    s1, s3 = s1.clamp(max=134), s3.clamp(max=134)
    for gated in (False, True):
        args = (x, w1, s1, w3, s3, 0.5) if gated else (x, w1, s1)
        b = ws.fp8_gemm_warp_split(*args, tiles=tiles, pairs=False)
        for two, early in ((None, None), (False, False), (False, True), (True, None)):
            torch.testing.assert_close(ws.fp8_gemm_warp_split(*args, tiles=tiles, pairs=True, two=two, early=early), b,
                                       rtol=0, atol=0)


def test_second_factor_choice(monkeypatch):
    """`two` and `early`: the host check (read once per scale tensor and version, a byte past 134 in one row block
    seen), the linears that make the factor early, bad values named. (The kernel's two loops and EARLY are bit-tested
    against the per-element decoder on a GPU: test_gpu_pairs_decoder_bits, test_gpu_capture_before_the_check.)"""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 256, generator=g).to(DEV)
    w, s = _w(g, 64, 256)
    reads = []
    real = ws.as_u8
    monkeypatch.setattr(ws, "as_u8", lambda t: reads.append(t) or real(t))
    assert not ws.scales_above_134(s) and ws._two_key(None, s, None) is False
    assert len(reads) == 1  # the second question was answered from the cache
    s2 = s.clone()
    s2[1, 3] = 135  # in the second row block only
    assert ws.scales_above_134(s2) and ws._two_key(None, s, s2) is True
    assert ws._two_key(False, s, s2) is False and ws._two_key(True, s, None) is True  # forced either way
    s[0, 0] = 200  # in place: _version moves, the cached answer is not reused
    assert ws.scales_above_134(s) and len(reads) == 3
    s[0, 0] = 120
    assert ws.early_for(5120, 2304) and not ws.early_for(2304, 5120, True)  # shared w2 only (EARLY_LINEARS)
    assert not ws.early_for(5120, 8192) and not ws.early_for(1280, 5120)
    ref = ws.fp8_gemm_warp_split(x, w, s2, tiles=(2, 16, 64, 2), two=True)
    assert torch.equal(ws.fp8_gemm_warp_split(x, w, s2, tiles=(2, 16, 64, 2)), ref)
    with pytest.raises(ValueError, match="lin: two='both'"):
        ws.fp8_gemm_warp_split(x, w, s, tiles=(2, 16, 64, 2), two="both", name="lin")


@pytest.mark.gpu
def test_gpu_capture_before_the_check():
    """A scale tensor first seen inside a CUDA-graph capture (no host sync allowed there) gets both factors: the
    capture succeeds and replays the eager call's bits; the one-factor loop with the factor made early or late gives
    the same bits too (scale bytes <= 134)."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(8, 512, generator=g).to(torch.bfloat16).to(DEV)
    w, s = _w(g, 96, 512)
    eager = ws.fp8_gemm_warp_split(x, w, s, pairs=False)
    for early in (False, True):
        assert torch.equal(ws.fp8_gemm_warp_split(x, w, s, pairs=True, two=False, early=early), eager)
    assert torch.equal(ws.fp8_gemm_warp_split(x, w, s, pairs=True, two=True), eager)  # (compiled before the capture)
    fresh = s.clone()  # never checked
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ws.fp8_gemm_warp_split(x, w, fresh)
    assert fresh not in ws._SCALES_SEEN  # the capture did not check it
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_fp8_gemm_dispatch_rule(monkeypatch):
    """`default_for` as it reads on sm90: 2-8 tokens, the measured linears only."""
    monkeypatch.setattr(ws, "mma_sync_decode_for", lambda device: True)
    cpu = torch.device("cpu")
    assert ws.default_for(cpu, 8, 2304, 5120, True) and ws.default_for(cpu, 2, 5120, 2304)
    assert ws.default_for(cpu, 8, 1280, 5120) and ws.default_for(cpu, 8, 5120, 8192)
    assert not ws.default_for(cpu, 1, 2304, 5120, True) and not ws.default_for(cpu, 9, 2304, 5120, True)
    assert not ws.default_for(cpu, 8, 32768, 1280) and not ws.default_for(cpu, 8, 25600, 6144)  # wq_b, engram wkv
    assert not ws.default_for(cpu, 8, 2304, 5120, False)  # w1/w3's shape as a plain linear: not measured
    monkeypatch.setattr(ws, "WARP_SPLIT_DECODE", False)
    assert not ws.default_for(cpu, 8, 2304, 5120, True)


def test_fp8_gemm_dispatch():
    """fp8_gemm / fp8_gemm_swiglu reach the kernel by path="warp_split" (the reference's numbers); the default takes it
    only on sm90 CUDA for the measured linears at 2-8 tokens; the mma path's options are refused on it by name."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(8, 512, generator=g).to(DEV)
    w1, s1 = _w(g, 40, 512)
    w3, s3 = _w(g, 40, 512)
    y = fg._gemm(x, w1, s1, None, None, 0.0, False, None, "lin", path="warp_split")
    torch.testing.assert_close(y, fg.fp8_gemm_reference(x, w1, s1), rtol=1e-5, atol=1e-5)
    h = fg._gemm(x, w1, s1, w3, s3, 0.5, False, None, "lin", path="warp_split")
    # fp32 sums in the kernel's order and in torch's (which depends on the CPU's vector kernels): within the bound
    d1, d3 = formats.dequant_fp8_weight(w1, s1), formats.dequant_fp8_weight(w3, s3)
    bound = swiglu_bound(x @ d1.T, x @ d3.T, fp32_dot_bound(x, d1), fp32_dot_bound(x, d3), 0.5)
    assert ((h - fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, 0.5)).abs() <= bound).all()
    with pytest.raises(ValueError, match=r"lin: the warp-split path takes none of the mma path's options \(\['fold'\]\)"):
        fg._gemm(x, w1, s1, None, None, 0.0, False, None, "lin", path="warp_split", fold=True)
    cpu = torch.device("cpu")
    assert not ws.default_for(cpu, 8, 2304, 5120, True)  # never off sm90 (the interpreter included)
    assert ws._measured(2304, 5120, True) == "shared_w13" and ws._measured(5120, 2304, False) == "shared_w2"
    assert ws._measured(32768, 1280, False) is None  # wq_b: not measured, keeps fp8_gemm's tile
    assert ws.tiles_for(1280, 5120) == (4, 16, 256, 3) and ws.tiles_for(5120, 8192) == (4, 16, 256, 3)
    assert ws.tiles_for(2304, 5120, True) == (4, 16, 256, 3) and ws.tiles_for(64, 512) == (4, 16, 128, 3)
    assert ws.tiles_for(5120, 2304) == (2, 16, 128, 3) and ws.tiles_for(64, 160) is None

