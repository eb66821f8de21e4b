"""Kernel contracts: the IR's view of each kernel template that a plan may call.

A `kernel.call` names a template (`codegen/templates.py`), a variant and a target, and fixes the
template's specialization keys as attributes `key.<name>` (`key.N = 2048`, `key.act = "bf16"`).
Its contract, declared here beside the template's name, says what the call must look like:

- `implements`: the IR op or fused pattern the template stands for (what `specialize-kernels`
  replaced), e.g. `linear(dequant_weight{fp8_block})`;
- `inputs` / `results`: one `KArg` per launcher argument, in the launcher's order, with its
  accepted dtypes (`"act"` = the call's activation dtype key) and its shape written in key names
  and small expressions of them (`"cdiv(N, 32)"`); `writes` marks arguments a kernel updates in
  place (its operand is then a state buffer, and the call has effects);
- `keys`: the specialization keys every call must fix;
- `reference`: the template's semantics in plain PyTorch (and `dsv41c.formats`), which the
  interpreter runs for the call: it is what the replaced IR ops computed, so a plan interprets
  bit for bit the same before and after `specialize-kernels`.

The verifier checks every call against its contract, results included (`check_call`), through
`kernel.call`'s shape rule. This module is data plus that check: the IR never imports codegen;
codegen's tests check that each contract's argument names are its launcher's.
Known gaps: dims are compared after binding (a key named twice must be equal), not proved for
every value of a symbol; contracts exist only for the templates `specialize-kernels` selects.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from dsv41c.ir.lazy_torch import torch
from dsv41c.ir.types import DTYPES, TensorType


class ContractError(ValueError):
    """A kernel.call that its template's contract does not accept (the message says which argument)."""


@dataclass(frozen=True)
class KArg:
    name: str
    dtypes: tuple  # IR dtype names, or "act" for the call's activation dtype
    shape: tuple  # per dim: an int, a key name, or an expression of key names ("cdiv(N, 32)")
    writes: bool = False


@dataclass(frozen=True)
class KernelContract:
    template: str
    implements: str
    inputs: tuple
    results: tuple
    keys: tuple
    reference: Callable = field(compare=False)
    doc: str = ""


_CONTRACTS: dict[str, KernelContract] = {}
KEY_PREFIX = "key."


def register_contract(c: KernelContract) -> KernelContract:
    if c.template in _CONTRACTS:
        raise ValueError(f"kernel contract for '{c.template}' is already registered")
    _CONTRACTS[c.template] = c
    return c


def contract_of(template: str) -> KernelContract | None:
    return _CONTRACTS.get(template)


def all_contracts() -> dict[str, KernelContract]:
    return dict(_CONTRACTS)


def keys_of(attrs: dict) -> dict:
    """The `key.*` attributes of a kernel.call, without the prefix."""
    return {k[len(KEY_PREFIX):]: v for k, v in attrs.items() if k.startswith(KEY_PREFIX)}


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _eval_dim(expr, env: dict):
    """An int, a bound key name, or an expression of bound names (cdiv, +, -, *, //); None if unbound."""
    if isinstance(expr, int):
        return expr
    names = [n for n in _NAME.findall(expr) if n != "cdiv"]
    if any(n not in env for n in names):
        return None
    if _NAME.fullmatch(expr):
        return env[expr]
    vals = {n: env[n] for n in names}
    if not all(isinstance(v, int) for v in vals.values()):
        return None  # an expression of a symbolic dim: checked where the dim is concrete
    return eval(expr, {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b)}, vals)  # noqa: S307 - names checked


def _dtype_names(spec: KArg, act: str | None) -> tuple:
    return tuple(act if d == "act" else d for d in spec.dtypes)


