"""Does a decode step written into the arena capture as a CUDA graph, and if not, which op's write breaks it?

    python3 benchmarks/arena_capture.py [--preset tiny] [--out results/arena_capture_h200.json]

Builds the preset for the device (float32 activations, as the GPU tests do), loads it with the arena
on (`DSV41C_ARENA=1`), prefills 16 tokens and runs one decode op by op (the `once` ops, the launchers'
set-up), then captures the decode step (`runtime/decode_graph.py`). Where the capture fails, the ops
allowed to write into the arena are bisected: with the first k arena writes kept and the rest left
to torch's allocator, the smallest k that fails names the op whose write breaks the capture (its
target, loc and the error). Each try is one capture, nothing is replayed. Prints and writes JSON.
Known gaps: assumes one op breaks it (with several, the first is named); needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import write_json  # noqa: E402


def _try_capture(model, session) -> str | None:
    from dsv41c.runtime.decode_graph import DecodeGraph, GraphCaptureError

    fn = model.program["decode"]
    ids = torch.tensor([5], device=model.device)
    try:
        with torch.no_grad(), torch.device(model.device):
            DecodeGraph(fn, model._inputs("decode", session, ids), [(a["role"], a["name"]) for a in fn.args],
                        session.state, model.device)
    except GraphCaptureError as e:
        return str(e)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("arena_capture: needs a CUDA GPU", file=sys.stderr)
        return 2
    import dsv41c
    from dsv41c.driver import build_artifact

    torch.backends.cuda.matmul.allow_tf32 = False
    p = torch.cuda.get_device_properties(0)
    path = os.path.join(tempfile.mkdtemp(), f"{a.preset}-f32.dsv41c")
    build_artifact(path, preset=a.preset, target=f"cuda:sm{p.major}{p.minor}", activation_dtype="float32")
    os.environ["DSV41C_ARENA"] = "1"
    model = dsv41c.load(path, device="cuda")
    model.cuda_graphs = False
    s = model.new_session()
    model.prefill(s, list(range(3, 19)))
    model.decode(s)
    fn = model.program["decode"]
    writers = [op for op in fn.ops if op.place is not None]
    saved = [(op.place, op.form) for op in writers]

    def allow(k: int) -> str | None:
        for i, (op, (place, form)) in enumerate(zip(writers, saved)):
            op.place, op.form = (place, form) if i < k else (None, None)
        try:
            return _try_capture(model, s)
        finally:
            for op, (place, form) in zip(writers, saved):
                op.place, op.form = place, form

    out = {"preset": a.preset, "gpu": p.name, "torch": torch.__version__, "arena_writers": len(writers),
           "arena": model.arena_stats().get("decode")}
    err = allow(len(writers))
    out["captures_with_every_write"] = err is None
    if err is not None:
        out["error"] = err
        out["captures_without_the_arena"] = allow(0) is None
        lo, hi = 0, len(writers)  # allow(lo) captures, allow(hi) fails
        if out["captures_without_the_arena"]:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if allow(mid) is None:
                    lo = mid
                else:
                    hi = mid
            op = writers[hi - 1]
            out["first_breaking_write"] = {"index": fn.ops.index(op), "target": op.rec["target"],
                                           "loc": op.rec.get("loc"), "form": op.form,
                                           "error": allow(hi)}
    write_json(a.out, out)
    print(json.dumps(out, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
