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
(longest first), and by size x length; the smallest arena is kept (ties: that order list).
Everything is integer arithmetic over a fixed order with index tie-breaks: deterministic.

Known gaps: no buffer may be split or moved during its life (no defragmentation); the
placement of each gap at its low end is not tuned (placing against the larger neighbour
can do better on some inputs); quadratic in the worst case (each buffer scans the placed
buffers, vectorized with numpy).
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
    starts = np.zeros(n, dtype=np.int64)
    ends = np.zeros(n, dtype=np.int64)
    offs = np.zeros(n, dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    out = [0] * n
    arena = 0
    k = 0
    for i in _order(buffers, how):
        s, e, size = buffers[i]
        best_off = None
        if k:
            hit = np.nonzero((starts[:k] <= e) & (ends[:k] >= s))[0]
            if len(hit):
                o, z = offs[hit], sizes[hit]
                order = np.lexsort((z, o))
                top, best_len = 0, None
                for oo, zz in zip(o[order].tolist(), z[order].tolist()):
                    if oo > top:
                        gap = oo - top
                        if gap >= size and (best_len is None or gap < best_len):
                            best_off, best_len = top, gap
                    top = max(top, oo + zz)
                if best_off is None:
                    best_off = top
            else:
                best_off = 0
        else:
            best_off = 0
        out[i] = best_off
        starts[k], ends[k], offs[k], sizes[k] = s, e, best_off, size
        k += 1
        arena = max(arena, best_off + size)
    return out, arena


def best_placement(buffers, orders=ORDERS) -> tuple[list[int], int, str]:
    """The smallest arena over `orders`: (offsets, arena bytes, the order that gave it)."""
    best = None
    for how in orders:
        offs, arena = place(buffers, how)
        if best is None or arena < best[1]:
            best = (offs, arena, how)
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
