"""schedule-streams: each layer's Q path and KV path on two streams, Engram look-ahead on a third.

    schedule-streams                    streams 0 (main, Q path), 1 (KV path), 2 (Engram aux)

1. Layers. The ops of layer N's attention are those whose `loc` is `layers.N.attn` or under
   it. Within them, dataflow decides: an op that depends on the layer's KV-path weights
   (`layers.N.attn.wkv.*`, `layers.N.attn.compressor.*`: wkv -> kv_norm -> RoPE -> window
   write, the compressor, the indexer keys; an op's results and the buffers it writes in
   place depend on what its operands depend on) and not on its Q-path weights
   (`layers.N.attn.wq_a.*`: wq_a -> q_norm -> wq_b -> RoPE, the indexer query) goes on
   stream 1; an op that depends on neither goes with its users when all of them are on
   stream 1 (the KV path's own weight dequantization), else stays on stream 0. What
   depends on both (indexer scores, top-k, attention) is the join and runs on stream 0.
2. Engram look-ahead. The ops of `layers.N.engram` that do not depend on any layer's work
   (the n-gram hash, the table and projection dequantization) move to stream 2 and in
   program order to the start of layer N-1 (no earlier than their operands), so they are
   issued a layer ahead; what reads the hidden state (the gather-and-gate op) stays.
3. Events. One forward sweep with vector clocks (`ir/happens_before.py`'s rule): before an
   op that reads a value (or overwrites an operand, `writes`) last touched on another
   stream and not yet ordered after it, insert `stream.record {stream = a}` and
   `stream.wait {stream = b}`; at the end every side stream joins stream 0, so the
   function's results and buffers are ready when stream 0 finishes. An op already carrying
   `stream` keeps it (the pass re-run on its own output adds nothing).

Stats: `ops:stream<k>`, `events`, `layers-split`, `engram-ops-ahead`, and the cost model's
figures (`passes/stream_cost.py`: an explicit H200 roofline plus a launch gap per kernel) in
nanoseconds: `serial-ns:<fn>` against `streams-ns:<fn>` for each function, and
`serial-ns:<fn>:layer<N>` against `streams-ns:<fn>:layer<N>` for each layer.
`stream_cost.stream_report(module)` gives the same per function as a dict (ops per stream,
events, per layer figures): the artifact's reports/streams.json and `dsv41c inspect --json`'s
`streams`.

Known gaps: the Engram gather itself is fused into `dsv41.engram_apply`, which reads the
hidden state, so only the hash and the dequantization go ahead; the split is by weight
names and dataflow, so a layer whose attention has no `wkv`/`compressor` weights stays on
one stream; no cost-driven choice (every layer is split).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Op
from dsv41c.ir.happens_before import op_stream
from dsv41c.ir.registry import lookup
from dsv41c.ir.types import EVENT
from dsv41c.ir.verify_streams import written_operands
from dsv41c.passes.base import ModulePass, PassResult

MAIN, KV, AUX = 0, 1, 2
Q_ROOTS = ("attn.wq_a.",)
KV_ROOTS = ("attn.wkv.", "attn.compressor.")
_LOC = re.compile(r"layers\.(\d+)\.(attn|engram)(?:\.|$)")
_LAYER = re.compile(r"layers\.(\d+)\.")


def _layer_of(loc):
    m = _LAYER.match(loc or "")
    return int(m.group(1)) if m else None


def _split_layers(f) -> int:
    """Stream 1 for each layer's KV path (step 1); returns how many layers were split."""
    regions: dict[int, list] = {}
    used_at: dict[int, list] = {}  # id(value) -> positions of the ops that read it, over the whole function
    for i, op in enumerate(f.ops):
        for v in op.operands:
            used_at.setdefault(id(v), []).append(i)
    for i, op in enumerate(f.ops):
        m = _LOC.match(op.loc or "")
        if m and m.group(2) == "attn" and "stream" not in op.attrs:
            regions.setdefault(int(m.group(1)), []).append(i)
    by_layer: dict[int, list] = {}  # layer -> its weight arguments, found in one sweep
    for a in f.args:
        k = _layer_of(a.name)
        if k is not None:
            by_layer.setdefault(k, []).append(a)
    split = 0
    for n, idx in regions.items():
        mine = by_layer.get(n, [])
        roots_q = {id(a) for a in mine if any(a.name.startswith(f"layers.{n}.{r}") for r in Q_ROOTS)}
        roots_kv = {id(a) for a in mine if any(a.name.startswith(f"layers.{n}.{r}") for r in KV_ROOTS)}
        if not roots_q or not roots_kv:
            continue
        dq, dkv = set(roots_q), set(roots_kv)
        side, touched = set(), set()
        for i in idx:
            op = f.ops[i]
            ids = [id(v) for v in op.operands]
            # what an op makes, and a buffer it writes in place, carries the paths it read
            outs = [id(r) for r in op.results] + [id(v) for v in written_operands(op)]
            on_q, on_kv = any(x in dq for x in ids), any(x in dkv for x in ids)
            if on_q:
                dq.update(outs)
            if on_kv:
                dkv.update(outs)
            if on_q or on_kv:
                touched.add(i)
            if on_kv and not on_q:
                side.add(i)
        # ops depending on neither: with their users, when every user in the layer is on the KV stream
        users: dict[int, list] = {}
        for i in idx:
            for v in f.ops[i].operands:
                users.setdefault(id(v), []).append(i)
        returned = {id(v) for v in f.returns or []}
        inside = set(idx)
        for i in reversed(idx):
            op = f.ops[i]
            rs = [id(r) for r in op.results]
            if i in side or i in touched or any(r in returned for r in rs):
                continue
            us = [u for r in rs for u in users.get(r, [])]
            if us and all(u in side for u in us) and all(u in inside for r in rs for u in used_at.get(r, ())):
                side.add(i)
        if not side:
            continue
        split += 1
        for i in side:
            f.ops[i].attrs = {**f.ops[i].attrs, "stream": KV}
    return split


