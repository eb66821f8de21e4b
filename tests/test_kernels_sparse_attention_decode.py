"""Batched-decode sparse attention variants vs the PyTorch reference (codegen/triton/sparse_attention.py).

Covers the decode paths added for a batch of queries: q·K^T in a runtime branch (qk_once: the
warpgroups split the keys instead of repeating the product), the last-arriver combine in the same
launch (fuse_combine) against the separate combine kernel, per-query base rows, ragged key counts
(KC not a multiple of the key block, windows cut by the sequence start), invalid (-1) selections and
all-padding key blocks (the branch's skip side). The interpreter runs small widths; the `gpu` test
runs the real widths (64 heads x 512, W 128, top-512) of the benchmarked S64 batch.
"""
import pytest
import torch

from dsv41c.codegen.triton import arrival
from dsv41c.codegen.triton import sparse_attention as sa
from dsv41c.codegen.triton.targets import interpreting
from dsv41c import formats

# the interpreter's tolerance or the compiled kernel's; the shared input builders and comparison
from kernel_helpers import ATTN_TOL as TOL, DEV, assert_bf16_close, rope_table  # noqa: E402


def batch_inputs(S, H, D, W, KC, N, quant, seed, pad_rows=()):
    """S queries, each with its own ring of W rows and its own region of N compressed rows (bases),
    ragged positions (one query near the sequence start) and -1 selections; rows in pad_rows select
    nothing (all their compressed blocks are padding)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(S, H, D, generator=g).to(torch.bfloat16)
    qpos = torch.randint(W, 4 * W, (S,), generator=g).to(torch.int32)
    qpos[0] = 3  # most of its window precedes the sequence start
    win = torch.randn(S * W, D, generator=g) * 2
    cmp = torch.randn(S * N, D, generator=g) * 2
    idx = torch.randint(-1, N, (S, KC), generator=g).to(torch.int32)
    idx[:, -5:] = -1
    for r in pad_rows:
        idx[r] = -1
    sink = torch.randn(H, generator=g)
    if quant:
        wq, we = formats.quant_fp8_ue8m0(win, 32)
        cp, cs = formats.quant_fp4_e4m3(cmp, 16)
        wkv = (wq.contiguous().view(torch.uint8).to(DEV), we.to(DEV))
        ckv = (cp.to(DEV), cs.contiguous().view(torch.uint8).to(DEV))
    else:
        wkv, ckv = win.to(torch.bfloat16).to(DEV), cmp.to(torch.bfloat16).to(DEV)
    kw = dict(window=W, ring=W, win_base=(torch.arange(S, dtype=torch.int32) * W).to(DEV),
              cmp_base=(torch.arange(S, dtype=torch.int32) * N).to(DEV))
    return (q.to(DEV), qpos.to(DEV), wkv, ckv, idx.to(DEV), sink.to(DEV)), kw


@pytest.mark.parametrize("quant", [True, False])
@pytest.mark.parametrize("qk_once,fuse,n_split,dv,block_n", [
    (True, True, 3, None, 16),    # new default shape: branch QK, fused combine, ragged last split
    (True, False, 3, None, 16),   # branch QK + separate combine kernel
    (False, True, 2, None, 16),   # old QK + fused combine
    (True, True, 1, None, 16),    # one split: no combine at all
    (True, True, 2, 32, 16),      # channel slices: per-slice products in branches, counters per slice
    (True, True, 4, None, 8),     # more splits than some queries' non-empty blocks
])
def test_decode_batch_variants(quant, qk_once, fuse, n_split, dv, block_n):
    if block_n < 16 and not (interpreting() or DEV == "cpu"):
        pytest.skip("key blocks below 16 run in the interpreter only (a compiled tl.dot needs K >= 16)")
    S, H, D, W, KC, N = 4, 16, 64, 16, 21, 24
    cos, sin = rope_table(512, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, quant, seed=7 + n_split, pad_rows=(2,))
    o = sa.sparse_attention(*args, cos, sin, n_split=n_split, dv=dv, block_n=block_n, qk_once=qk_once,
                            fuse_combine=fuse, **kw)
    r = sa.sparse_attention_ref(*args, cos, sin, **kw)
    assert_bf16_close(o, r, **TOL)


def test_fused_combine_matches_separate_and_leaves_counters_zero():
    """The last arriver merges the same tiles in the same split order as _combine_kernel: identical
    outputs; every counter is back at zero, so a second launch (a graph replay) is correct too."""
    S, H, D, W, KC, N = 3, 16, 64, 16, 40, 30
    cos, sin = rope_table(512, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=3)
    a = sa.sparse_attention(*args, cos, sin, n_split=3, block_n=16, fuse_combine=False, **kw)
    b = sa.sparse_attention(*args, cos, sin, n_split=3, block_n=16, fuse_combine=True, **kw)
    c = sa.sparse_attention(*args, cos, sin, n_split=3, block_n=16, fuse_combine=True, **kw)
    assert torch.equal(a, b) and torch.equal(b, c)
    assert int(arrival.counters(torch.device(DEV), S).abs().sum()) == 0


def test_combine_in_chunks_of_splits():
    """More splits than one chunk (NS = 16): the combine merges the first 16 splits, rescales them to the next
    chunk's max and adds the rest; the fused and the separate combine give the same bits, both match the
    reference. The tile rule keeps a chunk's partials at COMBINE_TILE floats."""
    S, H, D, W, KC, N = 2, 16, 64, 16, 300, 320
    cos, sin = rope_table(512, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=21)
    a = sa.sparse_attention(*args, cos, sin, n_split=20, block_n=16, fuse_combine=False, **kw)
    b = sa.sparse_attention(*args, cos, sin, n_split=20, block_n=16, fuse_combine=True, **kw)
    assert torch.equal(a, b)
    r = sa.sparse_attention_ref(*args, cos, sin, **kw)
    assert_bf16_close(a, r, **TOL)
    assert sa._combine_tile_shape(20, 64) == (16, 4) and sa._combine_tile_shape(2, 64) == (2, 16)
    assert sa._combine_tile_shape(10, 64) == (16, 4) and sa._combine_tile_shape(1, 64) == (1, 16)
    for n in (1, 2, 3, 10, 16, 40, 200):
        ns, hb = sa._combine_tile_shape(n, 64)
        assert ns * hb * 64 <= sa.COMBINE_TILE and 64 % hb == 0


