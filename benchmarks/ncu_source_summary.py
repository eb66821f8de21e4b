"""Summarize Nsight Compute's per-SASS-instruction source page (run_h200.sh step `profile_source`: ncu_source.csv).

For each kernel in the CSV (`ncu --import R --page source --csv --print-source sass`): the warp-stall samples by
reason and by opcode, the share of samples in each loop (backward branches) and outside them, the instructions
with the most samples (with their two largest stall reasons), and the shared-memory accesses with bank conflicts
(wavefronts over the ideal). No GPU needed; the report is text:

    python benchmarks/ncu_source_summary.py ncu_source.csv [--top 25] > summary.txt

Known gaps: ncu samples a subset of SMs; an idle SM (a program that finished early) leaves no samples, so the
shares are of busy time, not of the kernel's duration.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys


def _num(row, col, H) -> float:
    try:
        return float(row[H[col]].replace(",", ""))
    except (KeyError, ValueError, IndexError):
        return 0.0


def kernels(path: str):
    """(name, header, rows) per kernel block of the CSV."""
    rows = list(csv.reader(open(path)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] + [len(rows)]
    for a, b in zip(starts, starts[1:]):
        yield rows[a][1], rows[a + 1], rows[a + 2:b]


def summarize(name: str, hdr: list, body: list, top: int = 25) -> str:
    H = {h: i for i, h in enumerate(hdr)}
    S = "Warp Stall Sampling (All Samples)"
    tot = sum(_num(r, S, H) for r in body) or 1.0
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = [f"== {name}: {len(body)} SASS instructions, {tot:.0f} samples"]
    rs = sorted(((sum(_num(r, h, H) for r in body), h[6:]) for h in reasons), reverse=True)
    out.append("stall reasons: " + ", ".join(f"{n} {v / tot:.0%}" for v, n in rs if v / tot >= 0.01))
    ops, execd = collections.Counter(), collections.Counter()
    for r in body:
        words = r[H["Source"]].split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?"))
        op = op.split(".")[0]
        ops[op] += _num(r, S, H)
        execd[op] += _num(r, "Instructions Executed", H)
    out.append("samples by opcode (share / warp instructions executed): "
               + ", ".join(f"{o} {v / tot:.0%}/{execd[o]:.0f}" for o, v in ops.most_common(12)))
    base = int(body[0][0], 16)
    addr = [int(r[0], 16) - base for r in body]
    loops = []
    for r, a in zip(body, addr):
        m = re.search(r"BRA\s+(0x[0-9a-f]+)", r[H["Source"]])
        if m and int(m.group(1), 16) - base < a:
            loops.append((int(m.group(1), 16) - base, a))
    inside = 0.0
    for lo, hi in loops:
        sel = [r for r, a in zip(body, addr) if lo <= a <= hi]
        s = sum(_num(r, S, H) for r in sel)
        inside += s
        ex = max((_num(r, "Instructions Executed", H) for r in sel), default=0)
        out.append(f"loop {lo:#x}-{hi:#x}: {len(sel)} instructions, {s / tot:.1%} of samples, "
                   f"up to {ex:.0f} warp executions an instruction")
    out.append(f"outside loops: {(tot - inside) / tot:.1%} of samples")
    out.append(f"top {top} instructions by samples:")
    for r, a in sorted(zip(body, addr), key=lambda ra: -_num(ra[0], S, H))[:top]:
        two = sorted(((_num(r, h, H), h[6:]) for h in reasons), reverse=True)[:2]
        out.append(f"  {a:#8x} {_num(r, S, H) / tot:5.1%} {r[H['Source']][:64]:64s} "
                   + ", ".join(f"{n} {v:.0f}" for v, n in two if v))
    wf, ideal = "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"
    conf = [(r, a) for r, a in zip(body, addr) if _num(r, wf, H) > 1.5 * max(_num(r, ideal, H), 1)]
    tw, ti = sum(_num(r, wf, H) for r in body), sum(_num(r, ideal, H) for r in body)
    out.append(f"shared-memory wavefronts: {tw:.0f} (ideal {ti:.0f}); instructions with conflicts:")
    for r, a in sorted(conf, key=lambda ra: -_num(ra[0], wf, H))[:top]:
        out.append(f"  {a:#8x} {r[H['Source']][:56]:56s} wavefronts {_num(r, wf, H):8.0f} ideal "
                   f"{_num(r, ideal, H):8.0f} ({r[H['L1 Conflicts Shared N-Way']]}-way)")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    for name, hdr, body in kernels(args.csv):
        if body:
            print(summarize(name, hdr, body, args.top) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
