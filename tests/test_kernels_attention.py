"""Attention-path kernels vs their PyTorch references: KV codecs, compressor, indexer, sparse attention.

On a CPU machine the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET) on
small shapes with ragged edges; the `gpu`-marked tests run the same comparisons at the real
widths (64 heads × 512, indexer 32 × 128, top-512 / 2048 blocks) on a CUDA device.
Integer-exact results (codecs, indexer scores and top-k) must match bit for bit; bf16 outputs
within a few ulps (accumulation order differs from the reference).
"""

import pytest
import torch
import triton
import triton.language as tl

from dsv41c.codegen.triton import compressor as cm
from dsv41c.codegen.triton import indexer as ix
from dsv41c.codegen.triton import indexer_score as ixs
from dsv41c.codegen.triton import kv_pairs
from dsv41c.codegen.triton import kv_quant as kq
from dsv41c.codegen.triton import sparse_attention as sa
from dsv41c import formats

from kernel_helpers import (ATTN_TOL, DEV, assert_bf16_close, assert_compressor_close, bits,  # noqa: E402
                            compressor_latent_atol, compressor_weights, rope_table)
from kernel_helpers import fp4_e4m3_close as _fp4_e4m3_close  # noqa: E402
from ptx_model import bf16_bits, run_ptx  # noqa: E402


# ============================================================================ kv_quant


def _ties_rows(C, device):
    """Rows whose scaled values sit exactly on E4M3 / E2M1 rounding ties."""
    e4 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # non-negative codes
    mid = (e4[:-1] + e4[1:]) / 2  # every E4M3 midpoint (ties to even)
    e2 = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 3.0])
    rows = []
    for vals, top in ((mid, 448.0), (e2, 6.0)):
        v = vals[torch.arange(C) % vals.numel()].clone()
        v[0] = top  # pins the block amax so the scale is a known power of two
        sign = torch.where(torch.arange(C) % 3 == 1, -1.0, 1.0)
        rows.append(v * sign)
    return torch.stack(rows).to(device)


@pytest.mark.parametrize("S,R", [(5, 16), (37, 16), (1, 8)])
def test_fp8_ring_append_matches_numerics(S, R):
    C = 128
    g = torch.Generator().manual_seed(S)
    x = torch.randn(S, C, generator=g) * torch.logspace(-6, 4, S)[:, None]
    x[0, :3] = torch.tensor([-0.0, 1e-30, 0.0])
    x = x.to(DEV)
    if S > 2:
        x[:2] = _ties_rows(C, DEV) * torch.tensor([[1.0], [2.0 ** -5]], device=DEV)
    x = x.to(torch.bfloat16)
    pos = torch.arange(3, 3 + S, dtype=torch.int32, device=DEV)
    q1, e1 = torch.zeros(R, C, dtype=torch.uint8, device=DEV), torch.zeros(R, C // 32, dtype=torch.uint8, device=DEV)
    q2, e2 = q1.clone(), e1.clone()
    kq.fp8_ring_append(x, pos, q1, e1)
    kq.fp8_ring_append_ref(x, pos, q2, e2)
    assert torch.equal(q1, q2) and torch.equal(e1, e2)
    assert torch.equal(kq.fp8_dequant(q1, e1, torch.float32), kq.fp8_dequant_ref(q2, e2, torch.float32))


@pytest.mark.parametrize("fmt", ["e4m3", "ue8m0"])
def test_fp4_quant_dequant_bit_exact(fmt):
    C, N = 128, 23
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, C, generator=g) * torch.logspace(-5, 5, N)[:, None]
    x = x.to(DEV)
    x[:2] = _ties_rows(C, DEV)
    x[2] = 0.0
    for dt in (torch.float32, torch.bfloat16):
        p1, s1 = kq.fp4_quant(x.to(dt), fmt)
        p2, s2 = kq.fp4_quant_ref(x.to(dt), fmt)
        assert torch.equal(p1, p2) and torch.equal(bits(s1), bits(s2))
        assert torch.equal(kq.fp4_dequant(p1, s1, fmt, torch.float32), kq.fp4_dequant_ref(p2, s2, fmt, torch.float32))


# ============================================================================ compressor


def _compressor_inputs(ratio, T, D, C, CI, rope, grid, seed):
    g = torch.Generator().manual_seed(seed)
    t, cos, sin, pos = compressor_weights(ratio, T, D, C, CI, rope, grid, g)
    J = T // ratio
    rows = torch.randperm(J + 4, generator=g)[:J].to(torch.int32).to(DEV)
    rows[min(1, J - 1)] = -1  # a row that must not be written
    return t, cos, sin, pos, rows, J + 4


