"""share-csa2-state: one producer per CSA2 group for main KV, indexer keys, top-k and candidates.

CSA2 (spec §2, §3.3-3.4) computes each group's state once and publishes it to the group's other
layers: the KV source (mode full) owns the compressor (main KV) and the indexer keys; every index
source (full, reindex) scores its own queries against the group's keys and publishes a top-k that
the following Reuse layers read; the candidate source publishes the candidate blocks that the later
Reindex layers of its group consume. This pass makes the IR hold exactly that, and says so.

Algorithm, per function:
1. Find the producers in the IR, by op and dataflow, not by name alone:
   - compressors: `dsv41.compressor_step` (and the fused compressor ops, `COMPRESSOR_OPS`), the layer
     from the op's `loc("layers.L....")`, the ratio from its attribute;
   - indexer-key producers: the op that applies a layer's `attn.indexer.wk` weight (reached through
     its dequantization and views), the layer from the weight's name;
   - indexer-query scorers (`dsv41.index_scores`, `dsv41.index_scores_int8`), top-k producers
     (`dsv41.select_topk`) and candidate producers (`dsv41.candidate_blocks`), the layer from loc.
   A `kernel.call` with an `op` attribute counts as that op.
2. Merge duplicate computations of the same group state (a Reuse layer that recomputes its group's
   keys, scores or top-k; a segment stamped twice). Value numbering over the ops that compute group
   state (the compressor and indexer pieces, `loc("layers.L.attn.compressor" / ".attn.indexer...")`,
   and the producers): a side-effect-free op's number is (op, attributes, result types, its operands'
   numbers); every other value is numbered by identity (so the pass stays linear in those pieces, not
   in the function); a value some op writes in place gets a new version at every write, so a read
   after a write never numbers like the read before it. A producer whose number an earlier producer already has is a duplicate: its
   uses take the earlier results, and the ops that only fed it are erased. Unlike `cse`, an effect op
   in between (a stream event, a write of an unrelated buffer) does not stop the merge.
3. Check the producers against the layer plan (`frontend/layer_plan.py`, read from the module
   attribute `layer_plan` that the tracer writes): one compressor (of the plan's ratio) and one
   key producer per KV source; one scorer and one top-k per index source, each scoring its own KV
   group's keys; the Reuse layers' attention reading the top-k of the plan's top-k source; one
   candidate producer, at the candidate source, whose mask the consuming Reindex layers read. A count
   or a source off from the plan is a PassError naming the function, the group and the layer.
   Without the attribute (hand-written IR) step 3 is skipped and `plan_checked` is 0.

Stats (`<what>:<function>`): `compressors.ratio<r>`, `index_key_producers`, `index_scorers`,
`topk_producers`, `candidate_producers`, `duplicates_found`, `duplicates_removed` (and
`duplicates.<kind>`), plus `plan_checked`. `dsv41c inspect --json` shows them per function (`csa2`).

Known gaps: a producer that writes state in place (a cache append) is never merged: two appends of the
same entries are counted as found, not removed. The Reuse check follows the top-k value to its direct
users' locations; the main KV's readers are not traced (after `lower-kv-fp4` they read the group's cache
buffer, not a value). Value numbering is structural: it does not see that add(a, b) equals add(b, a),
nor a duplicate whose inputs were themselves recomputed outside the compressor and indexer pieces.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.attrs import attrs_key
from dsv41c.ir.registry import lookup
from dsv41c.ir.verify_streams import written_operands
from dsv41c.passes.base import ModulePass, PassError, PassResult
from dsv41c.passes.rewrite import replace_uses

COMPRESSOR_OPS = ("dsv41.compressor_step", "dsv41.compressor_fused")
SCORER_OPS = ("dsv41.index_scores", "dsv41.index_scores_int8")
TOPK_OPS = ("dsv41.select_topk",)
CANDIDATE_OPS = ("dsv41.candidate_blocks",)
# ops a weight goes through before the op that applies it; and ops a state value passes through unchanged
_WEIGHT_VIEWS = ("dsv41.dequant_weight", "aten.permute", "aten.transpose", "aten.t", "aten.view", "aten.reshape",
                 "aten.to", "aten.contiguous", "aten.clone")
_PASS_THROUGH = _WEIGHT_VIEWS + ("aten.cat", "aten.slice", "aten.narrow", "aten.unsqueeze", "aten.squeeze",
                                 "aten.expand", "dsv41.fq_indexer", "dsv41.fq_compressed_kv", "dsv41.cache_append",
                                 "dsv41.kv_pack", "dsv41.kv_unpack")
_LAYER = re.compile(r"^layers\.(\d+)\.")
_KEY_WEIGHT = ".attn.indexer.wk.weight"


def op_kind(op) -> str:
    """The name an op counts as: a kernel.call with `op` counts as that op."""
    if op.name == "kernel.call" and op.attrs.get("op"):
        return op.attrs["op"]
    return op.name


def loc_layer(loc) -> int | None:
    m = _LAYER.match(loc or "")
    return int(m.group(1)) if m else None


@dataclass
class Producers:
    """The CSA2 producers of one function: kind -> [(layer, op)] in program order."""
    compressors: list
    keys: list
    scorers: list
    topk: list
    candidates: list

    def all(self):
        for kind in ("compressors", "keys", "scorers", "topk", "candidates"):
            for layer, op in getattr(self, kind):
                yield kind, layer, op


def _weight_roots(f) -> dict:
    """id(value) -> the function argument (a weight) it is a dequantized / viewed copy of."""
    roots = {id(a): a.name for a in f.args}
    for op in f.ops:
        if op.name in _WEIGHT_VIEWS and op.operands and id(op.operands[0]) in roots:
            for r in op.results:
                roots[id(r)] = roots[id(op.operands[0])]
    return roots


def find_producers(f) -> Producers:
    roots = _weight_roots(f)
    p = Producers([], [], [], [], [])
    for op in f.ops:
        kind = op_kind(op)
        if kind in COMPRESSOR_OPS:
            p.compressors.append((loc_layer(op.loc), op))
        elif kind in SCORER_OPS:
            p.scorers.append((loc_layer(op.loc), op))
        elif kind in TOPK_OPS:
            p.topk.append((loc_layer(op.loc), op))
        elif kind in CANDIDATE_OPS:
            p.candidates.append((loc_layer(op.loc), op))
        if op.name not in _WEIGHT_VIEWS and kind not in SCORER_OPS + TOPK_OPS + CANDIDATE_OPS:
            for v in op.operands:  # the fused compressor is also its group's key producer
                name = roots.get(id(v), "")
                if name.endswith(_KEY_WEIGHT):
                    p.keys.append((loc_layer(name), op))
                    break
    return p


# ---------------------------------------------------------------------------- duplicates

def _written(f) -> set:
    return {id(v) for op in f.ops for v in written_operands(op)}


_CSA2_LOC = re.compile(r"\.attn\.(indexer|compressor)(\.|$)")


def value_numbers(f, only=None) -> dict:
    """id(value) -> int; equal numbers = the same computation on the same data (module docstring, step 2).
    `only(op)`: the ops to number structurally; every other op's results are numbered by identity."""
    table: dict = {}
    vn: dict = {}
    version: dict = {}
    written = _written(f)

    def number(key):
        n = table.get(key)
        if n is None:
            n = table[key] = len(table)
        return n

    for a in f.args:
        vn[id(a)] = -id(a)  # by identity (ids of live objects are distinct; numbers are >= 0)
    for op in f.ops:
        d = lookup(op_kind(op)) if only is None or only(op) else None
        if d is not None and not d.has_side_effects:
            ins = tuple((vn.get(id(v), -id(v)), version.get(id(v), 0)) if id(v) in written
                        else vn.get(id(v), -id(v)) for v in op.operands)
            base = (op.name, attrs_key(op.attrs), ins, tuple((r.type, attrs_key(r.attrs)) for r in op.results))
            for i, r in enumerate(op.results):
                vn[id(r)] = number((base, i))
        else:
            for r in op.results:
                vn[id(r)] = -id(r)
        if any(id(v) in written for v in op.operands):
            d = lookup(op_kind(op))
            if d is None or d.writes:
                for v in op.operands:
                    if id(v) in written:
                        version[id(v)] = version.get(id(v), 0) + 1
    return vn


