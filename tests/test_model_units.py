"""Unit tests of the reference model's pieces against hand-computed values (spec §3, §7)."""
import math

import pytest
import torch

from dsv41c import formats
from dsv41c.frontend.config import preset
from dsv41c.prims.engram_hash import engram_row_ids
from dsv41c.prims import quant
from dsv41c.prims.attention import sparse_attention, dense_attention, window_bias, window_indices
from dsv41c.prims.compressor import compressor_full, compressor_step
from dsv41c.prims.engram import chunk_row_ids
from dsv41c.prims.indexer import candidate_blocks, index_scores, select_topk
from dsv41c.prims.mhc import sinkhorn
from dsv41c.prims.moe import route, sqrtsoftplus, swiglu_expert
from dsv41c.prims.rope import apply_rope, inv_freq_compress, inv_freq_main, rope_cos_sin, \
    yarn_correction_range
from dsv41c.prims.topk import stable_topk

torch.set_num_threads(1)


# ---------------------------------------------------------------- RoPE
def test_yarn_range_of_the_published_config_is_15_25():
    assert yarn_correction_range(64, 160000, 65536, 32, 1) == (15, 25)


def test_yarn_frequencies_full_config():
    cfg = preset("full")
    f = inv_freq_compress(cfg, torch.float64)
    plain = 1.0 / 160000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.equal(f[:16], plain[:16])                        # i ≤ 15 unchanged
    assert torch.allclose(f[25:], plain[25:] / 16, rtol=1e-15)     # i ≥ 25 divided by the factor
    i = 20                                                          # halfway: ramp = 0.5
    assert f[i].item() == pytest.approx(0.5 * plain[i].item() / 16 + 0.5 * plain[i].item(), rel=1e-14)
    main = inv_freq_main(cfg, torch.float64)
    assert torch.allclose(main, 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))


def test_rope_is_interleaved_complex_rotation_and_inverse_undoes_it():
    inv = torch.tensor([1.0, 0.1], dtype=torch.float64)
    pos = torch.tensor([3])
    cos, sin = rope_cos_sin(inv, pos)
    x = torch.tensor([[7.0, 1.0, 0.0, 0.5, -2.0]], dtype=torch.float64)  # 1 nope channel + 2 pairs
    y = apply_rope(x, cos, sin)
    assert y[0, 0] == 7.0
    pairs = x[:, 1:].clone().reshape(1, 2, 2)
    z = torch.view_as_complex(pairs) * torch.polar(torch.ones(2, dtype=torch.float64), 3 * inv)
    assert torch.allclose(y[0, 1:], torch.view_as_real(z).flatten())
    assert torch.allclose(apply_rope(y, cos, sin, inverse=True), x)


# ---------------------------------------------------------------- mHC
def test_sinkhorn_is_doubly_stochastic_ish():
    g = torch.Generator().manual_seed(0)
    comb = sinkhorn(torch.randn(50, 4, 4, generator=g), iters=20, eps=1e-6)
    assert (comb > 0).all()
    assert torch.allclose(comb.sum(-2), torch.ones(50, 4), atol=1e-5)  # columns: exact after the last step
    assert torch.allclose(comb.sum(-1), torch.ones(50, 4), atol=1e-2)  # rows: converging


def test_sinkhorn_one_iteration_is_softmax_then_column_normalization():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]], dtype=torch.float64)
    got = sinkhorn(logits, iters=1, eps=0.0)
    soft = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)
    assert torch.allclose(got, soft / soft.sum(0, keepdim=True))


# ---------------------------------------------------------------- MoE
def test_sqrtsoftplus_values_and_underflow():
    x = torch.tensor([0.0, 50.0, -200.0, -20.0])
    s = sqrtsoftplus(x)
    assert s[0].item() == pytest.approx(math.sqrt(math.log(2)))
    assert s[1].item() == pytest.approx(math.sqrt(50.0))
    assert s[2].item() == 0.0 and torch.isfinite(s).all()
    assert s[3].item() == pytest.approx(math.sqrt(math.log1p(math.exp(-20))), rel=1e-5)
    # every selected score underflows: the +1e-20 floor keeps the weights finite (0, not NaN)
    w, idx = route(torch.ones(1, 2), torch.full((3, 2), -200.0), torch.zeros(3), 2, route_scale=1.5)
    assert torch.equal(w, torch.zeros(1, 2)) and idx.tolist() == [[0, 1]]


