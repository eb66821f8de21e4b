"""lower-indexer-int8: the exact integer scorer gives the float path's scores (so its top-k), with counted fallbacks."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv41c.frontend.config import preset
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.verifier import verify, verify_errors
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import make_pass
from dsv41c.prims.indexer import index_scores
from dsv41c.prims.indexer_int8 import count_fallbacks, index_scores_int8
from dsv41c.prims.quant import fq_indexer


def _fp4(shape, spread, g, dtype=torch.float32):
    """FP4 data whose per-32 block scales spread by exp(N(0, spread)): a wide spread fails the INT8 proof."""
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    s = torch.exp(torch.randn(shape[:-1] + (shape[-1] // 32,), generator=g, dtype=torch.float64) * spread)
    return fq_indexer((x * s.repeat_interleave(32, -1)).to(dtype))


def _bits(t):
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_scores_are_the_float_paths_bit_for_bit_whatever_the_data(dtype):
    from dsv41c import formats
    from dsv41c.codegen.triton.indexer_score import expected_fallbacks, visible_counts

    kinds = set()
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        T, h, d, N = 1 + seed % 5, 4, (32, 64, 128)[seed % 3], seed % 37
        spread = (0.2, 2.5)[seed % 2]
        q, k = _fp4((T, h, d), spread, g, dtype), _fp4((N, d), spread, g, dtype)
        if seed % 7 == 3:
            k = torch.randn(N, d, generator=g, dtype=dtype)  # off the FP4 grid: the float path throughout
        w = torch.randn(T, h, generator=g, dtype=dtype)
        pos = torch.randint(0, 2 * N + 2, (T,), generator=g)  # some entries not visible yet (a cache's tail)
        ratio = 1 + seed % 2
        with count_fallbacks() as c:
            got = index_scores_int8(q, w, k, pos, ratio, 16, 8)
        assert torch.equal(_bits(got), _bits(index_scores(q, w, k, pos, ratio))), seed
        kinds |= {key for key, n in c.items() if n and key.startswith(("fallback", "pairs_integer", "off_grid"))}
        n = min(int((pos.max() + 1) // ratio), N)
        if seed % 7 != 3 and dtype == torch.float32:  # the kernels' own count of these inputs' fallbacks
            qp, qe = formats.quant_fp4_ue8m0(q)
            kp, ke = formats.quant_fp4_ue8m0(k[:n])
            want = expected_fallbacks(qp, qe, kp, ke, visible_counts(pos, ratio, n), 16, 8)
            assert {key: c[key] for key in want} == want, seed
    assert kinds == {"fallback_heads", "fallback_head_tiles", "fallback_tiles", "pairs_integer", "off_grid_rows"}


@pytest.fixture(scope="module")
def mini():
    from csa2_helpers import traced, weights

    return preset("mini"), traced("mini"), weights("mini", 2)


def _args(m, fname, cfg, sd, ids, state=None):
    from dsv41c.frontend.step import new_state

    st = state or new_state(cfg)
    return {a.name: ids if a.name == "ids" else st[a.name] if a.name.startswith("state.") else sd[a.name]
            for a in m.functions[fname].args}


def _run(m, fname, ins):
    topk = []

    def on_op(op, outs):
        if op.name == "dsv41.select_topk":
            topk.append(outs[0] if isinstance(outs, (list, tuple)) else outs)

    return interpret(m, fname, ins, on_op=on_op), topk


def test_the_mini_plan_keeps_its_top_k_and_its_answer_bit_for_bit(mini):
    cfg, traced, sd = mini
    res = PassManager([make_pass("lower-indexer-int8")]).run(traced.clone())
    after = res.module
    verify(after)
    st = res.records[0].stats
    assert st["lowered:prefill"] == st["lowered:decode"] == 4 and st["left_float:decode"] == 0
    assert not any(op.name == "dsv41.index_scores" for op in after.ops())
    ids = torch.randint(0, cfg.vocab_size, (20,), generator=torch.Generator().manual_seed(0))
    want, want_k = _run(traced, "prefill", _args(traced, "prefill", cfg, sd, ids))
    with count_fallbacks() as c:
        got, got_k = _run(after, "prefill", _args(after, "prefill", cfg, sd, ids))
    assert all(torch.equal(_bits(a) if a.is_floating_point() else a, _bits(b) if b.is_floating_point() else b)
               for a, b in zip(want, got))
    assert len(want_k) == 4 and all(torch.equal(a, b) for a, b in zip(want_k, got_k))
    assert min(int((k >= 0).sum(-1).max()) for k in want_k) == cfg.index_topk  # more entries than the top-k
    assert c["calls"] == 4 and c["pairs_integer"] > 0  # the fallback counts are reported by the run
    # a decode step on the state the prefill left
    state = dict(zip(traced.attrs["outputs"], want))
    one = torch.tensor([5])
    want, want_k = _run(traced, "decode", _args(traced, "decode", cfg, sd, one, state))
    got, got_k = _run(after, "decode", _args(after, "decode", cfg, sd, one, state))
    assert all(torch.equal(a, b) for a, b in zip(want + want_k, got + got_k))
    assert {op.attrs["block_q"] for op in after.functions["decode"].ops if op.name == "dsv41.index_scores_int8"} == {1}


def test_the_tiny_plans_scores_equal_on_the_inputs_the_float_path_saw():
    from csa2_helpers import traced, weights

    cfg = preset("tiny")
    m = traced("tiny")
    assert make_pass("lower-indexer-int8").run(m.clone()).stats["lowered:prefill"] == 8
    seen = []

    def on_op(op, outs):  # the float path's inputs and scores, op by op
        if op.name == "dsv41.index_scores":
            seen.append((op, outs[0] if isinstance(outs, (list, tuple)) else outs))

    sd = weights("tiny", 2)
    ids = torch.randint(0, cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(1))
    values = {}

    def keep(op, outs):
        for r, o in zip(op.results, outs if isinstance(outs, (list, tuple)) else [outs]):
            values[id(r)] = o
        on_op(op, outs)

    ins = _args(m, "prefill", cfg, sd, ids)
    values.update({id(a): ins[a.name] for a in m.functions["prefill"].args})
    interpret(m, "prefill", ins, on_op=keep)
    assert len(seen) == 8
    for op, want in seen:
        q, w, keys, pos = (values[id(v)] for v in op.operands)
        got = index_scores_int8(q, w, keys, pos, op.attrs["ratio"], 16, 128)
        assert torch.equal(_bits(got), _bits(want)), op.loc
        assert torch.equal(torch.ops.dsv41.select_topk(got, cfg.index_topk, None),
                           torch.ops.dsv41.select_topk(want, cfg.index_topk, None))


def test_scores_over_plain_floats_stay_on_the_float_path():
    from pathlib import Path

    text = (Path(__file__).parent / "golden" / "lower-indexer-int8.ir").read_text()
    res = make_pass("lower-indexer-int8").run(parse_module(text))
    assert res.stats == {"lowered:decode": 1, "left_float:decode": 1}  # the kv-quant-off plan's scores stay


def test_the_kill_switch_leaves_the_float_scores(monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("DSV41C_DISABLE_LOWER_INDEXER_INT8", "1")
    text = (Path(__file__).parent / "golden" / "lower-indexer-int8.ir").read_text()
    res = PassManager([make_pass("lower-indexer-int8")]).run(parse_module(text))
    assert res.records[0].disabled and not any(op.name == "dsv41.index_scores_int8" for op in res.module.ops())


def test_a_head_dim_off_the_fp4_block_is_refused_by_the_verifier():
    text = ('func @f(%q: f32[1, 2, 16], %w: f32[1, 2], %k: f32[3, 16], %p: i64[1]) -> (f32[1, 3]) {\n'
            '  %s = dsv41.index_scores_int8(%q, %w, %k, %p) {block_q = 1, block_t = 128, ratio = 1} : '
            '(f32[1, 2, 16], f32[1, 2], f32[3, 16], i64[1]) -> f32[1, 3] loc("layers.2.attn.indexer")\n'
            '  return %s\n}\n')
    errors = verify_errors(parse_module(text))
    assert errors and "index_scores_int8: the head dim 16 is not a multiple of the FP4 block 32" in errors[0]


def test_the_indexer_score_contract_checks_the_packed_operands_and_gives_the_ops_scores():
    from dsv41c import formats
    from dsv41c.codegen.triton.indexer_score import index_scores_ref, visible_counts
    from dsv41c.ir.kernel_contracts import ContractError, check_call, reference_call
    from dsv41c.ir.types import DTYPES, TensorType

    keys = {"key.H": 4, "key.CI": 128, "key.BQ": 1, "key.BT": 128, "key.ratio": 2}
    types = [TensorType(DTYPES[d], s) for d, s in (("fp4e2m1x2", (3, 4, 64)), ("e8m0", (3, 4, 4)), ("f32", (3, 4)),
                                                   ("fp4e2m1x2", (20, 64)), ("e8m0", (20, 4)), ("i64", (3,)))]
    assert check_call("indexer_score", types, keys) == [TensorType(DTYPES["f32"], (3, 20))]
    with pytest.raises(ContractError, match=r"operand 'k_exps' dim 1 must be CI // 32 = 4, got e8m0\[20, 2\]"):
        check_call("indexer_score", types[:4] + [TensorType(DTYPES["e8m0"], (20, 2))] + types[5:], keys)
    g = torch.Generator().manual_seed(4)
    q, k = _fp4((3, 4, 128), 1.0, g), _fp4((20, 128), 1.0, g)
    w, pos = torch.randn(3, 4, generator=g), torch.tensor([10, 25, 39])
    (qp, qe), (kp, ke) = formats.quant_fp4_ue8m0(q), formats.quant_fp4_ue8m0(k)
    got = reference_call("indexer_score", [qp, qe, w, kp, ke, pos], keys)
    assert torch.equal(got, index_scores(q, w, k, pos, 2))  # the op it stands for, bit for bit
    # the kernel's own reference sums the heads in its pinned order: the same scores to rounding
    kernel = index_scores_ref(qp, qe, w * 128 ** -0.5, kp, ke, visible_counts(pos, 2, 20))
    fin = torch.isfinite(got)
    assert torch.equal(fin, torch.isfinite(kernel)) and torch.allclose(got[fin], kernel[fin], rtol=1e-6, atol=1e-7)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 100_000))
def test_random_csa2_modules_keep_their_values(seed):
    from dsv41c.ir.testing import random_inputs, same_outputs
    from dsv41c.ir.testing_csa2 import random_csa2_module

    m = random_csa2_module(seed)
    out = make_pass("lower-indexer-int8").run(m.clone()).module
    verify(out)
    for s in (seed, seed + 1):
        ins = random_inputs(m, "decode", s, T=3, N1=5)
        assert same_outputs(interpret(m, "decode", ins), interpret(out, "decode", ins)), s


@pytest.mark.parametrize("S, BQ", [(1, 1), (5, 16)])
def test_the_indexer_score_launcher_of_a_plan_gives_the_contracts_scores(S, BQ):
    """Run in Triton's interpreter here (tests/conftest.py): the kernel's scores against the call's reference."""
    from dsv41c import formats
    from dsv41c.codegen.triton.indexer_call import index_scores_call
    from dsv41c.ir.kernel_contracts import reference_call
    from dsv41c.kernel_check import TOLERANCES

    g = torch.Generator().manual_seed(S)
    q, k = _fp4((S, 4, 32), 1.0, g), _fp4((40, 32), 1.0, g)
    w, pos = torch.randn(S, 4, generator=g), torch.arange(S) * 7 + 11
    (qp, qe), (kp, ke) = formats.quant_fp4_ue8m0(q), formats.quant_fp4_ue8m0(k)
    keys = {"H": 4, "CI": 32, "BQ": BQ, "BT": 128, "ratio": 2}
    got = index_scores_call(qp, qe, w, kp, ke, pos, **keys)
    want = reference_call("indexer_score", [qp, qe, w, kp, ke, pos], {f"key.{n}": v for n, v in keys.items()})
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    err = torch.where(got == want, 0.0, (got - want).abs())
    assert bool((err <= TOLERANCES["indexer_score"](want)).all())


