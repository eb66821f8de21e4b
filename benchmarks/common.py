"""What every kernel benchmark shares: timing, the measured ceilings, floors, errors, JSON output.

Timing: `ms` is the median of `triton.testing.do_bench` (events around each call, L2 flushed
between calls); at decode shapes that includes the host launch path, so `ms_graph` also times
CUDA-graph replay (`do_bench_cudagraph`: the way the runtime replays a decode step), which is
the kernel's device time plus the in-graph launch gap. Replaying the same call keeps inputs
that fit the L2 (50 MB on an H200) in the L2, which a real decode step over 40 layers of weights
does not, so `ms_graph` also measures a "cold" replay (L2 flushed by a read of twice its size
before each call, the flush's own time subtracted); the decode verdict (`decode_goal`) uses it.

`ms_compiled` times torch.compile of the eager reference on the same inputs (Inductor, default
mode), for the kernels where that comparison is cheap to make (a few elementwise/reduction ones).

Ceilings (measured in the same process, so every ratio is same run, same GPU): copy bandwidth
(1 GiB device-to-device copy, bytes read + written), the bf16 / fp32 / int8 matmul rates
(8192³ torch products), and the launch floor: the graph-replay time of a Triton kernel that
copies one float, the least any kernel that reads and writes memory costs on this GPU.

Floors (`floors.py`, re-exported here): `floor_ms` = max(bytes / copy bandwidth, FLOPs / matmul rate of the
kind the kernel uses; int8 at twice the bf16 rate, `int8_rate`). A decode kernel that moves a few hundred KB
has a bytes floor far below one launch; the entries record both the plain bytes floor and `launch_floor_ms`,
and say which one they beat.

Known gaps: the ceilings are one measurement each (no repeat spread); the launch floor is one
tiny kernel, not a kernel with this one's argument count; the cold time is a difference of two
medians (~0.5 µs of noise).
"""
from __future__ import annotations

import json
import os
import platform
import time
import traceback

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from benchmarks.floors import decode_verdict, floor_ms, int8_rate, refloor  # noqa: F401 (re-exported)

DEV = "cuda"


def ms(fn, rep: int = 100) -> float:
    """Median milliseconds of fn() under triton.testing.do_bench (rep is its budget in ms)."""
    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


class GraphTime(float):
    """A graph-replay median (ms, L2 warm: the same inputs every replay) carrying `.cold`: the same
    call with L2 flushed before each replay (see `ms_graph`), or None where it was not measured."""
    cold = None


_FLUSH: list = []


