"""Pass name -> pass class, loaded lazily; and the pipeline text `-p a,b{opt=v},c`.

`PASSES` maps each CLI name to "module:Class"; a pass module is imported only when its
pass is asked for, so `dsv41c opt -p dce` does not import the kernel planners. Adding a
pass is one line here plus its file (and a slot in `pipeline.py`).

Pipeline text: passes separated by commas; options in braces after the name, separated by
spaces, `key=value`, a value with spaces or commas in double quotes:
`fold-shapes{bind="T=1,L=4096"},canonicalize,cse,dce`.
"""
from __future__ import annotations

import importlib
import re

from dsv41c.passes.base import ModulePass, PassError

PASSES = {
    "dce": "dsv41c.passes.dce:DeadCodeElimination",
    "cse": "dsv41c.passes.cse:CommonSubexpressionElimination",
    "canonicalize": "dsv41c.passes.canonicalize:Canonicalize",
    "fold-shapes": "dsv41c.passes.fold_shapes:FoldShapes",
    "plan-memory": "dsv41c.passes.plan_memory:PlanMemory",
    "schedule-streams": "dsv41c.passes.schedule_streams:ScheduleStreams",
    "specialize-kernels": "dsv41c.passes.specialize_kernels:SpecializeKernels",
    "plan-chunks": "dsv41c.passes.plan_chunks:PlanChunks",
    "split-ced-prefill": "dsv41c.passes.split_ced_prefill:SplitCedPrefill",
    "share-csa2-state": "dsv41c.passes.share_csa2_state:ShareCsa2State",
    "lower-kv-fp4": "dsv41c.passes.lower_kv_fp4:LowerKvFp4",
    "lower-indexer-int8": "dsv41c.passes.lower_indexer_int8:LowerIndexerInt8",
    "fuse-compressor": "dsv41c.passes.fuse_compressor:FuseCompressor",
    "hoist-invariants": "dsv41c.passes.hoist_invariants:HoistInvariants",
    "gather-engram-rows": "dsv41c.passes.gather_engram_rows:GatherEngramRows",
    # Later passes plug in here: share-csa2-state, fuse-compressor, lower-kv-fp4,
    # lower-indexer-int8, split-ced-prefill, plan-chunks, schedule-streams, plan-memory,
    # specialize-kernels, partition-pd, plan-dspark.
}


def pass_class(name: str) -> type[ModulePass]:
    target = PASSES.get(name)
    if target is None:
        raise PassError(f"unknown pass '{name}' (known: {', '.join(sorted(PASSES))})")
    mod, cls = target.split(":")
    klass = getattr(importlib.import_module(mod), cls)
    if klass.name != name:
        raise PassError(f"{target} is registered as '{name}' but names itself '{klass.name}'")
    return klass


def make_pass(name: str, **options) -> ModulePass:
    return pass_class(name)(**options)


_OPT_RE = re.compile(r'\s*([A-Za-z_][\w-]*)=("(?:[^"\\]|\\.)*"|[^\s"]*)\s*')


def parse_pipeline(text: str) -> list[ModulePass]:
    out = []
    for item in _split(text):
        name, brace, rest = item.partition("{")
        name = name.strip()
        options = {}
        if brace:
            if not rest.endswith("}"):
                raise PassError(f"pass '{name}': options must end with '}}': {item!r}")
            body, pos = rest[:-1], 0
            while pos < len(body):
                m = _OPT_RE.match(body, pos)
                if not m or m.end() == pos:
                    raise PassError(f"pass '{name}': cannot read options {body[pos:]!r} (want key=value ...)")
                options[m.group(1).replace("-", "_")] = m.group(2)
                pos = m.end()
        out.append(pass_class(name).from_options(options))
    if not out:
        raise PassError("no passes given")
    return out


def _split(text: str):
    items, cur, depth, quote = [], "", 0, False
    prev = ""
    for ch in text:
        if ch == '"' and prev != "\\":
            quote = not quote
        elif not quote:
            depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0 and not quote:
            if not cur.strip():  # 'dce,' or 'a,,b': a slip that would silently drop a pass
                raise PassError(f"empty pass name at item {len(items) + 1} of pipeline {text!r}")
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
        prev = ch
    if quote or depth:
        raise PassError(f"unbalanced quotes or braces in pipeline {text!r}")
    if cur.strip():
        items.append(cur.strip())
    elif items:
        raise PassError(f"empty pass name at item {len(items) + 1} of pipeline {text!r}")
    return items
