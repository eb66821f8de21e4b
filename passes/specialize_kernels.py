"""specialize-kernels{target=T}: replace the ops a kernel implements with `kernel.call`s of a variant for T.

Algorithm, one forward walk per function:
1. Patterns (`_PATTERNS`): each matches a root op and the ops feeding it that only it uses, checks
   the kernel's contract (`ir/kernel_contracts.py`) and the kernel matrix (`codegen/kernel_select.py`,
   variants built for the config's widths), and replaces the root with one `kernel.call` whose
   specialization keys (`key.*`) come from the IR's static shapes and the config, never from a live
   device. The fed ops it subsumed die and are erased here. Today one pattern:
   - dense FP8 linear: `aten.matmul(x, aten.permute(dsv41.dequant_weight{fp8_block}(W, S), [1, 0]))`
     -> `kernel.call @fp8_gemm(x, W, S)` (the weight is read packed: the dequantized copy is gone);
     mode `prefill` for a chunk of T tokens, `gemv` (or `decode` where no gemv variant exists) for one.
2. Every domain op (`dsv41.*`) left after the patterns must have a generic fallback on T
   (`GENERIC_FALLBACK`: the op then runs as its reference implementation, and the report says why
   it has no kernel yet); one without is an error naming the op, its loc and the target.
Stats: `kernel_calls:<template>/<variant>`, `fallback:<op>` (domain ops left to their reference),
`dequantized_weights_left` (dequant_weight ops a kernel could still absorb) and, per function,
`aten_left:<function>` (compute ops outside a kernel call; shape-only ops are not counted).
Target `cpu` is a no-op: the cpu plan runs reference ops.
Known gaps: the other templates (attention, compressor, indexer, MoE, mHC, norms, Engram) need the
packed KV state and the fusions of `lower-kv-fp4`, `fuse-compressor` and `lower-indexer-int8`
before a call can satisfy their contracts; until then their ops take the generic fallback. A
variant's launch parameters (split, workspace) are still chosen by its launcher from the shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Op
from dsv41c.ir.kernel_contracts import KEY_PREFIX, ContractError, check_call
from dsv41c.ir.types import TensorType
from dsv41c.passes.base import ModulePass, PassError, PassResult
from dsv41c.passes.rewrite import erase_dead_ops

# Domain ops that run as their reference on a GPU target until the pass that makes their kernel's operands
# exists; each with the reason the report shows.
GENERIC_FALLBACK = {
    "dsv41.sparse_attention": "its kernel reads the FP8 window ring and the FP4 compressed cache (lower-kv-fp4)",
    "dsv41.compressor_step": "its kernel is the fused compressor chain with an in-place FP4 cache append "
                             "(fuse-compressor, lower-kv-fp4)",
    "dsv41.index_scores": "its kernel scores FP4 indexer keys on the exact integer path (lower-indexer-int8)",
    "dsv41.index_scores_int8": "its kernel (indexer_score) reads the packed FP4 codes and UE8M0 exponents; the "
                               "operands are FP4 values until the indexer cache and queries are stored packed",
    "dsv41.select_topk": "its kernel selects from the integer-path scores (lower-indexer-int8)",
    "dsv41.candidate_blocks": "its kernel is fused into the integer-path scoring (lower-indexer-int8)",
    "dsv41.moe": "its kernels take the routed experts stacked per layer in MXFP4; the plan binds them per expert",
    "dsv41.hc_mixes": "its kernel (mhc_pre) fuses the collapse with the previous site's mixes",
    "dsv41.engram_hash": "no kernel: host-side hashing of the token tail",
    "dsv41.cache_append": "a state write: its kernel is the compressor's fused FP4 cache append (fuse-compressor)",
    "dsv41.ring_append": "a state write: its kernel is kv_fp8_ring_append, on the packed window (lower-kv-fp4)",
    "dsv41.kv_pack": "its kernels are fp4_quant / the fused quantizing writers (kv_fp8_ring_append, compressor)",
    "dsv41.kv_unpack": "its kernels are fp4_dequant / fp8_ue8m0_dequant, or the readers that decode in-kernel",
    "dsv41.engram_apply": "its kernels read the FP8 table and its scales packed (engram_gather, engram_gate)",
    "dsv41.fq_window_kv": "the window KV is fake-quantized until lower-kv-fp4 stores it packed",
    "dsv41.fq_compressed_kv": "the compressed KV is fake-quantized until lower-kv-fp4 stores it packed",
    "dsv41.fq_indexer": "the indexer keys are fake-quantized until lower-kv-fp4 stores them packed",
    "dsv41.dequant_weight": "a weight no kernel reads packed yet (norm weights, BF16 linears, the experts)",
}

# ops that only move, view or size data: not counted as compute left outside kernels
_SHAPE_OPS = {"aten.view", "aten.reshape", "aten.permute", "aten.transpose", "aten.t", "aten.unsqueeze",
              "aten.squeeze", "aten.expand", "aten.flatten", "aten.slice", "aten.select", "aten.narrow",
              "aten.cat", "aten.stack", "aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind",
              "aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.broadcast_to", "aten.sym_size",
              "aten.sym_numel", "aten.scalar_tensor", "aten.arange", "aten.full", "aten.full_like", "aten.zeros",
              "aten.ones", "aten.empty", "aten.zeros_like", "aten.ones_like", "aten.new_zeros", "aten.new_ones",
              "aten.new_empty", "aten.view_dtype", "aten.to", "aten.type_as"}


def is_compute(op) -> bool:
    return not (op.name in _SHAPE_OPS or op.name.startswith(("sym.", "stream.", "kernel.")))


def _aten_left(module) -> dict:
    return {f"aten_left:{f.name}": sum(1 for op in f.ops if op.name.startswith("aten.") and is_compute(op))
            for f in module.functions.values()}


def _uses(f) -> dict:
    n: dict = {}
    for op in f.ops:
        for v in op.operands:
            n[id(v)] = n.get(id(v), 0) + 1
    for v in f.returns or ():
        n[id(v)] = n.get(id(v), 0) + 1
    return n


def _static(t) -> bool:
    return isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape)


@dataclass(frozen=True)
class SpecializeKernels(ModulePass):
    name: ClassVar[str] = "specialize-kernels"
    target: str = "cpu"

    def run(self, module) -> PassResult:
        if self.target == "cpu":  # nothing to choose; what is left outside kernels is still reported
            return PassResult(module, False, _aten_left(module))
        from dsv41c.codegen.matrix import TARGETS

        if self.target not in TARGETS:
            raise PassError(f"specialize-kernels: unknown target '{self.target}' (targets: {', '.join(TARGETS)})")
        widths = _widths(module)
        stats: dict = {}
        changed = False
        for f in module.functions.values():
            changed |= self._function(f, widths, stats)
        stats.update(_aten_left(module))
        return PassResult(module, changed, dict(sorted(stats.items())))

    def _function(self, f, widths, stats) -> bool:
        uses = _uses(f)
        by_result = {id(r): op for op in f.ops for r in op.results}
        out, changed = [], False
        for op in f.ops:
            new = _fp8_linear(op, by_result, uses, self.target, widths, f.name)
            if new is not None:
                stats_key = f"kernel_calls:{new.attrs['template']}/{new.attrs['variant']}"
                stats[stats_key] = stats.get(stats_key, 0) + 1
                out.append(new)
                changed = True
                continue
            out.append(op)
        f.ops = out
        if changed:  # the dequantized weights and views the calls absorbed
            erase_dead_ops(f)
        for op in f.ops:  # what is left: a fallback the matrix names, or an error
            if op.name.startswith("dsv41."):
                if op.name not in GENERIC_FALLBACK:
                    raise PassError(f"specialize-kernels: op {op.name} at loc({op.loc}) in @{f.name} has no kernel "
                                    f"variant and no generic fallback on {self.target}")
                key = f"fallback:{op.name}"
                stats[key] = stats.get(key, 0) + 1
        return changed


def _widths(module):
    """The model widths the kernel variants are built for: the module's `widths` attribute (the tracer writes
    the config's integer fields there), else the published config's."""
    from types import SimpleNamespace

    from dsv41c.codegen.triton.widths import PUBLISHED, ModelWidths

    text = module.attrs.get("widths")
    if not text:
        return PUBLISHED
    try:
        fields = {k: int(v) for k, v in (item.split("=", 1) for item in text.split())}
        return ModelWidths.of(SimpleNamespace(**fields))
    except ValueError as e:
        raise PassError(f"specialize-kernels: the module's widths attribute is not usable: {e}") from None


def _fp8_linear(op, by_result, uses, target, widths, fname):
    """matmul(x, permute(dequant_weight{fp8_block}(W, S), [1, 0])) -> kernel.call fp8_gemm(x, W, S)."""
    from dsv41c.codegen.kernel_select import select_variant

    if op.name != "aten.matmul" or len(op.operands) != 2:
        return None
    x, wt = op.operands
    perm = by_result.get(id(wt))
    if perm is None or perm.name != "aten.permute" or tuple(perm.attrs.get("dims", ())) != (1, 0):
        return None
    deq = by_result.get(id(perm.operands[0]))
    if deq is None or deq.name != "dsv41.dequant_weight" or deq.attrs.get("fmt") != "fp8_block" \
            or deq.attrs.get("block") != 32 or deq.attrs.get("bf16_round"):
        return None
    if uses.get(id(wt), 0) != 1 or not isinstance(x.type, TensorType) or x.type.rank != 2:
        return None
    w, s = deq.operands
    if not (_static(w.type) and _static(s.type)):
        return None
    N, K = w.type.shape
    M = x.type.shape[0]
    act = x.type.dtype.name
    modes = ("prefill",) if not isinstance(M, int) or M > 16 else (("gemv", "decode") if M == 1 else ("decode",))
    spec = None
    linear = _linear_name(deq.loc)
    for mode in modes:
        keys = {"N": N, "K": K, "mode": mode, "act": act}
        spec = select_variant("fp8_gemm", target, {**keys, "linear": linear}, widths)
        if spec is not None:
            break
    if spec is None:
        return None  # no variant: the dequantized matmul stays (counted in dequantized_weights_left)
    attrs = {"template": "fp8_gemm", "variant": spec.variant, "target": target,
             **{KEY_PREFIX + k: v for k, v in keys.items()}}
    try:
        types = check_call("fp8_gemm", [x.type, w.type, s.type], {k: v for k, v in attrs.items()
                                                                   if k.startswith(KEY_PREFIX)})
    except ContractError as e:
        raise PassError(f"specialize-kernels: the call made for loc({op.loc}) in @{fname} breaks its contract: {e}")
    new = Op("kernel.call", [x, w, s], types, attrs, deq.loc or op.loc, [r.name for r in op.results])
    # the matmul's result keeps its identity for later users: rebind them to the call's result
    _replace_uses(op, new)
    return new


def _linear_name(loc) -> str:
    """`layers.3.attn.indexer.wq_b` -> `indexer_wq_b`, `layers.0.ffn.shared_experts.w2` -> `shared_w2`: the
    kernel library's names of the model's linears (a variant built for the same linear is preferred)."""
    parts = (loc or "").split(".")
    leaf = parts[-1] if parts else ""
    if len(parts) >= 2 and parts[-2] in ("indexer", "engram"):
        return f"{parts[-2]}_{leaf}"
    if len(parts) >= 2 and parts[-2] == "shared_experts":
        return f"shared_{leaf}"
    return leaf


def _replace_uses(old, new):
    """Later ops read `old`'s results: make the new op own those Value objects instead."""
    for r_old, r_new in zip(old.results, new.results):
        r_old.owner, r_old.type = new, r_new.type
    new.results = list(old.results)
