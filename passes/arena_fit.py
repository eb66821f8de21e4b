"""Offsets for buffers with known lifetimes in one arena: best fit, several orders, smallest kept.

    offsets, arena, order = best_placement(buffers)    # buffers: [(start, end, size)], size aligned
    lower_bound(buffers)                                # max over time of live bytes

A buffer lives over the closed interval [start, end] of schedule positions; two buffers
whose intervals meet must not share an address.

Algorithm (XLA's heap simulator / TFLite's greedy-by-size offline planner): buffers are
placed one at a time in a given order. For the buffer at hand, the placed buffers whose
lifetimes meet its own are sorted by offset; the free space of its interval is the
complement of their union, as gaps (adjacent and overlapping neighbours coalesce into one
occupied run, so freed neighbours merge). The smallest gap that holds the buffer wins
(best fit; ties by the lower offset) and the buffer takes its low end (the gap is split,
the rest stays free for later buffers); with no fitting gap it goes on top. The orders
tried: by size (largest first), by start (the online allocator's order), by lifetime length
(longest first), and by size x length; the smallest arena is kept (ties: that order list),
and the search stops early at an order whose arena equals the lower bound (nothing is smaller).
Everything is integer arithmetic over a fixed order with index tie-breaks: deterministic.

Known gaps: no buffer may be split or moved during its life (no defragmentation); the
placement of each gap at its low end is not tuned (placing against the larger neighbour
can do better on some inputs); quadratic in the worst case (each buffer scans the placed
buffers that meet its lifetime: those found through a start-sorted index, vectorized with numpy).
"""
from __future__ import annotations

import numpy as np

ALIGN = 256
ORDERS = ("size", "start", "length", "area")


def align(n: int, a: int = ALIGN) -> int:
    return -(-int(n) // a) * a


def lower_bound(buffers) -> int:
    """max over positions of the bytes of the buffers live there."""
    events: dict[int, int] = {}
    for s, e, size in buffers:
        events[s] = events.get(s, 0) + size
        events[e + 1] = events.get(e + 1, 0) - size
    live = peak = 0
    for p in sorted(events):
        live += events[p]
        peak = max(peak, live)
    return peak


def _order(buffers, how: str) -> list[int]:
    idx = range(len(buffers))
    if how == "size":
        key = lambda i: (-buffers[i][2], buffers[i][0], i)  # noqa: E731
    elif how == "start":
        key = lambda i: (buffers[i][0], -buffers[i][2], i)  # noqa: E731
    elif how == "length":
        key = lambda i: (-(buffers[i][1] - buffers[i][0]), -buffers[i][2], i)  # noqa: E731
    elif how == "area":
        key = lambda i: (-(buffers[i][1] - buffers[i][0] + 1) * buffers[i][2], i)  # noqa: E731
    else:
        raise ValueError(f"unknown placement order {how!r} (known: {', '.join(ORDERS)})")
    return sorted(idx, key=key)


def place(buffers, how: str = "size") -> tuple[list[int], int]:
    """Offsets (in the input's order) and the arena size for one placement order."""
    n = len(buffers)
    out = [0] * n
    if not n:
        return out, 0
    # Candidates by start time: a buffer of lifetime <= span that meets [s, e] starts in
    # [s - span, e], one contiguous run of the start-sorted list; the few longer ones are
    # checked apart. The work per buffer follows the live set, not the function's size.
    by_start = sorted(range(n), key=lambda i: (buffers[i][0], i))
    rank = [0] * n
    for r, i in enumerate(by_start):
        rank[i] = r
    S = np.array([buffers[i][0] for i in by_start], dtype=np.int64)
    E = np.array([buffers[i][1] for i in by_start], dtype=np.int64)
    lengths = E - S
    span = int(np.quantile(lengths, 0.99)) if n > 100 else int(lengths.max())
    short = lengths <= span
    long_idx = np.flatnonzero(~short)
    off = np.zeros(n, dtype=np.int64)
    top = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    arena = 0
    for i in _order(buffers, how):
        s, e, size = buffers[i]
        lo, hi = np.searchsorted(S, s - span, "left"), np.searchsorted(S, e, "right")
        cand = lo + np.flatnonzero(placed[lo:hi] & short[lo:hi] & (E[lo:hi] >= s))
        if len(long_idx):
            li = long_idx[placed[long_idx] & (S[long_idx] <= e) & (E[long_idx] >= s)]
            if len(li):
                cand = np.concatenate((cand, li))
        best_off = 0
        if len(cand):
            o = off[cand]
            srt = np.argsort(o, kind="stable")
            o, t = o[srt], top[cand][srt]
            run = np.maximum.accumulate(t)          # top of the occupied run below each buffer
            prev = np.concatenate(([0], run[:-1]))
            gaps = o - prev                         # free bytes just below each buffer
            fit = np.flatnonzero(gaps >= size)
            if len(fit) and size:
                j = fit[np.argmin(gaps[fit])]       # best fit; argmin takes the lowest offset on ties
                best_off = int(prev[j])
            else:
                best_off = int(run[-1])
        out[i] = best_off
        r = rank[i]
        off[r], top[r], placed[r] = best_off, best_off + size, True
        arena = max(arena, best_off + size)
    return out, arena


def best_placement(buffers, orders=ORDERS) -> tuple[list[int], int, str]:
    """The smallest arena over `orders`: (offsets, arena bytes, the order that gave it).
    Stops at the first order whose arena equals the lower bound: no placement is smaller."""
    best = None
    floor = lower_bound(buffers)
    for how in orders:
        offs, arena = place(buffers, how)
        if best is None or arena < best[1]:
            best = (offs, arena, how)
        if arena <= floor:
            break
    if best is None:
        return [], 0, orders[0] if orders else ""
    return best


def overlaps(buffers, offsets) -> list[tuple[int, int]]:
    """Pairs (i, j) that meet in time and in address (empty for a valid placement)."""
    out = []
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    for a_pos, i in enumerate(order):
        si, ei, zi = buffers[i]
        for j in order[a_pos + 1:]:
            sj, ej, zj = buffers[j]
            if sj > ei:
                break
            if offsets[i] < offsets[j] + zj and offsets[j] < offsets[i] + zi and zi and zj:
                out.append((min(i, j), max(i, j)))
    return out


__all__ = ["ALIGN", "ORDERS", "align", "lower_bound", "place", "best_placement", "overlaps"]
