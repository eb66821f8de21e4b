"""Render the kernel benchmark JSON (benchmarks/results/*.json) as the markdown tables of docs/KERNELS.md.

Usage: python benchmarks/kernels_table.py benchmarks/results/kernels_attention.json benchmarks/results/kernels_ffn.json
Columns: Triton median time, eager PyTorch reference time, speedup, the floor (max of
bytes / measured copy bandwidth and FLOPs / measured matrix rate), time over floor, the
correctness figure the script recorded, and the issue's goal where one applies.
"""
import json
import sys


def _err(r) -> str:
    e = r.get("error", r.get("rel_err"))
    if isinstance(e, dict):
        return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in e.items()
                         if not isinstance(v, dict))
    return "" if e is None else f"rel {e:.2e}"


def _f(v, fmt="{:.3f}") -> str:
    return "–" if v is None else fmt.format(v)


def render(path: str) -> str:
    d = json.load(open(path))
    ceil = d.get("ceilings", {})
    env = d.get("env", {k: d.get(k) for k in ("gpu", "torch", "triton")})
    lines = [f"`{path}` — {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}; measured "
             f"ceilings: copy {ceil.get('copy_TBps', 0):.2f} TB/s, bf16 matmul {ceil.get('bf16_TFLOPs', 0):.0f} TFLOP/s",
             "", "| kernel | Triton ms | eager ms | speedup | floor ms | × floor | bf16-rate frac | check | goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in d["results"]:
        over = r.get("triton_over_floor", r.get("time_over_floor"))
        goal = r.get("goal") or ""
        if goal:
            goal += " ✔" if r.get("goal_met") else " ✘"
        frac = r.get("frac_bf16_rate")
        lines.append(f"| {r['name']} | {_f(r.get('triton_ms'), '{:.4f}')} | {_f(r.get('eager_ms'), '{:.4f}')} | "
                     f"{_f(r.get('speedup_vs_eager'), '{:.1f}×')} | {_f(r.get('floor_ms'), '{:.4f}')} | "
                     f"{_f(over, '{:.2f}')} | {_f(frac, '{:.0%}')} | {_err(r)} | {goal} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(render(p) for p in sys.argv[1:]))
