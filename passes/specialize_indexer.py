"""The indexer_score pattern of specialize-kernels: `dsv41.index_scores_int8` over packed FP4 data -> kernel.call.

    index_scores_int8(kv_unpack{fp4_ue8m0}(qc, qe), w, kv_unpack{fp4_ue8m0}(kc, ke), positions)
        -> kernel.call @indexer_score(qc, qe, w, kc, ke, positions) {key.H, key.CI, key.BQ, key.BT, key.ratio}

The kernel reads the queries' and the key cache's codes and exponents as stored (the unpacks die when
nothing else reads them); the variant comes from the kernel matrix for the config's widths: the decode kernel
for BQ 1 (the op's query block), the queries-as-rows kernel for BQ 16, plain (no candidate mask, no block
max: those are separate ops). The call's reference is the op's, so the plan interprets to the same bits;
the kernel itself sums the heads in its own order (the per-op check's `indexer_score` rule).
Known gaps: the candidate-source and Reindex flavours (block max, candidate mask fused in) are not selected.
"""
from __future__ import annotations

from dsv41c.ir.core import Op
from dsv41c.ir.kernel_contracts import KEY_PREFIX, ContractError, check_call
from dsv41c.ir.types import TensorType
from dsv41c.passes.base import PassError


def _unpacked(v, by_result):
    d = by_result.get(id(v))
    if d is None or d.name != "dsv41.kv_unpack" or d.attrs.get("fmt") != "fp4_ue8m0" or len(d.operands) != 2:
        return None
    return d.operands


def indexer_scores_call(op, by_result, target, widths, fname):
    """The kernel.call for `op` (a dsv41.index_scores_int8), or None where its operands are not packed data or
    the matrix has no variant."""
    from dsv41c.codegen.kernel_select import select_variant

    if op.name != "dsv41.index_scores_int8" or len(op.operands) != 4:
        return None
    q, w, keys, positions = op.operands
    qp, kp = _unpacked(q, by_result), _unpacked(keys, by_result)
    if qp is None or kp is None or not isinstance(q.type, TensorType) or q.type.rank != 3:
        return None
    _, H, CI = q.type.shape
    if not (isinstance(H, int) and isinstance(CI, int)) or w.type.dtype.name != "f32":
        return None
    BQ, BT = op.attrs["block_q"], op.attrs["block_t"]
    spec = select_variant("indexer_score", target, {"H": H, "CI": CI, "BQ": BQ, "BT": BT, "USE_CAND": False,
                                                    "WRITE_BMAX": False}, widths)
    if spec is None:
        return None
    attrs = {"template": "indexer_score", "variant": spec.variant, "target": target, KEY_PREFIX + "H": H,
             KEY_PREFIX + "CI": CI, KEY_PREFIX + "BQ": BQ, KEY_PREFIX + "BT": BT, KEY_PREFIX + "ratio": op.attrs["ratio"]}
    operands = [qp[0], qp[1], w, kp[0], kp[1], positions]
    try:
        types = check_call("indexer_score", [v.type for v in operands], attrs)
    except ContractError as e:
        raise PassError(f"specialize-kernels: the call made for loc({op.loc}) in @{fname} breaks its contract: {e}")
    new = Op("kernel.call", operands, types, attrs, op.loc, [r.name for r in op.results])
    for r_old, r_new in zip(op.results, new.results):  # later users keep reading the same Value
        r_old.owner, r_old.type = new, r_new.type
    new.results = list(op.results)
    return new
