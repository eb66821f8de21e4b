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


def _weight(sd, a):
    """A weight argument's tensor: the stored one, or the per-expert tensors a stacked argument names, stacked."""
    if "stack_of" in a.attrs:
        return torch.stack([sd[a.attrs["stack_of"].replace("{e}", str(e))] for e in range(a.attrs["stack_count"])])
    return sd[a.name]


def _inputs(m, fname, cfg, sd, ids):
    from dsv41c.frontend.step import new_state

    st = new_state(cfg)
    return {a.name: ids if a.name == "ids" else st[a.name] if a.name.startswith("state.") else _weight(sd, a)
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
    assert all(op.attrs["target"] == "cuda:sm90" and op.attrs["key.act"] and op.loc for op in calls)
    assert {op.attrs["template"] for op in calls} == {"fp8_gemm", "moe_ffn", "rmsnorm", "mhc_pre"}
    for fname, n in (("prefill", 5), ("decode", 1)):
        want = interpret(before, fname, _inputs(before, fname, cfg, sd, ids[:n]))
        got = interpret(after.module, fname, _inputs(after.module, fname, cfg, sd, ids[:n]))
        assert all(torch.equal(a, b) for a, b in zip(want, got)), fname  # bit for bit


def test_every_moe_reads_its_experts_stacked_and_packed(traced):
    """Each layer's dsv41.moe becomes one moe_ffn call on the experts' stored codes and scales, stacked per matrix
    into one argument (named for the runtime to bind): no expert is dequantized and no per-expert argument is left."""
    cfg = preset("mini")
    after = PassManager([make_pass("specialize-kernels", target="cuda:sm90")]).run(traced.clone())
    stats = after.records[0].stats
    for fname, variant in (("prefill", "backbone_gemv"), ("decode", "backbone_gemv")):
        f = after.module.functions[fname]
        assert not any(op.name == "dsv41.moe" for op in f.ops)
        assert not any(op.name == "dsv41.dequant_weight" and op.attrs["fmt"] == "fp4_row" for op in f.ops)
        calls = [op for op in f.ops if op.name == "kernel.call" and op.attrs["template"] == "moe_ffn"]
        assert len(calls) == cfg.num_hidden_layers and {c.attrs["variant"] for c in calls} == {variant}
        assert not any(".experts.0." in a.name for a in f.args)
        w1 = next(a for a in f.args if a.name == "layers.0.ffn.experts.w1.weight")
        assert (str(w1.type), w1.attrs["stack_of"], w1.attrs["stack_count"]) == (
            f"fp4e2m1x2[{cfg.n_routed_experts}, {cfg.moe_intermediate_size}, {cfg.hidden_size // 2}]",
            "layers.0.ffn.experts.{e}.w1.weight", cfg.n_routed_experts)
        c = calls[0]
        assert c.operands[3] is w1 and c.attrs["key.TOPK"] == cfg.num_experts_per_tok and c.attrs["key.path"] == "gemv"
        assert "moe_decode_down_fp4/backbone_k4_forward" in c.attrs["key.components"].split(",")
    assert stats["kernel_calls:moe_ffn/backbone_gemv"] == 2 * cfg.num_hidden_layers
    assert "fallback:dsv41.moe" not in stats


def test_every_mhc_site_computes_its_mixes_and_its_input_in_one_call(traced):
    """Both sites of every layer: hc_mixes and the collapse of the site's input with the previous site's pre become
    one mhc_pre call whose first result is that input (the collapse's ops are gone)."""
    cfg = preset("mini")
    after = PassManager([make_pass("specialize-kernels", target="cuda:sm90")]).run(traced.clone()).module
    for fname in ("prefill", "decode"):
        f = after.functions[fname]
        calls = [op for op in f.ops if op.name == "kernel.call" and op.attrs["template"] == "mhc_pre"]
        assert len(calls) == 2 * cfg.num_hidden_layers and not any(op.name == "dsv41.hc_mixes" for op in f.ops)
        for c in calls:
            H, pre_prev = c.operands[:2]
            assert [str(r.type) for r in c.results[1:]] == [f"f32[{H.type.shape[0]}, 4]"] * 2 + [
                f"f32[{H.type.shape[0]}, 4, 4]"]
            assert c.results[0].type.shape == (H.type.shape[0], cfg.hidden_size) and pre_prev.type.dtype.name == "f32"
        # no site's collapse is left beside its call: only the head's own (it has no hc_mixes site)
        left = [op for op in f.ops if op.name == "aten.sum" and tuple(op.attrs.get("dim") or ()) == (-2,)]
        assert [op.loc for op in left] == ["epilogue"]


def test_a_moe_whose_experts_are_not_stored_weights_falls_back_and_says_why():
    from dsv41c.passes import specialize_kernels as sk

    args = ", ".join(f"%e{i}: bf16[{'64, 32' if i % 3 == 1 else '32, 64'}]" for i in range(6))
    text = (f"func @f(%x: bf16[2, 64], %g: bf16[2, 64], %b: bf16[2], {args}, %s1: bf16[32, 64], %s2: bf16[64, 32], "
            "%s3: bf16[32, 64]) -> (bf16[2, 64]) {\n"
            "  %y = dsv41.moe(%x, %g, %b, " + ", ".join(f"%e{i}" for i in range(6)) + ", %s1, %s2, %s3) "
            "{gate_temp = 1.0, norm_topk_prob = true, route_scale = 1.5, swiglu_limit = 10.0, top_k = 1} : "
            "(bf16[2, 64], bf16[2, 64], bf16[2], " + ", ".join(["bf16[32, 64]", "bf16[64, 32]", "bf16[32, 64]"] * 2)
            + ", bf16[32, 64], bf16[64, 32], bf16[32, 64]) -> bf16[2, 64] loc(\"layers.0.ffn\")\n  return %y\n}\n")
    res = sk.SpecializeKernels(target="cuda:sm90").run(parse_module(text))
    assert res.stats["moe_not_matched:weights_not_stored_packed"] == 1 and res.stats["fallback:dsv41.moe"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5])