def test_specialize_kernels_calls_the_indexer_kernel_on_the_packed_plan_and_keeps_its_bits():
    from csa2_helpers import traced, weights

    from dsv41c.frontend.step import new_state

    cfg = preset("mini")
    before = make_pass("lower-indexer-int8").run(make_pass("lower-kv-fp4").run(traced("mini")).module).module
    res = make_pass("specialize-kernels", target="cuda:sm90").run(before.clone())
    after = res.module
    verify(after)
    calls = {k: v for k, v in res.stats.items() if k.startswith("kernel_calls:indexer_score/")}
    assert calls == {"kernel_calls:indexer_score/prefill_plain_bt128": 4, "kernel_calls:indexer_score/decode_plain_bt128": 4}
    assert not any(op.name == "dsv41.index_scores_int8" for op in after.ops())
    sd = weights("mini", 2)
    ids = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    st = new_state(cfg)

    def args(m):
        out = {}
        for a in m.functions["prefill"].args:
            if a.name == "ids":
                out[a.name] = ids
            elif a.name in st:
                out[a.name] = st[a.name]
            elif a.name.startswith("state."):
                out[a.name] = torch.zeros([int(d) for d in a.type.shape], dtype=a.type.dtype.torch)
            elif a.attrs.get("stack_of"):  # the experts stacked per layer matrix (specialize-kernels' MoE call)
                out[a.name] = torch.stack([sd[a.attrs["stack_of"].format(e=e)] for e in range(a.attrs["stack_count"])])
            else:
                out[a.name] = sd[a.name]
        return out

    from dsv41c.ir.testing import same_outputs

    assert same_outputs(interpret(before, "prefill", args(before)), interpret(after, "prefill", args(after)))
