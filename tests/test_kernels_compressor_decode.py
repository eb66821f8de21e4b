"""The compressor's decode path (1-4 tokens): the fused one-launch kernel (split-K FMA GEMV, the last
program to arrive runs the tail) against `compress_ref` and against the two-launch path.

Inputs are built as in test_kernels_attention.py's compressor tests. With dyadic inputs (`grid`)
every linear and sum of squares is exact in fp32, so ratio 1 must match the reference bit for bit
whatever the summation order; random inputs differ by fp32 accumulation order only (rare one-step
FP4 flips). Also: the arrival counter is back at 0 after a call, and two calls give identical bytes.
The `gpu` test runs the real widths (C=512, D=5120, indexer 128) on a CUDA device.
"""

import pytest
import torch

from dsv41c.codegen.triton import arrival
from dsv41c.codegen.triton import compressor as cm

from kernel_helpers import (DEV, assert_compressor_close, bits, compressor_latent_atol,  # noqa: E402
                            compressor_weights)
from kernel_helpers import fp4_e4m3_close as _fp4_e4m3_close  # noqa: E402


def _compressor_inputs(ratio, T, D, C, CI, rope, grid, seed):
    return compressor_weights(ratio, T, D, C, CI, rope, grid, torch.Generator().manual_seed(seed))


NAMES = ("kv codes", "kv scales", "index codes", "index scales", "latent")
# small widths for the interpreter; KPS 64 makes 4 K-splits of D=256 (the tail adds several partials)
SMALL = dict(D=256, C=128, CI=32, rope=32, cfg={"KPS": 64, "BK": 32, "IBK": 32})


def _rows(J, skip, device=DEV):
    """Cache rows for J entries of an N = J + 3 cache, entry `skip` (if any) set to -1."""
    rows = torch.tensor([J + 2 - i for i in range(J)], dtype=torch.int32)
    if skip is not None:
        rows[skip] = -1
    return rows.to(device), J + 3


