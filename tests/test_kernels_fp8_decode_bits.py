"""FP8 GEMM weight decoder DECODE_W 1 (E4M3 words -> bf16x2 by bit assembly, bf16x2.e4m3_words_to_bf16).

Interpreter: the decoded tile equals value(code)·2^(e-127) rounded to bf16 (exact for e >= 7, where every
product is a bf16 value) for all 256 codes, negative zero, subnormals and scales from 0 to 255 (e > 134
needs the second scale factor; 255 is NaN), in the column order `k_order_w` promises; the GEMM with
DECODE_W 1 matches `fp8_gemm_reference` at small ragged shapes. `gpu`: the real decode widths (inline-PTX
bf16x2 fma) vs float64.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dsv41c.codegen.triton import fp8_gemm as fg
from dsv41c import formats
from dsv41c.codegen.triton import fp8_tiles as ft
from dsv41c.codegen.triton import bf16x2 as bx2
from dsv41c.codegen.triton import widths
from kernel_helpers import fp32_dot_bound  # noqa: E402
from ptx_model import bf16_bits, bf16_value, prmt, run_ptx

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16_ULP = 2.0 ** -7
# UE8M0 exponents: tiny (bf16 rounding of the smallest products), the real range, the f1 limit 134 and past it
# (second factor), overflow to inf (large e) and NaN (255)
EXPONENTS = [0, 1, 3, 6, 7, 8, 60, 100, 110, 117, 120, 125, 127, 130, 134, 135, 136, 140, 160, 200, 240, 247, 254,
             255]


@triton.jit
def _decode_tile_kernel(w_ptr, s_ptr, out_ptr, R: tl.constexpr, BK: tl.constexpr, PTX: tl.constexpr,
                        F32: tl.constexpr):
    rr = tl.arange(0, R)
    ww = tl.load(w_ptr.to(tl.pointer_type(tl.uint32)) + rr[:, None] * (BK // 4) + tl.arange(0, BK // 4)[None, :])
    sc = tl.load(s_ptr + rr[:, None] * (BK // 32) + tl.arange(0, BK // 32)[None, :])
    t = bx2.e4m3_words_to_bf16(ww, sc, R, BK, PTX, F32, True)
    tl.store(out_ptr + rr[:, None] * BK + tl.arange(0, BK)[None, :], t)


def e4m3_values() -> torch.Tensor:
    """float64 value of every code 0..255 (the NaN codes 0x7F/0xFF as ±480: what the bit decoders give)."""
    c = torch.arange(256)
    e4, m = (c >> 3) & 15, (c & 7).double()
    v = torch.where(e4 > 0, torch.exp2((e4 - 7).double()) * (1 + m / 8), m * 2.0 ** -9)
    return torch.where(c >= 128, -v, v)


def test_value_table_matches_torch_e4m3():
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    assert torch.equal(codes.view(torch.float8_e4m3fn).double(), e4m3_values()[codes.long()])
    assert torch.equal(e4m3_values()[0x80].view(torch.int64), torch.tensor(-0.0, dtype=torch.float64).view(torch.int64))


def test_k_order_w_is_a_permutation_with_register_pairs():
    for BK in (32, 64, 128, 256):
        p = ft.k_order_w(BK)
        assert sorted(p.tolist()) == list(range(BK))
        # logical pairs (2c, 2c+1) are the two halves of one word, byte P: original k = 4m + P and 4m + 2 + P
        assert torch.equal(p[1::2] - p[0::2], torch.full((BK // 2,), 2))
        assert (p[: BK // 2] % 2 == 0).all() and (p[BK // 2:] % 2 == 1).all()
    x = torch.arange(2 * 256.0).view(2, 256)
    xp = ft.permute_k_w(x, 128)
    assert torch.equal(xp[:, :128], x[:, ft.k_order_w(128)]) and torch.equal(xp[:, 128:], x[:, 128 + ft.k_order_w(128)])
    with pytest.raises(ValueError):
        ft.k_order_w(48)


def _decode(w: torch.Tensor, s: torch.Tensor, BK: int, f32: bool) -> torch.Tensor:
    R = w.shape[0]
    out = torch.empty(R, BK, dtype=torch.float32 if f32 else torch.bfloat16, device=w.device)
    _decode_tile_kernel[(1,)](w, s, out, R=R, BK=BK, PTX=fg.ptx_for(w.device), F32=f32)
    return out


@pytest.mark.parametrize("BK", [128, 64])
def test_decode_words_all_codes_all_scales_exact(BK):
    """Every code under every exponent: the decoded tile (float32 carrying bf16 values in the interpreter, bf16 on
    CUDA) has the bits of bf16(value·2^(e-127)) (round to nearest even; exact for e >= 7), sign of zero included."""
    E = torch.tensor(EXPONENTS)
    rows_per_e = 256 // BK
    R = triton.next_power_of_2(len(E) * rows_per_e)
    codes = torch.arange(256, dtype=torch.uint8).repeat(R // rows_per_e)[: R * BK].view(R, BK)
    e_row = torch.cat([E.repeat_interleave(rows_per_e), torch.full((R - len(E) * rows_per_e,), 127)])
    s = e_row[:, None].expand(R, BK // 32).to(torch.uint8).contiguous()
    out = _decode(codes.to(DEV), s.to(DEV), BK, f32=DEV == "cpu").cpu()
    # expected in natural column order: value·2^(e-127) is exact in float32 (>= 2^-136, <= 448·2^127 or inf)
    vals = e4m3_values()[codes.long()].float() * torch.exp2((e_row - 127).float())[:, None]
    vals = torch.where((e_row == 255)[:, None], float("nan"), vals)
    want = vals.to(torch.bfloat16)[:, ft.k_order_w(BK)]
    got = out.to(torch.bfloat16) if out.dtype == torch.float32 else out
    if out.dtype == torch.float32:  # the float32 carries a bf16 value exactly (low 16 bits zero)
        assert ((out.view(torch.int32) & 0xFFFF) == 0).all()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    # where bf16 holds every product (e >= 7) this is exactly formats.dequant_fp8_weight's float32 value
    ok = (e_row >= 7) & (e_row < 255) & (torch.arange(R) < len(E) * rows_per_e)
    finite = codes & 0x7F != 0x7F
    deq = formats.dequant_fp8_weight(codes.view(torch.float8_e4m3fn), torch.full((triton.cdiv(R, 32), BK // 32), 127,
                                                                             dtype=torch.uint8))
    deq = deq * torch.exp2((e_row - 127).float())[:, None]
    ref = deq[:, ft.k_order_w(BK)][ok]
    sel = finite[:, ft.k_order_w(BK)][ok]
    assert torch.equal(got.float()[ok][sel], ref[sel])


@pytest.mark.parametrize("M", [1, 2, 5, 8, 16])
@pytest.mark.parametrize("gated", [False, True])
def test_fp8_gemm_decode_w_matches_reference(M, gated):
    g = torch.Generator().manual_seed(100 + M)
    N, K = 70, 256  # ragged N (a partial 32-row scale group and a partial BN tile)
    x = (torch.randn(M, K, generator=g)).to(DEV)
    w1, s1 = formats.quant_fp8_weight(torch.randn(N, K, generator=g) * 0.05)
    w3, s3 = formats.quant_fp8_weight(torch.randn(N, K, generator=g) * 0.05)
    w1, s1, w3, s3 = w1.to(DEV), s1.to(DEV), w3.to(DEV), s3.to(DEV)
    lim = 0.5
    if gated:
        ref = fg.fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, lim)
        run = lambda **kw: fg._gemm(x, w1, s1, w3, s3, lim, False, None, "t", path="mma", **kw)  # noqa: E731
    else:
        ref = fg.fp8_gemm_reference(x, w1, s1)
        run = lambda **kw: fg._gemm(x, w1, s1, None, None, 0.0, False, None, "t", path="mma", **kw)  # noqa: E731
    for tiles in (None, (16, 32, 128, 1, 2, 4, 1), (16, 64, 64, 1, 1, 4, 1)):
        y = run(decode_w=1, tiles=tiles)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(run(decode_w=1, fold=False), ref, rtol=1e-5, atol=1e-6)


def test_fp8_gemm_decode_w_large_scales_take_the_two_factor_loop():
    """A UE8M0 byte > 134 (2^(e-7) is no bf16) in one program's rows: that program runs the two-multiply loop
    (`_any_scale_above`), the others the one-multiply loop; both exact."""
    g = torch.Generator().manual_seed(9)
    N, K = 70, 256
    x = torch.randn(8, K, generator=g).to(DEV)
    w, s = formats.quant_fp8_weight(torch.randn(N, K, generator=g) * 0.05)
    s = s.clone()
    s[1, 3] = 140  # rows 32..63, k 96..127: the second split of the second row tile (BN 32)
    s[2, 0] = 150
    w, s = w.to(DEV), s.to(DEV)
    y = fg._gemm(x, w, s, None, None, 0.0, False, None, "t", path="mma", decode_w=1, tiles=(16, 32, 64, 1, 2, 4, 1))
    ref = fg.fp8_gemm_reference(x, w, s)
    # the big block dominates some outputs: fp32 sum-order differences scale with the largest term
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
    assert ref.abs().max() > 1e4  # the large scales are exercised


def _prmt(a: int, sel: int) -> int:
    """prmt.b32 d, a, a, sel (default mode)."""
    return prmt(a, a, sel)


def test_ptx_prmt_form_matches_the_shift_mask_form():
    """The inline-PTX decode (prmt, << 4, & 0x87F087F0) gives the bits of `e4m3_bf16x2_bits`, on every byte pair."""
    def shift_mask(w, P):
        if P == 0:
            return ((w << 8) & 0x80008000) | ((w << 4) & 0x07F007F0)
        return (w & 0x80008000) | ((w >> 4) & 0x07F007F0)
    g = torch.Generator().manual_seed(5)
    words = [b0 | (b1 << 8) | (b0 ^ 0x5A) << 16 | (b1 ^ 0xC3) << 24 for b0 in range(256) for b1 in range(0, 256, 7)]
    words += torch.randint(0, 2 ** 32, (2000,), generator=g, dtype=torch.int64).tolist()
    for w in words:
        for P, sel in ((0, 0xA280), (1, 0xB391)):
            assert ((_prmt(w, sel) << 4) & 0x87F087F0) == shift_mask(w, P), (hex(w), P)


# ============================================================================ the byte-pair decoder (inline PTX: fp8_warp_split)


def _pairs_factor_bits(e: int) -> tuple:
    """e4m3_pairs_to_bf16's two bf16 factor fields for UE8M0 byte e."""
    return (min(e, 134) + 120) << 7, 0x7FC0 if e == 255 else (max(e, 134) - 7) << 7


