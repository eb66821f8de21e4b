"""The plan's streams and events on a CUDA device: stream k of a step -> a torch.cuda.Stream, events -> torch.cuda.Event.

`schedule-streams` gives each program step a stream index (0 = the step's default stream) and
joins streams with `rt.record` (an event recorded on the recording step's stream after everything
before it there) and `rt.wait` (the waiting step's stream waits for that event). On the CPU the
executor runs the steps in order, which is one valid schedule, so both are no-ops; on a GPU
`DeviceStreams` makes them real:
- stream 0 is the stream current when the function starts; streams 1.. are made once per device;
- `on(k)` runs a step's launches on stream k;
- `record(k)` records a torch.cuda.Event on stream k; `wait(k, event)` makes stream k wait for it;
- a tensor made on one stream and read on another is marked used by the reader
  (`Tensor.record_stream`), so torch's caching allocator does not hand its memory out again
  before the reader has finished with it;
- `join()` makes stream 0 wait for every other stream before the function returns (the verifier
  already rejects a returned value that was not joined; this keeps a crafted plan from racing).
The values in the function's arena (`arena.py`) need no such marking: plan-memory kept their bytes
until every stream that reads them has joined.
Known gaps: the values outside the arena (kernel launchers' and domain ops' results) come from torch's
caching allocator.
"""
from __future__ import annotations

import torch

_SIDE: dict = {}  # (device index, stream index) -> torch.cuda.Stream, made once


class DeviceStreams:
    def __init__(self, device, count: int):
        self.device = torch.device(device)
        self.main = torch.cuda.current_stream(self.device)
        self.streams = [self.main]
        for k in range(1, count):
            key = (self.device.index, k)
            if key not in _SIDE:
                _SIDE[key] = torch.cuda.Stream(self.device)
            self.streams.append(_SIDE[key])
        # side streams start after everything issued before this function on the main stream
        for s in self.streams[1:]:
            s.wait_stream(self.main)

    def on(self, k: int):
        return torch.cuda.stream(self.streams[k])

    def record(self, k: int):
        ev = torch.cuda.Event()
        ev.record(self.streams[k])
        return ev

    def wait(self, k: int, event) -> None:
        self.streams[k].wait_event(event)

    def used(self, args, k: int, made_on) -> None:
        """Mark every tensor in `args` made on another stream (`made_on(t)` -> its stream) as used on stream k."""
        for a in args:
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(t, torch.Tensor) and t.is_cuda and made_on(t) not in (None, k):
                    t.record_stream(self.streams[k])

    def join(self) -> None:
        for s in self.streams[1:]:
            self.main.wait_stream(s)
