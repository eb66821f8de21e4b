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
packed caches. The RoPE and norm steps are recognised as "the rest of the chain at the compressor's loc",
not matched op by op: the numeric tests (interpreter before == after) are what pins that the fused op
computes what they did.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Op
from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import replace_uses

PACK_ROLES = {"fp4_e4m3": ("kv_codes", "kv_scales"), "fp4_ue8m0": ("key_codes", "key_scales")}


class _Skip(Exception):
    pass


def _chain(f, comp):
    return [op for op in f.ops if op.loc == comp.loc and op.name != "aten.new_zeros"]


def fuse_one(f, comp, counts: dict):
    """The fused op for the chain of `comp`, inserted, the chain erased; or raise _Skip(why)."""
    chain = _chain(f, comp)
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
    from dsv41c.ir.registry import lookup

    cargs, _ = lookup(comp.name).bind(comp.operands, comp.attrs)
    wk = None
    by_def = {id(r): op for op in chain for r in op.results}
    for op in chain:
        if op.name == "aten.matmul" and op.operands[0] is lat:
            t = by_def.get(id(op.operands[1]))
            if t is not None and t.name in ("aten.permute", "aten.t", "aten.transpose") and id(t.operands[0]) not in defined:
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
    for i, op in enumerate(f.ops):
        if id(op) in ids:
            continue
        for v in op.operands:
            if id(v) in defined:
                if id(v) not in leaving:
                    raise _Skip("escapes")
                first_use = min(first_use, i)
    if any(id(v) in defined and id(v) not in leaving for v in f.returns or ()):
        raise _Skip("escapes")
    inputs = [cargs["x"], cargs["pos"], cargs["wkv"], cargs["wgate"], cargs["norm_w"], cargs["buf_kv"],
              cargs["buf_gate"], inv[0], wk, norm[0]] + [role[n][0] for n in ("kv_codes", "kv_scales", "key_codes",
                                                                            "key_scales")]
    pos_of = {id(r): i for i, op in enumerate(f.ops) for r in op.results}
    last_def = max((pos_of.get(id(v), -1) for v in inputs if v is not None), default=-1)
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
    subst = {id(old): new for old, new in zip(outs, fused.results)}
    f.ops.insert(last_def + 1, fused)
    f.ops = [op for op in f.ops if id(op) not in ids]
    replace_uses(f, subst)
    counts["chain_ops_removed"] = counts.get("chain_ops_removed", 0) + len(chain)
    return fused


@dataclass(frozen=True)
class FuseCompressor(ModulePass):
    name: ClassVar[str] = "fuse-compressor"

    def run(self, module) -> PassResult:
        import dsv41c.ir.ops_compressor_fused  # noqa: F401  (the op this pass makes)

        stats: dict = {}
        total = 0
        for f in module.functions.values():
            counts: dict = {}
            n = 0
            for comp in [op for op in f.ops if op.name == "dsv41.compressor_step"]:
                try:
                    fused = fuse_one(f, comp, counts)
                except _Skip as why:
                    key = f"not_fused.{why}"
                    stats[key] = stats.get(key, 0) + 1
                    continue
                n += 1
                key = f"fused.ratio{fused.attrs['ratio']}:{f.name}"
                stats[key] = stats.get(key, 0) + 1
            stats[f"fused:{f.name}"] = n
            stats[f"chain_ops_removed:{f.name}"] = counts.get("chain_ops_removed", 0)
            total += n
        return PassResult(module, total > 0, dict(sorted(stats.items())))