def _engram_ahead(f) -> int:
    """Step 2; returns how many ops moved to the aux stream."""
    pos = {id(r): i for i, op in enumerate(f.ops) for r in op.results}
    first_of_layer: dict[int, int] = {}
    for i, op in enumerate(f.ops):
        n = _layer_of(op.loc)
        if n is not None:
            first_of_layer.setdefault(n, i)
    groups: dict[int, list] = {}
    for i, op in enumerate(f.ops):
        m = _LOC.match(op.loc or "")
        if m and m.group(2) == "engram" and "stream" not in op.attrs:
            groups.setdefault(int(m.group(1)), []).append(i)
    moved = 0
    for n in sorted(groups):
        ahead, ahead_ids, need = [], set(), -1
        for i in groups[n]:
            op = f.ops[i]
            d = lookup(op.name)
            if d is None or d.has_side_effects:
                continue
            ok = True
            for v in op.operands:
                if id(v) in ahead_ids or id(v) not in pos:
                    continue
                src = f.ops[pos[id(v)]]
                if _layer_of(src.loc) is not None:
                    ok = False
                    break
                need = max(need, pos[id(v)])
            if ok:
                ahead.append(i)
                ahead_ids.update(id(r) for r in op.results)
        if not ahead:
            continue
        anchor = max(first_of_layer.get(n - 1, groups[n][0]), need + 1)
        if anchor >= ahead[0]:
            anchor = ahead[0]
        chosen = set(ahead)
        moving = [f.ops[i] for i in ahead]
        for op in moving:
            op.attrs = {**op.attrs, "stream": AUX}
        rest = [op for i, op in enumerate(f.ops) if i not in chosen]
        # the anchor's index among the remaining ops: ops before it that stay
        cut = sum(1 for i in range(anchor) if i not in chosen)
        f.ops = rest[:cut] + moving + rest[cut:]
        moved += len(moving)
        pos = {id(r): i for i, op in enumerate(f.ops) for r in op.results}
        first_of_layer = {}
        for i, op in enumerate(f.ops):
            k = _layer_of(op.loc)
            if k is not None:
                first_of_layer.setdefault(k, i)
    return moved


