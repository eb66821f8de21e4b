"""specialize-kernels{target=T}: replace the ops a kernel implements with `kernel.call`s of a variant for T.

Algorithm, one forward walk per function:
1. Patterns (`_PATTERNS`): each matches a root op and the ops feeding it that only it uses, checks
   the kernel's contract (`ir/kernel_contracts.py`) and the kernel matrix (`codegen/kernel_select.py`,
   variants built for the config's widths), and replaces the root with one `kernel.call` whose
   specialization keys (`key.*`) come from the IR's static shapes and the config, never from a live
   device. The fed ops it subsumed die and are erased here. The patterns:
   - dense FP8 linear: `aten.matmul(x, aten.permute(dsv41.dequant_weight{fp8_block}(W, S), [1, 0]))`
     -> `kernel.call @fp8_gemm(x, W, S)` (the weight is read packed: the dequantized copy is gone);
     mode `prefill` for a chunk of T tokens, `gemv` (or `decode` where no gemv variant exists) for one.
   - MoE FFN: `dsv41.moe(x, gate, bias, [dequant_weight{fp4_row}(W, S)] per expert matrix,
     dequant_weight{fp8_block} shared w1/w2/w3)` -> `kernel.call @moe_ffn(x, gate, bias, W1, S1, W3, S3,
     W2, S2, sw1, ss1, sw3, ss3, sw2, ss2)`. The routed experts' stored codes and scales become one
     function argument per matrix, `<layer>.ffn.experts.w1.weight` [E, ...] with `stack_of` / `stack_count`
     (the runtime stacks the checkpoint's per-expert tensors once at load, as stored), and the per-expert
     arguments go. Path `gemv` (per-slot FP4 GEMVs, any token count) for a decode step and wherever the
     grouped GEMMs' k tiles do not divide the widths, `grouped` for a chunk otherwise; GEMV core 1 (mma.sync)
     for bf16 at widths that are multiples of 128. `key.components` names the other binaries the launch runs
     (router, prep / down / combine, the shared expert's FP8 GEMMs), which the compile driver builds too.
   - RMSNorm: the canonical chain `mul(w, to(mul(xf, rsqrt(add(mean(square(xf), [-1], keepdim), eps)))))`
     with `xf = to(x, f32)` -> `kernel.call @rmsnorm(x, w)` (key eps from the add).
   - mHC site: `dsv41.hc_mixes(H, fn, base, scale)` and the collapse of the same H with the previous
     site's pre, `to(sum(mul(unsqueeze(pre_prev, -1), to(H, f32)), [-2]))` -> `kernel.call @mhc_pre(H,
     pre_prev, fn, base, scale) -> (x_in, pre, post, comb)` at the hc_mixes (the collapse's last op is
     absorbed: its result is the call's x_in). A site with no such collapse keeps its reference.
   - index scores: `dsv41.index_scores_int8(kv_unpack{fp4_ue8m0}(qc, qe), w, kv_unpack{fp4_ue8m0}(kc, ke), p)`
     -> `kernel.call @indexer_score(qc, qe, w, kc, ke, p)`, the packed queries and key cache read as stored
     (passes/specialize_indexer.py).
2. Every domain op (`dsv41.*`) left after the patterns must have a generic fallback on T
   (`GENERIC_FALLBACK`: the op then runs as its reference implementation, and the report says why
   it has no kernel yet); one without is an error naming the op, its loc and the target.
Stats: `kernel_calls:<template>/<variant>`, `fallback:<op>` (domain ops left to their reference),
`dequantized_weights_left` (dequant_weight ops a kernel could still absorb) and, per function,
`aten_left:<function>` (compute ops outside a kernel call; shape-only ops are not counted).
Target `cpu` is a no-op: the cpu plan runs reference ops.
Known gaps: the other templates (attention, compressor, indexer, mHC, Engram) need the packed KV state and
the fusions of `lower-kv-fp4`, `fuse-compressor` and `lower-indexer-int8` before a call can satisfy their
contracts; until then their ops take the generic fallback. Launch parameters: fp8_gemm's split and tiles and
moe_ffn's workspaces and router tiles are still chosen by their launchers from the shapes; no workspace is a
value in the IR yet; mhc_pre's expand (mhc_post) is not matched. The MoE gate bias keeps its cast (dequant_weight{cast}) as the call's operand; the
norms of 3-D values (per-head) are not matched.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Function, Op
from dsv41c.ir.kernel_contracts import KEY_PREFIX, ContractError, check_call
from dsv41c.ir.types import TensorType
from dsv41c.passes.base import ModulePass, PassError, PassResult
from dsv41c.passes.rewrite import erase_dead_ops, use_counts
from dsv41c.passes.specialize_indexer import indexer_scores_call

# Domain ops that run as their reference on a GPU target until the pass that makes their kernel's operands
# exists; each with the reason the report shows.
GENERIC_FALLBACK = {
    "dsv41.sparse_attention": "its kernel reads the FP8 window ring (codes + UE8M0 scales) and the FP4 compressed "
                              "cache in place; the plan hands it a pool concatenated from kv_unpack of the ring and "
                              "of the step's packed rows, with ring-order indices built by ATen ops: no pattern over "
                              "that chain yet (nor a float variant for kv-quant off)",
    "dsv41.compressor_fused": "its kernel (compressor) takes complete groups, the RoPE table and the cache rows; the "
                              "carry and the table lookups stay to be split out of the fused op",
    "dsv41.compressor_step": "its kernel is the fused compressor chain with an in-place FP4 cache append "
                             "(fuse-compressor, lower-kv-fp4)",
    "dsv41.index_scores": "its kernel scores FP4 indexer keys on the exact integer path (lower-indexer-int8)",
    "dsv41.index_scores_int8": "its kernel (indexer_score) reads packed FP4 data: these operands are not "
                               "kv_unpack{fp4_ue8m0}s, or the target has no variant for the widths",
    "dsv41.select_topk": "its kernel selects from the integer-path scores (lower-indexer-int8)",
    "dsv41.candidate_blocks": "its kernel is fused into the integer-path scoring (lower-indexer-int8)",
    "dsv41.moe": "not the pattern moe_ffn implements (the stats' moe_not_matched:<why> say which part differs), "
                 "or no moe_ffn variant on the target",
    "dsv41.hc_mixes": "a site whose input is not collapsed from its streams with the previous site's pre (the "
                      "pattern mhc_pre implements)",
    "dsv41.engram_hash": "no kernel: host-side hashing of the token tail",
    "dsv41.cache_append": "a state write: its kernel is the compressor's fused FP4 cache append (fuse-compressor)",
    "dsv41.ring_append": "a state write: its kernel is kv_fp8_ring_append, on the packed window (lower-kv-fp4)",
    "dsv41.kv_pack": "its kernels are fp4_quant / the fused quantizing writers (kv_fp8_ring_append, compressor)",
    "dsv41.kv_unpack": "its kernels are fp4_dequant / fp8_ue8m0_dequant, or the readers that decode in-kernel",
    "dsv41.engram_apply": "its kernels read the FP8 table and its scales packed (engram_gather, engram_gate)",
    "dsv41.fq_window_kv": "the window KV is fake-quantized until lower-kv-fp4 stores it packed",
    "dsv41.fq_compressed_kv": "the compressed KV is fake-quantized until lower-kv-fp4 stores it packed",
    "dsv41.fq_indexer": "the indexer keys are fake-quantized until lower-kv-fp4 stores them packed",
    "dsv41.dequant_weight": "a weight no kernel reads packed yet (norm weights, BF16 linears, casts)",
    "dsv41.dequant_rows": "the table rows an Engram lookup reads (gather-engram-rows); engram_gather would read them packed",
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
        uses = use_counts(f)
        by_result = {id(r): op for op in f.ops for r in op.results}
        out, changed = [], False
        stacks: dict = {}  # stacked weight name -> its function argument (one per layer matrix)
        users: dict = {}
        for op in f.ops:
            for v in op.operands:
                users.setdefault(id(v), []).append(op)
        absorbed: set = set()  # ops after a call that the call computes too (an mHC site's collapse)
        arg_names = {a.name for a in f.args}
        for op in f.ops:
            if id(op) in absorbed:
                continue
            new = _fp8_linear(op, by_result, uses, self.target, widths, f.name)
            if new is None and op.name == "dsv41.hc_mixes":
                new = _mhc_site(op, by_result, uses, users, self.target, widths, absorbed)
            if new is None and op.name == "aten.mul":
                new = _rmsnorm(op, by_result, uses, self.target, widths)
            if new is None and op.name == "dsv41.moe":
                new = _moe(op, by_result, uses, self.target, widths, f, stacks, stats, arg_names)
            if new is None and op.name == "dsv41.index_scores_int8":
                new = indexer_scores_call(op, by_result, self.target, widths, f.name)
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
        if stacks:  # the per-expert weights a stacked argument now binds: no op reads them any more
            _drop_unused_args(f, {m for v in stacks.values() for m in _members(v)})
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
    # the variant's launch decisions (tiles, split-K, decoder, warps) travel with the call: its launcher takes them
    launch = {k: v for k, v in spec.keys.items() if k in _FP8_LAUNCH_KEYS}
    launch.update(num_warps=spec.num_warps, num_stages=spec.num_stages)
    attrs = {"template": "fp8_gemm", "variant": spec.variant, "target": target,
             **{KEY_PREFIX + k: v for k, v in {**keys, **launch}.items()}}
    try:
        types = check_call("fp8_gemm", [x.type, w.type, s.type], {k: v for k, v in attrs.items()
                                                                   if k.startswith(KEY_PREFIX)})
    except ContractError as e:
        raise PassError(f"specialize-kernels: the call made for loc({op.loc}) in @{fname} breaks its contract: {e}")
    new = Op("kernel.call", [x, w, s], types, attrs, deq.loc or op.loc, [r.name for r in op.results])
    # the matmul's result keeps its identity for later users: rebind them to the call's result
    _replace_uses(op, new)
    return new


def _fed_by(v, by_result, uses, fmt, dtype):
    """The dequant_weight{fmt} op (block 32, no bf16 rounding, to `dtype`) that makes `v` for one user and reads
    function arguments (the stored weight and its scale), else None."""
    d = by_result.get(id(v))
    if d is None or d.name != "dsv41.dequant_weight" or d.attrs.get("fmt") != fmt or d.attrs.get("block") != 32 \
            or d.attrs.get("bf16_round") or uses.get(id(v), 0) != 1 or v.type.dtype != dtype:
        return None
    if len(d.operands) != 2 or not all(isinstance(a.owner, Function) for a in d.operands):
        return None
    return d


_EXPERT = re.compile(r"^(?P<head>.+)\.experts\.(?P<e>\d+)\.(?P<tail>.+)$")


def _stacked(f, members, stacks, arg_names):
    """The argument binding `members` (expert e's tensor at index e, equal types) stacked along a new dim 0:
    named `<head>.experts.<tail>`, attributes stack_of = `<head>.experts.{e}.<tail>` and stack_count = E, which
    the runtime resolves at load into one device tensor as stored (nothing dequantized). None if the names do
    not follow the checkpoint's expert naming or the types differ."""
    heads = [_EXPERT.match(m.name or "") for m in members]
    if not all(heads) or any(int(h["e"]) != e for e, h in enumerate(heads)):
        return None
    head, tail = heads[0]["head"], heads[0]["tail"]
    if any((h["head"], h["tail"]) != (head, tail) for h in heads) or any(m.type != members[0].type for m in members):
        return None
    name = f"{head}.experts.{tail}"
    if name in stacks:
        return stacks[name]
    if name in arg_names:
        raise PassError(f"specialize-kernels: @{f.name} already has an argument %{name}; the stacked experts of "
                        f"%{members[0].name} cannot take that name")
    t = members[0].type
    v = f.add_arg(name, TensorType(t.dtype, (len(members),) + tuple(t.shape)),
                  {"stack_of": f"{head}.experts.{{e}}.{tail}", "stack_count": len(members)})
    stacks[name] = v
    return v


def _members(v):
    fmt, n = v.attrs["stack_of"], v.attrs["stack_count"]
    return [fmt.replace("{e}", str(e)) for e in range(n)]


def _drop_unused_args(f, names):
    """Remove the arguments named in `names` that no op and no return reads (indices renumbered)."""
    used = {id(x) for op in f.ops for x in op.operands} | {id(x) for x in f.returns or ()}
    f.args = [a for a in f.args if a.name not in names or id(a) in used]
    for i, a in enumerate(f.args):
        a.index = i


def _moe(op, by_result, uses, target, widths, f, stacks, stats, arg_names):
    """dsv41.moe(x, gate, bias, [dequant_weight{fp4_row}(W, S) per expert matrix], dequant_weight{fp8_block}
    shared w1/w2/w3) -> kernel.call @moe_ffn(x, gate, bias, W1, S1, W3, S3, W2, S2, sw1, ss1, sw3, ss3, sw2, ss2)
    with the experts' stored tensors stacked per layer (`_stacked`); None (the op falls back) where the op is not
    that shape, with `moe_not_matched:<why>` counted."""
    from dsv41c.codegen.kernel_select import select_variant, variants
    from dsv41c.codegen.triton.moe_ffn import components

    def miss(why):
        stats[f"moe_not_matched:{why}"] = stats.get(f"moe_not_matched:{why}", 0) + 1
        return None

    a = op.attrs
    if not a.get("norm_topk_prob", True) or not a.get("swiglu_limit", 0) > 0:
        return miss("unnormalized_or_unclamped")
    x, gate_w, bias, *rest = op.operands
    n = len(rest) - 3
    if n <= 0 or n % 3 or not isinstance(x.type, TensorType) or x.type.rank != 2:
        return miss("operands")
    dt = x.type.dtype
    experts = [_fed_by(v, by_result, uses, "fp4_row", dt) for v in rest[:n]]
    shared = [_fed_by(v, by_result, uses, "fp8_block", dt) for v in rest[n:]]
    if not all(experts) or not all(shared):
        return miss("weights_not_stored_packed")
    E = n // 3
    packed = {}
    for j, m in enumerate(("w1", "w2", "w3")):
        for k, part in enumerate(("w", "s")):
            v = _stacked(f, [experts[3 * e + j].operands[k] for e in range(E)], stacks, arg_names)
            if v is None:
                return miss("expert_names")
            packed[part + m[1]] = v
    (sw1, ss1), (sw2, ss2), (sw3, ss3) = (d.operands for d in shared)
    T, D = x.type.shape
    I = packed["w1"].type.shape[1]
    act = dt.name
    keys = {"E": E, "D": D, "I": I, "TOPK": int(a["top_k"]), "act": act}
    tokens = T if isinstance(T, int) and T == 1 else "T"
    grouped = select_variant("moe_ffn", target, {**keys, "path": "grouped"}, widths) if tokens != 1 else None
    if grouped is not None and (D % grouped.keys["BK"] or I % grouped.keys["BK"]):
        grouped = None  # the grouped GEMMs' k tiles do not divide these widths: the GEMV path serves any T
    core = 1 if act == "bf16" and D % 128 == 0 and I % 128 == 0 else 0  # core 1: f16-exact x, 128-wide steps
    spec = grouped or select_variant("moe_ffn", target, {**keys, "path": "gemv", "core": core}, widths) \
        or select_variant("moe_ffn", target, {**keys, "path": "gemv", "core": 0}, widths)
    if spec is None:
        return miss("no_variant")
    shared_modes = ("prefill",) if tokens != 1 else ("gemv", "decode")
    comp = components(target, widths, spec.keys["path"], spec.keys["core"], tokens)
    I_s = sw1.type.shape[0]
    for tmpl, (N_, K_), linear in (("fp8_gemm_swiglu", (I_s, D), "shared_w13"), ("fp8_gemm", (D, I_s), "shared_w2")):
        sel = next((v for m in shared_modes if (v := select_variant(
            tmpl, target, {"N": N_, "K": K_, "mode": m, "act": act, "linear": linear}, widths))), None)
        if sel is None:
            return miss("no_shared_expert_variant")
        comp = [c for c in comp if not c.startswith(tmpl + "/")] + [f"{tmpl}/{sel.variant}"]
    have = {}
    for c in comp:
        tmpl, var = c.split("/", 1)
        if tmpl not in have:
            have[tmpl] = {s.variant for s in variants(tmpl, target, widths)}
        if var not in have[tmpl]:
            return miss("no_component_variant")
    attrs = {"template": "moe_ffn", "variant": spec.variant, "target": target,
             **{KEY_PREFIX + k: v for k, v in spec.keys.items() if k != "router"},
             KEY_PREFIX + "act": act, KEY_PREFIX + "route_scale": float(a["route_scale"]),
             KEY_PREFIX + "limit": float(a["swiglu_limit"]), KEY_PREFIX + "gate_temp": float(a.get("gate_temp", 1.0)),
             KEY_PREFIX + "components": ",".join(comp)}
    operands = [x, gate_w, bias, packed["w1"], packed["s1"], packed["w3"], packed["s3"], packed["w2"], packed["s2"],
                sw1, ss1, sw3, ss3, sw2, ss2]
    try:
        types = check_call("moe_ffn", [v.type for v in operands], attrs)
    except ContractError as e:
        raise PassError(f"specialize-kernels: the call made for loc({op.loc}) in @{f.name} breaks its contract: {e}")
    new = Op("kernel.call", operands, types, attrs, op.loc, [r.name for r in op.results])
    _replace_uses(op, new)
    return new


def _rmsnorm(op, by_result, uses, target, widths):
    """mul(w, to(mul(xf, rsqrt(add(mean(square(xf), [-1], keepdim), eps))))) with xf = to(x, f32) (the casts absent
    where x is already f32) -> kernel.call @rmsnorm(x, w). Every op of the chain but xf has this one user; None if
    the chain is not exactly that (other dims, a dtype on the mean, an alpha on the add) or has no variant."""
    from dsv41c.codegen.kernel_select import select_variant

    def one(v, name):
        d = by_result.get(id(v))
        return d if d is not None and d.name == name and uses.get(id(v), 0) == 1 else None

    a, b = op.operands if len(op.operands) == 2 else (None, None)
    if not (isinstance(getattr(a, "type", None), TensorType) and isinstance(getattr(b, "type", None), TensorType)):
        return None
    w, n = (a, b) if a.type.rank == 1 else (b, a)
    if w.type.rank != 1 or n.type.rank != 2 or w.type.dtype != n.type.dtype:
        return None
    act = n.type.dtype
    cast = one(n, "aten.to")
    mul = one(cast.operands[0], "aten.mul") if cast is not None else one(n, "aten.mul")
    if mul is None or len(mul.operands) != 2 or (cast is None and act.name != "f32"):
        return None
    xf, r = mul.operands
    rs = one(r, "aten.rsqrt")
    ad = one(rs.operands[0], "aten.add") if rs is not None else None
    if ad is None or len(ad.operands) != 1 or set(ad.attrs) != {"other"} or not isinstance(ad.attrs["other"], float):
        return None
    mn = one(ad.operands[0], "aten.mean")
    if mn is None or tuple(mn.attrs.get("dim") or ()) not in ((-1,), (1,)) or not mn.attrs.get("keepdim") \
            or mn.attrs.get("dtype") is not None:
        return None
    sq = one(mn.operands[0], "aten.square")
    if sq is None or sq.operands[0] is not xf or xf.type.dtype.name != "f32":
        return None
    up = by_result.get(id(xf))
    x = up.operands[0] if up is not None and up.name == "aten.to" and up.operands[0].type.dtype == act else xf
    if x.type.dtype != act or x.type.rank != 2 or not isinstance(x.type.shape[1], int) \
            or x.type.shape[1] != w.type.shape[0] or (cast is not None and cast.attrs.get("dtype") != act):
        return None
    N = x.type.shape[1]
    spec = select_variant("rmsnorm", target, {"N": N, "act": act.name, "HAS_WEIGHT": True}, widths)
    if spec is None:
        return None
    attrs = {"template": "rmsnorm", "variant": spec.variant, "target": target, KEY_PREFIX + "N": N,
             KEY_PREFIX + "act": act.name, KEY_PREFIX + "eps": float(ad.attrs["other"]),
             KEY_PREFIX + "BLOCK_N": spec.keys["BLOCK_N"]}
    types = check_call("rmsnorm", [x.type, w.type], attrs)
    new = Op("kernel.call", [x, w], types, attrs, op.loc, [r_.name for r_ in op.results])
    _replace_uses(op, new)
    return new


def _mhc_site(op, by_result, uses, users, target, widths, absorbed):
    """hc_mixes(H) and the collapse of the same H with the previous site's pre,
    `to(sum(mul(unsqueeze(pre_prev, -1), to(H, f32)), [-2]), H's dtype)` (the casts absent for f32 streams), ->
    kernel.call @mhc_pre(H, pre_prev, fn, base, scale) -> (x_in, pre, post, comb) at the hc_mixes; the collapse's
    last op is absorbed (its result is the call's x_in), the rest dies. None where no such collapse reads H
    (the site keeps its reference)."""
    from dsv41c.codegen.kernel_select import select_variant

    H, fn, base, scale = op.operands
    if not isinstance(H.type, TensorType) or H.type.rank != 3 or len(op.results) != 3:
        return None
    act = H.type.dtype
    f32 = act.name == "f32"

    def only_user(v, name):
        us = users.get(id(v), [])
        return us[0] if len(us) == 1 and us[0].name == name and uses.get(id(v), 0) == 1 else None

    starts = ([H] if f32 else []) + [u.results[0] for u in users.get(id(H), []) if u.name == "aten.to"
                                     and u.attrs.get("dtype") is not None and u.attrs["dtype"].name == "f32"]
    for hf in starts:
        muls = [u for u in users.get(id(hf), []) if u.name == "aten.mul" and len(u.operands) == 2]
        for m in muls:
            other = m.operands[0] if m.operands[1] is hf else m.operands[1]
            un = by_result.get(id(other))
            if un is None or un.name != "aten.unsqueeze" or un.attrs.get("dim") not in (-1, 2):
                continue
            pre_prev = un.operands[0]
            if pre_prev.type.dtype.name != "f32" or pre_prev.type.shape != H.type.shape[:2]:
                continue
            s = only_user(m.results[0], "aten.sum")
            if s is None or tuple(s.attrs.get("dim") or ()) not in ((-2,), (1,)) or s.attrs.get("keepdim") \
                    or s.attrs.get("dtype") is not None:
                continue
            last = only_user(s.results[0], "aten.to")
            if last is None or last.attrs.get("dtype") != act:
                last = s if f32 else None  # f32 streams: the cast back may be gone (canonicalize)
            if last is None:
                continue
            T, HC, D = H.type.shape
            mode = "decode_gemv" if T == 1 else "prefill"
            streams = "fp32" if f32 else "bf16"
            spec = select_variant("mhc_pre", target, {"HC": HC, "D": D, "mode": mode, "streams": streams}, widths)
            if spec is None:
                return None
            comp = ["mhc_pre/coeff_bt1"] if T == 1 else [
                f"mhc_pre/decode_gemv_{streams}", f"mhc_pre/decode_{streams}", "mhc_pre/coeff_bt1",
                "mhc_pre/coeff_bt8", "mhc_pre/coeff_bt16"]
            a = op.attrs
            attrs = {"template": "mhc_pre", "variant": spec.variant, "target": target, KEY_PREFIX + "HC": HC,
                     KEY_PREFIX + "D": D, KEY_PREFIX + "act": act.name, KEY_PREFIX + "mode": mode,
                     KEY_PREFIX + "iters": int(a["iters"]), KEY_PREFIX + "hc_eps": float(a["hc_eps"]),
                     KEY_PREFIX + "norm_eps": float(a["norm_eps"]), KEY_PREFIX + "components": ",".join(comp)}
            types = check_call("mhc_pre", [H.type, pre_prev.type, fn.type, base.type, scale.type], attrs)
            x = last.results[0]
            new = Op("kernel.call", [H, pre_prev, fn, base, scale], types, attrs, op.loc,
                     [x.name] + [r.name for r in op.results])
            for r_old, r_new in zip([x, *op.results], new.results):
                r_old.owner, r_old.type = new, r_new.type
            new.results = [x, *op.results]
            for i, r in enumerate(new.results):
                r.index = i
            absorbed.add(id(last))
            return new
    return None


_FP8_LAUNCH_KEYS = ("BM", "BN", "BK", "GROUP_M", "SPLIT_K", "FOLD", "DECODE_W", "SPF", "GATED", "PIPE", "SEG")


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