@pytest.mark.parametrize("two", [False, True])
def test_pairs_asm_all_codes_all_byte_positions(two):
    """The inline PTX of the byte-pair decoder (bf16x2.e4m3_pairs_to_bf16), run instruction by instruction on its own
    text: every code in every byte of the 4-code register gives DECODE_W 0's bits, value·2^(e-127) rounded once to bf16 (the NaN codes 0x7F / 0xFF
    excepted: the quantizers never write them); one factor is exact up to e = 134, two for every e."""
    asm = (bx2.E4M3_PAIRS_TWO if two else bx2.E4M3_PAIRS_ONE).value
    vals = e4m3_values()
    exps = [x for x in EXPONENTS if two or x <= 134]
    for i, e in enumerate(exps):
        # each of the 4 elements with its own scale byte, so a factor paired with the wrong element shows
        es = [e, exps[(i + 3) % len(exps)], exps[(i + 7) % len(exps)], exps[(i + 11) % len(exps)]]
        b1, b2 = zip(*(_pairs_factor_bits(x) for x in es))
        regs_in = {"$3": b1[0] | b1[1] << 16, "$4": b1[2] | b1[3] << 16, "$5": b2[0] | b2[1] << 16,
                   "$6": b2[2] | b2[3] << 16}
        for c in range(256):
            codes = [c, (c + 37) % 256, (c + 101) % 256, 255 - c]
            word = codes[0] | codes[1] << 8 | codes[2] << 16 | codes[3] << 24
            regs = run_ptx(asm, dict(regs_in, **{"$2": word}))
            got = [regs["$0"] & 0xFFFF, regs["$0"] >> 16, regs["$1"] & 0xFFFF, regs["$1"] >> 16]
            for k, ek, g in zip(codes, es, got):
                if k & 0x7F == 0x7F:
                    continue
                want = float(torch.tensor(vals[k].item(), dtype=torch.float32) * 2.0 ** (ek - 127))
                if ek == 255:
                    assert bf16_value(g) != bf16_value(g), (ek, k)  # NaN scale byte
                else:
                    assert g == bf16_bits(want), (ek, k, hex(g), want)


