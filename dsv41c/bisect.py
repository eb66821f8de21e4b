"""`dsv41c bisect`: the first kernel call of a compiled plan whose output leaves its tolerance, named.

    dsv41c bisect ARTIFACT --ids 1,2,3 [--decode-steps N] [--interpret | --device cuda] [--json]

The plan runs as `dsv41c run` runs it (prefill of the ids, then greedy decode steps); every
`kernel.call` step's result is compared, on that step's own inputs, with the interpreter's semantics
of the call: its kernel contract's reference (`ir/kernel_contracts.py`, what the ops the call
replaced compute), within the template's tolerance (`dsv41c/kernel_check.py`). The first call past
its tolerance, in execution order, is named with its function, `loc` (e.g.
`layers.24.attn.index_scores`), template, variant and error figures; the rest of the run is checked
too, so the report also counts the calls past tolerance after it. A plan's other steps are torch
ops or domain ops run as their reference, so they are the interpreter's semantics by construction.
A cpu plan has no kernel call: bisect says so (its ops are all references). On a GPU the launchers
run the artifact's kernels (binaries where they match); with `--interpret` in Triton's interpreter.
Known gaps: a kernel that writes one of its inputs in place is compared against a reference run on
the written input.
"""
from __future__ import annotations

import json
import sys


def bisect(model, ids, decode_steps: int = 0) -> dict:
    """Run `model` on `ids` (+ decode steps); -> {"first": {...} or None, "checked": n, "past_tolerance": n}."""
    from dsv41c.kernel_check import call_error

    state = {"first": None, "checked": 0, "past": 0, "fn": "prefill"}

    def observe(rec, args, result):
        k = rec.get("kernel")
        if not k:
            return
        ratio, err = call_error(k, args, result)
        state["checked"] += 1
        if ratio > 1.0:
            state["past"] += 1
            if state["first"] is None:
                state["first"] = {"function": state["fn"], "loc": rec.get("loc"), "template": k["template"],
                                  "variant": k["variant"], "error_over_tolerance": ratio,
                                  "max_abs_error": float(err.max()) if err.numel() else 0.0,
                                  "fraction_differing": float((err > 0).double().mean()) if err.numel() else 0.0,
                                  "call_index": state["checked"] - 1}

    model.observe = observe
    try:
        s = model.new_session()
        model.prefill(s, ids)
        state["fn"] = "decode"
        for _ in range(decode_steps):
            model.decode(s)
    finally:
        model.observe = None
    return {"first": state["first"], "checked": state["checked"], "past_tolerance": state["past"]}


def cmd_bisect(args) -> int:
    from dsv41c.runtime.loader import load

    model = load(args.artifact, device=args.device, checkpoint=args.checkpoint, interpret=args.interpret)
    rep = bisect(model, model._check_ids(args.ids), args.decode_steps)
    rep["artifact"], rep["target"] = args.artifact, model.manifest["target"]
    if args.json:
        print(json.dumps(rep, indent=1))
    elif rep["checked"] == 0:
        print(f"bisect: {args.artifact} ({rep['target']}) has no kernel call: every op is its reference")
    elif rep["first"] is None:
        print(f"bisect: all {rep['checked']} kernel calls within their tolerance")
    else:
        f = rep["first"]
        print(f"bisect: first divergent kernel call: @{f['function']} loc({f['loc']}) {f['template']}/{f['variant']}: "
              f"error {f['max_abs_error']:.3g} is {f['error_over_tolerance']:.2f}x its tolerance "
              f"({100 * f['fraction_differing']:.1f}% of outputs differ); {rep['past_tolerance']} of "
              f"{rep['checked']} calls past tolerance")
    return 0 if rep["first"] is None else 1