def check_call(template: str, input_types: list, attrs: dict) -> list:
    """-> the result types of a kernel.call of `template` with these operand types and attributes;
    raises ContractError naming the argument that the contract does not accept."""
    c = contract_of(template)
    if c is None:
        raise ContractError(f"template '{template}' has no kernel contract (ir/kernel_contracts.py)")
    keys = keys_of(attrs)
    missing = [k for k in c.keys if k not in keys]
    if missing:
        raise ContractError(f"{template}: the call does not fix the key(s) {', '.join(missing)}")
    act = keys.get("act")
    if len(input_types) != len(c.inputs):
        raise ContractError(f"{template}: takes {len(c.inputs)} operand(s) "
                            f"({', '.join(a.name for a in c.inputs)}), the call gives {len(input_types)}")
    env = {k: v for k, v in keys.items() if isinstance(v, int)}
    for spec, t in zip(c.inputs, input_types):
        if not isinstance(t, TensorType):
            raise ContractError(f"{template}: operand '{spec.name}' must be a tensor, got {t}")
        ok = _dtype_names(spec, act)
        if t.dtype.name not in ok:
            raise ContractError(f"{template}: operand '{spec.name}' must be {' or '.join(ok)}, got {t}")
        if t.rank != len(spec.shape):
            raise ContractError(f"{template}: operand '{spec.name}' must have rank {len(spec.shape)} "
                                f"({', '.join(map(str, spec.shape))}), got {t}")
        for d, (want, got) in enumerate(zip(spec.shape, t.shape)):
            if isinstance(want, str) and _NAME.fullmatch(want) and want not in env:
                env[want] = got  # the first occurrence binds the name
                continue
            w = _eval_dim(want, env)
            if w is not None and w != got:
                raise ContractError(f"{template}: operand '{spec.name}' dim {d} must be {want} = {w}, got {t}")
    out = []
    for spec in c.results:
        shape = []
        for want in spec.shape:
            w = _eval_dim(want, env)
            if w is None:
                raise ContractError(f"{template}: result '{spec.name}' dim {want} is not bound by the operands")
            shape.append(w)
        dts = _dtype_names(spec, act)
        if dts[0] not in DTYPES:
            raise ContractError(f"{template}: result '{spec.name}' has dtype {dts[0]}, which the IR does not know")
        out.append(TensorType(DTYPES[dts[0]], tuple(shape)))
    return out


# ---------------------------------------------------------------------------- the contracts
def _fp8_linear(x, w, w_scale, **_):
    """y = x · dequant(W)ᵀ in x's dtype: the dequant_weight{fp8_block} -> permute -> matmul it replaced."""
    from dsv41c import formats

    return torch.matmul(x, formats.dequant_fp8_weight(w, w_scale, 32, x.dtype).t())


register_contract(KernelContract(
    template="fp8_gemm", implements="linear(dequant_weight{fp8_block})",
    inputs=(KArg("x", ("act",), ("M", "K")), KArg("w", ("fp8e4m3",), ("N", "K")),
            KArg("w_scale", ("e8m0",), ("cdiv(N, 32)", "cdiv(K, 32)"))),
    results=(KArg("y", ("act",), ("M", "N")),),
    keys=("N", "K", "mode", "act"), reference=_fp8_linear,
    doc="a dense FP8 linear: E4M3 weight with E8M0 32x32 block scales read packed"))


def _moe_ffn(x, gate_w, bias, w1, s1, w3, s3, w2, s2, sw1, ss1, sw3, ss3, sw2, ss2, *, TOPK, route_scale, limit,
             gate_temp, **_):
    """The dsv41.moe it replaced, on the stacked experts dequantized as its dequant_weight ops did (fp4_row /
    fp8_block, block 32, to x's dtype): bit for bit the plan before specialize-kernels."""
    import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)
    from dsv41c import formats

    dt = x.dtype
    experts = [formats.dequant_stored(w[e], s[e], "fp4_row", dt, False, 32)
               for e in range(w1.shape[0]) for w, s in ((w1, s1), (w2, s2), (w3, s3))]
    shared = [formats.dequant_stored(w, s, "fp8_block", dt, False, 32) for w, s in ((sw1, ss1), (sw2, ss2), (sw3, ss3))]
    return torch.ops.dsv41.moe(x, gate_w, bias, experts, *shared, int(TOPK), float(route_scale), float(limit),
                               float(gate_temp), True)


_FP8_PAIR = lambda n, rows, cols: (KArg(n, ("fp8e4m3",), (rows, cols)),  # noqa: E731
                                   KArg("ss" + n[2:], ("e8m0",), (f"cdiv({rows}, 32)", f"cdiv({cols}, 32)")))