def _run_compressor(fn, ratio, t, cos, sin, pos, rows, N, C, CI, lat_dtype):
    kc = torch.zeros(N, C // 2, dtype=torch.uint8, device=DEV)
    ks = torch.zeros(N, C // 16, dtype=torch.uint8, device=DEV)
    ic = torch.zeros(N, CI // 2, dtype=torch.uint8, device=DEV)
    isc = torch.zeros(N, CI // 32, dtype=torch.uint8, device=DEV)
    lat = torch.zeros(pos.shape[0], C, dtype=lat_dtype, device=DEV)
    fn(t["x"], t["wkv"], t["norm_w"], cos, sin, pos, rows, kc, ks, ratio=ratio,
       wgate=t["wgate"] if ratio == 2 else None, latent_out=lat, wk=t["wk"], k_norm_w=t["k_norm_w"],
       idx_cache=ic, idx_scale=isc)
    return kc, ks, ic, isc, lat


@pytest.mark.parametrize("T", [37, 5])
def test_compressor_ratio1_bit_exact_on_exact_gemm(T):
    C, CI, rope = 128, 32, 32
    t, cos, sin, pos, rows, N = _compressor_inputs(1, T, 256, C, CI, rope, grid=True, seed=1)
    a = _run_compressor(cm.compress, 1, t, cos, sin, pos, rows, N, C, CI, torch.bfloat16)
    b = _run_compressor(cm.compress_ref, 1, t, cos, sin, pos, rows, N, C, CI, torch.bfloat16)
    for name, x, y in zip(("kv codes", "kv scales", "index codes", "index scales", "latent"), a, b):
        assert torch.equal(bits(x), bits(y)), name
    written = set(rows[rows >= 0].tolist())
    for r in range(N):
        if r not in written:
            assert not a[0][r].any() and not a[2][r].any()


@pytest.mark.parametrize("ratio,T", [(1, 37), (2, 38), (1, 3), (2, 2)])
def test_compressor_random(ratio, T):
    """T > 32: fused GEMM path; T <= 32: decode path (split-K GEMV + tail)."""
    C, CI, rope = 128, 32, 32
    t, cos, sin, pos, rows, N = _compressor_inputs(ratio, T, 256, C, CI, rope, grid=False, seed=T)
    lat_dt = torch.bfloat16 if ratio == 1 else torch.float32
    a = _run_compressor(cm.compress, ratio, t, cos, sin, pos, rows, N, C, CI, lat_dt)
    b = _run_compressor(cm.compress_ref, ratio, t, cos, sin, pos, rows, N, C, CI, lat_dt)
    assert_compressor_close(a, b, ratio, ulps=1, floor=1e-6, rtol=1e-5, atol=1e-6, kv_frac=0.02, key_frac=0.02,
                            lat_atol=compressor_latent_atol(t, ratio))
    assert (a[1] == b[1]).float().mean() > 0.97


def test_compressor_rejects_partial_pair():
    t, cos, sin, pos, rows, N = _compressor_inputs(2, 4, 64, 64, 32, 32, grid=False, seed=0)
    with pytest.raises(ValueError, match="complete aligned pairs"):
        cm.compress(t["x"][:3], t["wkv"], t["norm_w"], cos, sin, pos, rows, None, None, ratio=2, wgate=t["wgate"])


# ============================================================================ indexer


def _quant_rows(x):
    p, e = formats.quant_fp4_ue8m0(x.float(), 32)
    return p.to(DEV), e.to(DEV)


def _indexer_inputs(S, H, T, seed, spread_q=(), spread_k=(), dup=(), zero_keys=()):
    g = torch.Generator().manual_seed(seed)
    qp, qe = _quant_rows(torch.randn(S, H, 128, generator=g))
    k = torch.randn(T, 128, generator=g)
    kp, ke = _quant_rows(k)
    spread = torch.tensor([112, 127, 119, 131], dtype=torch.uint8, device=DEV)  # 19 apart: no INT8 alignment
    for s, h in spread_q:
        qe[s, h] = spread
    for t in spread_k:
        ke[t] = spread
    for a, b in dup:  # key b := key a (exact score ties)
        kp[b], ke[b] = kp[a], ke[a]
    for t in zero_keys:  # all-zero codes: score exactly 0 for every query
        kp[t] = 0
    w = torch.randn(S, H, generator=g).to(DEV)
    return qp, qe, w, kp, ke


def _check_indexer(args, qpos, programs=None, **kw):
    if programs is None:
        a = ix.indexer_topk(*args, qpos, **kw)
    else:  # the heads kernel with a given number of programs per query (tiles strided over them)
        q_codes, q_exps, w, k_codes, k_exps = args
        nvis = ix.visible_counts(qpos, kw["ratio"], k_codes.shape[0])
        cnt = torch.zeros(2, dtype=torch.int32, device=DEV)
        sc, _ = ix.index_scores(q_codes, q_exps, w.float() * 128 ** -0.5, k_codes, k_exps, nvis, block_q=1,
                                block_t=kw.get("block_t", 128), programs=programs, counters=cnt)
        a = ix.IndexerOut(ix.topk_select(sc, kw["topk"], chunk=kw.get("chunk", 4096)), None, None, sc, None,
                          {"fallback_heads": int((~ix.int8_rows_ok(q_codes, q_exps)).sum()),
                           "fallback_head_tiles": int(cnt[0]), "fallback_tiles": int(cnt[1])})
    b = ix.indexer_topk_ref(*args, qpos, **kw)
    assert torch.equal(a.scores.view(torch.int32), b.scores.view(torch.int32)), "scores not bit-identical"
    assert torch.equal(a.topk, b.topk), "top-k differs"
    if b.candidates is not None:
        assert torch.equal(a.block_max.view(torch.int32), b.block_max.view(torch.int32))
        assert torch.equal(a.cand_mask, b.cand_mask), "candidate blocks differ"
        if a.candidates is not None:  # candidate_ids=True: the ordered ids too
            assert torch.equal(a.candidates, b.candidates), "candidate block order differs"
    assert a.stats == b.stats, (a.stats, b.stats)
    return a


# block_q 1: the heads kernel (decode; one query's heads are the MMA columns), 16: queries as MMA rows
@pytest.mark.parametrize("block_q", [1, 16])
def test_indexer_exact_realistic_ratio2_with_candidates(block_q):
    S, H, T = 5, 4, 150
    args = _indexer_inputs(S, H, T, seed=3)
    qpos = torch.tensor([299, 0, 41, 150, 1000], dtype=torch.int32, device=DEV)  # ratio 2: 150, 0, 21, 75, all
    a = _check_indexer(args, qpos, ratio=2, topk=16, candidate_blocks=4, block_t=64, chunk=64, block_q=block_q)
    assert a.stats["fallback_tiles"] == 0 and a.stats["fallback_heads"] == 0
    assert (a.topk[1] == -1).all()  # position 0 at ratio 2 sees no compressed entry yet


@pytest.mark.parametrize("block_q,programs", [(1, None), (1, 1), (1, 3), (16, None)])
def test_indexer_adversarial_fallbacks_and_ties(block_q, programs):
    S, H, T = 3, 4, 200
    args = _indexer_inputs(S, H, T, seed=4, spread_q=[(0, 1), (2, 3)], spread_k=[70],
                           dup=[(10, 150), (10, 11), (20, 190)], zero_keys=range(100, 130))
    qpos = torch.tensor([199, 120, 60], dtype=torch.int32, device=DEV)
    a = _check_indexer(args, qpos, ratio=1, topk=64, block_t=64, chunk=128, block_q=block_q, programs=programs)
    st = a.stats
    # key 70's tile (64..127) is visible to queries 0 and 1: one whole-tile fallback per query block
    tiles = 2 if block_q == 1 else 1
    assert st["fallback_heads"] == 2 and st["fallback_head_tiles"] > 0 and st["fallback_tiles"] == tiles, st
    # the zero-score keys tie: of them, the lowest indices are taken, in ascending order
    zero_picks = [int(i) for i in a.topk[0] if i >= 0 and a.scores[0, i] == 0]
    assert zero_picks == sorted(zero_picks)


# 64 tiles on one program: the block-path mask's last bit (bit 63, the int64's sign); 69 tiles: more than the mask
# holds, so the launch takes two programs (`heads_launch`)
@pytest.mark.parametrize("T,spread_k", [(64 * 16, [600, 1020]), (69 * 16, [5, 1090])])
def test_indexer_heads_kernel_block_path_mask(T, spread_k):
    S, H = 1, 4
    args = _indexer_inputs(S, H, T, seed=6, spread_k=spread_k)
    qpos = torch.tensor([T + 3], dtype=torch.int32, device=DEV)
    assert ixs.heads_launch(S, T // 16, sms=132, programs=1)[0] == triton.cdiv(T // 16, 64)
    a = _check_indexer(args, qpos, ratio=1, topk=32, block_t=16, chunk=256, programs=1)
    assert a.stats["fallback_tiles"] == len(spread_k) and a.stats["fallback_heads"] == 0


@pytest.mark.parametrize("block_q", [1, 16])
def test_indexer_reindex_candidate_mask_and_single_query(block_q):
    S, H, T = 1, 4, 90
    args = _indexer_inputs(S, H, T, seed=5, spread_k=[33])
    qpos = torch.tensor([77], dtype=torch.int32, device=DEV)
    nblk = -(-T // 8)
    blocks = torch.tensor([[9, 0, 3, -1]], dtype=torch.int32, device=DEV)
    mask = ix.ids_to_mask(blocks, nblk)
    a = _check_indexer(args, qpos, ratio=1, topk=40, cand_mask=mask, block_t=64, chunk=64, block_q=block_q)
    sel = a.topk[0][a.topk[0] >= 0]
    assert set((sel // 8).tolist()) <= {9, 0, 3} and a.stats["fallback_tiles"] == 1


def test_indexer_overlap_needs_cuda():
    args = _indexer_inputs(1, 4, 64, seed=2)
    qpos = torch.tensor([63], dtype=torch.int32, device=DEV)
    kw = dict(ratio=1, topk=8, candidate_blocks=2, block_t=64, chunk=64, overlap_selections=False)
    a = ix.indexer_topk(*args, qpos, **kw)
    assert torch.equal(a.cand_mask, ix.indexer_topk_ref(*args, qpos, **kw).cand_mask)
    b = ix.indexer_topk(*args, qpos, candidate_ids=True, **kw)
    assert torch.equal(b.candidates, ix.indexer_topk_ref(*args, qpos, **kw).candidates)
    if DEV == "cpu":
        with pytest.raises(ValueError, match="CUDA"):
            ix.indexer_topk(*args, qpos, **{**kw, "overlap_selections": True})


def test_indexer_step_prep_matches_the_torch_glue():
    """The one-launch step prep (visible counts, pinned newest block, scaled head weights) gives the bits of
    the PyTorch expressions it replaced, at positions with nothing visible, on block edges and past T."""
    qpos = torch.tensor([-5, -2, -1, 0, 2, 3, 4, 31, 32, 33, 10 ** 6], dtype=torch.int32, device=DEV)
    w = torch.randn(qpos.shape[0], 32, generator=torch.Generator().manual_seed(1)).to(DEV)
    for ratio, T, cb in ((4, 50, 8), (1, 20, 8), (128, 7, 8)):
        nvis, pin, wq = ix.step_prep(qpos, w, ratio, T, cb, 128 ** -0.5)
        ref_nvis = ix.visible_counts(qpos, ratio, T)
        assert torch.equal(nvis, ref_nvis.clamp(min=0))  # qpos < -1: -1 there, 0 here; both see nothing
        assert torch.equal(pin, torch.where(ref_nvis > 0, (ref_nvis - 1) // cb, -1).to(torch.int32))
        assert torch.equal(wq, w.float() * (128 ** -0.5))
    with pytest.raises(ValueError, match="qpos"):
        ix.step_prep(qpos[:3], w, 4, 50, 8, 1.0)


# merge 32 / 64: two or four lists per merge program, so the merge runs several levels
@pytest.mark.parametrize("S,N,k,chunk,merge", [(2, 300, 16, 64, 32), (2, 700, 20, 128, 64), (2, 700, 20, 128, 16384),
                                               (2, 40, 64, 64, 16384)])
def test_topk_select_stable_ties(S, N, k, chunk, merge):
    g = torch.Generator().manual_seed(N)
    s = torch.randn(S, N, generator=g).round(decimals=1).to(DEV)  # many exact ties
    s[:, ::5] = 0.0
    s[:, 2::7] = -0.0
    s[0, N // 2:] = float("-inf")
    s[-1] = 1.0  # a row of one value: the first k indices
    pin = torch.tensor([N - 1] + [-1] * (S - 1), dtype=torch.int32, device=DEV)
    for p in (None, pin):
        a = ix.topk_select(s, k, p, chunk=chunk, merge=merge)
        b = ix.topk_select_ref(s, k, p)
        assert torch.equal(a, b)
    assert torch.equal(ix.topk_select(s, k, chunk=chunk, merge=merge)[-1][:min(k, N)],
                       torch.arange(min(k, N), dtype=torch.int32, device=DEV))


# ============================================================================ sparse attention


def _attn_inputs(S, H, D, W, KC, N, quant, seed, R=None):
    g = torch.Generator().manual_seed(seed)
    R = R or W + S + 3
    q = torch.randn(S, H, D, generator=g).to(torch.bfloat16).to(DEV)
    qpos = torch.randint(0, 3 * W, (S,), generator=g).to(torch.int32)
    qpos[0] = 2  # a query near the sequence start: most of its window is empty
    win = torch.randn(R, D, generator=g) * 2
    cmp = torch.randn(N, D, generator=g) * 2
    idx = torch.randint(-1, N, (S, KC), generator=g).to(torch.int32)
    idx[:, -3:] = -1  # trailing padding
    sink = torch.randn(H, generator=g)
    if quant:
        wq, we = formats.quant_fp8_ue8m0(win, 32)
        cp, cs = formats.quant_fp4_e4m3(cmp, 16)
        wkv, ckv = (bits(wq).to(DEV), we.to(DEV)), (cp.to(DEV), bits(cs).to(DEV))
    else:
        wkv, ckv = win.to(torch.bfloat16).to(DEV), cmp.to(torch.bfloat16).to(DEV)
    return q, qpos.to(DEV), wkv, ckv, idx.to(DEV), sink.to(DEV)


@triton.jit
def _kv_tile_probe(kv_ptr, sc_ptr, o_ptr, n_rows, BN: tl.constexpr, D: tl.constexpr, WIN: tl.constexpr,
                   UPCAST: tl.constexpr = True, PAIRS: tl.constexpr = False, PTX: tl.constexpr = False):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    v = sa._kv_tile(kv_ptr, sc_ptr, rows, rows < n_rows, 0, BN, D, D, WIN, True, UPCAST, PAIRS, PTX)
    v = v.to(tl.float32) * 256.0  # units of 2^-8
    tl.store(o_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], v, mask=(rows < n_rows)[:, None])


def _kv_tile_every_code(win, pairs=False, ptx=False, D=64, n=24, dev=DEV):
    """Probe _kv_tile on every E4M3 / packed-E2M1 code with extreme and subnormal scales; bits vs the reference."""
    g = torch.Generator().manual_seed(1)
    if win:
        codes = torch.arange(256, dtype=torch.int32).repeat(n * D // 256 + 1)[:n * D].view(n, D)
        codes[(codes & 0x7F) == 0x7F] = 0  # E4M3 NaN is not produced by the quantizer
        codes = codes.to(torch.uint8)
        sc = torch.randint(100, 150, (n, D // 32), generator=g).to(torch.uint8)
        sc[0, :2] = torch.tensor([1, 254], dtype=torch.uint8)  # 2^-126 and 2^127
        ref = formats.dequant_fp8_ue8m0(codes.view(torch.float8_e4m3fn), sc, 32)
    else:
        codes = torch.randint(0, 256, (n, D // 2), generator=g).to(torch.uint8)
        codes[0, :] = torch.arange(D // 2, dtype=torch.uint8) * 8  # every nibble value twice
        sc = torch.randint(0, 127, (n, D // 16), generator=g).to(torch.uint8)
        sc[1, :4] = torch.tensor([1, 7, 8, 0x7E], dtype=torch.uint8)  # E4M3 subnormals, smallest normal, 448
        ref = formats.dequant_fp4_e4m3(codes, sc.view(torch.float8_e4m3fn), 16)
    out = torch.full((n, D), float("nan"), device=dev)
    _kv_tile_probe[(triton.cdiv(n, 16),)](codes.to(dev), sc.to(dev), out, n, BN=16, D=D, WIN=win,
                                         UPCAST=not ptx, PAIRS=pairs, PTX=ptx)
    ref = ref.float()
    if ptx:  # a bf16 tile (units of 2^-8): the exact value rounded once to nearest even bf16
        ref = (ref / 256).to(torch.bfloat16).float() * 256
    assert torch.equal(out.cpu().view(torch.int32), ref.view(torch.int32))


def _e4m3_value(byte: int) -> float:
    return torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).double().item()


def test_e2m1_pairs_asm_every_byte_every_position():
    """kv_pairs.py's inline PTX for packed E2M1, run instruction by instruction on its own text (tests/ptx_model.py):
    every byte value in each of the 4 byte positions, each byte with its own E4M3 scale (so a factor applied to the
    wrong byte shows), gives the bf16 bits of value·scale·2^-8 for both of its channels (exact: no rounding)."""
    asm = kv_pairs._E2M1_PAIRS.value
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    value = lambda n: (-1.0 if n & 8 else 1.0) * e2m1[n & 7]  # noqa: E731
    factor = lambda sb: bf16_bits(_e4m3_value(sb) * 2.0 ** 118)  # noqa: E731
    scale_sets = [(0x38, 0x39, 0x3A, 0x3B), (1, 7, 8, 0x7E), (0, 0x7E, 1, 0x40), (0x20, 0x55, 0x66, 0x11)]
    for sbs in scale_sets:
        f = [factor(x) for x in sbs]
        regs_in = {"$5": f[0] | f[1] << 16, "$6": f[2] | f[3] << 16}
        for c in range(256):
            codes = [c, (c + 37) % 256, (c + 101) % 256, 255 - c]
            word = codes[0] | codes[1] << 8 | codes[2] << 16 | codes[3] << 24
            out = run_ptx(asm, dict(regs_in, **{"$4": word}))
            for j in range(4):
                sc = _e4m3_value(sbs[j])
                want = bf16_bits(value(codes[j] & 15) * sc / 256) | bf16_bits(value(codes[j] >> 4) * sc / 256) << 16
                assert out[f"${j}"] == want, (sbs, j, hex(codes[j]), hex(out[f"${j}"]), hex(want))


@pytest.mark.parametrize("win", [True, False])
@pytest.mark.parametrize("pairs", [False, True])
def test_kv_tile_dequant_exact_every_code(win, pairs):
    """The attention kernel's in-register dequant (fp16 bit patterns + group scale; pairs: kv_pairs.py's
    emulated bf16x2 bit fields for E2M1) equals the format's reference for every E4M3 / packed-E2M1 code,
    with extreme and subnormal scales."""
    _kv_tile_every_code(win, pairs)


@pytest.mark.parametrize("S,quant,n_split,dv,lazy", [(3, True, None, None, 0.0), (1, True, None, None, 0.0),
                                                    (4, False, 1, None, 0.0), (2, True, 1, 64, 0.0),
                                                    (1, False, 3, 64, 0.0), (1, True, 2, 32, 0.0),
                                                    (3, True, None, None, 4.0), (2, False, 1, 64, 4.0)])
def test_sparse_attention(S, quant, n_split, dv, lazy):
    """Key splits (+ combine) and channel slices (dv < D: QK per slice, slice cv is V); KC = 21 is not a
    multiple of the key block (the kernel masks the tail); lazy: the running max's slack (`_attend_block`)."""
    H, D, W, KC, N = 16, 128, 16, 21, 40
    cos, sin = rope_table(512, 16)
    q, qpos, wkv, ckv, idx, sink = _attn_inputs(S, H, D, W, KC, N, quant, seed=S + 10 * bool(quant))
    kw = dict(window=W, block_n=16)
    o = sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, n_split=n_split, dv=dv, lazy_rescale=lazy,
                            **kw)
    r = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)
    assert_bf16_close(o, r, **ATTN_TOL)


def test_sparse_attention_batched_bases():
    """Per-query base rows (batched decode: one ring and one compressed region per sequence)."""
    H, D, W, KC, N, S = 16, 64, 16, 16, 24, 2
    cos, sin = rope_table(512, 8)
    q, qpos, wkv, ckv, idx, sink = _attn_inputs(S, H, D, W, KC, 2 * N, True, seed=99, R=2 * W)
    wb = torch.tensor([0, W], dtype=torch.int32, device=DEV)
    cb = torch.tensor([0, N], dtype=torch.int32, device=DEV)
    idx = idx % N
    kw = dict(window=W, ring=W, block_n=16, win_base=wb, cmp_base=cb)
    wkv = (wkv[0][:2 * W], wkv[1][:2 * W])
    o = sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)
    r = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)
    assert_bf16_close(o, r, **ATTN_TOL)


# ============================================================================ registry


def test_templates_registered_with_real_width_variants():
    from dsv41c.codegen import templates

    reg = templates._REGISTRY  # this file's modules are imported above; others' are not needed here
    for name in ("compressor", "kv_fp8_ring_append", "fp4_quant", "fp4_dequant", "fp8_ue8m0_dequant",
                 "indexer_score", "indexer_topk", "sparse_attention"):
        t = reg[name]
        for target in ("cuda:sm80", "cuda:sm90", "cuda:sm100", "rocm:gfx942", "rocm:gfx950", "rocm:gfx1100"):
            specs = t.specializations(target)
            assert specs, (name, target)
            for sp in specs:
                assert list(sp.signature) == list(sp.kernel.arg_names)
                assert all(sp.signature[k] == "constexpr" for k in sp.constexprs)
                assert set(sp.constexprs) <= set(t.keys), (name, sorted(set(sp.constexprs) - set(t.keys)))
    attn = [s for s in reg["sparse_attention"].specializations("cuda:sm90") if "H" in s.constexprs]
    assert {s.constexprs["H"] for s in attn} == {64} and {s.constexprs["D"] for s in attn} == {512}


# ============================================================================ GPU tier (real widths)


@pytest.mark.gpu
def test_gpu_indexer_exact_real_widths():
    S, H, T = 32, 32, 20000
    args = _indexer_inputs(S, H, T, seed=11, spread_q=[(3, 5)], spread_k=[5000], dup=[(10, 19000)],
                           zero_keys=range(100, 200))
    qpos = torch.arange(T - S, T, dtype=torch.int32, device=DEV)
    nblk = -(-T // 8)
    a = _check_indexer(args, qpos, ratio=1, topk=512, candidate_blocks=2048)
    # one bad key tile, seen by both 16-query blocks; one bad query-head row
    assert a.stats["fallback_tiles"] == 2 and a.stats["fallback_heads"] == 1 and a.stats["fallback_head_tiles"] > 0
    mask = a.cand_mask
    _check_indexer(args, qpos, ratio=1, topk=512, cand_mask=mask)


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1, 3])
def test_gpu_indexer_decode_heads_kernel(S):
    """The decode scoring kernel (one query's heads as the MMA columns, key tiles strided over the
    programs) at real widths: bit-identical scores, the same fallback counts, identical selections."""
    H, T = 32, 20000
    args = _indexer_inputs(S, H, T, seed=12, spread_q=[(0, 7)], spread_k=[777, 15000], dup=[(10, 19000)],
                           zero_keys=range(100, 200))
    qpos = torch.arange(T - S, T, dtype=torch.int32, device=DEV)
    a = _check_indexer(args, qpos, ratio=1, topk=512, candidate_blocks=2048, block_q=1)
    assert a.stats["fallback_tiles"] == 2 * S and a.stats["fallback_head_tiles"] > 0
    mask = a.cand_mask
    _check_indexer(args, qpos, ratio=2, topk=512, cand_mask=mask, block_q=1)
    _check_indexer(args, qpos, ratio=1, topk=512, block_q=1, block_t=64, programs=7)


@pytest.mark.gpu
def test_gpu_indexer_step_overlapped_selections():
    """The decode step at its real size (one query over 131,072 entries, candidate-2048 + top-512): the two
    selections on two streams (the CUDA default) give the sequential path's indices, also from a CUDA graph."""
    H, T = 32, 131072
    args = _indexer_inputs(1, H, T, seed=13, dup=[(10, 100000)])
    qpos = torch.tensor([T - 1], dtype=torch.int32, device=DEV)
    kw = dict(ratio=1, topk=512, candidate_blocks=2048, block_q=1, with_stats=False)
    a = _check_indexer(args, qpos, **kw)  # overlapped (the default on CUDA) against the reference
    b = ix.indexer_topk(*args, qpos, overlap_selections=False, **kw)
    assert torch.equal(a.topk, b.topk) and torch.equal(a.cand_mask, b.cand_mask)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = ix.indexer_topk(*args, qpos, **kw)
    for _ in range(2):
        c.topk.fill_(-7)  # a replay that wrote nothing would leave these
        c.cand_mask.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(c.topk, a.topk) and torch.equal(c.cand_mask, a.cand_mask)


@pytest.mark.gpu
def test_gpu_indexer_step_pdl_chain_under_graph_replay():
    """The decode step PDL-chained (prep -> scoring, its query decoded before its wait -> the one-launch top-k)
    gives the unchained step's indices, also from a CUDA graph whose first kernel rewrites the query codes and
    scales: a scoring launch that decoded its query before that copy finished would score the other query."""
    H, T = 32, 131072
    a_args = _indexer_inputs(1, H, T, seed=14, dup=[(10, 100000)])
    b_args = _indexer_inputs(1, H, T, seed=15)
    qpos = torch.tensor([T - 1], dtype=torch.int32, device=DEV)
    kw = dict(ratio=1, topk=512, candidate_blocks=2048, block_q=1, with_stats=False)
    rest = a_args[2:]  # the same weights and keys; two queries
    want = [ix.indexer_topk(*x[:2], *rest, qpos, pdl=False, **kw) for x in (a_args, b_args)]
    assert not torch.equal(want[0].topk, want[1].topk)
    got = ix.indexer_topk(*a_args[:2], *rest, qpos, pdl=True, **kw)
    assert torch.equal(got.topk, want[0].topk) and torch.equal(got.cand_mask, want[0].cand_mask)
    qc, qe = a_args[0].clone(), a_args[1].clone()  # the graph's inputs, rewritten by its first kernels
    src_c, src_e = a_args[0].clone(), a_args[1].clone()
    ix.indexer_topk(qc, qe, *rest, qpos, pdl=True, **kw)  # compile / allocate the workspaces before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qc.copy_(src_c)
        qe.copy_(src_e)
        c = ix.indexer_topk(qc, qe, *rest, qpos, pdl=True, **kw)
    for i in (1, 0, 1, 0):
        src_c.copy_((a_args, b_args)[i][0])
        src_e.copy_((a_args, b_args)[i][1])
        c.topk.fill_(-7)
        c.cand_mask.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(c.topk, want[i].topk) and torch.equal(c.cand_mask, want[i].cand_mask), i


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,T", [(1, 130), (2, 130), (1, 1), (2, 2)])
def test_gpu_compressor_real_widths(ratio, T):
    t, cos, sin, pos, rows, N = _compressor_inputs(ratio, T, 5120, 512, 128, 64, grid=False, seed=ratio)
    lat_dt = torch.bfloat16 if ratio == 1 else torch.float32
    a = _run_compressor(cm.compress, ratio, t, cos, sin, pos, rows, N, 512, 128, lat_dt)
    b = _run_compressor(cm.compress_ref, ratio, t, cos, sin, pos, rows, N, 512, 128, lat_dt)
    # K = 5120 MMA accumulation order: the linear output may round one ulp apart, then the norm
    # scales it; the floor is the latent's O(1) scale (it is RMS-normalized)
    if ratio == 1:
        assert_bf16_close(a[4], b[4], ulps=4, floor=2.0)
    else:
        torch.testing.assert_close(a[4], b[4], rtol=1e-4, atol=1e-4)
    _fp4_e4m3_close(a[0], a[1], b[0], b[1], frac=0.03)


@pytest.mark.gpu
@pytest.mark.parametrize("S,quant,cfg", [(1, True, {}), (1, False, {}), (48, True, {}), (1, True, {"dv": 128}),
                                         (1, True, {"block_n": 32}), (64, True, {"n_split": 1}),
                                         (3, False, {"dv": 256}), (64, True, {"kv_pairs": True}),
                                         (64, True, {"lazy_rescale": 8.0}),
                                         (1, True, {"kv_pairs": True, "lazy_rescale": 8.0}),
                                         (64, True, {"kv_pairs": True, "pdl": True}), (1, True, {"pdl": True}),
                                         (64, True, {"kv_pairs": False, "pdl": False}), (1, True, {"kv_pairs": False}),
                                         (64, True, {"cvec": 4}), (64, True, {"cvec": 16}), (1, True, {"cvec": 16})])
def test_gpu_sparse_attention_real_widths(S, quant, cfg):
    H, D, W, KC, N = 64, 512, 128, 512, 3000
    cos, sin = rope_table(4096, 32)
    q, qpos, wkv, ckv, idx, sink = _attn_inputs(S, H, D, W, KC, N, quant, seed=S, R=W + S + 1)
    o = sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, ws=False, **cfg)  # this file's kernel; ws: below
    r = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin)
    # P is rounded to bf16 for the P·V MMA: the error scales with the values (|v| ~ 2), not with
    # the (cancelling) output, so the floor is two bf16 ulps of the value scale
    assert_bf16_close(o, r, ulps=4, floor=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("S,cfg,KC", [(48, {}, 512), (64, {}, 512), (64, {"n_split": 1}, 512), (64, {"n_split": 3}, 512),
                                      (2, {}, 512), (5, {}, 200), (1, {}, 512),
                                      (64, {"ws_cfg": {"partial_bf16": True}}, 512),
                                      (64, {"ws_cfg": {"partial_bf16": False}}, 512),
                                      (5, {"ws_cfg": {"partial_bf16": True}}, 200),
                                      (64, {"n_split": 3, "ws_cfg": {"partial_bf16": True}}, 512)])
def test_gpu_sparse_attention_ws_real_widths(S, cfg, KC):
    """The warp-specialized Gluon kernel (sparse_attention_ws.py) against the reference and against the Triton
    kernel: empty window slots (qpos 2), padded and out-of-range index columns (KC not a multiple of the key block),
    1 / 2 / 3 key splits, a block range ending inside the window, fp32 and bf16 partials;
    a second call gives the same bits."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the ws kernel needs sm90+")
    H, D, W, N = 64, 512, 128, 3000
    cos, sin = rope_table(4096, 32)
    q, qpos, wkv, ckv, idx, sink = _attn_inputs(S, H, D, W, KC, N, True, seed=S + KC, R=W + S + 1)
    o = sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, ws=True, **cfg)
    r = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin)
    t = sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, ws=False,
                            **{k: v for k, v in cfg.items() if k != "ws_cfg"})
    assert_bf16_close(o, r, ulps=4, floor=2.0)
    assert_bf16_close(o, t, ulps=4, floor=2.0)
    assert torch.equal(o, sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, ws=True, **cfg))


@pytest.mark.gpu
def test_gpu_sparse_attention_ws_batched_bases():
    """64 batched decode queries with per-query ring and cache bases (the benchmark's layout), ws against reference."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the ws kernel needs sm90+")
    S, H, D, W, KC, N = 64, 64, 512, 128, 512, 64 * 256
    g = torch.Generator().manual_seed(7)
    cos, sin = rope_table(1 << 16, 32)
    q = torch.randn(S, H, D, generator=g).to(torch.bfloat16).to(DEV)
    qpos = torch.randint(0, 60000, (S,), generator=g).to(torch.int32).to(DEV)
    win, cmp = torch.randn(W * S, D, generator=g) * 2, torch.randn(N, D, generator=g) * 2
    wq, we = formats.quant_fp8_ue8m0(win, 32)
    cp, cs = formats.quant_fp4_e4m3(cmp, 16)
    wkv, ckv = (bits(wq).to(DEV), we.to(DEV)), (cp.to(DEV), bits(cs).to(DEV))
    idx = torch.randint(-1, N // S, (S, KC), generator=g).to(torch.int32).to(DEV)
    sink = torch.randn(H, generator=g).to(DEV)
    kw = dict(ring=W, win_base=torch.arange(S, dtype=torch.int32, device=DEV) * W,
              cmp_base=torch.arange(S, dtype=torch.int32, device=DEV) * (N // S))
    o = sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, ws=True, **kw)
    r = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)
    assert_bf16_close(o, r, ulps=4, floor=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("win", [True, False])
def test_gpu_kv_tile_pairs_every_code(win):
    """kv_pairs.py's inline-PTX bf16x2 decoders (register order of the packed operands, prmt selectors) give the
    reference's bits for every code and the extreme scales, at the kernel's real width."""
    _kv_tile_every_code(win, pairs=True, ptx=True, D=512, n=40, dev="cuda")


@pytest.mark.gpu
def test_gpu_kv_codecs_real_widths():
    x = (torch.randn(300, 512, device=DEV) * torch.logspace(-4, 3, 300, device=DEV)[:, None]).to(torch.bfloat16)
    pos = torch.arange(300, dtype=torch.int32, device=DEV)
    q1, e1 = torch.zeros(128, 512, dtype=torch.uint8, device=DEV), torch.zeros(128, 16, dtype=torch.uint8, device=DEV)
    q2, e2 = q1.clone(), e1.clone()
    kq.fp8_ring_append(x, pos, q1, e1)
    kq.fp8_ring_append_ref(x, pos, q2, e2)
    assert torch.equal(q1, q2) and torch.equal(e1, e2)
    for fmt, C in (("e4m3", 512), ("ue8m0", 128)):
        p1, s1 = kq.fp4_quant(x[:, :C], fmt)
        p2, s2 = kq.fp4_quant_ref(x[:, :C], fmt)
        assert torch.equal(p1, p2) and torch.equal(bits(s1), bits(s2))
