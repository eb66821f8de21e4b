"""Where the one-launch split top-k spends its time: clock64 reads between the phases of each program.

Usage (a CUDA GPU): python benchmarks/topk_phase_times.py   -> $OUT/topk_phase_times.json (or ./)

`fused_timed` is `indexer_topk._split_fused_kernel` phase for phase (the same helpers, called in the same
order) with a `clock64` read stored after each phase: load, radix level 1 (histogram, atomics, barrier,
digit pick), levels 2-4 (where the row needs them), gather, the gather barrier, rank, exit; plus
%globaltimer at start and end (the programs' start spread). Printed per decode shape (top-512 of 131,072
scores; top-2048 of 16,384 pinned block maxima): min / median / max cycles of each phase over the
programs, the row's end state, and the CUDA-graph replay time of the real kernel in its one-launch and
six-launch forms (20 calls per replay). Keep the copy in step with `_split_fused_kernel` when it changes.
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from dsv41c.codegen.triton import indexer_topk as tk  # noqa: E402
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter  # noqa: E402


@triton.jit
def _clk(x):
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _gt(x):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def fused_timed(idx_ptr, s_ptr, pin_ptr, hist_ptr, state_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr,
                cnt_ptr, times_ptr, N, stride_s, k, cap, n_prog, K: tl.constexpr, CAP: tl.constexpr,
                CHUNK: tl.constexpr, BITS: tl.constexpr, R: tl.constexpr, TB: tl.constexpr, USE_PIN: tl.constexpr):
    NB: tl.constexpr = 1 << BITS
    p = tl.program_id(0)
    row = tl.program_id(1)
    tp = times_ptr + (row * n_prog + p) * 16
    tl.store(tp + 15, _gt(p))
    tl.store(tp + 0, _clk(p))
    cnt = cnt_ptr + row
    hist = hist_ptr + row.to(tl.int64) * (4 * NB)
    i = p * CHUNK + tl.arange(0, CHUNK)
    key, ku, valid = tk._row_keys(s_ptr, pin_ptr, row, i, N, stride_s, USE_PIN)
    b = tl.arange(0, NB)
    tl.store(tp + 1, _clk(tl.sum(valid.to(tl.int32), axis=0)))
    kk, prefix, shift, above, hd, done = tk._fused_level(ku, valid, b, hist, cnt, n_prog, 1, k, 0,
                                                         tl.zeros((), tl.uint32), cap, BITS, 1)
    tl.store(tp + 2, _clk(hd))
    n_sync = p * 0 + 1
    if done == 0:
        kk, prefix, shift, above, hd, done = tk._fused_level(ku, valid, b, hist, cnt, n_prog, 2, kk, above, prefix,
                                                             cap, BITS, 2)
        n_sync = p * 0 + 2
        if done == 0:
            kk, prefix, shift, above, hd, done = tk._fused_level(ku, valid, b, hist, cnt, n_prog, 3, kk, above,
                                                                 prefix, cap, BITS, 3)
            n_sync = p * 0 + 3
            if done == 0:
                kk, prefix, shift, above, hd, done = tk._fused_level(ku, valid, b, hist, cnt, n_prog, 4, kk,
                                                                     above, prefix, cap, BITS, 4)
                n_sync = p * 0 + 4
    tl.store(tp + 3, _clk(hd))
    tk._gather_lists(key, ku, valid, i, prefix, shift.to(tl.uint32), slot_ptr, sure_ptr, bkt_ptr, ties_ptr, row, p,
                     n_prog, K, CAP)
    tl.store(tp + 4, _clk(p))
    tk._grid_sync(cnt, (n_sync + 1) * n_prog)
    tl.store(tp + 5, _clk(p))
    tk._rank_outputs(idx_ptr, s_ptr, pin_ptr, slot_ptr, sure_ptr, bkt_ptr, ties_ptr, N, stride_s, k, n_prog, row, p,
                     prefix, shift, above, hd, kk, K, CAP, CHUNK, R, TB, USE_PIN)
    tl.store(tp + 6, _clk(p))
    if p == 0:
        for lv in range(0, n_sync):
            tl.store(hist + lv * NB + b, tl.zeros((NB,), tl.int32))
        tk._store_state(state_ptr + row * 8, prefix, shift, above, hd, kk, done)
    if arrive_last(cnt, (n_sync + 2) * n_prog):
        reset_counter(cnt)
    tl.store(tp + 7, _clk(p))
    tl.store(tp + 14, _gt(p))


def run(N, k, use_pin):
    dev = torch.device("cuda")
    S = 1
    g = torch.Generator(device="cuda").manual_seed(0)
    s = torch.randn(S, N, device=dev, generator=g)
    pin = torch.full((S,), N - 3, dtype=torch.int32, device=dev) if use_pin else None
    CHUNK = tk.split_chunk(N, S, dev)
    P = triton.cdiv(N, CHUNK)
    K = triton.next_power_of_2(k)
    hist, slots = tk._split_workspace(dev, S, tk._LEVELS)
    cnt = counters(dev, S)
    out = torch.empty((S, k), dtype=torch.int32, device=dev)
    state = torch.empty((S, 8), dtype=torch.int32, device=dev)
    sure = torch.empty((S, K), dtype=torch.int64, device=dev)
    bkt = torch.empty((S, tk.SPLIT_CAP), dtype=torch.int64, device=dev)
    ties = torch.empty((S, P), dtype=torch.int32, device=dev)
    times = torch.zeros((S, P, 16), dtype=torch.int64, device=dev)
    pin_t = pin if use_pin else out
    nw = 8 if CHUNK >= 4096 else 4
    res = {}
    for rep in range(5):
        fused_timed[(P, S)](out, s, pin_t, hist, state, slots, sure, bkt, ties, cnt, times, N, s.stride(0), k, tk.SPLIT_CAP, P,
                            K=K, CAP=tk.SPLIT_CAP, CHUNK=CHUNK, BITS=tk._BITS, R=tk.RANK_R, TB=256, USE_PIN=use_pin, num_warps=nw)
        torch.cuda.synchronize()
    assert torch.equal(out, tk.topk_select_ref(s, k, pin)), "mismatch"
    t = times[0].cpu()
    d = (t[:, 1:8] - t[:, 0:7]).float()  # cycles per phase
    names = ["load", "level1", "levels2to4", "gather", "sync", "rank", "exit"]
    res = {n: {"min": float(d[:, j].min()), "med": float(d[:, j].median()), "max": float(d[:, j].max())} for j, n in enumerate(names)}
    gstart = t[:, 15] - t[:, 15].min()
    gend = t[:, 14] - t[:, 15].min()
    res["start_spread_ns"] = float(gstart.max())
    res["end_ns_max"] = float(gend.max())
    res["total_cycles_med"] = float((t[:, 7] - t[:, 0]).float().median())
    res["state"] = state[0].tolist()
    res["P"] = P; res["CHUNK"] = CHUNK
    # graph time of the real kernel
    x = s.clone()
    tk.topk_select_split(x, k, pin)
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(20):
            tk.topk_select_split(x, k, pin)
    gr.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); gr.replay(); e1.record(); torch.cuda.synchronize()
    res["graph_us_fused"] = e0.elapsed_time(e1) * 1000 / 20
    gr2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr2):
        for _ in range(20):
            tk.topk_select_split(x, k, pin, fused=False)
    gr2.replay(); torch.cuda.synchronize()
    e0.record(); gr2.replay(); e1.record(); torch.cuda.synchronize()
    res["graph_us_five"] = e0.elapsed_time(e1) * 1000 / 20
    return res


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("benchmarks/topk_phase_times.py needs a CUDA GPU")
    out = {}
    for N, k, pin in ((131072, 512, False), (16384, 2048, True)):
        out[f"N{N}_k{k}"] = run(N, k, pin)
        print(f"N{N}_k{k}", json.dumps(out[f"N{N}_k{k}"]))
    with open(os.path.join(os.environ.get("OUT", "."), "topk_phase_times.json"), "w") as f:
        json.dump(out, f, indent=1)
