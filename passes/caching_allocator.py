"""An estimate of PyTorch's CUDA caching allocator for one allocation sequence.

    est = simulate([("alloc", 0, 4096), ("alloc", 1, 3 << 20), ("free", 0), ...])
    est.reserved_peak, est.allocated_peak, est.segments

What it models (c10/cuda/CUDACachingAllocator.cpp, default settings):
- sizes rounded up to 512-byte blocks (kMinBlockSize), a 0-byte request to one block;
- two pools: small (<= 1 MiB, kSmallSize) and large;
- a new segment when no cached block fits: 2 MiB (kSmallBuffer) for small requests, 20 MiB
  (kLargeBuffer) for large requests under 10 MiB (kMinLargeAlloc), else the request rounded
  up to 2 MiB (kRoundLarge);
- best fit among the pool's free blocks (smallest block that holds the request, then the
  lowest segment and offset), splitting the block when the remainder is >= 512 bytes
  (small pool) or > 1 MiB (large pool), otherwise handing out the whole block;
- on free, the block merges with its free neighbours in the same segment;
- segments are never returned to the device (no `empty_cache`, no OOM-driven release):
  `reserved_peak` is what `torch.cuda.max_memory_reserved()` would read.
What it does not model: per-stream pools and deferred frees of blocks used on another
stream (`record_stream`), `max_split_size_mb`, `roundup_power2_divisions`, expandable
segments, garbage-collection thresholds, and the CUDA driver's own granularity.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(n: int) -> int:
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def segment_size(rounded: int) -> int:
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Block:
    seg: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None

    def key(self):
        return (self.size, self.seg, self.offset)


@dataclass(frozen=True)
class Estimate:
    reserved_peak: int
    allocated_peak: int
    segments: int
    requested_peak: int


def simulate(events) -> Estimate:
    """events: ("alloc", id, bytes) / ("free", id) in program order."""
    pools = {True: [], False: []}  # small? -> sorted [(size, seg, offset, block)]
    live: dict = {}
    reserved = allocated = requested = 0
    peak_alloc = peak_req = 0
    nseg = 0

    def add_free(b):
        b.free = True
        insort(pools[b.small], (*b.key(), id(b), b))

    def drop_free(b):
        pool = pools[b.small]
        pool.remove((*b.key(), id(b), b))

    for ev in events:
        if ev[0] == "alloc":
            _, key, nbytes = ev
            size = round_size(int(nbytes))
            small = size <= SMALL_SIZE
            pool = pools[small]
            b = None
            j = bisect_left(pool, (size,))  # sorted by (size, segment, offset): the first that fits is the best fit
            if j < len(pool):
                b = pool.pop(j)[-1]
            if b is None:
                seg = segment_size(size)
                b = _Block(nseg, 0, seg, small)
                nseg += 1
                reserved += seg
            b.free = False
            rest = b.size - size
            if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
                tail = _Block(b.seg, b.offset + size, rest, small, True, b, b.next)
                if b.next is not None:
                    b.next.prev = tail
                b.next = tail
                b.size = size
                add_free(tail)
            live[key] = (b, int(nbytes))
            allocated += b.size
            requested += int(nbytes)
            peak_alloc = max(peak_alloc, allocated)
            peak_req = max(peak_req, requested)
        elif ev[0] == "free":
            b, nbytes = live.pop(ev[1])
            allocated -= b.size
            requested -= nbytes
            for nb in (b.prev, b.next):
                if nb is not None and nb.free:
                    drop_free(nb)
                    if nb is b.prev:
                        nb.size += b.size
                        nb.next = b.next
                        if b.next is not None:
                            b.next.prev = nb
                        b = nb
                    else:
                        b.size += nb.size
                        b.next = nb.next
                        if nb.next is not None:
                            nb.next.prev = b
            add_free(b)
        else:
            raise ValueError(f"caching allocator: unknown event {ev!r}")
    return Estimate(reserved, peak_alloc, nseg, peak_req)


__all__ = ["simulate", "Estimate", "round_size", "segment_size"]
