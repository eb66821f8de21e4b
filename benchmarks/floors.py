"""Floors: the least time a kernel's bytes and FLOPs allow on the measured ceilings (pure Python, no GPU).

`floor_ms` is max(bytes / copy bandwidth, FLOPs / matrix rate of the kernel's kind) against the ceilings that
`common.measure_ceilings` measured in the same run; `int8_rate` is the int8 ceiling (twice the bf16 rate, see
there); `refloor` redoes a kept JSON row's floor and decode verdict with today's `floor_ms`, so a correction of
the floors reaches the kept tables without a new GPU run (`kernels_table.py` marks such rows, `read_floor.py`
reads rows through it).

Known gaps: one ceiling per kind and run (no spread); the bf16 ceiling is cuBLAS's 8192^3 rate, not the chip's
datasheet peak.
"""
from __future__ import annotations


def int8_rate(ceil: dict) -> float:
    """The int8 ceiling (TOP/s): the larger of torch._int_mm's measured rate and twice the measured bf16 rate.
    Hopper's dense int8 tensor-core rate is twice its bf16 one; torch._int_mm reaches only ~128 TOP/s on the H200
    (about a tenth of 2x bf16), so taken alone it made int8 FLOP floors ~10x too high and verdicts against them
    too kind (the tables before this correction: the one-query indexer scoring counted as 1.96x its floor, 7.4x its bytes
    floor)."""
    return max(ceil.get("int8_TOPs") or 0.0, 2 * ceil["bf16_TFLOPs"])


def floor_ms(ceil: dict, bytes_: float, flops: float = 0.0, kind: str = "bf16"):
    """(floor, bytes floor, FLOP floor) in ms for a kernel moving bytes_ and doing flops of `kind`."""
    t_b = bytes_ / (ceil["copy_TBps"] * 1e12) * 1e3
    rate = {"bf16": ceil["bf16_TFLOPs"], "int8": int8_rate(ceil),
            "fp32": ceil.get("fp32_TFLOPs") or ceil["bf16_TFLOPs"] / 8}[kind]
    t_f = flops / (rate * 1e12) * 1e3
    return max(t_b, t_f), t_b, t_f


def decode_verdict(e: dict, floor: float, ceil: dict) -> dict:
    """The decode goal's fields for entry e against floor (ms): its best time is the better of the Triton median
    and the L2-cold graph replay where measured, else the warm one (the floor assumes HBM reads; a warm replay of
    a kernel whose inputs fit the L2 can beat it), within 2x of the floor or not; launch_bound where the floor is
    below one launch (no kernel can go there: said, not hidden)."""
    cold = e.get("graph_cold_ms")
    best = min(x for x in (e.get("triton_ms"), cold if cold is not None else e.get("graph_ms")) if isinstance(x, float))
    lf = ceil.get("launch_floor_ms") or 0.0
    return {"best_over_floor": best / floor if floor else None, "goal_met": best <= 2 * floor,
            "launch_bound": floor < lf, "goal_met_vs_launch_floor": best <= 2 * max(floor, lf)}


def refloor(e: dict, ceil: dict) -> dict:
    """Entry e of a kept benchmark JSON with its floor recomputed by today's `floor_ms` from its own bytes, FLOPs
    and FLOP kind and its run's ceilings, and the floor's verdicts (x floor, decode goal) redone from its own times;
    `refloored_from` keeps the run's floor. e unchanged where the floor is the same (within 0.1 %) or the entry
    lacks what it takes (bytes, flop_kind, ceilings)."""
    if not ceil or e.get("bytes") is None or e.get("flop_kind") not in ("bf16", "int8", "fp32") \
            or not e.get("floor_ms"):
        return e
    f = floor_ms(ceil, e["bytes"], e.get("flops") or 0.0, e["flop_kind"])[0]
    if abs(f - e["floor_ms"]) <= 1e-3 * e["floor_ms"]:
        return e
    out = dict(e, floor_ms=f, refloored_from=e["floor_ms"])
    if e.get("triton_ms"):
        out["triton_over_floor"] = e["triton_ms"] / f
    if str(e.get("goal", "")).startswith("decode"):  # the decode verdict is against the floor; others are not
        out.update(decode_verdict(e, f, ceil))
    return out
