"""Happens-before over a function's streams: which ops are ordered before which.

    hb = HappensBefore(f)
    hb.ordered(i, j)          # op #i is finished before op #j starts, on every valid execution
    hb.last_unaware(i)        # the last op position that may still run concurrently with op #i

An op runs on the stream named by its `stream` attribute (default 0; `stream.record` and
`stream.wait` carry theirs as their schema attribute). Ops on one stream run in program
order; `stream.wait(%e) {stream = s}` orders everything after it on `s` behind everything
before the `stream.record` that made `%e` on the recording stream. No other edge exists:
in particular a value defined on one stream and used on another is NOT ordered by the use
(that is the rule `ir/verify_streams.py` enforces).

Algorithm: vector clocks. Each op gets a clock (one counter per stream): the clock of the
previous op on its stream, joined (element-wise max) with the recorded clock for a wait,
then its own stream's counter set to its position on that stream (1-based). `ordered(i, j)`
is `clock(j)[stream(i)] >= seq(i)`. `last_unaware(i)` is the largest position p such that
op #p does not know op #i (p < i when everything after i knows it): a buffer read by op #i
may be reused only by an op defined after that position.

Known gaps: events recorded but never waited on order nothing; a wait on an event from a
function argument (none exist today) is treated as ordering nothing.
"""
from __future__ import annotations

from bisect import bisect_left


def op_stream(op) -> int:
    s = op.attrs.get("stream", 0)
    return s if isinstance(s, int) and not isinstance(s, bool) else 0


class HappensBefore:
    def __init__(self, f):
        ops = f.ops
        self.n = len(ops)
        self.streams = sorted({op_stream(op) for op in ops} | {0})
        slot = {s: k for k, s in enumerate(self.streams)}
        self.slot = slot
        ns = len(self.streams)
        last = [tuple([0] * ns)] * ns  # clock of the latest op on each stream
        counter = [0] * ns
        recorded: dict[int, tuple] = {}
        self.stream = [0] * self.n
        self.seq = [0] * self.n
        self.clock: list[tuple] = [()] * self.n
        for i, op in enumerate(ops):
            k = slot[op_stream(op)]
            c = list(last[k])
            if op.name == "stream.wait" and op.operands:
                rc = recorded.get(id(op.operands[0]))
                if rc is not None:
                    c = [max(a, b) for a, b in zip(c, rc)]
            counter[k] += 1
            c[k] = counter[k]
            c = tuple(c)
            self.stream[i], self.seq[i], self.clock[i] = k, counter[k], c
            last[k] = c
            if op.name == "stream.record" and op.results:
                recorded[id(op.results[0])] = c
        self._unaware = None

    def ordered(self, i: int, j: int) -> bool:
        """Op #i finishes before op #j starts (i == j counts as ordered)."""
        return self.clock[j][self.stream[i]] >= self.seq[i]

    def last_unaware(self, i: int) -> int:
        """The largest position p with op #p not ordered after op #i, or -1 if none."""
        if self._unaware is None:
            self._build_unaware()
        k, s = self.stream[i], self.seq[i]
        marks, best = self._unaware[k]
        # ops whose clock on stream k is < s do not know op #i; best[m] = last position with clock < marks[m+1]
        m = bisect_left(marks, s) - 1
        return best[m] if m >= 0 else -1

    def _build_unaware(self):
        self._unaware = []
        for k in range(len(self.streams)):
            last_with = {}
            for p in range(self.n):
                last_with[self.clock[p][k]] = p
            marks = sorted(last_with)  # distinct clock values seen on stream k
            best, run = [], -1
            for v in marks:
                run = max(run, last_with[v])
                best.append(run)
            # positions whose clock value v < s: the prefix of marks below s
            self._unaware.append((marks, best))


__all__ = ["HappensBefore", "op_stream"]
