"""The per-op check of a GPU plan: every kernel call against its template's reference, on the call's inputs.

    report = check_kernel_calls(model, ids, decode_steps=1)   # model = dsv41c.load(path, interpret=True)

While the plan runs (prefill `ids`, then greedy decode steps), each `kernel.call` record's launcher
result (what the run continues with) is compared with its kernel contract's reference
(`ir/kernel_contracts.py`: what the ops the call replaced computed) on the same inputs. The
tolerance is the template's own test rule (`TOLERANCES`); the report gives per template and variant
the calls checked, the largest error against the tolerance, and the fraction of outputs that differ
at all. A call beyond its tolerance is a failure naming its loc, template and variant.
Known gaps: only templates with a contract are checked (the others are not kernel calls yet).
"""
from __future__ import annotations

import torch

from dsv41c.ir.kernel_contracts import reference_call


def _bf16_rule(ref: torch.Tensor) -> torch.Tensor:
    # the launcher accumulates in fp32 and rounds once to the output dtype; the reference rounds its own
    # fp32 (CPU) sum once too: two roundings and two summation orders apart, 2 ulps of the output dtype
    ulp = torch.finfo(ref.dtype).eps if ref.dtype.is_floating_point else 0.0
    return 2 * ulp * ref.abs().float() + 1e-6 * (ref.abs().float().max() + 1e-30)


def _moe_rule(ref: torch.Tensor) -> torch.Tensor:
    # the MoE kernels keep the gate/up sums in fp32 where the replaced op rounded each expert's x·w1ᵀ and x·w3ᵀ to
    # the activation dtype, and sum D-long dot products in their own order; their tests hold the FFN to 4 ulps of
    # the output dtype relative to the largest output (tests/test_kernels_ffn.py), per token here
    ulp = torch.finfo(ref.dtype).eps
    return 8 * ulp * ref.abs().float().amax(-1, keepdim=True) + 1e-6 * (ref.abs().float().max() + 1e-30)


def _norm_rule(ref: torch.Tensor) -> torch.Tensor:
    # fp32 statistics summed in the kernel's order, the normalized row rounded once to the activation dtype and
    # multiplied by the weight: 3 ulps of the output dtype (tests/test_kernels_ffn.py's bf16 rule)
    ulp = torch.finfo(ref.dtype).eps
    return 3 * ulp * ref.abs().float() + 1e-6 * (ref.abs().float().max() + 1e-30)


def _mix_rule(ref: torch.Tensor) -> torch.Tensor:
    # the mHC mixes: fp32 projections summed in the kernel's order, a sigmoid and 20 Sinkhorn rounds
    # (tests/test_kernels_ffn.py: rtol 1e-5, atol 1e-6)
    return 1e-5 * ref.abs().float() + 1e-6


def _score_rule(ref: torch.Tensor) -> torch.Tensor:
    # index scores: the dots are exact on both sides; the kernel folds d^-0.5 into w and sums the heads in order
    # h = 0..H-1 where the op sums relu(dot)·d^-0.5·w with torch (tests/test_lower_indexer_int8.py: rtol 1e-6);
    # an entry not visible is -inf on both sides (equal infinities count as no error)
    fin = ref.float().masked_fill(~torch.isfinite(ref), 0.0)
    return 1e-6 * fin.abs() + 1e-7 * (fin.abs().max() + 1e-30)


# per template: a rule, or one rule per result of a call with several
TOLERANCES = {"fp8_gemm": _bf16_rule, "moe_ffn": _moe_rule, "rmsnorm": _norm_rule, "indexer_score": _score_rule,
              "mhc_pre": (_bf16_rule, _mix_rule, _mix_rule, _mix_rule)}


def call_error(k: dict, args, result):
    """(largest error over tolerance, every element's absolute error) of one kernel call's `result` against its
    contract's reference on the same `args`; `k` is the call's program.json `kernel` record."""
    attrs = {f"key.{n}": v for n, v in k["keys"].items()}
    want = reference_call(k["template"], list(args), attrs)
    rules = TOLERANCES[k["template"]]
    wants, gots = (want, result) if isinstance(want, tuple) else ((want,), (result,))
    rules = rules if isinstance(rules, tuple) else (rules,) * len(wants)
    # equal values (equal infinities included: a score not yet visible is -inf) are no error
    errs = [torch.where(g.float() == w.float(), 0.0, (g.float() - w.float()).abs()) for g, w in zip(gots, wants)]
    err = torch.cat([e.flatten() for e in errs])
    ratio = max((float((e / rule(w)).max()) for e, w, rule in zip(errs, wants, rules) if e.numel()),
                default=0.0)  # 0 rows: nothing to check
    return ratio, err


def check_kernel_calls(model, ids, decode_steps: int = 1) -> dict:
    """Run `model` on `ids` (+ decode steps) and check every kernel call; -> report (see the module doc)."""
    rows: dict = {}
    failures: list = []

    def observe(rec, args, result):
        k = rec.get("kernel")
        if not k:
            return
        ratio, err = call_error(k, args, result)
        key = f"{k['template']}/{k['variant']}"
        row = rows.setdefault(key, {"calls": 0, "max_err_over_tol": 0.0, "max_abs_err": 0.0, "differ": 0,
                                    "elements": 0})
        row["calls"] += 1
        row["max_err_over_tol"] = max(row["max_err_over_tol"], ratio)
        row["max_abs_err"] = max(row["max_abs_err"], float(err.max()) if err.numel() else 0.0)
        row["differ"] += int((err > 0).sum())
        row["elements"] += err.numel()
        if ratio > 1.0:
            failures.append(f"{key} at loc({rec.get('loc')}): error {float(err.max()):.3g} is {ratio:.2f}x its "
                            f"tolerance")

    model.observe = observe
    try:
        s = model.new_session()
        model.prefill(s, ids)
        for _ in range(decode_steps):
            model.decode(s)
    finally:
        model.observe = None
    for row in rows.values():
        row["fraction_differing"] = row["differ"] / max(row["elements"], 1)
    return {"calls": sum(r["calls"] for r in rows.values()), "by_variant": rows, "failures": failures}
