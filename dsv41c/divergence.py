"""Where two runs of the same traced step part: the first op whose value differs beyond a threshold.

    report = first_divergence(model_a, model_b, ids, threshold=2e-2)

Both models are compiled artifacts of the same config (for instance a GPU plan in bf16 run with its
kernel calls interpreted, against the cpu plan in bf16 or float32): the tracer gives every op the
`loc` of what it computes (`layers.3.attn.wq_a`, `layers.3.ffn`, ...), and a kernel call keeps the
loc of the op it replaced. Each run records, per loc, the value of the last op at that loc in
program order (the value the loc hands on); then the locs of run A are walked in A's order and the
first whose value's rel-L2 against B's value at the same loc exceeds `threshold` is named, with the
errors of every loc compared up to it (so a slow drift is visible as well as a jump).
Values compared: floating tensors of the same shape at both sides; integer results (top-k indices,
routing) are compared as the fraction of entries that differ.
Known gaps: one prefill of `ids` (no decode steps); a loc whose last op returns a tuple is skipped.
"""
from __future__ import annotations

import torch


def _record(model, ids) -> tuple[list, dict]:
    order, vals = [], {}

    def observe(rec, args, result):
        loc = rec.get("loc")
        if not loc or not isinstance(result, torch.Tensor):
            return
        if loc not in vals:
            order.append(loc)
        vals[loc] = result.detach().to("cpu", copy=True)

    model.observe = observe
    try:
        model.prefill(model.new_session(), ids)
    finally:
        model.observe = None
    return order, vals


def _error(a: torch.Tensor, b: torch.Tensor):
    if a.shape != b.shape:
        return None
    if a.dtype.is_floating_point and b.dtype.is_floating_point:
        a64, b64 = a.double(), b.double()
        return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))
    return float((a != b).double().mean()) if a.numel() else 0.0


def first_divergence(model_a, model_b, ids, threshold: float = 2e-2) -> dict:
    """The first loc of A's run whose value differs from B's beyond `threshold` (see the module doc)."""
    order_a, va = _record(model_a, ids)
    _, vb = _record(model_b, ids)
    compared = []
    for loc in order_a:
        if loc not in vb:
            continue
        e = _error(va[loc], vb[loc])
        if e is None:
            continue
        compared.append({"loc": loc, "error": e, "dtype": str(va[loc].dtype).replace("torch.", "")})
        if e > threshold:
            return {"first_divergent_loc": loc, "error": e, "threshold": threshold, "compared": compared}
    return {"first_divergent_loc": None, "threshold": threshold, "compared": compared}