def _live_ops(f) -> set:
    from dsv41c.passes.rewrite import has_side_effects

    live_vals = {id(v) for v in f.returns or []}
    live = set()
    for op in reversed(f.ops):
        if has_side_effects(op) or any(id(r) in live_vals for r in op.results):
            live.add(id(op))
            live_vals.update(id(v) for v in op.operands)
    return live


def merge_duplicates(f, prods: Producers) -> tuple[dict, int]:
    """Merge producers that compute what an earlier one computed. -> ({"duplicates.<kind>": n}, removed)."""
    from dsv41c.passes.rewrite import has_side_effects

    roots = {id(op) for _, _, op in prods.all()}
    # the group state is computed by the compressor and indexer pieces (locs `layers.L.attn.compressor`,
    # `layers.L.attn.indexer...`): numbering only those keeps the pass linear in them, not in the function
    vn = value_numbers(f, lambda op: id(op) in roots or bool(_CSA2_LOC.search(op.loc or "")))
    first: dict = {}
    subst: dict = {}
    found: dict = {}
    removed = 0
    order = {id(op): i for i, op in enumerate(f.ops)}
    for kind, _layer, op in sorted(prods.all(), key=lambda t: order[id(t[2])]):
        if not op.results:
            continue
        key = (kind, tuple(vn[id(r)] for r in op.results))
        if key not in first:
            first[key] = op
            continue
        found[f"duplicates.{kind}"] = found.get(f"duplicates.{kind}", 0) + 1
        if has_side_effects(op):
            continue
        for r, r0 in zip(op.results, first[key].results):
            subst[id(r)] = r0
        removed += 1
    if subst:
        before = _live_ops(f)
        replace_uses(f, subst)
        after = _live_ops(f)
        f.ops = [op for op in f.ops if not (id(op) in before and id(op) not in after)]
    return found, removed


