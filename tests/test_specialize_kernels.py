"""specialize-kernels: kernel calls chosen per target, checked by their contracts, numerically neutral."""
from __future__ import annotations

import inspect

import pytest
import torch

from dsv41c.frontend.config import preset
from dsv41c.ir.kernel_contracts import all_contracts
from dsv41c.ir.parser import parse_module
from dsv41c.ir.verifier import verify, verify_errors
from dsv41c.passes.base import PassError
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import make_pass

CALL = ('func @f(%x: f32[T, 64], %w: fp8e4m3[32, 64], %s: e8m0[1, 2]) -> (f32[T, 32]) {\n'
        '  %y = kernel.call(%x, %w, %s) {key.K = 64, key.N = 32, key.act = "f32", key.mode = "prefill", '
        'target = "cuda:sm90", template = "fp8_gemm", variant = "wq_a_prefill"} : '
        '(f32[T, 64], fp8e4m3[32, 64], e8m0[1, 2]) -> f32[T, 32]\n  return %y\n}\n')


def test_contracts_name_their_launchers_arguments():
    from dsv41c.codegen.templates import all_templates

    templates = all_templates()
    for name, c in all_contracts().items():
        params = list(inspect.signature(templates[name].launch).parameters)
        assert [a.name for a in c.inputs] == params[:len(c.inputs)], name


@pytest.mark.parametrize("change, message", [
    (("e8m0[1, 2]", "e8m0[2, 2]"), "operand 'w_scale' dim 0 must be cdiv(N, 32) = 1, got e8m0[2, 2]"),
    (("fp8e4m3[32, 64]", "bf16[32, 64]"), "operand 'w' must be fp8e4m3, got bf16[32, 64]"),
    (('key.act = "f32", ', ""), "the call does not fix the key(s) act"),
    (("-> f32[T, 32]\n", "-> f32[T, 31]\n"), "result %y has type f32[T, 31], the shape rule gives f32[T, 32]"),
])
def test_a_call_its_contract_refuses_is_named_with_the_argument(change, message):
    assert verify_errors(parse_module(CALL)) == []
    errors = verify_errors(parse_module(CALL.replace(*change)))
    assert errors and message in errors[0]


@pytest.fixture(scope="module")
def traced():
    from dsv41c.frontend.trace import trace

    m, _ = trace(preset("mini"), kv_quant=True, progress=None)
    return m


def _inputs(m, fname, cfg, sd, ids):
    from dsv41c.frontend.step import new_state

    st = new_state(cfg)
    return {a.name: ids if a.name == "ids" else st[a.name] if a.name.startswith("state.") else sd[a.name]
            for a in m.functions[fname].args}


def test_the_pass_changes_the_plan_not_the_answer(traced):
    from dsv41c.frontend.model.weights import stored_state_dict
    from dsv41c.ir import interpret

    cfg = preset("mini")
    sd = stored_state_dict(cfg, seed=2)
    ids = torch.tensor([3, 9, 27, 81, 11])
    before = traced.clone()
    after = PassManager([make_pass("specialize-kernels", target="cuda:sm90")]).run(traced.clone())
    verify(after.module)
    stats = after.records[0].stats
    assert sum(v for k, v in stats.items() if k.startswith("kernel_calls:fp8_gemm/")) > 0
    assert stats["fallback:dsv41.sparse_attention"] > 0 and stats["aten_left:prefill"] > 0
    calls = [op for op in after.module.functions["prefill"].ops if op.name == "kernel.call"]
    assert all(op.attrs["target"] == "cuda:sm90" and op.attrs["key.N"] and op.loc for op in calls)
    for fname, n in (("prefill", 5), ("decode", 1)):
        want = interpret(before, fname, _inputs(before, fname, cfg, sd, ids[:n]))
        got = interpret(after.module, fname, _inputs(after.module, fname, cfg, sd, ids[:n]))
        assert all(torch.equal(a, b) for a, b in zip(want, got)), fname  # bit for bit


def test_the_kill_switch_leaves_the_reference_plan(traced, monkeypatch):
    monkeypatch.setenv("DSV41C_DISABLE_SPECIALIZE_KERNELS", "1")
    res = PassManager([make_pass("specialize-kernels", target="cuda:sm90")]).run(traced.clone())
    assert res.records[0].disabled and not any(op.name == "kernel.call" for op in res.module.ops())


def test_a_domain_op_with_no_kernel_and_no_fallback_is_an_error_naming_it(monkeypatch):
    from dsv41c.passes import specialize_kernels as sk

    text = ('func @f(%q: f32[2, 4, 64], %p: f32[6, 64], %i: i64[2, 3], %s: f32[4]) -> (f32[2, 4, 64]) {\n'
            '  %o = dsv41.sparse_attention(%q, %p, %i, %s) {scale = 0.125} : (f32[2, 4, 64], f32[6, 64], i64[2, 3], '
            'f32[4]) -> f32[2, 4, 64] loc("layers.3.attn")\n  return %o\n}\n')
    monkeypatch.delitem(sk.GENERIC_FALLBACK, "dsv41.sparse_attention")
    with pytest.raises(PassError, match=r"dsv41.sparse_attention at loc\(layers.3.attn\) in @f has no kernel variant "
                                        r"and no generic fallback on rocm:gfx942"):
        make_pass("specialize-kernels", target="rocm:gfx942").run(parse_module(text))


def test_an_unknown_target_is_refused():
    with pytest.raises(PassError, match="unknown target 'cuda:sm75'"):
        make_pass("specialize-kernels", target="cuda:sm75").run(parse_module(CALL))