def insert_events(f) -> int:
    """Step 3: record/wait pairs where a cross-stream dependence is not yet ordered; returns how many."""
    streams = sorted({op_stream(op) for op in f.ops} | {MAIN})
    k = {s: j for j, s in enumerate(streams)}
    ns = len(streams)
    clock = {s: [0] * ns for s in streams}     # what each stream's next op is ordered after
    recorded: dict[int, list] = {}
    touched: dict[int, list] = {}             # id(value) -> [(stream, seq)] that a later reader must follow
    readers: dict[int, list] = {}             # id(value) -> [(stream, seq)] reads since its last write
    out, events = [], 0

    def advance(op, s):
        c = clock[s]
        c[k[s]] += 1
        return c[k[s]]

    def sync(needs, s, loc):
        nonlocal events
        for a in sorted(needs):
            rec = Op("stream.record", [], [EVENT], {"stream": a}, loc)
            advance(rec, a)
            recorded[id(rec.results[0])] = list(clock[a])
            wait = Op("stream.wait", [rec.results[0]], [], {"stream": s}, loc)
            clock[s] = [max(x, y) for x, y in zip(clock[s], recorded[id(rec.results[0])])]
            advance(wait, s)
            out.extend([rec, wait])
            events += 1

    def needs_of(deps, s):
        needs = {}
        for a, q in deps:
            if a != s and clock[s][k[a]] < q:
                needs[a] = max(needs.get(a, 0), q)
        return needs

    for op in f.ops:
        s = op_stream(op)
        deps = [d for v in op.operands for d in touched.get(id(v), ())]
        for w in written_operands(op):
            deps += readers.get(id(w), [])
        sync(needs_of(deps, s), s, op.loc)
        if op.name == "stream.wait" and op.operands and id(op.operands[0]) in recorded:
            clock[s] = [max(x, y) for x, y in zip(clock[s], recorded[id(op.operands[0])])]
        seq = advance(op, s)
        if op.name == "stream.record" and op.results:
            recorded[id(op.results[0])] = list(clock[s])
        for v in op.operands:
            readers.setdefault(id(v), []).append((s, seq))
        for w in written_operands(op):
            touched[id(w)] = touched.get(id(w), []) + [(s, seq)]
            readers[id(w)] = []
        for r in op.results:
            touched[id(r)] = [(s, seq)]
        out.append(op)
    deps = [d for v in f.returns or [] for d in touched.get(id(v), ())]
    sync(needs_of(deps, MAIN), MAIN, None)
    tails = {a: clock[a][k[a]] for a in streams if a != MAIN}
    sync(needs_of(list(tails.items()), MAIN), MAIN, None)
    f.ops = out
    return events


@dataclass(frozen=True)
class ScheduleStreams(ModulePass):
    name: ClassVar[str] = "schedule-streams"

    def run(self, module) -> PassResult:
        from dsv41c.passes.stream_cost import stream_cost

        stats = Counter()
        timing = {}
        for f in module.functions.values():
            stats["layers-split"] += _split_layers(f)
            stats["engram-ops-ahead"] += _engram_ahead(f)
            stats["events"] += insert_events(f)
            for op in f.ops:
                stats[f"ops:stream{op_stream(op)}"] += 1
            cost = stream_cost(module, f)
            timing[f"serial-ns:{f.name}"] = round(cost["serial_us"] * 1000)
            timing[f"streams-ns:{f.name}"] = round(cost["streams_us"] * 1000)
            for n, c in cost["layers"].items():
                timing[f"serial-ns:{f.name}:layer{n}"] = round(c["serial_us"] * 1000)
                timing[f"streams-ns:{f.name}:layer{n}"] = round(c["streams_us"] * 1000)
        changed = bool(stats["layers-split"] or stats["engram-ops-ahead"] or stats["events"])
        return PassResult(module, changed, {**dict(sorted(stats.items())), **timing})
