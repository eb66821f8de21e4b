"""The whole MoE FFN as one plan call: router, routed MXFP4 experts, FP8 shared expert, combine.

What (spec §3.5): y = Σ_j w_j · expert_{idx_j}(x) + shared(x), the router's sqrtsoftplus top-k with the
bias, clamped SwiGLU experts, in x's dtype. The experts are read as the checkpoint stores them, stacked
per layer: w1 / w3 [E, I, D/2] and w2 [E, D, I/2] packed E2M1 with E8M0 scales per 32 ([E, I, D/32],
[E, D, I/32]); the shared expert's w1 / w3 [I, D] and w2 [D, I] FP8 E4M3 with E8M0 32x32 block scales.

This module is the plan's entry to kernels that already exist; it adds no kernel of its own:
- `moe_ffn` (the launcher a `kernel.call @moe_ffn` runs) takes the decision of `specialize-kernels`
  as keys: `path` "gemv" (moe_decode.py: per-slot FP4 GEMVs straight from the router's ids, correct
  for any token count) or "grouped" (moe.py: dispatch + grouped FP4 GEMMs + combine), `core` (the
  GEMV core, 0 = CUDA-core FMAs, 1 = mma.sync), and the variant's tiles. It never forks a stream
  (the shared expert runs on the caller's stream, before the routed experts) and never asks the
  device which path or core to take.
- `moe_ffn_variants(target, widths)`: one variant per (path, core) for the backbone router of the
  config's widths. A variant's binary is its gate/up kernel; `key components` lists the other
  binaries its launch runs ("template/variant": router, prep / down / combine, the shared expert's
  FP8 GEMMs), which the compile driver builds beside it.
- `components(...)`: that list, from the kernel matrix of the target.

Known gaps: the launcher still allocates its workspaces (router partials, dispatch plan, x' / h',
counters) from torch's allocator and takes the router's and the shared expert's tiles from the token
count at run time, not from the plan; the FP8 shared expert runs before the routed experts, not
overlapped on a side stream (a stream is the scheduler's to give); the gate/up K split (KSPLIT) is 1
because the ahead-of-time prep variants zero no gate/up counters; the DSpark router has no variant
here (the plan holds no DSpark MoE yet).
"""
from __future__ import annotations

import torch

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton import moe as mo
from dsv41c.codegen.triton import moe_decode as md
from dsv41c.codegen.triton.fp8_gemm import fp8_gemm, fp8_gemm_swiglu
from dsv41c.codegen.triton.moe_reference import moe_forward_reference
from dsv41c.codegen.triton.moe_router import router, routers
from dsv41c.codegen.triton.targets import target_traits
from dsv41c.codegen.triton.widths import PUBLISHED

ROUTER = "backbone"


# ============================================================================ launcher


def _decode_tiles(D: int, I: int, k: int, core: int) -> dict:
    """The GEMV path's launch tiles of an ahead-of-time variant: its tiles, no K split, no PDL, no handoff."""
    t = md.decode_tiles(D, I, k, interp=False, core=core)
    t["gate_up"] = {**t["gate_up"], "ksplit": 1}
    return {**t, "pdl": False, "fine": False}


def moe_ffn(x, gate_w, bias, w1, s1, w3, s3, w2, s2, sw1, ss1, sw3, ss3, sw2, ss2, *, path: str, TOPK: int,
            route_scale: float, limit: float, gate_temp: float = 1.0, core: int = 0, BM: int = 0, BN: int = 0,
            BK: int = 0, BN_DOWN: int = 0, DOT_SCALED: bool = False, DECODE: int = 0, **_):
    """x [T, D] -> y [T, D] in x's dtype (see the module doc); keys as `specialize-kernels` fixed them."""
    if path not in ("gemv", "grouped"):
        raise ValueError(f"moe_ffn: path {path!r} is not 'gemv' or 'grouped'")
    T, D = x.shape
    I = w1.shape[1]
    tw, ti = router(x, gate_w, bias, TOPK, route_scale, gate_temp, gate_once=False, pdl=False)
    sh = fp8_gemm(fp8_gemm_swiglu(x, sw1, ss1, sw3, ss3, limit), sw2, ss2)
    if path == "gemv":
        return md.moe_experts_decode(x, ti, tw, w1, s1, w3, s3, w2, s2, limit, False, None, x.dtype, shared=sh,
                                     out_dtype=x.dtype, tiles=_decode_tiles(D, I, TOPK, core))
    ds, dec = bool(DOT_SCALED), int(DECODE)
    t_gu = (BM, BN, BK, 8 if BM == 128 else 4, 3 if BM == 128 else 2)
    t_dn = (BM, BN_DOWN or BN, BK, t_gu[3], t_gu[4])
    plan = mo.moe_align(ti, w1.shape[0], BM)
    # h stored in the down kernel's k order where the gate/up tile holds whole BK blocks (as the variant's H_DECODE)
    h_order = mo._order(dec, BK) if dec and BN % BK == 0 and I % BK == 0 else None
    h = mo.moe_gate_up(x, plan, tw, w1, s1, w3, s3, limit, False, None, ds, t_gu, dec, h_order)
    part = mo.moe_down(h, plan, w2, s2, x.dtype, ds, t_dn, dec, h_order)
    return mo.moe_combine(part, TOPK, sh, x.dtype)