register_contract(KernelContract(
    template="moe_ffn", implements="moe(x, gate, bias, [dequant_weight{fp4_row}(expert)...], "
                                   "dequant_weight{fp8_block}(shared)...)",
    inputs=(KArg("x", ("act",), ("T", "D")), KArg("gate_w", ("bf16", "f32"), ("E", "D")),
            KArg("bias", ("act",), ("E",)),
            KArg("w1", ("fp4e2m1x2",), ("E", "I", "D // 2")), KArg("s1", ("e8m0",), ("E", "I", "D // 32")),
            KArg("w3", ("fp4e2m1x2",), ("E", "I", "D // 2")), KArg("s3", ("e8m0",), ("E", "I", "D // 32")),
            KArg("w2", ("fp4e2m1x2",), ("E", "D", "I // 2")), KArg("s2", ("e8m0",), ("E", "D", "I // 32")),
            *_FP8_PAIR("sw1", "SI", "D"), *_FP8_PAIR("sw3", "SI", "D"), *_FP8_PAIR("sw2", "D", "SI")),
    results=(KArg("y", ("act",), ("T", "D")),),
    keys=("E", "D", "I", "TOPK", "path", "act", "route_scale", "limit", "gate_temp"), reference=_moe_ffn,
    doc="the MoE FFN: the routed experts stacked per layer as stored (E2M1 + E8M0 per 32), the shared "
        "expert FP8 with 32x32 block scales, all read packed"))


def _indexer_score(q_codes, q_exps, w, k_codes, k_exps, qpos, *, ratio, BQ, BT, **_):
    """The dsv41.index_scores_int8 the call stands for, on the packed operands unpacked (E2M1 + UE8M0 per 32):
    the float path's scores [S, T], with the exact integer dots."""
    from dsv41c import formats
    from dsv41c.prims.indexer_int8 import index_scores_int8

    acc = torch.float64 if w.dtype == torch.float64 else torch.float32
    q = formats.dequant_fp4_ue8m0(q_codes.view(torch.uint8), q_exps.view(torch.uint8), 32).to(acc)
    k = formats.dequant_fp4_ue8m0(k_codes.view(torch.uint8), k_exps.view(torch.uint8), 32).to(acc)
    return index_scores_int8(q, w.to(acc), k, qpos, int(ratio), int(BQ), int(BT))


register_contract(KernelContract(
    template="indexer_score", implements="dsv41.index_scores_int8 (queries and keys read packed)",
    inputs=(KArg("q_codes", ("fp4e2m1x2",), ("S", "H", "CI // 2")), KArg("q_exps", ("e8m0",), ("S", "H", "CI // 32")),
            KArg("w", ("f32",), ("S", "H")), KArg("k_codes", ("fp4e2m1x2",), ("T", "CI // 2")),
            KArg("k_exps", ("e8m0",), ("T", "CI // 32")), KArg("qpos", ("i64",), ("S",))),
    results=(KArg("scores", ("f32",), ("S", "T")),),
    keys=("H", "CI", "BQ", "BT", "ratio"), reference=_indexer_score,
    doc="exact index scores of FP4 queries and keys (INT8 products, INT32 sums, the scales after), per-row range "
        "proof with per-head and whole-tile fallbacks"))


def _rmsnorm(x, weight, *, eps, **_):
    """The canonical chain it replaced: weight · (x_f32 · rsqrt(mean(x_f32², -1) + eps)).to(x.dtype), op for op."""
    xf = x.to(torch.float32)
    return torch.mul(weight, torch.mul(xf, torch.rsqrt(torch.add(torch.mean(torch.square(xf), [-1], True), eps)))
                     .to(x.dtype))


register_contract(KernelContract(
    template="rmsnorm", implements="mul(w, to(mul(x_f32, rsqrt(add(mean(square(x_f32), -1), eps)))))",
    inputs=(KArg("x", ("act",), ("M", "N")), KArg("weight", ("act",), ("N",))),
    results=(KArg("y", ("act",), ("M", "N")),),
    keys=("N", "act", "eps"), reference=_rmsnorm,
    doc="a weighted RMSNorm over the last dim, fp32 statistics, output in the activation dtype"))


def _mhc_pre(H, pre_prev, fn, base, scale, *, iters, hc_eps, norm_eps, **_):
    """The dsv41.hc_mixes of a site and the collapse of its input that it replaced:
    x_in = to(sum(mul(unsqueeze(pre_prev, -1), to(H, f32)), [-2]), H's dtype), op for op."""
    import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)

    pre, post, comb = torch.ops.dsv41.hc_mixes(H, fn, base, scale, int(iters), float(hc_eps), float(norm_eps))
    x = torch.sum(torch.mul(torch.unsqueeze(pre_prev, -1), H.to(torch.float32)), [-2]).to(H.dtype)
    return x, pre, post, comb


