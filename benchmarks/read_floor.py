"""The read floor: how long the GPU takes to read N bytes from HBM in one kernel, measured, for each decode case.

Why: the decode goal compares a kernel's L2-cold graph-replay time with its *bytes floor* (bytes / measured
copy bandwidth). That floor has no fixed cost in it: no launch, no first round trip to HBM, no ramp of the
request stream. For a kernel of a few MB those fixed costs are most of its time, so "within 2x of the bytes
floor" can be out of reach for ANY kernel that has to read those bytes. This script measures that bound
instead of arguing it: for each decode case of the kernel benchmarks' JSON (a row with the decode goal whose
bytes floor is at least 95 % of the launch floor; up to --max-mb), it times the fastest of several pure
streaming-read kernels over exactly that many bytes, replayed from a CUDA graph with the L2 flushed before each
replay (the same `common.ms_graph` cold measurement the kernel tables use), and records:

- `read_floor_ms`: the least cold replay time over the read kernels (each program reads one contiguous chunk
  with 16-byte loads, sums it, and stores one int32: no cross-program combine, no compute),
- `budget_ms`: 2 x the bytes floor (what the goal allows),
- `read_bound`: read_floor_ms > budget_ms: no single kernel that reads these bytes can meet the goal here,
- the case's own cold time (from the JSON) over the read floor.

Read kernels (`_read_kernel`): P programs (1, 2, 4 or 8 per SM; --wide adds 16), each reading its contiguous
chunk in a loop whose step issues UNROLL (1, 2) independent loads of BLOCK int32 (4-16 KB; --wide adds 2 KB);
torch's own `sum` of the buffer is timed too. The best three are timed again with 4x the replay budget. Each
timing is three graph benchmarks (warm, flush + kernel, flush alone), about a second at the default budget, so
the 12 distinct sizes of the kernel tables take ~6.5 minutes on an H200 (run_h200.sh gives the step at least
420 s; --only picks cases; the JSON is written after each case, so a run stopped at its limit keeps what it has).

    python benchmarks/read_floor.py benchmarks/results/kernels_ffn.json benchmarks/results/kernels_attention.json \
        --out benchmarks/results/read_floor.json

Measured (H200, torch 2.11 / triton 3.6, results/read_floor.json): a cold read costs about 2.75 µs
plus bytes at ~4.4 TB/s (4.0 MB 3.6 µs, 6.6 MB 4.3, 10.5 MB 5.2, 23.7 MB 7.8, 42 MB 12.3), so below ~11 MB no
kernel that reads its bytes once can be within 2x of the bytes floor. Read-bound: wq_a at 1 and 8 tokens (4.3 / 4.2
µs against a 3.1 µs budget), the router at 8 tokens (3.6 against 1.9), the compressor at ratio 1 (4.2 against 2.5)
and ratio 2 (5.2 against 5.0: a 5 % margin, within the run-to-run spread of these cold times, 4.09-4.34 µs for
wq_a's 6.6 MB over three runs). torch's `sum` over the same int32 buffer takes 3.7-5.7x the read floor.

Known gaps: the read kernels are Triton's (a hand-written CUDA stream could be a little faster, so the floor is
an upper bound on the true one, within the noise of a cold replay, ~0.5 µs); the cases' bytes are what the
benchmarks count (weights, activations, outputs), read here as one contiguous buffer, while the kernels also
write their outputs. The cases with a FLOP floor above their bytes floor (batched attention, the indexer) are
listed with their FLOP floor; the read floor does not bound them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import triton
import triton.language as tl

from benchmarks.floors import refloor

# the sweep: programs an SM x int32 a load step (4-16 KB; --wide: 2-16 KB, up to 16 programs an SM)
SWEEPS = {"default": ((1, 2, 4, 8), (1024, 2048, 4096)), "wide": ((1, 2, 4, 8, 16), (512, 1024, 2048, 4096))}
LAUNCH_MARGIN = 0.95  # a bytes floor within 5 % of the launch floor counts as a decode case (the router at 8)


@triton.jit
def _read_kernel(buf_ptr, out_ptr, n, CHUNK, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Program p sums int32 [p·CHUNK, (p+1)·CHUNK) of buf (n elements) and stores the sum: a loop whose step
    issues UNROLL independent loads of BLOCK elements (all in flight before their sums). CHUNK is a runtime
    argument (a multiple of 16) so that one compile serves every size."""
    CHUNK = tl.multiple_of(CHUNK, 16)
    p = tl.program_id(0)
    base = p.to(tl.int64) * CHUNK
    # one bound, a multiple of 16 (the launcher pads n and CHUNK; Triton specializes an int argument divisible by
    # 16 as such): the mask is constant over 4 elements, so the loads are 16-byte vectors (sm90: LDG.E.128)
    end = tl.minimum(base + CHUNK, n)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for k in range(0, CHUNK, BLOCK * UNROLL):
        for i in tl.static_range(UNROLL):
            offs = base + k + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(buf_ptr + offs, mask=offs < end, other=0)
    tl.store(out_ptr + p, tl.sum(acc, axis=0))