def test_all_padding_blocks_and_empty_window():
    """A query at position 0 (a window of one key) whose selections are all -1: every compressed
    block takes the branch's skip side; its output is that one key's value (plus the sink)."""
    S, H, D, W, KC, N = 2, 16, 64, 16, 32, 16
    cos, sin = rope_table(512, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=5, pad_rows=(0, 1))
    args[1][0] = 0
    for fuse in (True, False):
        o = sa.sparse_attention(*args, cos, sin, n_split=3, block_n=16, fuse_combine=fuse, **kw)
        r = sa.sparse_attention_ref(*args, cos, sin, **kw)
        assert_bf16_close(o, r, **TOL)


def test_bad_dv_is_rejected():
    S, H, D, W, KC, N = 2, 16, 64, 16, 8, 8
    cos, sin = rope_table(64, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=1)
    with pytest.raises(ValueError, match="dv"):
        sa.sparse_attention(*args, cos, sin, dv=48, **kw)


def test_fp4_row_vectors_keep_the_bits():
    """cvec 4 / 16 (the packed FP4 rows loaded 4 / 16 bytes a thread: another register layout, the same offsets) give
    the default's bits, one query and a batch, with and without a channel slice; a bad cvec is refused."""
    S, H, D, W, KC, N = 3, 16, 64, 16, 40, 48
    cos, sin = rope_table(512, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=7)
    for dv in (None, 32):
        ref = sa.sparse_attention(*args, cos, sin, n_split=2, dv=dv, **kw)
        for cvec in (4, 16):
            assert torch.equal(sa.sparse_attention(*args, cos, sin, n_split=2, dv=dv, cvec=cvec, **kw), ref)
    with pytest.raises(ValueError, match="cvec 2 must be 4, 8 or 16"):
        sa.sparse_attention(*args, cos, sin, cvec=2, **kw)


