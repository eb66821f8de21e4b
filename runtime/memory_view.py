"""`dsv41c inspect ARTIFACT --memory`: the memory plan the compile wrote into reports/.

    arena_summary(report)        # reports/memory.json -> {fn: {bytes, lower_bound, no_reuse, ...}}
    format_memory(path, report)  # the table and the timeline pictures' paths, as text

Reads only what the compile wrote (reports/memory.json and the memory_<fn>.png/.svg it
lists): the runtime imports nothing from the compiler side, so nothing is re-planned or
re-drawn here. An artifact without the report says so in one line.
"""
from __future__ import annotations

import os

REPORT = "reports/memory.json"
_KEYS = ("bytes", "lower_bound", "no_reuse", "caching_allocator_estimate")


def arena_summary(report: dict | None) -> dict:
    """Per function: bytes, lower_bound, no_reuse, caching_allocator_estimate, chunk (T bound, or None)."""
    out = {}
    for fn, s in sorted(((report or {}).get("functions") or {}).items()):
        out[fn] = {k: s.get(k) for k in _KEYS}
        out[fn]["chunk"] = (s.get("binding") or {}).get("T")
    return out


def _mib(n) -> str:
    return f"{n / (1 << 20):12.3f}" if isinstance(n, (int, float)) else f"{'?':>12}"


def format_memory(path: str, report: dict | None) -> str:
    if not report:
        return f"{path}: no {REPORT} (compiled without plan-memory's report)"
    lines = [f"memory plan of {path} (MiB; arena offsets 256-byte aligned)",
             f"  {'function':<10}{'arena':>12}{'lower bound':>12}{'ratio':>8}{'no reuse':>12}{'caching':>12}"
             f"{'buffers':>9}  order  binding"]
    for fn, s in sorted(report.get("functions", {}).items()):
        ratio = s.get("ratio_to_lower_bound")
        bind = ",".join(f"{k}={v}" for k, v in sorted((s.get("binding") or {}).items()))
        lines.append(f"  {fn:<10}{_mib(s.get('bytes'))}{_mib(s.get('lower_bound'))}"
                     f"{ratio if ratio is not None else '?':>8}{_mib(s.get('no_reuse'))}"
                     f"{_mib(s.get('caching_allocator_estimate'))}{s.get('buffers', '?'):>9}  {s.get('order', '?')}"
                     f"  {bind}")
    for fn, pics in sorted((report.get("pictures") or {}).items()):
        for rel in pics:
            where = os.path.join(path, rel)
            lines.append(f"  @{fn} timeline: {where}" + ("" if os.path.exists(where) else " (missing)"))
    return "\n".join(lines)