def test_decode_w_choice_and_refusals(monkeypatch):
    """The mma path's weight decoder: the word decoder (1) by default only from DECODE_W_MIN_WEIGHTS weights on CUDA
    decode shapes, else the per-element one (0); anything but 0 / 1 is refused, and only the word decoder's x is
    permuted."""
    x = torch.randn(3, 256)
    assert ft._decoder_x(x, 0, 128) is x
    assert torch.equal(ft._decoder_x(x, 1, 128), ft.permute_k_w(x, 128))
    with pytest.raises(ValueError, match="0 or 1"):
        ft._decode_w(2, 8, 2304, 5120, 128, torch.device("cpu"))
    monkeypatch.setattr(ft, "ptx_for", lambda device: True)
    cuda = torch.device("cuda")
    assert ft._decode_w(None, 8, 2304, 5120, 128, cuda) == 0
    assert ft._decode_w(None, 8, 25600, 6144, 128, cuda) == ft.DECODE_W_CUDA  # the largest linear takes the words
    assert ft._decode_w(None, 64, 2304, 5120, 128, cuda) == 0  # prefill
    with pytest.raises(ValueError, match="K % BK == 0"):
        ft._decode_w(1, 8, 2304, 5100, 128, cuda)


def test_decode_w_launches_its_tile_and_x_order(monkeypatch):
    """What `_gemm` hands the kernel for each decoder (the launch replaced by a recorder, CPU tensors): DECODE_W 0 runs
    the 2-warp tile (the stacked one for the gated linear) on x as given; DECODE_W 1 the word decoder's 4-warp tile on
    a permuted x."""
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.update(x=args[0], **kw)
            return launch

    monkeypatch.setattr(fg, "fp8_gemm_kernel", Recorder())
    monkeypatch.setattr(fg, "ptx_for", lambda device: True)
    monkeypatch.setattr(ft, "ptx_for", lambda device: True)
    monkeypatch.setattr(fg, "mma_sync_decode_for", lambda device: True)
    monkeypatch.setattr(ft, "interpreting", lambda: False)  # the GPU's tile plan, not the interpreter's small tiles
    g = torch.Generator().manual_seed(8)
    w, s = formats.quant_fp8_weight(torch.randn(2304, 5120, generator=g) * 0.05)
    w3, s3 = formats.quant_fp8_weight(torch.randn(2304, 5120, generator=g) * 0.05)
    x = torch.randn(8, 5120, generator=g).to(torch.bfloat16)
    tiles = {}
    for dw in (0, 1):
        fg._gemm(x, w, s, None, None, 0.0, False, None, "t", path="mma", decode_w=dw)
        tiles[dw] = (seen["BN"], seen["num_warps"], seen["SPLIT_K"])
        assert seen["DECODE_W"] == dw and torch.equal(seen["x"], x) == (dw != 1)
    assert tiles[0] != tiles[1] and tiles[0][1] == 2 and tiles[1][1] == 4
    fg._gemm(x, w, s, w3, s3, 10.0, False, None, "t", path="mma", decode_w=0)
    assert seen["GATED"] == 2 and seen["DECODE_W"] == 0 and seen["num_warps"] == 2