@pytest.mark.parametrize("lazy", [-1.0, float("inf"), float("nan"), 31.0])
def test_bad_lazy_rescale_is_rejected(lazy):
    S, H, D, W, KC, N = 2, 16, 64, 16, 8, 8
    cos, sin = rope_table(64, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=1)
    with pytest.raises(ValueError, match="lazy_rescale"):
        sa.sparse_attention(*args, cos, sin, lazy_rescale=lazy, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"qk_once": False, "fuse_combine": False, "block_n": 64, "num_stages": 2},
                                 {"block_n": 64, "num_stages": 2}, {"block_n": 16}, {"n_split": 4},
                                 {"fuse_combine": False}])
def test_gpu_decode_batch_real_widths(cfg):
    """The benchmarked S64 batch at real widths (each query its own ring and compressed region)."""
    S, H, D, W, KC, N = 64, 64, 512, 128, 512, 1024
    cos, sin = rope_table(4096, 32)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=64, pad_rows=(5,))
    o = sa.sparse_attention(*args, cos, sin, **cfg, **kw)
    r = sa.sparse_attention_ref(*args, cos, sin, **kw)
    # P is rounded to bf16 for the P·V MMA: the floor is two bf16 ulps of the value scale (|v| ~ 2)
    assert_bf16_close(o, r, ulps=4, floor=2.0)
    o2 = sa.sparse_attention(*args, cos, sin, **cfg, **kw)  # counters left at zero: a replay agrees
    assert torch.equal(o, o2)


@pytest.mark.gpu
@pytest.mark.parametrize("H,D,S", [(16, 64, 4), (8, 64, 3), (4, 64, 1), (16, 128, 4), (96, 64, 2)])
def test_gpu_quantized_heads_not_a_multiple_of_64_are_padded(H, D, S):
    """FP8/FP4 KV with fewer than 64 heads (the tiny and mini presets): compiled for CUDA these products came out wrong
    (errors of 4-10, every knob), so the launcher pads q and the sink with zero heads to a multiple of 64;
    the result matches the reference and has the caller's head count. Small blocks below 16 are refused clearly."""
    W, KC, N = 16, 21, 24
    cos, sin = rope_table(512, 8)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=H + S, pad_rows=(0,) if S > 1 else ())
    o = sa.sparse_attention(*args, cos, sin, **kw)
    r = sa.sparse_attention_ref(*args, cos, sin, **kw)
    assert o.shape == (S, H, D)
    assert_bf16_close(o, r, **TOL)
    with pytest.raises(ValueError, match="below 16"):
        sa.sparse_attention(*args, cos, sin, block_n=8, **kw)


@pytest.mark.gpu
def test_gpu_default_leaves_ws_where_its_blocks_do_not_tile_the_window():
    """64 heads x 512 FP8/FP4 queries with a 16-key window: the default takes the Triton kernel (the ws kernel's 64-key
    blocks do not tile the window) instead of raising; ws=True still says why it cannot."""
    S, H, D, W, KC, N = 4, 64, 512, 16, 40, 64
    cos, sin = rope_table(512, 32)
    args, kw = batch_inputs(S, H, D, W, KC, N, True, seed=5)
    o = sa.sparse_attention(*args, cos, sin, **kw)
    r = sa.sparse_attention_ref(*args, cos, sin, **kw)
    assert_bf16_close(o, r, **TOL)
    with pytest.raises(ValueError, match="not a multiple of the ws key block"):
        sa.sparse_attention(*args, cos, sin, ws=True, **kw)
