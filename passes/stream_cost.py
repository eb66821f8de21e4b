"""The stream plan's cost: per layer, the serial time against the scheduled streams' time.

    stream_cost(module, f)   -> {"serial_us", "streams_us", "critical_path_us", "work_bound_us",
                                 "layers": {N: {...the same per layer...}}}
    stream_report(module)    -> per function: ops per stream, events, and stream_cost
    stream_report_json(module) -> reports/streams.json (the constants beside the figures)

Time of an op (an explicit roofline on an H200, the constants below): an op whose registry
cost is zero FLOPs and zero bytes (a view, a size op, a stream event) takes no time; any other
op is one launch, `LAUNCH_S + max(bytes / HBM_BYTES_PER_S, flops / PEAK_FLOPS)`, with the
registry's `Cost` (a `kernel.call` naming an `op` costs as that op) evaluated at the binding
plan-memory would use (`resolve_binding`: the module's `memory.bind.<fn>`, else its
defaults).

Serial: the sum of the op times, one stream. Streams: a list schedule of the plan as
scheduled, each stream running its ops in program order, a `stream.wait` starting no earlier
than the time its event's `stream.record` was reached on the recording stream; the
critical path is the last finish. Two streams share the HBM and the SMs, so the scheduled
time is also bounded below by the work without launch gaps (`work_bound`: the sum of the
roofline parts): `streams = max(critical path, work bound)`. What overlap hides is launch
latency and the shorter path's time; a plan with one stream has streams == serial.

Per layer: the ops whose `loc` is `layers.N...` (the Engram ops issued a layer ahead count
in their own layer N), simulated on their own from time 0 (a wait on an event recorded
outside the layer does not delay); ops outside every layer are in the function's totals only.

Known gaps: a bare `kernel.call` of a template costs its operands' and results' bytes and,
when it fixes `key.N` (a linear's output width), 2·numel(first operand)·N FLOPs: no per-template
cost model yet; events cost nothing (under CUDA graphs they are graph edges); concurrent
kernels are assumed not to slow each other beyond the shared work bound; LAUNCH_S is a
typical launch-to-launch gap, not a measurement of this plan.
"""
from __future__ import annotations

import re

from dsv41c.ir.happens_before import op_stream
from dsv41c.ir.registry import Cost, memory_cost
from dsv41c.ir.ops_runtime import effective
from dsv41c.ir.symbolic import SymExpr
from dsv41c.ir.types import TensorType

HBM_BYTES_PER_S = 4.2e12   # H200 HBM3e, sustained (4.8 TB/s peak)
PEAK_FLOPS = 710e12        # H200 dense BF16 tensor-core, sustained
LAUNCH_S = 2e-6            # launch-to-launch gap of one small kernel

_LAYER = re.compile(r"layers\.(\d+)\.")


def _num(x, env) -> float:
    if isinstance(x, SymExpr):
        return float(x.evaluate(env))
    return float(x or 0)


def op_cost(op) -> Cost:
    """The registry's cost of `op` (a kernel.call standing for an op costs as that op)."""
    if op.name == "kernel.call" and not op.attrs.get("op"):
        from dsv41c.ir.schema import Args

        types = [v.type for v in op.operands]
        a = Args()
        a["inputs"] = types
        moved = memory_cost(a, [r.type for r in op.results]).bytes
        n = op.attrs.get("key.N")
        flops = 2 * types[0].numel * n if isinstance(n, int) and isinstance(types[0], TensorType) else 0
        return Cost(flops, moved)
    d, attrs = effective(op.name, op.attrs)
    return d.cost(op.operands, attrs, [r.type for r in op.results])


def op_key(op):
    """What an op's cost depends on (name, operand and result types, attributes), hashable; None if not."""
    key = (op.name, tuple(v.type for v in op.operands), tuple(r.type for r in op.results),
           tuple(sorted(op.attrs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def op_time(op, env, memo=None) -> tuple:
    """(seconds with the launch, seconds of roofline work) of one op at binding `env`; `memo` (a dict) reuses
    the figures of an op with the same name, types and attributes (the layers repeat their ops)."""
    key = op_key(op) if memo is not None else None
    if key is not None and key in memo:
        return memo[key]
    c = op_cost(op)
    flops, moved = _num(c.flops, env), _num(c.bytes, env)
    out = _roofline(flops, moved)
    if key is not None:
        memo[key] = out
    return out


def _roofline(flops, moved) -> tuple:
    if flops == 0 and moved == 0:
        return 0.0, 0.0
    work = max(moved / HBM_BYTES_PER_S, flops / PEAK_FLOPS)
    return LAUNCH_S + work, work


def _simulate(ops, times) -> float:
    """The last finish of a list schedule of `ops` (in program order) on their streams."""
    ready: dict = {}
    event_at: dict = {}
    end = 0.0
    for op, t in zip(ops, times):
        s = op_stream(op)
        start = ready.get(s, 0.0)
        if op.name == "stream.wait" and op.operands:
            start = max(start, event_at.get(id(op.operands[0]), 0.0))
        finish = start + t
        ready[s] = finish
        if op.name == "stream.record" and op.results:
            event_at[id(op.results[0])] = finish
        end = max(end, finish)
    return end


def _figures(ops, times, works) -> dict:
    serial = sum(times)
    path = _simulate(ops, times)
    bound = sum(works)
    streams = max(path, bound)
    return {"serial_us": round(serial * 1e6, 3), "streams_us": round(streams * 1e6, 3),
            "critical_path_us": round(path * 1e6, 3), "work_bound_us": round(bound * 1e6, 3),
            "saved_pct": round(100 * (serial - streams) / serial, 2) if serial else 0.0}


def stream_cost(module, f, env=None) -> dict:
    from dsv41c.passes.plan_memory import resolve_binding

    env = resolve_binding(module, f) if env is None else env
    memo: dict = {}
    tw = [op_time(op, env, memo) for op in f.ops]
    times, works = [t for t, _ in tw], [w for _, w in tw]
    out = _figures(f.ops, times, works)
    per: dict = {}
    for op, t, w in zip(f.ops, times, works):
        m = _LAYER.match(op.loc or "")
        if m:
            per.setdefault(int(m.group(1)), ([], [], []))
            for lst, x in zip(per[int(m.group(1))], (op, t, w)):
                lst.append(x)
    out["layers"] = {n: _figures(*per[n]) for n in sorted(per)}
    out["binding"] = dict(sorted(env.items()))
    return out


def stream_report(module) -> dict:
    """Per function: `ops_per_stream`, `events`, and the cost figures of `stream_cost`."""
    out = {}
    for f in module.functions.values():
        counts: dict = {}
        for op in f.ops:
            counts[op_stream(op)] = counts.get(op_stream(op), 0) + 1
        out[f.name] = {"ops_per_stream": {str(k): counts[k] for k in sorted(counts)},
                       "events": sum(1 for op in f.ops if op.name == "stream.record"),
                       **stream_cost(module, f)}
    return out


def stream_report_json(module) -> dict:
    """reports/streams.json: the roofline's constants and `stream_report` (layer keys as text)."""
    fns = stream_report(module)
    for d in fns.values():
        d["layers"] = {str(n): v for n, v in d["layers"].items()}
    return {"model": {"hbm_bytes_per_s": HBM_BYTES_PER_S, "peak_flops": PEAK_FLOPS, "launch_s": LAUNCH_S},
            "functions": fns}


__all__ = ["HBM_BYTES_PER_S", "LAUNCH_S", "PEAK_FLOPS", "op_cost", "op_key", "op_time", "stream_cost", "stream_report",
           "stream_report_json"]
