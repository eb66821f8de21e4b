"""One arena per function: the transient values of a run written at plan-memory's offsets.

    arena = Arena(spec["arena"], device)       # {"bytes", "binding"} from program.json
    slot = ArenaSlot.compile(rec["arena"][0])  # {offset, bytes, dtype, shape}
    buf = arena.view(slot, env)                # the value's bytes, or None (larger than planned)
    arena.placed(buf)                          # counted once the op wrote it
    arena.owns(t)                              # does t share the arena's bytes?

The arena is one byte tensor, allocated once per function and device (the first run on that
device) and kept: every later run, and a CUDA graph captured from one, writes the same
addresses. Its slots are those of the values the runtime writes (codegen/cpu.py places them
again with plan-memory's lifetimes, so the bytes of values made elsewhere are not reserved in
it): two values live at the same time never share bytes (lifetimes extended to stream joins and
to the last read of any view, see `ir/aliases.py`), so the executor only has to write each value
where the plan put it:

- an ATen op with an `out=` form writes its result into its slot (the overload packet picks the
  out overload; `_to_copy` copies into it, which is what `_to_copy` itself does);
- a view op's result shares its base's bytes, as planned;
- everything else (domain ops on their reference, kernel launchers, factory ops, ops whose
  sizes are known only after they run) is served by torch's allocator, and a result of one of
  them that shares the arena's bytes without being planned as a view is copied out, so no
  later write into the arena can change it.

A value larger than its slot (a run past the binding the arena was planned at, such as a
prefill longer than the compiled chunk) is served by torch's allocator too: correct, counted
in `stats["oversize"]`.

Where it is on: the loader turns it on for runs on the CPU and, on a CUDA device, only with
`DSV41C_ARENA=1`: on the H200 a tiny decode step run op by op in the arena gave the allocator's
answer, but its CUDA-graph capture failed (the loader then decodes op by op, 12x slower on
`bench`), and the cause was not found before the device time ran out.

Known gaps: kernel launchers and the `dsv41.*` reference ops allocate their own results, so
the arena holds only the ATen ops' values (`stats` says how many values and bytes it served,
`benchmarks/arena_coverage.py` how many a plan places); the launchers' split-K partials and
workspaces come from torch's allocator; the capture above.
"""
from __future__ import annotations

import torch


class ArenaSlot:
    """One planned result: its offset and planned size, dtype and the size expressions of its shape."""

    __slots__ = ("offset", "bytes", "dtype", "dims", "itemsize", "last")

    def __init__(self, offset: int, nbytes: int, dtype: torch.dtype, dims: list):
        self.offset, self.bytes, self.dtype, self.dims = offset, nbytes, dtype, dims
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.last = None  # (arena, shape, view): the view made last time, reused while the shape is the same

    @classmethod
    def compile(cls, rec: dict, compile_dim) -> "ArenaSlot":
        dims = [(lambda env, d=d: d) if isinstance(d, int) else compile_dim(d) for d in rec["shape"]]
        return cls(int(rec["offset"]), int(rec["bytes"]), getattr(torch, rec["dtype"]), dims)

    def shape(self, env) -> list | None:
        try:
            return [int(d(env)) for d in self.dims]
        except NameError:  # a size the run has not bound yet (data-dependent): not known before the op
            return None


class Arena:
    def __init__(self, spec: dict, device):
        self.bytes = int(spec["bytes"])
        self.binding = dict(spec.get("binding") or {})
        self.tensor = torch.empty(max(self.bytes, 1), dtype=torch.uint8, device=device if device is not None else "cpu")
        self.device = self.tensor.device  # with its index ("cuda" -> "cuda:0"), as tensors compare it
        self._ptr = self.tensor.untyped_storage().data_ptr()
        # values written in place, their bytes; results served by torch's allocator instead (too large for
        # their slot); results that shared the arena's bytes unplanned and were copied out
        self.stats = {"placed": 0, "placed_bytes": 0, "oversize": 0, "copied_out": 0}

    def view(self, slot: ArenaSlot, env) -> torch.Tensor | None:
        shape = slot.shape(env)
        if shape is None:
            return None
        n = slot.itemsize
        for d in shape:
            n *= d
        if n > slot.bytes:
            self.stats["oversize"] += 1
            return None
        last = slot.last
        if last is not None and last[0] is self and last[1] == shape:  # a decode step: the same view every time
            return last[2]
        v = self.tensor[slot.offset:slot.offset + n].view(slot.dtype).view(shape)
        slot.last = (self, shape, v)
        return v

    def placed(self, buf: torch.Tensor) -> None:
        """A value was written into `buf`, a view `view` gave."""
        self.stats["placed"] += 1
        self.stats["placed_bytes"] += buf.numel() * buf.element_size()

    def owns(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.device == self.device and t.untyped_storage().data_ptr() == self._ptr


def out_overload(fn, args: list, kwargs: dict, buf: torch.Tensor):
    """The out= overload of an ATen target for these arguments (resolved once per op: through the overload
    packet each call costs some 3x a direct overload call on the CPU), or None if it has none for them."""
    packet = fn.overloadpacket if isinstance(fn, torch._ops.OpOverload) else fn
    try:
        name = torch._C._jit_resolve_packet(packet._qualified_op_name, *args, **kwargs, out=buf)
    except RuntimeError:
        return None
    return getattr(packet, name)


def write_into(fn, form: str, buf: torch.Tensor, args: list, kwargs: dict) -> torch.Tensor:
    """Run an ATen target with its result written into `buf` (shape and dtype as planned); `fn` is the
    resolved out= overload (`out_overload`), or anything for the "copy" form."""
    if form == "copy":
        return buf.copy_(args[0])
    return fn(*args, **kwargs, out=buf)


__all__ = ["Arena", "ArenaSlot", "out_overload", "write_into"]