def test_the_moe_launcher_equals_its_contract_reference(dtype, T):
    """moe_ffn's launcher (Triton's interpreter here) against its contract's reference (the dsv41.moe it replaced)
    on stacked stored experts, within the per-op check's tolerance, for a decode step and a chunk."""
    from dsv41c import formats
    from dsv41c.codegen.triton.moe_ffn import moe_ffn
    from dsv41c.ir.kernel_contracts import reference_call
    from dsv41c.kernel_check import TOLERANCES

    g = torch.Generator().manual_seed(7)
    E, D, I, k = 8, 64, 32, 2
    x = torch.randn(T, D, generator=g).to(dtype)
    gate, bias = (torch.randn(E, D, generator=g) * 0.2).to(dtype), (torch.randn(E, generator=g) * 0.05).to(dtype)

    def fp4(n, kk):
        ws = [formats.quant_fp4_weight(torch.randn(n, kk, generator=g) * 0.1) for _ in range(E)]
        return torch.stack([w for w, _ in ws]).view(torch.uint8), torch.stack([s for _, s in ws])

    experts = (*fp4(I, D), *fp4(I, D), *fp4(D, I))  # w1, s1, w3, s3, w2, s2
    shared = []
    for n, kk in ((I, D), (I, D), (D, I)):  # sw1, sw3, sw2
        shared += formats.quant_fp8_weight(torch.randn(n, kk, generator=g) * 0.05)
    keys = {"TOPK": k, "route_scale": 1.5, "limit": 10.0, "gate_temp": 1.0}
    got = moe_ffn(x, gate, bias, *experts, *shared, path="gemv", core=0, **keys)
    want = reference_call("moe_ffn", [x, gate, bias, *experts, *shared], {f"key.{n}": v for n, v in keys.items()})
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == (T, D)
    assert float(want.abs().max()) > 0.01  # the experts contribute
    assert bool(((got.float() - want.float()).abs() <= TOLERANCES["moe_ffn"](want)).all())


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