def _run(fn, ratio, t, cos, sin, pos, rows, N, C, CI, fuse_idx, **kw):
    kc = torch.zeros(N, C // 2, dtype=torch.uint8, device=DEV)
    ks = torch.zeros(N, C // 16, dtype=torch.uint8, device=DEV)
    ic = torch.zeros(N, CI // 2, dtype=torch.uint8, device=DEV)
    isc = torch.zeros(N, CI // 32, dtype=torch.uint8, device=DEV)
    lat = torch.zeros(pos.shape[0], C, dtype=torch.bfloat16 if ratio == 1 else torch.float32, device=DEV)
    idx = dict(wk=t["wk"], k_norm_w=t["k_norm_w"], idx_cache=ic, idx_scale=isc) if fuse_idx else {}
    fn(t["x"], t["wkv"], t["norm_w"], cos, sin, pos, rows, kc, ks, ratio=ratio,
       wgate=t["wgate"] if ratio == 2 else None, latent_out=lat, **idx, **kw)
    return kc, ks, ic, isc, lat


def _counter():
    return int(arrival.counters(DEV, 1)[0])


CASES = [(1, 1, None), (1, 1, 0), (1, 2, 1), (2, 2, None), (2, 2, 0), (2, 4, 1)]


@pytest.mark.parametrize("fuse_idx,idx_mma", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("ratio,T,skip", CASES)
def test_decode_fused_bit_exact_on_exact_gemm(ratio, T, skip, fuse_idx, idx_mma):
    """Dyadic x and wkv: the fused launch writes exactly the reference's bytes (ratio 1: all outputs;
    ratio 2: the gate is random, so its fp32 softmax inputs differ by summation order; codes compared
    with the one-step tolerance there). idx_mma: the indexer key's product on the tensor cores."""
    D, C, CI, rope = SMALL["D"], SMALL["C"], SMALL["CI"], SMALL["rope"]
    t, cos, sin, pos = _compressor_inputs(ratio, T, D, C, CI, rope, grid=True, seed=10 + T)
    rows, N = _rows(T // ratio, skip)
    a = _run(cm.compress, ratio, t, cos, sin, pos, rows, N, C, CI, fuse_idx, fused_tail=True,
             decode_cfg={**SMALL["cfg"], "idx_mma": idx_mma})
    b = _run(cm.compress_ref, ratio, t, cos, sin, pos, rows, N, C, CI, fuse_idx)
    assert _counter() == 0
    if ratio == 1:
        for name, x, y in zip(NAMES, a, b):
            assert torch.equal(bits(x), bits(y)), name
    else:
        torch.testing.assert_close(a[4], b[4], rtol=1e-5, atol=1e-6)
        _fp4_e4m3_close(a[0], a[1], b[0], b[1])
    written = set(rows[rows >= 0].tolist())
    for r in range(N):  # rows not named (and the -1 entry) are never written
        if r not in written:
            assert not a[0][r].any() and not a[1][r].any() and not a[2][r].any() and not a[3][r].any()
    if skip is None or T // ratio > 1:
        assert a[0].any() and a[1].any()  # something was written
        if fuse_idx:
            assert a[2].any() and a[3].any()


@pytest.mark.parametrize("idx_mma", [False, True])
@pytest.mark.parametrize("ratio,T,skip", CASES)
def test_decode_fused_random_vs_ref_and_two_launch(ratio, T, skip, idx_mma):
    D, C, CI, rope = SMALL["D"], SMALL["C"], SMALL["CI"], SMALL["rope"]
    t, cos, sin, pos = _compressor_inputs(ratio, T, D, C, CI, rope, grid=False, seed=20 + T)
    rows, N = _rows(T // ratio, skip)
    a = _run(cm.compress, ratio, t, cos, sin, pos, rows, N, C, CI, True, fused_tail=True,
             decode_cfg={**SMALL["cfg"], "idx_mma": idx_mma})
    o = _run(cm.compress, ratio, t, cos, sin, pos, rows, N, C, CI, True, fused_tail=False)
    b = _run(cm.compress_ref, ratio, t, cos, sin, pos, rows, N, C, CI, True)
    for ref in (b, o):
        assert_compressor_close(a, ref, ratio, ulps=1, floor=1e-6, rtol=1e-5, atol=1e-6, kv_frac=0.03, key_frac=0.05,
                                lat_atol=compressor_latent_atol(t, ratio))


def test_decode_fused_counter_reset_and_repeatable():
    """The last arriver leaves the counter at 0, so a second launch (a graph replay) behaves the same."""
    D, C, CI, rope = SMALL["D"], SMALL["C"], SMALL["CI"], SMALL["rope"]
    t, cos, sin, pos = _compressor_inputs(2, 4, D, C, CI, rope, grid=False, seed=5)
    rows, N = _rows(2, None)
    assert _counter() == 0
    first = _run(cm.compress, 2, t, cos, sin, pos, rows, N, C, CI, True, fused_tail=True, decode_cfg=SMALL["cfg"])
    assert _counter() == 0
    second = _run(cm.compress, 2, t, cos, sin, pos, rows, N, C, CI, True, fused_tail=True, decode_cfg=SMALL["cfg"])
    assert _counter() == 0
    for name, x, y in zip(NAMES, first, second):
        assert torch.equal(bits(x), bits(y)), name


def test_decode_fused_is_default_where_it_applies_and_refuses_elsewhere(monkeypatch):
    calls = []
    real = cm._launch_decode_fused
    monkeypatch.setattr(cm, "_launch_decode_fused", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    D, C, CI, rope = 64, 64, 32, 32
    t, cos, sin, pos = _compressor_inputs(1, 3, D, C, CI, rope, grid=False, seed=1)
    rows, N = _rows(3, None)
    _run(cm.compress, 1, t, cos, sin, pos, rows, N, C, CI, True)  # 3 rows: two-launch path
    assert calls == []
    with pytest.raises(ValueError, match="fused_tail=True"):
        _run(cm.compress, 1, t, cos, sin, pos, rows, N, C, CI, True, fused_tail=True)
    t2 = dict(t, x=t["x"][:2])
    r2, N2 = _rows(2, None)
    _run(cm.compress, 1, t2, cos, sin, pos[:2], r2, N2, C, CI, True)  # 2 rows: fusable, but untimed: two launches
    assert calls == []
    t1 = dict(t, x=t["x"][:1])
    r1, N1 = _rows(1, None)
    _run(cm.compress, 1, t1, cos, sin, pos[:1], r1, N1, C, CI, True)
    assert calls == [1]
    with pytest.raises(ValueError, match="unknown decode_cfg"):
        _run(cm.compress, 1, t1, cos, sin, pos[:1], r1, N1, C, CI, True, decode_cfg={"BM": 4})


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,T", [(1, 1), (1, 2), (2, 2), (2, 4)])
@pytest.mark.parametrize("cfg", [None, {"BN": 16}, {"IBK": 256}, {"idx_mma": True}, {"idx_mma": True, "IBK": 64}])
def test_gpu_decode_fused_real_widths(ratio, T, cfg):
    t, cos, sin, pos = _compressor_inputs(ratio, T, 5120, 512, 128, 64, grid=False, seed=ratio + T)
    rows, N = _rows(T // ratio, None)
    a = _run(cm.compress, ratio, t, cos, sin, pos, rows, N, 512, 128, True, fused_tail=True, decode_cfg=cfg)
    assert _counter() == 0
    b = _run(cm.compress_ref, ratio, t, cos, sin, pos, rows, N, 512, 128, True)
    assert_compressor_close(a, b, ratio, ulps=4, floor=2.0, rtol=1e-4, atol=1e-4, kv_frac=0.03, key_frac=0.03)
    a2 = _run(cm.compress, ratio, t, cos, sin, pos, rows, N, 512, 128, True, fused_tail=True, decode_cfg=cfg)
    for name, x, y in zip(NAMES, a, a2):
        assert torch.equal(bits(x), bits(y)), name


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,T", [(1, 1), (2, 2)])
def test_gpu_decode_pdl_behind_the_norm_keeps_the_bits(ratio, T):
    """The one-launch decode compressor with PDL (DECODE_CFG "pdl": its first weights load before the grid wait)
    behind the decode norm (PDL, releasing at its start), in one CUDA graph whose first kernel rewrites the norm's
    input: every replay writes the bytes of the same chain launched without PDL on the new input (a read of x before
    the wait would show), and the arrival counter is back at 0."""
    from dsv41c.codegen.triton import rmsnorm as rn
    from dsv41c.codegen.triton.pdl import pdl_for
    t, cos, sin, pos = _compressor_inputs(ratio, T, 5120, 512, 128, 64, grid=False, seed=40 + ratio)
    if not pdl_for(t["x"].device):
        pytest.skip("needs programmatic dependent launch (sm90+)")
    rows, N = _rows(T // ratio, None)
    h = t["x"].clone()
    nw = (1 + 0.1 * torch.randn(5120, device=DEV)).to(torch.bfloat16)

    def chain(x, pdl):
        y = rn.rmsnorm(x, nw, 1e-20, pdl=pdl)
        return _run(cm.compress, ratio, dict(t, x=y), cos, sin, pos, rows, N, 512, 128, True, fused_tail=True,
                    decode_cfg={"pdl": pdl})
    xs = h.clone()
    chain(xs, True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        xs.copy_(h)
        outs = chain(xs, True)
    for i in range(3):
        h.copy_(torch.randn(T, 5120, device=DEV).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert _counter() == 0
        for name, x, y in zip(NAMES, outs, chain(h, False)):
            assert torch.equal(bits(x), bits(y)), f"{name}, replay {i}"
