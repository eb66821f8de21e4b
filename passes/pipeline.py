"""The whole compile pipeline as one list, in order (MLC-LLM's pipeline.py).

`PIPELINE` holds pass specs (the `-p` text of each pass); `build_pipeline()` turns them
into pass objects through the lazy registry, so this file imports no pass module. The
slots of the passes still to come are listed in order where they go; each lands as one
line here, one in `passes/registry.py`, and its own file.

Order, and why: shapes first (later rewrites match on static shapes), then local
simplification, then merging, then sweeping what the others left dead. The domain passes
come after the clean-up because they match on canonical op chains; scheduling and memory
planning come last because they fix the order and the addresses of everything before; the
chunk is chosen between them, on the scheduled order, by the arena plan-memory would make.

Target dependence is explicit: an entry `(spec, prefixes)` runs only for targets whose name
starts with one of `prefixes`. `schedule-streams` runs for the GPU targets (`cuda:*`,
`rocm:*`), whose runtime maps streams to device queues; the `cpu` target (and Ascend, whose
runtime has no stream mapping yet) keeps one serial stream, which is also what the
reference executor runs. An entry `(spec, CED_SPLIT)` is optional: `split-ced-prefill` runs
after the domain rewrites (it slices their @prefill) and before the kernels are chosen, so
its @prefill_encoder is specialized, scheduled and planned like @prefill.
"""
from __future__ import annotations

from dsv41c.passes.registry import parse_pipeline

GPU_TARGETS = ("cuda:", "rocm:")
CED_SPLIT = "ced-split"  # an entry run only when asked for (`dsv41c compile --ced-split`)

PIPELINE = [
    "fold-shapes",
    "canonicalize",
    "cse",
    "dce",
    "share-csa2-state",     # one producer per Full/Reindex/Reuse group, checked against the layer plan
    "lower-kv-fp4",         # the KV state stored packed (FP4 + E4M3/16, FP4 + E8M0/32, FP8 + E8M0/32)
    "fuse-compressor",      # compressor -> RoPE -> FP4 pack -> cache appends (lower-kv-fp4's form) as one op
    "lower-indexer-int8",   # exact integer scoring of FP4 indexer data (the float path's scores)
    "gather-engram-rows",   # an Engram layer dequantizes the table rows it reads, not the whole table
    ("split-ced-prefill", CED_SPLIT),    # optional: @prefill_encoder + the exact decoder suffix
    "cse{across_writes=true}",  # again after the domain rewrites: per-layer position arithmetic merges across layers
    "dce",
    "specialize-kernels{target=TARGET}",  # kernel.call per target from the kernel matrix
    ("schedule-streams", GPU_TARGETS),   # Q/KV paths on two streams + events, Engram on an aux stream
    "hoist-invariants",     # what reads only weights and constants runs at the first step, not every step
    "plan-chunks{budget=BUDGET}",        # prefill chunk size from the memory budget (0: none, the chunk stays)
    "plan-memory",          # arena offsets for transient values
]


def pipeline_specs(target: str = "cpu", memory_budget: int = 0, ced_split: bool = False) -> list:
    """PIPELINE for `target`: entries restricted to other targets left out, the optional
    split-ced-prefill only with `ced_split`, `TARGET` and `BUDGET` (bytes, `dsv41c compile
    --memory-budget`; 0 = none) filled in."""
    out = []
    for item in PIPELINE:
        spec, only = item if isinstance(item, tuple) else (item, None)
        if only == CED_SPLIT:
            if not ced_split:
                continue
        elif only is not None and not target.startswith(only):
            continue
        out.append(spec.replace("TARGET", f'"{target}"').replace("BUDGET", str(int(memory_budget))))
    return out


def build_pipeline(specs=None, target: str = "cpu") -> list:
    """Pass objects for `specs` (default: PIPELINE for `target`), e.g. ["fold-shapes{bind=\\"T=1\\"}", "dce"]."""
    return parse_pipeline(",".join(specs if specs is not None else pipeline_specs(target)))