# ---------------------------------------------------------------------------- the plan check

def _sources(v, by_result, stop) -> tuple[set, set]:
    """Walk back from v through pass-through ops: (state argument names reached, stop ops reached)."""
    args, ops, seen, todo = set(), set(), set(), [v]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        op = by_result.get(id(x))
        if op is None:
            if x.name:
                args.add(x.name)
            continue
        if id(op) in stop:
            ops.add(id(op))
        elif op.name in _PASS_THROUGH or op.name.startswith("sym."):
            todo.extend(op.operands)
    return args, ops


def _operand(op, name):
    d = lookup(op_kind(op))
    attrs = {k: v for k, v in op.attrs.items() if k not in ("template", "variant", "target", "op")}
    args, _ = d.bind(op.operands, attrs)
    return args.get(name)


class _Check:
    def __init__(self, fname):
        self.fname = fname

    def fail(self, group, layer, mode, what):
        g = f"group {group}, " if group is not None else ""
        raise PassError(f"share-csa2-state: @{self.fname}: {g}layer {layer} ({mode}): {what}")


def check_plan(f, prods: Producers, plan) -> None:
    chk = _Check(f.name)
    spec = {s.index: s for s in plan}
    by_result = {id(r): op for op in f.ops for r in op.results}

    def per_layer(items, want_layers, what, kind):
        got: dict = {}
        for layer, op in items:
            got.setdefault(layer, []).append(op)
        for layer, ops in got.items():
            s = spec.get(layer)
            if layer not in want_layers:
                mode = s.mode if s is not None else "no such layer"
                chk.fail(s.kv_group if s else None, layer, mode,
                         f"has {len(ops)} {what}, the layer plan gives it none (at {ops[0].loc or 'no loc'})")
            if len(ops) != 1:
                chk.fail(s.kv_group, layer, s.mode, f"has {len(ops)} {what} after merging duplicates, want 1")
        for layer in want_layers:
            if layer not in got:
                s = spec[layer]
                chk.fail(s.kv_group, layer, s.mode, f"has no {what}; the layer plan gives it one ({kind})")
        return {layer: ops[0] for layer, ops in got.items()}

    full = [s.index for s in plan if s.mode == "full"]
    index_src = [s.index for s in plan if s.owns_indexer_query and s.ratio]
    cand_src = [s.index for s in plan if s.candidates == "produces"]
    comps = per_layer(prods.compressors, full, "compressor", "KV source")
    for layer, op in comps.items():
        if op.attrs.get("ratio") != spec[layer].ratio:
            chk.fail(layer, layer, "full", f"compressor has ratio {op.attrs.get('ratio')}, the plan "
                                           f"{spec[layer].ratio}")
    keys = per_layer(prods.keys, full, "indexer-key producer", "KV source")
    scorers = per_layer(prods.scorers, index_src, "indexer-query scorer", "index source")
    topks = per_layer(prods.topk, index_src, "top-k producer", "index source")
    cands = per_layer(prods.candidates, cand_src, "candidate producer", "candidate source")
    key_ops = {id(op): layer for layer, op in keys.items()}
    for layer, op in scorers.items():
        s = spec[layer]
        args, reached = _sources(_operand(op, "keys"), by_result, key_ops)
        groups = {key_ops[i] for i in reached} | {int(a.rsplit(".", 1)[1]) for a in args
                                                  if a.startswith("state.index_k.")}
        if groups != {s.kv_group}:
            chk.fail(s.kv_group, layer, s.mode, f"scores the keys of group(s) {sorted(groups) or 'none'}, "
                                                f"the plan's group is {s.kv_group}")
    cand_ops = {id(op): layer for layer, op in cands.items()}
    topk_ids = {id(op.results[0]) for op in topks.values() if op.results}
    users: dict = {}
    for u in f.ops:
        for v in u.operands:
            if id(v) in topk_ids:
                users.setdefault(id(v), []).append(u)
    for layer, op in topks.items():
        s = spec[layer]
        mask = _operand(op, "candidates")
        if s.candidates == "consumes":
            _, reached = _sources(mask, by_result, cand_ops) if mask is not None else (set(), set())
            if not reached:
                chk.fail(s.kv_group, layer, s.mode, "consumes candidates but its top-k reads no candidate mask")
        elif mask is not None:
            chk.fail(s.kv_group, layer, s.mode, "its top-k reads a candidate mask, the plan gives it none")
        # the Reuse check: the layers whose ops read this top-k are those whose top-k source it is
        readers = {loc_layer(u.loc) for u in users.get(id(op.results[0]), ())} - {None}
        want = {t.index for t in plan if t.ratio and t.topk_source == layer}
        for m in sorted(readers - want):
            t = spec.get(m)
            chk.fail(t.kv_group if t else None, m, t.mode if t else "no such layer",
                     f"reads the top-k of layer {layer}; the plan's top-k source is {t.topk_source if t else None}")
        for m in sorted(want - readers):
            chk.fail(spec[m].kv_group, m, spec[m].mode, f"does not read the top-k of its source layer {layer}")


