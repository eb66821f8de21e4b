"""How much of a compiled plan's transient memory the runtime's arena holds (no GPU needed).

    python3 benchmarks/arena_coverage.py ARTIFACT [ARTIFACT ...] [--out results/arena_coverage.json]

For each function of each artifact's program.json: the values plan-memory placed (count and their
sizes at the arena's binding, summed), split by who makes them at run time (codegen/cpu.py decides):
- `written`: an ATen op with an out= form (runtime/arena.py writes it at its offset);
- `kernel`: a kernel launcher (allocates its own result);
- `domain`: a `dsv41.*` op on its reference (allocates its own);
- `other`: ATen ops without an out= form (einsum, ...), factory ops, results sized only as they run;
plus the runtime's arena (the written values placed again) against plan-memory's arena of every
transient value, and the views (no bytes of their own).
Static: read from the plan, so it says what the arena can hold, not what a given run placed
(`CompiledModel.arena_stats()` says that: a value larger than its slot falls back).
Known gaps: an ATen op with an out= form for some argument types only (a scalar operand) counts as
`written` here and falls back at run time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import write_json  # noqa: E402


def coverage(path: str) -> dict:
    spec = json.load(open(os.path.join(path, "program.json")))
    report = {}
    for name, f in spec["functions"].items():
        arena = f.get("arena") or {}
        written = {"values": 0, "bytes": 0}
        for rec in f["ops"]:
            for slot in rec.get("arena") or []:
                if slot:
                    written["values"] += 1
                    written["bytes"] += int(slot["bytes"])
        rows = {"written": written, **(arena.get("unserved") or {})}
        total = sum(r["bytes"] for r in rows.values())
        report[name] = {"arena_bytes": arena.get("bytes"), "planned_arena_bytes": arena.get("planned_bytes"),
                        "binding": arena.get("binding"), "views": sum(bool(r.get("alias")) for r in f["ops"]),
                        "placed_bytes": total, **rows,
                        "written_share_of_bytes": round(written["bytes"] / total, 4) if total else None}
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args(argv)
    out = {"torch": torch.__version__, "artifacts": {}}
    for p in a.artifacts:
        m = json.load(open(os.path.join(p, "manifest.json")))
        out["artifacts"][os.path.basename(p.rstrip("/"))] = {"target": m.get("target"), "functions": coverage(p)}
    write_json(a.out, out)
    print(json.dumps(out, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
