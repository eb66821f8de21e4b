"""Decode as a CUDA graph: a session's decode step captured once, then replayed for every token.

Why: run op by op from Python, a decode step of the `bench` plan spends about 390 ms on the host
for about 48 ms of device work (some 4,000 steps, 7,000 launches). Captured, a step is one graph
launch and the host only feeds the token and reads the logits.

What makes a step capturable, and where it is ensured:
- static shapes: the decode function binds no size from data (checked here: a function with
  `bind` steps or size symbols is refused) and the state has fixed capacity (`--max-context`);
- no host read: the state appends, the compressor's decode form, the INT8 index scorer and the
  Engram hash take their positions on the device (`prims/state.py`, `prims/compressor.py`,
  `prims/indexer_int8.py`, `prims/engram_hash.py`); the capacity check is the loader's, made
  from the session's host-side position before each step;
- the kernel launchers take the current stream (the capture's).

How: `DecodeGraph(fn, inputs, roles, state, device)` records one run of `fn` under `torch.cuda.graph`
(its own memory pool; the values plan-memory placed are written in the function's arena, made
before the capture: `arena.py`) with a static ids buffer in place of the token, the session's state
tensors and the bound weights as the other inputs. The run keeps every value it makes until it
returns (`Function.run(capturing=True)`), so a buffer read on a side stream is never handed to a
later op of the graph. The state results that are new tensors (a compressor's caches, the
position) are copied back into the session's buffers at the end of the graph, so the next
replay reads the state the last one wrote, at the same addresses. The capture is tried with the
plan's streams and events first, then (where that capture fails) with every step on the capture
stream in program order (`serial`: one valid schedule of the same steps). `step(ids)` copies the token
into the static buffer, replays, and returns the logits (a copy: the graph's output buffer is
rewritten by the next replay).

Capture needs the function's `once` ops already run and the launchers and cuBLAS warmed, so the
loader runs a session's first decode op by op and captures at its second. A capture that fails
(an op that reads the host, a launch that cannot be captured) raises `GraphCaptureError` naming
the op where torch stopped; the loader then keeps that model op by op and says why once.
Known gaps: one graph per session (a new session captures again, in a new pool); no bucketing by
context length (the plan's shapes are those of the compiled capacity already); prefill is not
captured (its chunks vary in length).
"""
from __future__ import annotations

import gc

import torch


class GraphCaptureError(RuntimeError):
    """The decode step could not be captured as a CUDA graph (says which op, or which property, and why)."""


class _CaptureFailed(Exception):
    """torch or the driver stopped one capture attempt (the message: its first line)."""


def check_capturable(fn) -> None:
    """Refuse a function whose shapes depend on its inputs' data or sizes."""
    binds = [op.where for op in fn.ops if op.bind]
    if binds:
        raise GraphCaptureError(f"@{fn.name}: {len(binds)} step(s) bind a size from data, first {binds[0]}")
    if fn.symbols:
        raise GraphCaptureError(f"@{fn.name}: its shapes depend on the inputs' sizes ({', '.join(sorted(fn.symbols))})")


class DecodeGraph:
    def __init__(self, fn, inputs: list, roles: list, state: dict, device):
        """inputs: the function's arguments in order (the ids one is replaced by a static buffer);
        roles: (role, name) per argument; state: the session's state tensors by name (written back)."""
        check_capturable(fn)
        self.device = torch.device(device)
        self.fn = fn
        i_ids = [k for k, (role, _) in enumerate(roles) if role == "input"]
        if len(i_ids) != 1:
            raise GraphCaptureError(f"@{fn.name}: {len(i_ids)} token inputs (a decode step takes one)")
        self.ids = torch.zeros_like(inputs[i_ids[0]])
        args = list(inputs)
        args[i_ids[0]] = self.ids
        why = []
        for serial in (False, True):  # the plan's streams, else every step on the capture stream
            try:
                self._capture(fn, args, state, serial)
                self.serial, self.first_error = serial, why[0] if why else None
                return
            except _CaptureFailed as e:
                why.append(str(e))
                self.graph = self.logits = None
                e.__cause__ = e.__context__ = None  # its frames hold the run's values, in the failed graph's pool
                del e
                gc.collect()
                torch.cuda.empty_cache()
        raise GraphCaptureError(f"@{fn.name}: capture failed with the plan's streams ({why[0]}) and on one "
                                f"stream ({why[1]})")

    def _capture(self, fn, args: list, state: dict, serial: bool) -> None:
        self.graph = torch.cuda.CUDAGraph()
        names = fn.output_names
        fn.arena(self.device)  # the function's arena (if planned) is made outside the graph's pool, once
        try:
            with torch.cuda.graph(self.graph):
                outs = fn.run(args, device=self.device, capturing=True, serial=serial)
                for name, new in zip(names[1:], outs[1:]):
                    old = state.get(name)
                    if old is None:
                        raise GraphCaptureError(f"@{fn.name}: result {name} is not a state buffer of the session")
                    if new is not old:
                        if new.shape != old.shape or new.dtype != old.dtype:
                            raise GraphCaptureError(
                                f"@{fn.name}: state {name} changes from {old.dtype}{list(old.shape)} to "
                                f"{new.dtype}{list(new.shape)} (a growing state cannot be captured; "
                                f"compile with --max-context)")
                        old.copy_(new)
        except GraphCaptureError:
            raise
        except Exception as e:  # noqa: BLE001 - torch and the CUDA driver raise many kinds here
            raise _CaptureFailed(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from e
        self.logits = outs[0]

    def step(self, host_ids: torch.Tensor) -> torch.Tensor:
        """Feed `host_ids` (the step's token), replay the graph -> the logits [1, vocab] (a copy)."""
        self.ids.copy_(host_ids, non_blocking=False)
        self.graph.replay()
        return self.logits.clone()
