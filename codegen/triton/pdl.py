"""Programmatic dependent launch (PDL): let a decode kernel start while its predecessor drains.

Why: a decode step is a chain of small kernels; between two of them a CUDA graph still pays the
predecessor's tail (its last programs finishing while most SMs idle), the dispatch of the next
grid, and then that grid's first DRAM round trip before any bytes stream. On sm90+ a kernel
launched with the programmatic-stream-serialization attribute (Triton: `launch_pdl=True`) may be
scheduled as soon as every program of the previous kernel has executed
`griddepcontrol.launch_dependents` (or exited); it must execute `griddepcontrol.wait` before it
touches anything that kernel writes — the wait returns when the predecessor has completed and its
memory is visible. What a kernel does BEFORE its wait overlaps the predecessor: address math, and
loads of data that cannot be in flight, i.e. the weights.

The contract every PDL kernel in this package keeps (so that chains of them stay correct):
1. `grid_wait` before the first load of anything a recent kernel may write, and before any store
   or atomic (counters included);
2. `grid_release` only after its own `grid_wait`: then a kernel that starts early knows that the
   kernel TWO launches back has completed (its predecessor passed its wait, which needed that
   one complete), so
3. before its wait a kernel may read static data (weights, scales) and data written at least two
   launches earlier (e.g. the routed experts' ids, produced before the MoE prep kernel), never
   its immediate predecessor's output.
One kernel replaces rule 1's wait with finer ones: moe_decode's down kernel (with its per-slot handoff)
waits per slot on a counter the gate/up kernel releases after each finished tile, and releases its own
dependents only after those waits (its docstring gives the argument).
A kernel that is not PDL-launched (torch's own, or PDL off) simply serializes as usual, and
`griddepcontrol.wait` without a pending dependency returns at once, so mixing is safe.

Where: sm90 and newer CUDA devices (`pdl_for`), not under TRITON_INTERPRET and not on ROCm (the
kernels take a PDL constexpr; with it False no griddepcontrol instruction is emitted, so sm80 and
the AMD targets compile unchanged). `PDL_CUDA = False` turns it off everywhere.

Measured (H200, benchmarks/step_chain.py, results/step_chain.json): what a decode kernel adds to the
step behind the kernel that produces its input, L2-cold, serialized -> PDL: wq_a at one token 5.3-5.5 -> 3.9-4.0
µs, shared w2 at 8 tokens 6.5-6.8 -> 5.2, the router at 8 tokens 12.7-12.8 -> 11.4-11.6, the decode compressor
10.0-10.3 -> 8.7-8.9 (ratio 1). The decode norm (rmsnorm.py) and the decode compressor joined the PDL kernels for it.

Known gaps: the ahead-of-time variants are built with PDL off (the runtime's launcher would have
to set the launch attribute); the kernel tables time single kernels in a graph, where PDL has no
predecessor to overlap, so there it shows only in the multi-launch rows (MoE experts, the whole FFN, sparse
attention with its combine); step_chain.py times two-kernel chains, not a whole decode step.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

PDL_CUDA = True  # module switch: PDL on sm90+ CUDA devices

_CC: dict = {}


def pdl_for(device) -> bool:
    """Whether kernels on `device` are compiled with grid-dependency control and launched with PDL."""
    device = torch.device(device)
    if (not PDL_CUDA or device.type != "cuda" or torch.version.hip is not None
            or os.environ.get("TRITON_INTERPRET", "0") == "1"):
        return False
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _CC:
        _CC[i] = torch.cuda.get_device_capability(i)[0]
    return _CC[i] >= 9


def launch_kw(pdl: bool) -> dict:
    """The launch keyword for a PDL kernel ({} when off: the interpreter and older Tritons take no extra key)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def grid_wait(PDL: tl.constexpr):
    """Block until the previous kernel in the stream has completed and its writes are visible (no-op unless PDL)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def grid_release(PDL: tl.constexpr):
    """Let the next PDL kernel be scheduled once every program got here; call only after `grid_wait`."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