register_contract(KernelContract(
    template="mhc_pre", implements="hc_mixes(H) + the collapse to(sum(mul(unsqueeze(pre_prev), to(H, f32)), -2))",
    inputs=(KArg("H", ("act",), ("T", "HC", "D")), KArg("pre_prev", ("f32",), ("T", "HC")),
            KArg("fn", ("bf16", "f32"), ("HC * HC + 2 * HC", "HC * D")),
            KArg("base", ("bf16", "f32"), ("HC * HC + 2 * HC",)), KArg("scale", ("bf16", "f32"), (3,))),
    results=(KArg("x", ("act",), ("T", "D")), KArg("pre", ("f32",), ("T", "HC")),
             KArg("post", ("f32",), ("T", "HC")), KArg("comb", ("f32",), ("T", "HC", "HC"))),
    keys=("HC", "D", "act", "iters", "hc_eps", "norm_eps"), reference=_mhc_pre,
    doc="an mHC site: unweighted RMSNorm of the streams, the 24 mixes (pre, post, Sinkhorn comb) and the "
        "collapse of the site's input with the previous site's pre"))


def _compressor(x, wkv, norm_w, cos, sin, pos, rows, kv_cache, kv_scale, *, eps=1e-20, **_):
    """The compressed-KV half of dsv41.compressor_fused at ratio 1 (the launcher's positional interface):
    latent = RMSNorm(x · wkvᵀ), RoPE at the entry positions (table rows cos[pos], sin[pos]), FP4 E2M1 + E4M3
    per 16 packed, written to cache rows `rows` (-1: skipped); -> the two caches after the write."""
    import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)
    from dsv41c.prims.norms import rms_norm
    from dsv41c.prims.rope import apply_rope

    lat = rms_norm(x @ wkv.T, norm_w, float(eps))
    p = pos.long()
    codes, scales = torch.ops.dsv41.kv_pack(apply_rope(lat, cos[p], sin[p]), "fp4_e4m3")
    kc, ks = kv_cache.clone(), kv_scale.clone()
    keep = rows.long() >= 0
    kc.view(torch.uint8)[rows.long()[keep]] = codes.view(torch.uint8)[keep]
    ks.view(torch.uint8)[rows.long()[keep]] = scales.view(torch.uint8)[keep]
    return kc, ks


register_contract(KernelContract(
    template="compressor", implements="dsv41.compressor_fused at ratio 1, its compressed-KV half",
    inputs=(KArg("x", ("act",), ("T", "D")), KArg("wkv", ("act", "bf16", "f32"), ("C", "D")),
            KArg("norm_w", ("act", "bf16", "f32"), ("C",)), KArg("cos", ("f32",), ("P", "ROPE // 2")),
            KArg("sin", ("f32",), ("P", "ROPE // 2")), KArg("pos", ("i32", "i64"), ("T",)),
            KArg("rows", ("i32", "i64"), ("T",)), KArg("kv_cache", ("fp4e2m1x2",), ("N", "C // 2"), writes=True),
            KArg("kv_scale", ("fp8e4m3",), ("N", "C // 16"), writes=True)),
    results=(KArg("kv_cache", ("fp4e2m1x2",), ("N", "C // 2")), KArg("kv_scale", ("fp8e4m3",), ("N", "C // 16"))),
    keys=("C", "ROPE", "RATIO", "act"), reference=_compressor,
    doc="the fused compressor: wkv -> RMSNorm -> RoPE -> FP4 pack -> cache rows, in place (ratio 1; the ratio-2 "
        "gate and the indexer key are keyword arguments of its launcher, outside this contract)"))


def reference_call(template: str, inputs: list, attrs: dict):
    """Run a kernel.call's contract reference (the interpreter's semantics of the call)."""
    c = contract_of(template)
    if c is None:
        return None
    return c.reference(*inputs, **keys_of(attrs))


__all__ = ["KArg", "KernelContract", "ContractError", "register_contract", "contract_of", "all_contracts",
           "check_call", "keys_of", "reference_call", "KEY_PREFIX"]
