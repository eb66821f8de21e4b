"""L2 bulk prefetch of byte ranges a program will read later (the compressor's decode tail).

Why: a decode GEMV streams each weight byte once, so its speed is the number of bytes it keeps in
flight. A program that loads its tile chunk by chunk has only its software-pipeline depth in flight
(a few KB per SM), and the first chunk pays a full DRAM round trip after launch. On sm90+ one
`cp.async.bulk.prefetch.L2.global [addr], size` per weight row asks the memory system for the whole
row range at once (no registers, no shared memory, nothing waits on it); the program's own loads
then hit the L2. Issued before the grid-dependency wait (pdl.py), the requests also overlap the
previous kernel's tail.

Contract: addresses 16-byte aligned and sizes multiples of 16 (the launchers check the base
pointers; rows start at multiples of K, a multiple of 16, plus whole 128-column tiles). Rows past
the matrix are clamped to its last row by the caller (a duplicate prefetch is harmless; a size of
0 is not allowed). Only resident programs prefetch, so the bytes requested at once are bounded by
(resident programs × their slab), not by the matrix.

Where: CUDA sm90+ (`l2_prefetch_for`), not under TRITON_INTERPRET, not on ROCm. Used by compressor.py's
one-launch decode (`_prefetch_tail`: the tail's wk, norm weights and RoPE rows, read only by the last arriver).

Not used by the decode GEMVs, where it was measured slower (H200, benchmarks/tuning/tune_fp8_prefetch.json, L2-cold
graph replay): every decode linear got slower with it — wo_b at one token 18.6 -> 20.2 µs (64 KB a
program) / 22.2 µs (the whole split), shared w13 15.0 -> 18.4 µs, engram wkv at 8 tokens 73.5 ->
75.9 / 99.3 µs — and the MoE decode GEMVs, which had it on their 32 KB slabs for one run, went from
54.5 to 75.9 µs at one token, PDL on in both (tuning/tune_moe_decode_prefetch.json against
tuning/tune_moe_decode_pdl.json; removed there). The programs' own loads
already keep HBM busy; the bulk requests compete with them and, in the waterfall loop ptxas emits
(the instruction takes uniform operands), are issued once per row by every warp that holds it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from dsv41c.codegen.triton.pdl import pdl_for

L2_PREFETCH_CUDA = True  # module switch


def l2_prefetch_for(device, *tensors) -> bool:
    """Whether decode GEMVs on `device` prefetch their weight rows (sm90+ CUDA, 16-byte aligned bases)."""
    return L2_PREFETCH_CUDA and pdl_for(device) and all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


@triton.jit
def prefetch_rows_l2(row_ptrs, nbytes, ON: tl.constexpr):
    """One L2 bulk prefetch of nbytes (int32, multiple of 16) from each pointer of row_ptrs (any shape)."""
    if ON:
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; // dummy $0", "=r,l,r",
                                  [row_ptrs, tl.zeros(row_ptrs.shape, tl.int32) + nbytes], dtype=tl.int32,
                                  is_pure=False, pack=1)
