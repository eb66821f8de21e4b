"""fuse-compressor: each KV source's compressor chain becomes one `dsv41.compressor_fused` op.

What (spec §3.3-3.4): a KV source's step is the compressor (ratio 1: wkv -> RMSNorm; ratio 2: the gated
pair pooling with its carry), then, at the entries' positions, RoPE -> FP4 E2M1 + E4M3/16 pack -> the
compressed-KV cache append, and the indexer key k_norm(wk · latent) -> RoPE -> FP4 + UE8M0/32 pack -> the
indexer-key cache append. Engines run these as a dozen small ops; the compressor kernel template
(codegen/triton/compressor.py) runs them as one. This pass makes the IR say so: the chain becomes one op
(ir/ops_compressor_fused.py), whose reference is the same chain, so the plan computes the same bits.

Algorithm, per function: for each `dsv41.compressor_step` at `loc("layers.G.attn.compressor")`, the chain is
the ops at that same loc (the Compress segment the tracer stamped; the carry's `aten.new_zeros` of a ratio-1
source stays outside). It is fused when it is the packed form `lower-kv-fp4` leaves: two `dsv41.kv_pack`
(fp4_e4m3 for the latent, fp4_ue8m0 for the key) feeding four `dsv41.cache_append` of state buffers, one
`aten.matmul` of the latent with the indexer's wk, and nothing of the chain read outside it but the four
appended caches and the carry. The operands are found by role (the compressor's own operands; the caches by
the pack that feeds their append; wk through its transpose; the key norm's weight and the RoPE inverse
frequencies as the chain's two remaining inputs, told apart by the op that reads them); the fused op goes
where the chain's last input is defined and before its first outside reader, and the chain is erased.
A chain that does not have that form is left alone and counted (`not_fused.<why>`).

Stats: `fused:<function>` (and `fused.ratio<r>:<function>`), `chain_ops_removed:<function>`, `not_fused.<why>`.
Known gaps: the fake-quantized (not yet packed) and the kv-quant-off chains are not fused: the kernel writes
packed caches. The fused op is not a kernel.call yet: the compressor kernel's launcher takes complete groups,
the RoPE table rows and the cache rows (its contract covers the ratio-1 compressed-KV half), so the carry,
the table lookup and the indexer key's half still have to be split out of the op; until then it runs as its
reference on GPU targets (a generic fallback). The RoPE and norm steps are recognised as "the rest of the chain at the compressor's loc",
not matched op by op: the numeric tests (interpreter before == after) are what pins that the fused op
computes what they did.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Op
from dsv41c.ir.registry import lookup
from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import replace_uses

PACK_ROLES = {"fp4_e4m3": ("kv_codes", "kv_scales"), "fp4_ue8m0": ("key_codes", "key_scales")}


class _Skip(Exception):
    pass


class _Index:
    """One function's compressor chains (the ops at each compressor's loc), the readers of the values they
    define and the positions of the values they read: two sweeps, nothing kept per op of the rest (the
    full plan has ~10^5 ops)."""

    def __init__(self, f):
        locs = {op.loc for op in f.ops if op.name == "dsv41.compressor_step"}
        self.by_loc: dict = {loc: [] for loc in locs}
        for op in f.ops:
            if op.loc in self.by_loc and op.name != "aten.new_zeros":  # a ratio-1 source's empty carry stays out
                self.by_loc[op.loc].append(op)
        chain_ops = [op for ops in self.by_loc.values() for op in ops]
        defined = {id(r) for op in chain_ops for r in op.results}
        needed = {id(v) for op in chain_ops for v in op.operands}
        self.pos: dict = {}
        self.readers: dict = {}
        for i, op in enumerate(f.ops):
            for r in op.results:
                if id(r) in needed:
                    self.pos[id(r)] = i
            for v in op.operands:
                if id(v) in defined:
                    self.readers.setdefault(id(v), []).append((i, op))
        self.returned = {id(v) for v in f.returns or ()}


def plan_fusion(f, comp, ix: _Index):
    """(index of the op after which the fused op goes, the fused op, ids of the chain's ops, result
    substitution) for the chain of `comp`; or raise _Skip(why)."""
    chain = ix.by_loc.get(comp.loc, [])
    ids = {id(op) for op in chain}
    defined = {id(r) for op in chain for r in op.results}
    packs = [op for op in chain if op.name == "dsv41.kv_pack"]
    appends = [op for op in chain if op.name == "dsv41.cache_append"]
    if any(op.name.startswith("dsv41.fq_") for op in chain):
        raise _Skip("fake_quantized")
    if sorted(p.attrs.get("fmt") for p in packs) != ["fp4_e4m3", "fp4_ue8m0"] or len(appends) != 4:
        raise _Skip("not_packed")
    if sum(op.name == "dsv41.compressor_step" for op in chain) != 1:
        raise _Skip("two_compressors")
    role = {}
    by_result = {id(r): (p, i) for p in packs for i, r in enumerate(p.results)}
    for ap in appends:
        cache, rows = ap.operands[0], ap.operands[1]
        if id(rows) not in by_result or id(cache) in defined:
            raise _Skip("append_of_other_rows")
        p, i = by_result[id(rows)]
        role[PACK_ROLES[p.attrs["fmt"]][i]] = (cache, ap)
    lat = comp.results[0]
    cargs, _ = lookup(comp.name).bind(comp.operands, comp.attrs)
    wk = None
    by_def = {id(r): op for op in chain for r in op.results}
    for op in chain:
        if op.name == "aten.matmul" and op.operands[0] is lat:
            t = by_def.get(id(op.operands[1]))
            if t is not None and t.name in ("aten.permute", "aten.t", "aten.transpose") \
                    and id(t.operands[0]) not in defined:
                wk = t.operands[0]
    if wk is None:
        raise _Skip("no_key_projection")
    known = {id(v) for v in (cargs["x"], cargs["pos"], cargs["wkv"], cargs["wgate"], cargs["norm_w"],
                             cargs["buf_kv"], cargs["buf_gate"], wk) if v is not None}
    known |= {id(c) for c, _ in role.values()}
    rest, readers = {}, {}
    for op in chain:
        for v in op.operands:
            if id(v) not in defined and id(v) not in known:
                rest[id(v)] = v
                readers.setdefault(id(v), set()).add(op.name)
    inv = [v for i, v in rest.items() if "aten.unsqueeze" in readers[i]]
    norm = [v for i, v in rest.items() if "aten.mul" in readers[i] and "aten.unsqueeze" not in readers[i]]
    if len(rest) != 2 or len(inv) != 1 or len(norm) != 1:
        raise _Skip("inputs")
    # what leaves the chain: the appended caches and the carry, nothing else
    leaving = {id(ap.results[0]) for _, ap in role.values()} | {id(comp.results[1]), id(comp.results[2])}
    first_use = len(f.ops)
    for vid in defined:
        outside = [i for i, op in ix.readers.get(vid, ()) if id(op) not in ids]
        if (outside or vid in ix.returned) and vid not in leaving:
            raise _Skip("escapes")
        first_use = min([first_use] + outside)
    inputs = [cargs["x"], cargs["pos"], cargs["wkv"], cargs["wgate"], cargs["norm_w"], cargs["buf_kv"],
              cargs["buf_gate"], inv[0], wk, norm[0]] + [role[n][0] for n in ("kv_codes", "kv_scales", "key_codes",
                                                                            "key_scales")]
    last_def = max((ix.pos.get(id(v), -1) for v in inputs if v is not None), default=-1)
    if last_def >= first_use:
        raise _Skip("order")
    names = {n: role[n][1].attrs.get("name", n) for n in ("kv_codes", "key_codes")}
    attrs = {"ratio": comp.attrs["ratio"], "eps": comp.attrs["eps"],
             "kv_name": names["kv_codes"].removesuffix(".codes"), "key_name": names["key_codes"].removesuffix(".codes")}
    operands = [v for v in inputs if v is not None]  # an absent wgate (ratio 1) is left out, as in compressor_step
    outs = [role[n][1].results[0] for n in ("kv_codes", "kv_scales", "key_codes", "key_scales")]
    outs += [comp.results[1], comp.results[2]]
    fused = Op("dsv41.compressor_fused", operands, [v.type for v in outs], attrs, comp.loc,
               [v.name for v in outs])
    return last_def, fused, ids, {id(old): new for old, new in zip(outs, fused.results)}


def fuse_all(f, stats: dict) -> int:
    """Fuse every compressor chain of f (planned on the original order, applied in one rebuild)."""
    ix = _Index(f)
    after: dict = {}
    drop, subst = set(), {}
    n = 0
    for comp in [op for op in f.ops if op.name == "dsv41.compressor_step"]:
        try:
            at, fused, ids, sub = plan_fusion(f, comp, ix)
        except _Skip as why:
            key = f"not_fused.{why}"
            stats[key] = stats.get(key, 0) + 1
            continue
        after.setdefault(at, []).append(fused)
        drop |= ids
        subst.update(sub)
        n += 1
        key = f"fused.ratio{fused.attrs['ratio']}:{f.name}"
        stats[key] = stats.get(key, 0) + 1
    if n:
        out = [fused for fused in after.get(-1, [])]
        for i, op in enumerate(f.ops):
            if id(op) not in drop:
                out.append(op)
            out.extend(after.get(i, ()))
        f.ops = out
        replace_uses(f, subst)
    stats[f"fused:{f.name}"] = n
    stats[f"chain_ops_removed:{f.name}"] = len(drop)
    return n


@dataclass(frozen=True)
class FuseCompressor(ModulePass):
    name: ClassVar[str] = "fuse-compressor"

    def run(self, module) -> PassResult:
        import dsv41c.ir.ops_compressor_fused  # noqa: F401  (the op this pass makes)

        stats: dict = {}
        total = sum(fuse_all(f, stats) for f in module.functions.values())
        return PassResult(module, total > 0, dict(sorted(stats.items())))
