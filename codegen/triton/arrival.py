"""Last-arriver reduction: fold a split-K (or any split) epilogue into the same launch.

Algorithm ("serial split-K", as in CUDA's threadFenceReduction sample): every program of a
group writes its fp32 partial to a workspace, then takes a ticket from a per-group int32
counter with a gpu-scope acquire-release atomic. The program that draws the last ticket has
seen (acquire) every other program's partial (release) and runs the epilogue: it reads the
partials back in split order, so the sum is deterministic (the same order as a separate
reduce kernel), and resets the counter to 0 so the next launch (or CUDA-graph replay) starts
clean. This saves the second launch (~1-2 us at decode shapes) that a separate reduction costs.

Memory-model notes: `tl.debug_barrier()` (bar.sync) orders every thread's partial stores
before the releasing atomic, whose release is cumulative over what the CTA barrier made
visible to the issuing thread; the last program reads partials with `.cg` loads (L2, not the
non-coherent L1, which may hold lines from a previous replay).

Known gaps: the counters live in per-device buffers owned by this module (`counters`), so two
launches that use the same buffer must not run concurrently on different streams: users that may
(the shared expert's FP8 GEMMs on moe_forward's side stream vs the fused router on the main one: "split"
and "router"; indexer_topk's candidate selection on the side stream vs its top-k: "topk_side" and "split")
take different `pool`s. The runtime's memory planner will own them once it exists. Under TRITON_INTERPRET programs run one
after another, so the last ticket is simply the last program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.triton.pdl import grid_release, grid_wait

_COUNTERS: dict = {}


@triton.jit
def arrive_last(counter_ptr, n_arrivals):
    """Call after storing this program's partial: True in exactly one program, the last to arrive."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    return ticket == n_arrivals - 1


@triton.jit
def reset_counter(counter_ptr):
    """The last arriver leaves the counter at 0 for the next launch."""
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def signal_done(counter_ptr):
    """After a program's stores: count it in (the CTA barrier orders every thread's stores before the
    gpu-scope release, as in `arrive_last`). The other half of `wait_count`."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def wait_count(counter_ptr, n):
    """Spin until the counter reaches n (gpu-scope acquire: the counted programs' stores are visible to
    this program's loads after it). Written as an atomic add of 0; LLVM turns that into an acquire load
    (sm90 SASS: LDG.E.STRONG.GPU then CCTL.IVALL, the L1 invalidate), so polling adds no atomics."""
    c = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while c < n:
        c = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def wait_inputs(ready_ptr, READY: tl.constexpr, PDL: tl.constexpr, RELEASE: tl.constexpr):
    """Before a kernel reads its producer's output: READY > 0 spins until the counter at ready_ptr reaches READY
    (`wait_count`: the producer counts its finished tiles), else the PDL grid dependency wait (pdl.py); then, with
    RELEASE, releases the dependent grid (a caller with more waits to come releases itself later)."""
    if READY > 0:
        wait_count(ready_ptr, READY)
    else:
        grid_wait(PDL)
    if RELEASE:
        grid_release(PDL)


_RETIRED: list = []


def counters(device, n: int, pool: str = "split") -> torch.Tensor:
    """n zeroed int32 counters on `device` from buffer `pool` (kernels leave them zeroed; grown, never
    shrunk). A buffer that is outgrown is kept alive, never freed: a CUDA graph captured earlier still
    points at it. Kernels that may run concurrently on two streams must use different pools."""
    key = (torch.device(device).type, torch.device(device).index, pool)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf
