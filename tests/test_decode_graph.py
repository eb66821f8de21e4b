"""Decode as a CUDA graph: the host-read-free forms its ops take, and the capture itself (on a GPU).

Here: the compressor's one-token form equals the serving step bit for bit at every phase of its group;
the state appends with a tensor position write what the integer form writes; the index scorer's static
form equals its dynamic one; a function whose shapes depend on data is refused a capture, naming the op.
On a GPU (`gpu`): a tiny float32 artifact (kv-quant on: the fused compressor) decodes the same tokens and
logits replayed as a graph as op by op, and the captured step really replays (the session holds a graph).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from dsv41c.prims.compressor import compressor_step, compressor_step_one
from dsv41c.prims.indexer_int8 import index_scores_int8
from dsv41c.prims.state import cache_append_, masked_rows, ring_append_


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_compressor_equals_the_serving_step_at_every_phase(dtype):
    g = torch.Generator().manual_seed(0)
    ratio, D, C = 4, 24, 16
    wkv, wgate = torch.randn(C, D, generator=g).to(dtype), torch.randn(C, D, generator=g).to(dtype)
    norm_w = torch.rand(C, generator=g).to(dtype) + 0.5
    acc = torch.float32
    bk = torch.zeros(ratio - 1, C, dtype=acc)
    bg = torch.zeros(ratio - 1, C, dtype=acc)
    bk1, bg1 = bk.clone(), bg.clone()
    emitted = 0
    for pos in range(3 * ratio + 1):
        x = torch.randn(1, D, generator=g).to(dtype)
        b = pos % ratio
        lat, nk, ng = compressor_step(x, wkv, wgate, norm_w, ratio, 1e-6, bk[:b], bg[:b])
        want_k, want_g = torch.zeros_like(bk), torch.zeros_like(bg)
        want_k[:nk.shape[0]], want_g[:ng.shape[0]] = nk, ng
        got, complete, gk, gg = compressor_step_one(x, wkv, wgate, norm_w, ratio, 1e-6, bk1, bg1, torch.tensor(pos))
        assert bool(complete) == (lat.shape[0] == 1), pos
        if lat.shape[0]:
            assert torch.equal(got, lat), pos
            emitted += 1
        assert torch.equal(gk, want_k) and torch.equal(gg, want_g), pos
        bk, bg, bk1, bg1 = want_k, want_g, gk, gg
    assert emitted == 3


def test_appends_at_a_tensor_position_write_what_the_integer_form_writes():
    g = torch.Generator().manual_seed(1)
    cache = torch.zeros(8, 4).to(torch.float8_e4m3fn)
    rows = torch.randn(2, 4, generator=g).to(torch.float8_e4m3fn)
    a = cache_append_(cache.clone(), rows, 3)
    b = cache_append_(cache.clone(), rows, torch.tensor(3))
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    ring = torch.zeros(5, 4)
    r = torch.randn(7, 4, generator=g)
    assert torch.equal(ring_append_(ring.clone(), r, 11), ring_append_(ring.clone(), r, torch.tensor(11)))
    # masked rows: the new rows only where kept, else the cache's own rows back
    filled = cache_append_(cache.clone(), rows, 3)
    kept = masked_rows(filled, rows[:1], torch.tensor(0), torch.tensor(True))
    same = masked_rows(filled, rows[:1], torch.tensor(3), torch.tensor(False))
    assert torch.equal(kept.view(torch.uint8), rows[:1].view(torch.uint8))
    assert torch.equal(same.view(torch.uint8), filled[3:4].view(torch.uint8))


def test_static_index_scores_equal_the_dynamic_ones():
    from dsv41c.prims.quant import fq_indexer

    g = torch.Generator().manual_seed(2)
    T, H, d, N, ratio = 3, 4, 128, 12, 4
    q = fq_indexer(torch.randn(T, H, d, generator=g), True)
    keys = torch.zeros(N, d)
    keys[:7] = fq_indexer(torch.randn(7, d, generator=g), True)  # rows past the entry count stay zero
    w = torch.randn(T, H, generator=g)
    positions = torch.tensor([26, 27, 28])
    want = index_scores_int8(q, w, keys, positions, ratio, static=False)
    got = index_scores_int8(q, w, keys, positions, ratio, static=True)
    assert torch.equal(torch.isinf(want), torch.isinf(got))
    assert torch.equal(want[~torch.isinf(want)], got[~torch.isinf(got)])


def _program(path):
    from dsv41c.runtime.executor import Program

    with open(os.path.join(path, "program.json")) as f:
        return Program(json.load(f))


def test_a_function_whose_shapes_depend_on_data_is_refused_a_capture(mini_on, tiny_off):
    from dsv41c.runtime.decode_graph import GraphCaptureError, check_capturable

    check_capturable(_program(mini_on)["decode"])  # kv-quant on: the fused compressor, nothing bound from data
    with pytest.raises(GraphCaptureError, match=r"@prefill: .*(bind a size from data|depend on the inputs' sizes)"):
        check_capturable(_program(mini_on)["prefill"])
    # kv-quant off keeps the unfused compressor, whose emitted rows are a data-dependent count
    with pytest.raises(GraphCaptureError, match=r"@decode: \d+ step\(s\) bind a size from data, first "
                                                r"dsv41.compressor_step.default at loc\(layers\.\d+\.attn\.compressor\)"):
        check_capturable(_program(tiny_off)["decode"])


@pytest.mark.gpu
def test_a_replayed_decode_equals_the_op_by_op_one_on_the_gpu(tmp_path, monkeypatch):
    """Replayed, op by op in the arena (DSV41C_ARENA=1) and op by op with torch's allocator only: one answer."""
    import dsv41c
    from dsv41c.driver import build_artifact

    torch.backends.cuda.matmul.allow_tf32 = False
    p = torch.cuda.get_device_properties(0)
    path = str(tmp_path / "tiny-f32.dsv41c")
    build_artifact(path, preset="tiny", target=f"cuda:sm{p.major}{p.minor}", activation_dtype="float32")
    prompt = list(range(3, 19))
    monkeypatch.setenv("DSV41C_ARENA", "1")
    eager = dsv41c.load(path, device="cuda")
    eager.cuda_graphs = False
    monkeypatch.delenv("DSV41C_ARENA")
    graphed = dsv41c.load(path, device="cuda")
    monkeypatch.setenv("DSV41C_ARENA", "0")
    plain = dsv41c.load(path, device="cuda")
    plain.cuda_graphs = False
    s1, s2, s3 = eager.new_session(), graphed.new_session(), plain.new_session()
    for m, s in ((eager, s1), (graphed, s2), (plain, s3)):
        m.prefill(s, prompt)
    for i in range(12):
        a, b, c = eager.decode(s1), graphed.decode(s2), plain.decode(s3)
        assert int(a.argmax()) == int(b.argmax()) == int(c.argmax()), i
        assert float((a - b).norm() / a.norm()) <= 1e-5, i
        assert float((a - c).norm() / c.norm()) <= 1e-5, i
    assert graphed.graph_error is None and s2.graph is not None
    st = eager.arena_stats()
    assert st["decode"]["placed"] > 0 and plain.arena_stats() == {}