def decode_cases(paths: list[str]) -> list[dict]:
    """The decode-goal rows of the kernel benchmark JSONs whose floor (as `floors.refloor` computes it now) is at
    least LAUNCH_MARGIN of their run's launch floor."""
    cases = []
    for path in paths:
        doc = json.load(open(path))
        if not (doc.get("ceilings") or {}).get("copy_TBps") or not isinstance(doc.get("results"), list):
            raise SystemExit(f"read_floor: {path} is not a kernel benchmark JSON (no ceilings.copy_TBps / results)")
        lf = doc["ceilings"].get("launch_floor_ms") or 0.0
        for r in doc.get("results", []):
            if not str(r.get("goal", "")).startswith("decode") or not r.get("bytes"):
                continue
            r = refloor(r, doc["ceilings"])  # today's floor (the int8 ceiling), as kernels_table shows it
            if r["floor_ms"] < LAUNCH_MARGIN * lf:
                continue
            bytes_floor = r["bytes"] / (doc["ceilings"]["copy_TBps"] * 1e12) * 1e3
            cases.append({"name": r["name"], "source": os.path.basename(path), "bytes": int(r["bytes"]),
                          "floor_ms": r["floor_ms"], "flops": r.get("flops", 0),
                          "floor_kind": "bytes" if r["floor_ms"] <= 1.001 * bytes_floor else "flops",
                          "cold_ms": r.get("graph_cold_ms"), "goal_met": r.get("goal_met")})
    return cases


def verdict(c: dict, read_floor_ms: float | None) -> dict:
    """Case c (from decode_cases) with its read floor and what follows from it: the goal's budget (2x the bytes /
    FLOP floor), read_bound (the read alone exceeds it) and the kernel's cold time over the read floor; a case
    without a read floor (above --max-mb) gets None for those."""
    if read_floor_ms is None:
        return dict(c, read_floor_ms=None, budget_ms=2 * c["floor_ms"], read_bound=None, cold_over_read_floor=None)
    return dict(c, read_floor_ms=read_floor_ms, budget_ms=2 * c["floor_ms"],
                read_bound=read_floor_ms > 2 * c["floor_ms"],
                cold_over_read_floor=(c["cold_ms"] / read_floor_ms) if c.get("cold_ms") else None)


def rederive(path: str, jsons: list[str]) -> dict:
    """Recompute a kept read-floor JSON's floors and verdicts from the kernel JSONs as `decode_cases` reads them
    now (today's `floors.floor_ms`), keeping every measured read floor; the document says when and why."""
    doc = json.load(open(path))
    now = {c["name"]: c for c in decode_cases(jsons)}
    cases = []
    for c in doc["cases"]:
        if c["name"] not in now:
            raise SystemExit(f"read_floor --rederive: {c['name']} (in {path}) is no decode case of {jsons}")
        keep = {k: c[k] for k in ("read_config", "torch_sum_cold_ms", "bytes_floor_ms_here") if k in c}
        cases.append({**verdict(now[c["name"]], c.get("read_floor_ms")), **keep})
    doc["cases"] = cases
    doc.setdefault("rederived", []).append({"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                            "why": "floors and verdicts from the kernel JSONs as decode_cases reads "
                                                   "them now (floors.floor_ms: int8 at 2x the bf16 rate)"})
    return doc


