"""How much of a compiled plan's transient memory the runtime's arena holds (no GPU needed).

    python3 benchmarks/arena_coverage.py ARTIFACT [ARTIFACT ...] [--out results/arena_coverage.json]

For each function of each artifact's program.json: the values plan-memory placed (count and their
planned bytes at the arena's binding), split by who makes them at run time:
- `written`: an ATen op with an out= form (runtime/arena.py writes it at its offset);
- `kernel`: a kernel launcher (allocates its own result);
- `domain`: a `dsv41.*` op on its reference (allocates its own);
- `other`: ATen ops without an out= form (einsum, ...) and factory ops;
plus the arena's size and plan-memory's lower bound, and the views (no bytes of their own).
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


def coverage(path: str) -> dict:
    from dsv41c.runtime.arena import out_form
    from dsv41c.runtime.executor import Program

    spec = json.load(open(os.path.join(path, "program.json")))
    prog = Program(spec)
    report = {}
    memory = os.path.join(path, "reports", "memory.json")
    planned = json.load(open(memory))["functions"] if os.path.exists(memory) else {}
    for name, f in spec["functions"].items():
        fn = prog[name]
        rows = {k: {"values": 0, "bytes": 0} for k in ("written", "kernel", "domain", "other")}
        views = 0
        for op, rec in zip(fn.ops, f["ops"]):
            views += bool(rec.get("alias"))
            for slot in rec.get("arena") or []:
                if not slot:
                    continue
                t = rec["target"]
                kind = ("kernel" if t.startswith("kernel.") else "domain" if t.startswith("dsv41.")
                        else "written" if op.place is not None or (out_form(op.fn) and not op.factory) else "other")
                rows[kind]["values"] += 1
                rows[kind]["bytes"] += int(slot["bytes"])
        total = sum(r["bytes"] for r in rows.values())
        arena = f.get("arena") or {}
        report[name] = {"arena_bytes": arena.get("bytes"), "binding": arena.get("binding"),
                        "lower_bound": (planned.get(name) or {}).get("lower_bound"), "views": views,
                        "placed_bytes": total, **rows,
                        "written_share_of_bytes": round(rows["written"]["bytes"] / total, 4) if total else None}
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
    text = json.dumps(out, indent=1, sort_keys=True)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