def test_router_uses_bias_for_selection_only_and_breaks_ties_low():
    x = torch.ones(1, 1)
    gate_w = torch.tensor([[1.0], [2.0], [1.0], [0.0]])
    bias = torch.tensor([0.0, -5.0, 0.0, 0.0])
    w, idx = route(x, gate_w, bias, 2, route_scale=1.5)
    assert idx.tolist() == [[0, 2]]  # expert 1 is biased out; 0 and 2 tie -> lower index first
    s = sqrtsoftplus(torch.tensor(1.0))
    assert torch.allclose(w, torch.full((1, 2), 1.5 * s / (2 * s + 1e-20)))


def test_swiglu_clamps_up_both_sides_gate_from_above_and_weight_before_w2():
    x = torch.tensor([[1.0]])
    w1 = torch.tensor([[20.0], [-20.0], [3.0]])   # gate: 20 -> 10 (clamped), -20 (not clamped), 3
    w3 = torch.tensor([[-15.0], [15.0], [2.0]])   # up: -15 -> -10, 15 -> 10, 2
    w2 = torch.eye(3)
    y = swiglu_expert(x, w1, w2, w3, 10.0, weight=torch.tensor([[0.5]]))
    silu = torch.nn.functional.silu
    want = 0.5 * torch.stack([silu(torch.tensor(10.0)) * -10, silu(torch.tensor(-20.0)) * 10,
                              silu(torch.tensor(3.0)) * 2])
    assert torch.allclose(y[0], want)


# ---------------------------------------------------------------- top-k / indexer
def test_stable_topk_ties_toward_lower_index_and_drops_neg_inf():
    s = torch.tensor([[0.0, 1.0, 1.0, -0.0, 1.0, float("-inf")]])
    assert stable_topk(s, 2).tolist() == [[1, 2]]
    assert stable_topk(s, 5).tolist() == [[1, 2, 4, 0, 3]]
    assert stable_topk(s, 8).tolist() == [[1, 2, 4, 0, 3, -1, -1, -1]]
    z = torch.tensor([[-0.0, 0.0, -0.0, 0.0]])
    assert stable_topk(z, 3).tolist() == [[0, 1, 2]]


def test_visibility_rule_ratio_2_and_1():
    q = torch.ones(6, 1, 4)
    w = torch.ones(6, 1)
    keys = torch.ones(3, 4)
    vis = index_scores(q, w, keys, torch.arange(6), ratio=2) > float("-inf")
    # entry t visible at p iff t < (p+1)//2
    assert vis.sum(-1).tolist() == [0, 1, 1, 2, 2, 3]
    vis1 = index_scores(q[:3], w[:3], keys, torch.arange(3), ratio=1) > float("-inf")
    assert vis1.sum(-1).tolist() == [1, 2, 3]


def test_candidate_source_pins_the_newest_visible_block():
    # 10 entries, blocks of 4: [0..3] [4..7] [8,9]; the query at p=6 (ratio 1) sees 0..6,
    # newest block = 1 even though its scores are the lowest.
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, -9.0, -9.0, -9.0] + [float("-inf")] * 3])
    cand = candidate_blocks(scores, torch.tensor([6]), ratio=1, topk_blocks=1, block_size=4)
    assert cand.tolist() == [[False] * 4 + [True] * 4 + [False] * 2]
    cand2 = candidate_blocks(scores, torch.tensor([6]), ratio=1, topk_blocks=2, block_size=4)
    assert cand2.tolist() == [[True] * 8 + [False] * 2]  # block 2 is not visible: never a candidate
    # level 2: top-k only inside the candidates
    assert select_topk(scores, 2, cand).tolist() == [[4, 5]]


def test_no_visible_entries_selects_nothing():
    scores = torch.full((1, 4), float("-inf"))
    cand = candidate_blocks(scores, torch.tensor([0]), ratio=2, topk_blocks=2, block_size=2)
    assert not cand.any()
    assert select_topk(scores, 3, cand).tolist() == [[-1, -1, -1]]