def _flush_buffer() -> torch.Tensor:
    """Twice the L2 of int32, read before each cold replay so the kernel's inputs come from HBM."""
    if not _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 * 2**20
        _FLUSH.append(torch.empty(2 * l2 // 4, dtype=torch.int32, device=DEV))
    return _FLUSH[0]


def ms_graph(fn, rep: int = 100, cold: bool = True):
    """Median milliseconds of one fn() replayed from a CUDA graph; a string saying why when it cannot be captured.

    Replaying the same call keeps inputs smaller than the L2 (50 MB on an H200) in the L2, which a real
    decode step (40 layers of weights) does not; so `.cold` of the result is also measured: the graph
    of (flush, fn) minus the graph of (flush) alone, where flush READS twice the L2 (a sum), so the
    L2 is left holding clean lines: a flush that writes (zero_) leaves dirty lines whose write-back
    then competes with the kernel's reads and inflates the time. The difference of two medians
    carries ~0.5 µs of noise."""
    try:
        from triton.testing import do_bench_cudagraph

        t = GraphTime(do_bench_cudagraph(fn, rep=rep, return_mode="median"))
        if cold:
            buf = _flush_buffer()
            both = do_bench_cudagraph(lambda: (buf.sum(), fn()), rep=rep, return_mode="median")
            alone = do_bench_cudagraph(lambda: buf.sum(), rep=rep, return_mode="median")
            t.cold = max(float(both) - float(alone), 0.0)
        return t
    except Exception as e:  # noqa: BLE001 - recorded in the JSON, not fatal
        return f"unavailable: {type(e).__name__}: {e}"[:300]


def ms_compiled(fn, *args, rep: int = 100) -> dict:
    """torch.compile(fn) on these args: its median ms and its compile seconds (or why it failed)."""
    try:
        t0 = time.time()
        cfn = torch.compile(fn, dynamic=False)
        cfn(*args)
        torch.cuda.synchronize()
        return {"compiled_ms": ms(lambda: cfn(*args), rep=rep), "compile_s": time.time() - t0}
    except Exception as e:  # noqa: BLE001 - recorded in the JSON, not fatal
        return {"compiled_ms": None, "compile_error": f"{type(e).__name__}: {e}"[:300]}


@triton.jit
def _one_element_copy_kernel(x_ptr, y_ptr):
    tl.store(y_ptr, tl.load(x_ptr))


def launch_floor_ms() -> float:
    """Graph-replay time of a kernel that copies one float: the least any kernel that reads and writes
    memory costs here (one launch + one dependent memory round trip)."""
    x = torch.ones(1, device=DEV)
    y = torch.empty(1, device=DEV)
    t = ms_graph(lambda: _one_element_copy_kernel[(1,)](x, y), cold=False)
    return t if isinstance(t, float) else float("nan")


def measure_ceilings(int8: bool = False, fp32: bool = False) -> dict:
    out = {}
    n = 1 << 29  # 1 GiB of bf16, several times the 50 MB L2
    a = torch.empty(n, dtype=torch.bfloat16, device=DEV).normal_()
    b = torch.empty_like(a)
    out["copy_TBps"] = 2 * a.numel() * 2 / (ms(lambda: b.copy_(a)) * 1e-3) / 1e12
    a = b = None  # free the 2 GiB before the GEMMs
    m = 8192
    x = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    out["bf16_TFLOPs"] = 2 * m**3 / (ms(lambda: x @ y) * 1e-3) / 1e12
    if fp32:
        xf, yf = x.float(), y.float()
        out["fp32_TFLOPs"] = 2 * m**3 / (ms(lambda: xf @ yf) * 1e-3) / 1e12
        xf = yf = None
    if int8:
        try:
            xi = torch.randint(-8, 8, (m, m), device=DEV, dtype=torch.int8)
            yi = torch.randint(-8, 8, (m, m), device=DEV, dtype=torch.int8)
            out["int8_TOPs"] = 2 * m**3 / (ms(lambda: torch._int_mm(xi, yi)) * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - the int8 floor then falls back to 2x bf16
            out["int8_TOPs"] = None
            out["int8_error"] = str(e)[:200]
    out["launch_floor_ms"] = launch_floor_ms()
    return out


def decode_goal(e: dict, ceil: dict, t_graph) -> dict:
    """Fill the 'decode within 2x of the bytes floor' verdict of entry e from its graph-replay time
    (`floors.decode_verdict`: the L2-cold replay time where it was measured, else the warm one)."""
    e["graph_ms"] = t_graph
    e["graph_cold_ms"] = getattr(t_graph, "cold", None)
    e["goal"] = "decode <= 2x bytes floor"
    e.update(decode_verdict(e, e["floor_ms"], ceil))
    return e


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def max_rel(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {"max_abs": float((a - b).abs().max()), "max_rel": float(((a - b).abs() / (b.abs() + 1e-3)).max())}


def guarded(out: list, name: str, fn) -> None:
    """Run one measurement; a failure is recorded under its name and the next case still runs."""
    try:
        e = fn()
        out.append(e)
        keys = ("name", "triton_ms", "graph_ms", "eager_ms", "floor_ms", "rel_err", "goal_met")
        print(json.dumps({k: e[k] for k in keys if k in e}, default=str), flush=True)
    except Exception as ex:  # noqa: BLE001 - one failing kernel must not lose the others
        out.append({"name": name, "error": f"{type(ex).__name__}: {ex}", "traceback": traceback.format_exc()[-3000:]})
        print(f"[{name}] FAILED: {ex!r}"[:500], flush=True)
    torch.cuda.empty_cache()


def env_info() -> dict:
    return {"host": platform.node(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def write_json(path: str | None, doc: dict) -> None:
    """Write doc atomically (a crash mid-write leaves the previous file); no path: nothing to write."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)
