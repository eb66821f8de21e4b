"""One cached side stream per device, for launchers that run two independent kernel chains at once.

Why: at decode sizes many kernels fill only part of the GPU (or spend most of their time waiting on
memory latency), so two independent ones overlap well; under CUDA-graph capture the fork / join of a
side stream becomes two parallel branches of the graph, so the replay keeps the overlap with no host
work. Users: moe.moe_forward (the shared expert's FP8 GEMMs beside the router and routed experts) and
indexer.indexer_topk (the candidate-block selection beside the top-512 selection).

Contract (what keeps the caching allocator safe without `record_stream`): every use of the side
stream starts with `side.wait_stream(main)` and the main stream waits for the side stream before
anything the side stream wrote is read or freed, all from one main stream per device. Kernels that
may run at the same time on the two streams must not share workspace: arrival.py's counters take a
`pool` per concurrent user, and so does indexer_topk's split workspace.

Known gaps: one side stream per device (two nested overlapped regions would serialize on it); the
stream is created with the default priority.
"""
from __future__ import annotations

import torch

_SIDE_STREAMS: dict = {}


def side_stream(device) -> torch.cuda.Stream:
    """The side stream of a CUDA device (created on first use, then reused, so graphs captured earlier stay valid)."""
    key = torch.device(device)
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(key)
    return _SIDE_STREAMS[key]