def _configs(n_int32: int, sms: int, sweep: str = "default"):
    """(name, grid, CHUNK, BLOCK, UNROLL, num_warps) of the read kernels for a buffer of n_int32 elements:
    SWEEPS[sweep]'s programs an SM and load sizes, 1-2 loads in flight a program (no more than its chunk needs)."""
    per_sms, blocks = SWEEPS[sweep]
    out = []
    for per_sm in per_sms:
        chunk = triton.cdiv(n_int32, per_sm * sms)
        chunk = triton.cdiv(chunk, 16) * 16  # 64-byte aligned chunks: see _read_kernel
        for block in blocks:
            for unroll in (1, 2):
                small = block == blocks[0] and unroll == 1  # always one configuration per grid
                if not small and (block * unroll > 2 * triton.next_power_of_2(chunk)
                                  or (unroll > 1 and block * unroll // 2 >= chunk)):
                    continue
                nw = 8 if block >= 4096 else 4
                out.append((f"p{per_sm}_b{block}_u{unroll}_w{nw}", triton.cdiv(n_int32, chunk), chunk, block, unroll,
                            nw))
    return out


def measure(nbytes: int, ms_graph, torch, rep: int = 40, confirm: int = 3, sweep: str = "default") -> dict:
    """Cold replay times of the read kernels and torch's sum over nbytes; the best few timed again."""
    from dsv41c.codegen.triton.targets import sm_count

    n = triton.cdiv(nbytes, 64) * 16  # whole 64-byte runs (< 64 bytes more than the case's): see _read_kernel
    buf = torch.randint(-1000, 1000, (n,), dtype=torch.int32, device="cuda")
    sms = sm_count(buf.device)
    out = torch.empty(max(SWEEPS[sweep][0]) * sms + 1, dtype=torch.int32, device="cuda")  # one sum a program
    times, calls = {}, {}
    for name, grid, chunk, block, unroll, nw in _configs(n, sms, sweep):
        def f(grid=grid, chunk=chunk, block=block, unroll=unroll, nw=nw):
            _read_kernel[(grid,)](buf, out, n, CHUNK=chunk, BLOCK=block, UNROLL=unroll, num_warps=nw)
        f()
        assert int(out[:grid].sum()) == int(buf.sum()), name  # every byte read
        t = ms_graph(f, rep=rep)
        if isinstance(t, float) and t.cold is not None:
            times[name], calls[name] = t.cold, f
    t = ms_graph(lambda: buf.sum(), rep=rep)
    torch_sum = t.cold if isinstance(t, float) else None
    best = sorted(times, key=times.get)[:confirm]
    again = {}
    for name in best:  # the winners again with a larger budget: the cold time is a difference of two medians
        t = ms_graph(calls[name], rep=4 * rep)
        again[name] = t.cold if isinstance(t, float) else None
    pick = min((k for k in again if again[k] is not None), key=again.get)
    return {"bytes": nbytes, "read_floor_ms": again[pick], "config": pick, "torch_sum_cold_ms": torch_sum,
            "sweep_cold_ms": times, "confirm_cold_ms": again}


def run(args) -> dict:
    import torch

    from benchmarks.common import env_info, measure_ceilings, ms_graph, write_json

    ceil = measure_ceilings()
    cases = decode_cases(args.json)
    if not cases:
        raise SystemExit(f"read_floor: no decode case with bytes in {args.json}")
    if args.only:
        cases = [c for c in cases if any(k in c["name"] for k in args.only.split(","))]
    seen: dict = {}
    for c in cases:
        if c["bytes"] > args.max_mb * 1e6:  # the big cases (all met): bandwidth, not fixed cost, sets their time
            c.update(verdict(c, None))
            continue
        if c["bytes"] not in seen:
            seen[c["bytes"]] = measure(c["bytes"], ms_graph, torch, rep=args.rep,
                                       sweep="wide" if args.wide else "default")
            print(json.dumps({"bytes": c["bytes"], "read_floor_us": round(seen[c["bytes"]]["read_floor_ms"] * 1e3, 2),
                              "config": seen[c["bytes"]]["config"]}), flush=True)
        m = seen[c["bytes"]]
        # the floor measured here (this run's copy bandwidth), and the case's own floor from its run
        c.update(verdict(c, m["read_floor_ms"]), bytes_floor_ms_here=c["bytes"] / (ceil["copy_TBps"] * 1e12) * 1e3,
                 read_config=m["config"], torch_sum_cold_ms=m["torch_sum_cold_ms"])
        # after each case: a run stopped at its time limit keeps the cases it has (kernels_table reads them)
        write_json(args.out, {"kind": "read_floor", "partial": True, "env": env_info(), "ceilings": ceil,
                              "cases": [x for x in cases if "read_floor_ms" in x],
                              "sweeps": {str(k): v for k, v in seen.items()}})
    doc = {"kind": "read_floor", "env": env_info(), "ceilings": ceil, "cases": cases,
           "sweeps": {str(k): v for k, v in seen.items()}}
    write_json(args.out, doc)  # the whole run: no "partial"
    for c in cases:
        if c["read_floor_ms"] is None:
            continue
        print(f"{c['name']:44s} {c['bytes'] / 1e6:8.2f} MB floor {c['floor_ms'] * 1e3:6.2f} ({c['floor_kind']}) "
              f"budget {c['budget_ms'] * 1e3:6.2f} read {c['read_floor_ms'] * 1e3:6.2f} µs "
              f"cold {(c['cold_ms'] or 0) * 1e3:6.1f} -> {'READ-BOUND' if c['read_bound'] else 'reachable'}")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="kernel benchmark JSON (benchmarks/results/kernels_*.json)")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument("--max-mb", type=float, default=64.0,
                    help="cases above this many MB get no read floor (default 64)")
    ap.add_argument("--only", default=None, help="comma-separated substrings of case names to measure")
    ap.add_argument("--rep", type=int, default=40, help="replay budget (ms) of each sweep timing; 4x for the best 3")
    ap.add_argument("--wide", action="store_true", help="also 16 programs an SM and 2 KB loads (a wider sweep)")
    ap.add_argument("--list", action="store_true", help="print the decode cases and their bytes; no GPU needed")
    ap.add_argument("--rederive", metavar="READ_FLOOR_JSON", default=None,
                    help="recompute that kept file's floors and verdicts from the kernel JSONs (no GPU; writes --out)")
    args = ap.parse_args(argv)
    if args.rederive:
        from benchmarks.common import write_json

        write_json(args.out or args.rederive, rederive(args.rederive, args.json))
        return 0
    if args.list:
        for c in decode_cases(args.json):
            print(f"{c['name']:44s} {c['bytes'] / 1e6:9.2f} MB  floor {c['floor_ms'] * 1e3:7.2f} µs")
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