def test_fp8_gemm_decode_w_rejects_ragged_k():
    g = torch.Generator().manual_seed(3)
    w, s = formats.quant_fp8_weight(torch.randn(40, 160, generator=g))
    x = torch.randn(4, 160, generator=g).to(DEV)
    with pytest.raises(ValueError, match="decode_w"):
        fg._gemm(x, w.to(DEV), s.to(DEV), None, None, 0.0, False, None, "t", path="mma", decode_w=1)
    y = fg._gemm(x, w.to(DEV), s.to(DEV), None, None, 0.0, False, None, "t", path="mma")  # default: ragged K -> 0
    # fp32 sums in the kernel's order and in torch's (which depends on the CPU's vector kernels): within the bound
    bound = fp32_dot_bound(x, formats.dequant_fp8_weight(w, s).to(DEV))
    assert ((y - fg.fp8_gemm_reference(x, w.to(DEV), s.to(DEV))).abs() <= bound).all()


# ============================================================================ GPU tier: published widths


@pytest.mark.gpu
def test_gpu_decode_words_all_codes_all_scales_exact():
    test_decode_words_all_codes_all_scales_exact(128)


@pytest.mark.gpu
@pytest.mark.parametrize("decode_w", [0, 1])
def test_gpu_fp8_decode_w_real_widths(decode_w):
    g = torch.Generator().manual_seed(41)
    M = 8
    x = torch.randn(M, 8192, generator=g).to(torch.bfloat16).to(DEV)
    w, s = (t.to(DEV) for t in formats.quant_fp8_weight(torch.randn(5120, 8192, generator=g) * 0.05))
    exact = x.double() @ formats.dequant_fp8_weight(w, s).double().T
    y = fg._gemm(x, w, s, None, None, 0.0, False, None, "wo_b", path="mma", decode_w=decode_w)
    assert ((y.double() - exact).norm() / exact.norm()).item() < BF16_ULP
    x5 = x[:, :5120].contiguous()
    w1, s1 = (t.to(DEV) for t in formats.quant_fp8_weight(torch.randn(2304, 5120, generator=g) * 0.05))
    w3, s3 = (t.to(DEV) for t in formats.quant_fp8_weight(torch.randn(2304, 5120, generator=g) * 0.05))
    lim = 10.0
    g64 = (x5.double() @ formats.dequant_fp8_weight(w1, s1).double().T).clamp(max=lim)
    u64 = (x5.double() @ formats.dequant_fp8_weight(w3, s3).double().T).clamp(-lim, lim)
    h64 = torch.nn.functional.silu(g64) * u64
    h = fg._gemm(x5, w1, s1, w3, s3, lim, False, None, "shared_w13", path="mma", decode_w=decode_w)
    assert ((h.double() - h64).norm() / h64.norm()).item() < 2 * BF16_ULP