# ---------------------------------------------------------------- attention
def test_sparse_and_dense_attention_agree_and_sink_only_enlarges_denominator():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(5, 8, generator=g, dtype=torch.float64)
    sink = torch.tensor([0.3, -1.0], dtype=torch.float64)
    idx = torch.tensor([[0, 2, -1], [4, -1, -1], [1, 3, 0]])
    bias = torch.full((3, 5), float("-inf"), dtype=torch.float64)
    for t in range(3):
        for j in idx[t].tolist():
            if j >= 0:
                bias[t, j] = 0.0
    a = sparse_attention(q, keys, idx, sink, 0.5)
    b = dense_attention(q, keys, bias, sink, 0.5)
    assert torch.allclose(a, b)
    # row 1 attends one key: o = p·k with p = e^s / (e^s + e^sink)
    s = (q[1] @ keys[4]) * 0.5
    p = torch.exp(s) / (torch.exp(s) + torch.exp(sink))
    assert torch.allclose(a[1], p[:, None] * keys[4][None, :])


def test_window_is_the_last_w_positions_including_self():
    pos = torch.arange(5)
    bias = window_bias(pos, 3, torch.float32)
    assert (bias[4] == 0).tolist() == [False, False, True, True, True]
    assert window_indices(torch.tensor([1, 4]), 0, 3).tolist() == [[-1, 0, 1], [2, 3, 4]]
    assert window_indices(torch.tensor([10]), 8, 3).tolist() == [[0, 1, 2]]


# ---------------------------------------------------------------- compressor / quant / engram
def test_ratio2_compressor_pools_pairs_with_softmax_gate_and_carries_odd_tokens():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 16, generator=g)
    wkv, wgate = torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)
    nw = torch.ones(32)
    full = compressor_full(x, wkv, wgate, nw, 2, 1e-20)
    assert full.shape == (3, 32)
    kv, gate = x @ wkv.T, x @ wgate.T
    sm = torch.softmax(gate[2:4], dim=0)
    lat = (sm * kv[2:4]).sum(0)
    assert torch.allclose(full[1], lat * torch.rsqrt(lat.square().mean() + 1e-20), atol=1e-6)
    e = torch.zeros(0, 32)
    parts, bk, bg = [], e, e
    for a, b in ((0, 3), (3, 4), (4, 7)):
        out, bk, bg = compressor_step(x[a:b], wkv, wgate, nw, 2, 1e-20, bk, bg)
        parts.append(out)
    assert bk.shape[0] == 1  # token 6 waits for its partner
    assert torch.allclose(torch.cat(parts), full, atol=1e-6)


def test_fake_quant_matches_numerics_and_off_is_identity():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=g) * torch.rand(64, 1, generator=g) ** 4
    assert torch.equal(quant.fq_window_kv(x), formats.fake_quant_fp8_ue8m0(x, 32))
    assert torch.equal(quant.fq_compressed_kv(x), formats.fake_quant_fp4_e4m3(x, 16))
    assert torch.equal(quant.fq_indexer(x), formats.fake_quant_fp4_ue8m0(x, 32))
    for f in (quant.fq_window_kv, quant.fq_compressed_kv, quant.fq_indexer):
        assert f(x, enabled=False) is x
        assert f(x.double()).dtype == torch.float64
        assert torch.equal(f(x.double()).float(), f(x))  # fp32-exact inputs quantize identically


def test_engram_rows_chunked_equal_full_and_dead_blocks_lookback():
    cfg = preset("tiny")
    ids = torch.tensor([5, 9, 13, 2, 7, 300, 11, 4])
    full = engram_row_ids(ids, cfg, 0)
    assert torch.equal(torch.cat([chunk_row_ids(cfg, 0, ids[:0], ids[:3]),
                                  chunk_row_ids(cfg, 0, ids[:3], ids[3:5]),
                                  chunk_row_ids(cfg, 0, ids[2:5], ids[5:])]), full)
    dead = torch.zeros(8, dtype=torch.bool)
    dead[4] = True
    rows = engram_row_ids(ids, cfg, 0, dead=dead)
    pad_only = engram_row_ids(torch.full((1,), cfg.engram_pad_token_id), cfg, 0)
    assert torch.equal(rows[4], pad_only[0])  # HF: a DEAD token itself hashes as all padding
    assert torch.equal(rows[:4], full[:4])
    # position 5 looks back over the DEAD token: its 2-gram (t5, pad) differs from the full one
    assert not torch.equal(rows[5], full[5])
