"""lower-indexer-int8: index scoring over FP4 data becomes the exact integer scorer.

The indexer's queries and keys are FP4 (E2M1 with one UE8M0 scale per 32 channels, spec §3.4), so
their dot products are integer products of the codes times powers of two. `dsv41.index_scores_int8`
(ir/ops_indexer_int8.py, dsv41c/prims/indexer_int8.py) computes them so: a per-row range proof
(the codes shifted to the row's smallest exponent fit INT8), the integer dot with the scales applied
after, and the float path's dot where the proof does not hold (per query head: the per-head fallback
mask; per key tile: the whole-tile fallback). Its scores equal `dsv41.index_scores`'s bit for bit, so
the top-k, the candidates and everything after them are the float32 path's. The indexer_score kernel
(codegen/triton/indexer_score.py) implements it on the GPU.

Algorithm: one forward walk per function. A `dsv41.index_scores` whose queries and keys are FP4 data
becomes `dsv41.index_scores_int8` with the same operands and `ratio`, and the kernel's query block
(`block_q` 1 for up to HEADS_KERNEL_MAX_S static queries: the decode kernel; 16 otherwise) and key tile
(`block_t` 128). FP4 data is a value reached back through views, `aten.cat` and `dsv41.cache_append`
only from `dsv41.fq_indexer` (the fake quantizer), `dsv41.kv_unpack{fmt = "fp4_ue8m0"}` (the packed
indexer format) or the persistent indexer-key state (`state.index_k.*`, which the plan writes only
with FP4 keys). Scores over anything else (`--kv-quant off`) stay on the float path.

Stats: `lowered:<function>`, `left_float:<function>` (index_scores whose operands are not FP4 data).
Fallback counts are properties of the data: they are counted when the plan runs
(`with prims.indexer_int8.count_fallbacks() as c: interpret(...)`).
Known gaps: the op reads the FP4 values; after `lower-kv-fp4` they are `kv_unpack`s of the packed codes and
exponents, and `specialize-kernels` (passes/specialize_indexer.py) makes it a kernel.call of indexer_score
that reads those as stored, in its plain flavour only (the candidate source's block max and the Reindex
layers' candidate mask stay separate ops). The kernel sums the heads in its own pinned order
(w·d^-0.5 folded, h = 0..H-1): its scores can differ from this op's in the last bits (the per-op check's
tolerance), which can reorder top-k entries whose scores are that close.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Op
from dsv41c.passes.base import ModulePass, PassResult

HEADS_KERNEL_MAX_S = 4  # codegen/triton/indexer_score.py: up to this many queries take the decode (heads) kernel
BLOCK_T = 128  # the kernel's key tile (its AOT variants: bt128)
_VIEWS = ("aten.view", "aten.reshape", "aten.slice", "aten.narrow", "aten.unsqueeze", "aten.squeeze", "aten.clone",
          "aten.contiguous", "aten.alias", "aten.detach", "aten.to")
_MERGES = ("aten.cat", "dsv41.cache_append")


def is_fp4(v, by_result) -> bool:
    """v holds FP4 (E2M1 + UE8M0/32) values only (see the module docstring for what counts)."""
    todo, seen = [v], set()
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        op = by_result.get(id(x))
        if op is None:  # a function argument: the plan's indexer-key state
            if not (x.name or "").startswith("state.index_k.") or x.attrs.get("placement") != "persistent":
                return False
            continue
        if op.name == "dsv41.fq_indexer" or (op.name == "dsv41.kv_unpack" and op.attrs.get("fmt") == "fp4_ue8m0"):
            continue
        if op.name == "aten.to" and op.attrs.get("dtype") not in (None, x.type.dtype):
            return False  # a cast may round: only dtype-preserving copies pass
        if op.name in _VIEWS:
            todo.append(op.operands[0])
        elif op.name in _MERGES:
            todo.extend(o for o in op.operands if o.type.rank >= 1 and o.type.dtype == x.type.dtype)
        else:
            return False
    return True


def block_q_for(q_type) -> int:
    S = q_type.shape[0]
    return 1 if isinstance(S, int) and S <= HEADS_KERNEL_MAX_S else 16


@dataclass(frozen=True)
class LowerIndexerInt8(ModulePass):
    name: ClassVar[str] = "lower-indexer-int8"

    def run(self, module) -> PassResult:
        import dsv41c.ir.ops_indexer_int8  # noqa: F401  (the op this pass makes)

        stats: dict = {}
        total = 0
        for f in module.functions.values():
            by_result = {id(r): op for op in f.ops for r in op.results}
            lowered = left = 0
            for i, op in enumerate(f.ops):
                if op.name != "dsv41.index_scores":
                    continue
                q, w, keys, positions = op.operands
                if not (is_fp4(q, by_result) and is_fp4(keys, by_result)):
                    left += 1
                    continue
                new = Op("dsv41.index_scores_int8", [q, w, keys, positions], [r.type for r in op.results],
                         {**op.attrs, "block_q": block_q_for(q.type), "block_t": BLOCK_T}, op.loc)
                for r_old, r_new in zip(op.results, new.results):  # later users keep reading the same Value
                    r_old.owner = new
                new.results = list(op.results)
                f.ops[i] = new
                lowered += 1
            stats[f"lowered:{f.name}"] = lowered
            stats[f"left_float:{f.name}"] = left
            total += lowered
        return PassResult(module, total > 0, stats)
