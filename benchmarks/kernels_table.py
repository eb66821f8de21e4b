"""Render the kernel benchmark JSON (benchmarks/results/*.json) as the markdown tables of docs/KERNELS.md.

Usage: python benchmarks/kernels_table.py [--read-floor benchmarks/results/read_floor.json]
           benchmarks/results/kernels_attention.json benchmarks/results/kernels_ffn.json
           [benchmarks/results/compiled_baseline.json]
(compiled_baseline.py's JSON renders as its own table: each case against eager and torch.compile.)
Columns: Triton median time (do_bench), its CUDA-graph replay time where measured (decode
shapes; warm L2, and "cold": L2 flushed before each replay, which the decode verdict uses), eager PyTorch reference time, speedup, the floor (max of bytes / measured copy
bandwidth and FLOPs / measured matrix rate), the better time over the floor, the correctness
figure the script recorded, and the kernel's speed goal where one applies (✔/✘; "launch-bound" where
the floor is below the measured launch floor of an empty kernel). Rows whose floor today's `floors.floor_ms`
computes differently from the run (the int8 ceiling, corrected after some runs were kept) are recomputed and marked †.
With --read-floor (benchmarks/read_floor.py's
JSON), a "read floor ms" column gives, for the decode cases it measured, the least L2-cold time of a kernel that
only reads those bytes, and the goal cell says "read-bound" where that alone exceeds 2x the bytes floor.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.floors import refloor  # noqa: E402


def _err(r) -> str:
    e = r.get("error", r.get("rel_err"))
    if isinstance(e, dict):
        return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in e.items()
                         if not isinstance(v, dict))
    return "" if e is None else f"rel {e:.2e}"


def _f(v, fmt="{:.3f}") -> str:
    return "–" if v is None else fmt.format(v)


def render_compiled(path: str, d: dict) -> str:
    """benchmarks/compiled_baseline.py's JSON: each case against eager PyTorch and torch.compile of its reference."""
    env = d.get("env", {})
    lines = [f"`{path}` — {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}. × eager: do_bench "
             "medians (host launch path included); × torch.compile: CUDA-graph replay with the L2 flushed (graph cold) "
             "at decode shapes where both sides can be captured, else do_bench medians; `run`: the row's run (the "
             "JSON's `runs`)", "",
             "| case | ours µs | ours graph cold µs | eager µs | torch.compile µs | torch.compile graph cold µs | × eager | "
             "× torch.compile | compile s | compiled vs eager | run | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    us = lambda v: "–" if not isinstance(v, (int, float)) or v != v else f"{v * 1e3:.1f}"  # noqa: E731
    for r in d["results"]:
        if "error" in r:
            lines.append(f"| {r['name']} | FAILED: {str(r['error'])[:80]} |")
            continue
        note = r.get("compile_error") or r.get("compile_skipped") or r.get("compiled_graph_error") or ""
        if "synchronizes" in note:
            note = "no graph: the reference syncs with the host"
        elif "capture" in note:
            note = "no graph: its capture failed"
        note = (note + "; " if note else "") + r.get("note", "")
        rel = r.get("compiled_vs_eager_rel")
        basis = "" if r.get("ratio_basis") == "graph_cold" else " (do_bench)"
        lines.append(f"| {r['name']} | {us(r.get('ours_ms'))} | {us(r.get('ours_graph_cold_ms'))} | "
                     f"{us(r.get('eager_ms'))} | {us(r.get('compiled_ms'))} | {us(r.get('compiled_graph_cold_ms'))} | "
                     f"{_f(r.get('ours_vs_eager'), '{:.1f}×')} | {_f(r.get('ours_vs_compiled'), '{:.2f}×')}{basis} | "
                     f"{_f(r.get('compile_s'), '{:.1f}')} | {'–' if rel is None or rel != rel else f'{rel:.1e}'} | "
                     f"{r.get('run', '')} | {note.strip('; ')} |")
    return "\n".join(lines)


def render(path: str, read: dict | None = None) -> str:
    """The markdown table of one benchmark JSON; read: read_floor.json's cases by name (adds its column)."""
    d = json.load(open(path))
    if d.get("kind") == "compiled_baseline":
        return render_compiled(path, d)
    ceil = d.get("ceilings", {})
    env = d.get("env", {k: d.get(k) for k in ("gpu", "torch", "triton")})
    lines = [f"`{path}` — {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}; measured "
             f"ceilings: copy {ceil.get('copy_TBps', 0):.2f} TB/s, bf16 matmul {ceil.get('bf16_TFLOPs', 0):.0f} TFLOP/s"
             + (f", launch floor {ceil['launch_floor_ms'] * 1e3:.1f} µs" if ceil.get("launch_floor_ms") else ""),
             "", "| kernel | Triton ms | graph ms | cold graph ms | eager ms | speedup | torch.compile ms | floor ms "
             + ("| read floor ms " if read is not None else "")
             + "| × floor | bf16-rate frac | check | goal |", "|---|---|---|---|---|---|---|---|---|---|---|---|"
             + ("---|" if read is not None else "")]
    # rows re-run later and merged into the file (its "merged" entries) keep their own run's ceilings
    own = {n: m["ceilings"] for m in d.get("merged", []) if m.get("ceilings") for n in m.get("rows", [])}
    refloored = False
    for r in d["results"]:
        if "name" in r and "triton_ms" not in r:
            lines.append(f"| {r['name']} | FAILED: {str(r.get('error'))[:80]} |")
            continue
        r = refloor(r, own.get(r["name"], ceil))
        mark = " †" if "refloored_from" in r else ""
        refloored = refloored or bool(mark)
        g = r.get("graph_ms", r.get("triton_cudagraph_ms"))
        g = g if isinstance(g, float) else None
        over = r.get("best_over_floor")
        if over is None:  # rows timed cold without a decode verdict: the better of do_bench and the cold replay too
            ts = [t for t in (r.get("triton_ms"), r.get("graph_cold_ms")) if isinstance(t, float)]
            over = (min(ts) / r["floor_ms"] if ts and r.get("floor_ms")
                    else r.get("triton_over_floor", r.get("time_over_floor")))
        goal = r.get("goal") or ""
        rf = (read or {}).get(r["name"], {}).get("read_floor_ms")
        if goal:
            goal += " ✔" if r.get("goal_met") else " ✘"
            read_bound = not r.get("goal_met") and rf is not None and rf > 2 * r["floor_ms"]  # against today's floor
            why = [w for w, on in (("launch-bound", r.get("launch_bound")), ("read-bound", read_bound)) if on]
            if why:
                goal += f" ({', '.join(why)})"
        rcol = f"{_f(rf, '{:.4f}')} | " if read is not None else ""
        frac = r.get("frac_bf16_rate")
        lines.append(f"| {r['name']}{mark} | {_f(r.get('triton_ms'), '{:.4f}')} | {_f(g, '{:.4f}')} | "
                     f"{_f(r.get('graph_cold_ms'), '{:.4f}')} | "
                     f"{_f(r.get('eager_ms'), '{:.4f}')} | "
                     f"{_f(r.get('speedup_vs_eager'), '{:.1f}×')} | {_f(r.get('compiled_ms'), '{:.4f}')} | "
                     f"{_f(r.get('floor_ms'), '{:.4f}')} | {rcol}"
                     f"{_f(over, '{:.2f}')} | {_f(frac, '{:.0%}')} | {_err(r)} | {goal} |")
    if own:
        rerun = sorted({n for m in d.get("merged", []) for n in m.get("rows", [])})
        lines += ["", f"Rows re-run later and merged into this file ({len(rerun)}, the JSON's `merged` entries: "
                  + ", ".join(rerun) + ") are floored with their own run's ceilings."]
    if refloored:
        lines += ["", "† floor and verdicts recomputed from the row's own bytes, FLOPs and times and its run's ceilings "
                  "by `floors.floor_ms` as it is now (int8 at twice the bf16 rate, `floors.int8_rate`); the JSON keeps "
                  "the run's floor (`floors.refloor`)."]
    return "\n".join(lines)


def render_combined(paths: list[str], read: dict | None = None) -> str:
    """One table over several kernel-benchmark JSONs and compiled_baseline.py's JSON: every kernel row with its
    eager reference, torch.compile of that reference (compiled_baseline's ratio, both sides from one run, where it
    has the case; else the kernel JSON's own do_bench of it) and its floor."""
    docs = [(p, json.load(open(p))) for p in paths]
    comp = {r["name"]: r for p, d in docs if d.get("kind") == "compiled_baseline" for r in d["results"] if "error" not in r}
    lines = []
    for p, d in docs:
        env = d.get("env", {k: d.get(k) for k in ("gpu", "torch", "triton")})
        ceil = d.get("ceilings", {})
        what = (f"measured ceilings: copy {ceil.get('copy_TBps', 0):.2f} TB/s, bf16 matmul {ceil.get('bf16_TFLOPs', 0):.0f} "
                f"TFLOP/s" + (f", launch floor {ceil['launch_floor_ms'] * 1e3:.1f} µs" if ceil.get("launch_floor_ms") else "")
                if d.get("kind") != "compiled_baseline" else "the torch.compile column")
        lines.append(f"- `{p}`: {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}; {what}")
    lines += ["", "| kernel | do_bench ms | cold graph ms | eager ms | × eager | torch.compile ms | × torch.compile "
              "| floor ms | read floor ms | × floor | check | goal |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    refloored = False
    for p, d in docs:
        if d.get("kind") == "compiled_baseline":
            continue
        ceil = d.get("ceilings", {})
        own = {n: m["ceilings"] for m in d.get("merged", []) if m.get("ceilings") for n in m.get("rows", [])}
        for r in d["results"]:
            if "name" in r and "triton_ms" not in r:
                lines.append(f"| {r['name']} | FAILED: {str(r.get('error'))[:80] or '–'} |" + " |" * 10)
                continue
            if r.get("eager_ms") is None:  # a sweep row (configurations timed, no reference): not a kernel figure
                continue
            r = refloor(r, own.get(r["name"], ceil))
            mark = " †" if "refloored_from" in r else ""
            refloored = refloored or bool(mark)
            over = r.get("best_over_floor")
            if over is None:
                ts = [t for t in (r.get("triton_ms"), r.get("graph_cold_ms")) if isinstance(t, float)]
                over = (min(ts) / r["floor_ms"] if ts and r.get("floor_ms")
                        else r.get("triton_over_floor", r.get("time_over_floor")))
            # compiled_baseline names the indexer's default configuration without the kernel JSON's `_bt128`
            c = comp.get(r["name"], comp.get(r["name"].removesuffix("_bt128")))
            if c is not None and isinstance(c.get("ours_vs_compiled"), (int, float)):
                cold = c.get("ratio_basis") == "graph_cold"
                tc = c.get("compiled_graph_cold_ms") if cold else c.get("compiled_ms")
                tcx = f"{c['ours_vs_compiled']:.2f}×" + ("" if cold else " ᵈ")
            elif isinstance(r.get("compiled_ms"), float) and r.get("triton_ms"):
                tc, tcx = r["compiled_ms"], f"{r['compiled_ms'] / r['triton_ms']:.2f}× ᵈ"
            else:
                tc, tcx = None, "–"
            goal = r.get("goal") or ""
            rf = (read or {}).get(r["name"], {}).get("read_floor_ms")
            if goal:
                goal += " ✔" if r.get("goal_met") else " ✘"
                read_bound = not r.get("goal_met") and rf is not None and rf > 2 * r["floor_ms"]
                why = [w for w, on in (("launch-bound", r.get("launch_bound")), ("read-bound", read_bound)) if on]
                if why:
                    goal += f" ({', '.join(why)})"
            lines.append(f"| {r['name']}{mark} | {_f(r.get('triton_ms'), '{:.4f}')} | {_f(r.get('graph_cold_ms'), '{:.4f}')} | "
                         f"{_f(r.get('eager_ms'), '{:.4f}')} | {_f(r.get('speedup_vs_eager'), '{:.1f}×')} | "
                         f"{_f(tc, '{:.4f}')} | {tcx} | {_f(r.get('floor_ms'), '{:.4f}')} | {_f(rf, '{:.4f}')} | "
                         f"{_f(over, '{:.2f}')} | {_err(r)} | {goal} |")
    lines += ["", "× torch.compile: torch.compile's time over ours, both L2-cold CUDA-graph replays from one run of "
              "`compiled_baseline.py`; ᵈ: do_bench medians instead (no graph on one side, or a prefill shape)."]
    if refloored:
        lines += ["", "† floor and verdicts recomputed from the row's own bytes, FLOPs and times and its run's ceilings "
                  "by `floors.floor_ms` as it is now (`floors.refloor`); the JSON keeps the run's floor."]
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    read, combined = None, False
    if args[:1] == ["--combined"]:
        combined, args = True, args[1:]
    if args[:1] == ["--read-floor"]:
        read = {c["name"]: c for c in json.load(open(args[1]))["cases"]}
        args = args[2:]
    print(render_combined(args, read) if combined else "\n\n".join(render(p, read) for p in args))