def moe_ffn_reference(x, gate_w, bias, w1, s1, w3, s3, w2, s2, sw1, ss1, sw3, ss3, sw2, ss2, *, TOPK: int,
                      route_scale: float, limit: float, gate_temp: float = 1.0, **_):
    """The kernels' own arithmetic in PyTorch (fp32 GEMM sums, h and the slot outputs rounded to x's dtype)."""
    return moe_forward_reference(x, gate_w, bias, w1, s1, w3, s3, w2, s2, (sw1, ss1, sw3, ss3, sw2, ss2),
                                 top_k=TOPK, route_scale=route_scale, limit=limit, gate_temp=gate_temp)


# ============================================================================ variants


def _paths(tr) -> list:
    """(variant suffix, path, core): the GEMV path with each core the target has, and the grouped GEMMs."""
    out = [("gemv", "gemv", 0)]
    if 1 in md._cores(tr):
        out.append(("gemv_mma", "gemv", 1))
    return out + [("grouped", "grouped", 0)]


def components(target: str, widths=PUBLISHED, path: str = "gemv", core: int = 0, tokens="T", shared_mode="prefill"):
    """The binaries (template/variant) a launch of `moe_ffn` runs besides its gate/up kernel.

    tokens: 1 (the decode step: the fused one-launch router) or "T" (any count: every router variant the
    launch may take); shared_mode: the FP8 GEMM mode of the shared expert's two linears."""
    E, k = routers(widths)[ROUTER]
    out = [f"moe_router/decode_fused_{ROUTER}"]
    if tokens != 1:
        out += [f"moe_router/logits_{ROUTER}_decode", f"moe_router/logits_{ROUTER}_prefill",
                f"moe_router/topk_{ROUTER}_e{E}_k{k}"]
    out += [f"fp8_gemm_swiglu/shared_w13_{shared_mode}", f"fp8_gemm/shared_w2_{shared_mode}"]
    if path == "gemv":
        mma = "_mma" if core else ""
        out += [f"moe_decode_prep/plain{'_f16' if core else ''}", f"moe_decode_down_fp4/{ROUTER}_k{k}_forward{mma}"]
    else:
        out += ["moe_down_fp4/prefill", f"moe_combine/{ROUTER}_k{k}"]
    return out


def moe_ffn_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    from dataclasses import replace

    E, k = routers(widths)[ROUTER]
    gemv = {s.variant: s for s in md._gate_up_variants(target, widths)}
    grouped = {s.variant: s for s in mo._gate_up_variants(target, widths)}
    down = {s.variant: s for s in mo._down_variants(target, widths)}
    out = []
    for suffix, path, core in _paths(tr):
        keys = {"router": ROUTER, "E": E, "D": widths.hidden_size, "I": widths.moe_intermediate_size, "TOPK": k,
                "path": path, "core": core, "act": "bf16"}
        if path == "gemv":
            main = gemv[f"{ROUTER}_k{k}" + ("_mma" if core else "")]
        else:
            main = grouped[f"{ROUTER}_prefill"]
            ce = main.constexprs
            keys.update(BM=ce["BM"], BN=ce["BN"], BK=ce["BK"], BN_DOWN=down["prefill"].constexprs["BN"],
                        DOT_SCALED=ce["DOT_SCALED"], DECODE=ce["DECODE"])
        out.append(replace(main, variant=f"{ROUTER}_{suffix}", keys=keys))
    return out


register(KernelTemplate(
    name="moe_ffn", module=__name__,
    summary="the MoE FFN: router, routed MXFP4 experts (stacked, read packed), FP8 shared expert, combine",
    keys=("router", "E", "D", "I", "TOPK", "path", "core", "act", "BM", "BN", "BK", "BN_DOWN", "DOT_SCALED", "DECODE"),
    reference=moe_ffn_reference, launch=moe_ffn, specializations=moe_ffn_variants))