# ---------------------------------------------------------------------------- the pass

@dataclass(frozen=True)
class ShareCsa2State(ModulePass):
    name: ClassVar[str] = "share-csa2-state"

    def run(self, module) -> PassResult:
        plan = None
        text = module.attrs.get("layer_plan")
        if text:
            from dsv41c.frontend.layer_plan import plan_from_attr

            try:
                plan = plan_from_attr(str(text))
            except ValueError as e:
                raise PassError(f"share-csa2-state: the module's {e}") from None
        stats: dict = {"plan_checked": int(plan is not None)}
        removed_total = 0
        for f in module.functions.values():
            prods = find_producers(f)
            found, removed = merge_duplicates(f, prods)
            if removed:
                prods = find_producers(f)
            removed_total += removed
            n = f.name
            by_ratio: dict = {}
            for _, op in prods.compressors:
                by_ratio[op.attrs.get("ratio")] = by_ratio.get(op.attrs.get("ratio"), 0) + 1
            for r, c in sorted(by_ratio.items(), key=lambda kv: str(kv[0])):
                stats[f"compressors.ratio{r}:{n}"] = c
            stats[f"index_key_producers:{n}"] = len(prods.keys)
            stats[f"index_scorers:{n}"] = len(prods.scorers)
            stats[f"topk_producers:{n}"] = len(prods.topk)
            stats[f"candidate_producers:{n}"] = len(prods.candidates)
            stats[f"duplicates_found:{n}"] = sum(found.values())
            stats[f"duplicates_removed:{n}"] = removed
            for k, c in sorted(found.items()):
                stats[f"{k}:{n}"] = c
            if plan is not None:
                check_plan(f, prods, plan)
        return PassResult(module, removed_total > 0, stats)
