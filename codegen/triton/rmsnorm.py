"""RMSNorm (weighted or not) and the fused residual-add + RMSNorm, in Triton.

What (spec §3.1): y = w ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), statistics in
fp32, eps = rms_norm_eps (1e-20 in the published config). Unweighted (w = None):
y = (x_f32 · rsqrt(...)).to(x.dtype). The output dtype is x's (promoted with w's when they
differ, as torch's `w * y` would be). `add_rmsnorm(x, residual, w, eps)` first forms
s = (x_f32 + residual_f32).to(residual.dtype), writes it (the new residual) and normalizes s.

Algorithm: one program per row. When the row fits one tile (N <= BLOCK_N; the published
widths 5120, 1280, 512, 128 all do) it stays in registers: one read, one write. Wider rows
take two passes (sum of squares, then normalize); the add variant recomputes x + residual in
the second pass instead of re-reading its own stores.

Decode rows (M <= PDL_MAX_ROWS) launch with programmatic dependent launch on sm90+ (pdl.py): the kernel waits for
its predecessor and releases its successor at once, so a PDL successor (the FP8 GEMMs, the decode router and
compressor) is scheduled while the norm runs and starts reading its weights (benchmarks/step_chain.py).

Specialization keys: N (hidden 5120, q_norm 1280, kv_norm 512, k_norm 128), BLOCK_N,
HAS_WEIGHT, activation dtype, PDL (off in the ahead-of-time variants).

Known gaps: one row per program, so decode (1–8 rows) uses 1–8 programs; that is a latency,
not a bandwidth, problem and these norms are fusion candidates for their producers anyway.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.targets import interpreting, target_traits
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for



def norm_widths(widths=PUBLISHED) -> dict:
    """The model's RMSNorm widths by name: the hidden norms, q_norm, kv_norm and the indexer's k_norm."""
    return {"hidden": widths.hidden_size, "q_norm": widths.q_lora_rank, "kv_norm": widths.head_dim,
            "k_norm": widths.index_head_dim}


NORM_WIDTHS = norm_widths()  # the published config's: 5120, 1280, 512, 128


@triton.jit
def rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, eps, N: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_WEIGHT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr = False):
    """One row of contiguous [M, N] tensors. PDL: wait for the predecessor, then release the next kernel at
    once (pdl.py's contract), so a PDL successor's weight reads overlap this kernel."""
    grid_wait(PDL)
    grid_release(PDL)
    row = tl.program_id(0).to(tl.int64)
    xrow = x_ptr + row * N
    rrow = r_ptr + row * N
    if N <= BLOCK_N:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(xrow + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            x = (x.to(tl.float32) + tl.load(rrow + cols, mask=mask, other=0.0).to(tl.float32)).to(s_ptr.dtype.element_ty)
            tl.store(s_ptr + row * N + cols, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(xf * xf, axis=0) / N + eps))
        n = (xf * rstd).to(x.dtype).to(tl.float32)
        if HAS_WEIGHT:
            n = n * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * N + cols, n.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(xrow + cols, mask=mask, other=0.0)
            if HAS_RESIDUAL:
                x = (x.to(tl.float32) + tl.load(rrow + cols, mask=mask, other=0.0).to(tl.float32)).to(s_ptr.dtype.element_ty)
                tl.store(s_ptr + row * N + cols, x, mask=mask)
            xf = x.to(tl.float32)
            acc += xf * xf
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(acc, axis=0) / N + eps))
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(xrow + cols, mask=mask, other=0.0)
            if HAS_RESIDUAL:
                x = (x.to(tl.float32) + tl.load(rrow + cols, mask=mask, other=0.0).to(tl.float32)).to(s_ptr.dtype.element_ty)
            n = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
            if HAS_WEIGHT:
                n = n * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + row * N + cols, n.to(y_ptr.dtype.element_ty), mask=mask)


# ============================================================================ references


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    n = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return n if weight is None else weight * n


def add_rmsnorm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float):
    """-> (rmsnorm(s), s) with s = (x + residual) rounded to residual's dtype."""
    s = (x.float() + residual.float()).to(residual.dtype)
    return rmsnorm_reference(s, weight, eps), s


# ============================================================================ launchers


def _block(N: int) -> tuple[int, int]:
    if interpreting():
        return min(triton.next_power_of_2(N), 256), 4
    b = min(triton.next_power_of_2(N), 8192)
    return b, (8 if b >= 4096 else 4 if b >= 1024 else 2)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


# Rows up to which the norm is PDL-launched (the module docstring). H200, L2-cold, behind this norm
# (benchmarks/step_chain.py, results/step_chain.json), serialized -> PDL: what wq_a adds to the step
# 5.3-5.5 -> 3.9-4.0 µs at one token, the decode compressor 10.0-10.3 -> 8.7-8.9 µs at ratio 1.
PDL_MAX_ROWS = 16


def _launch(x, residual, weight, eps, pdl=None, block=None):
    N = x.shape[-1]
    if weight is not None and weight.shape != (N,):
        raise ValueError(f"rmsnorm: weight {tuple(weight.shape)} does not match the last dim {N}")
    x2 = _rows(x)
    s_dtype = residual.dtype if residual is not None else x.dtype
    out_dtype = s_dtype if weight is None else torch.promote_types(s_dtype, weight.dtype)
    y = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    r2 = _rows(residual) if residual is not None else x2
    s = torch.empty(x2.shape, dtype=s_dtype, device=x.device) if residual is not None else y
    M = x2.shape[0]
    if M:
        BLOCK, nw = _block(N)
        if block is not None and not interpreting():  # the plan's variant (the interpreter keeps its tiles)
            BLOCK, nw = block, (8 if block >= 4096 else 4 if block >= 1024 else 2)
        # PDL (None: on for decode row counts, where a successor's weight reads can overlap this short kernel)
        pdl = (M <= PDL_MAX_ROWS if pdl is None else bool(pdl)) and pdl_for(x.device)
        rmsnorm_kernel[(M,)](x2, r2, weight.contiguous() if weight is not None else x2, y, s, float(eps), N=N,
                             BLOCK_N=BLOCK, HAS_WEIGHT=weight is not None, HAS_RESIDUAL=residual is not None,
                             PDL=pdl, num_warps=nw, **launch_kw(pdl))
    return y.reshape(x.shape), s.reshape(x.shape)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, pdl: bool | None = None) -> torch.Tensor:
    """pdl: programmatic dependent launch (pdl.py) where the device has it; None: for up to PDL_MAX_ROWS rows."""
    return _launch(x, None, weight, eps, pdl)[0]


def rmsnorm_call(x: torch.Tensor, weight: torch.Tensor, *, N: int, eps: float, BLOCK_N: int = 0, **_) -> torch.Tensor:
    """A plan's `kernel.call @rmsnorm` (x [M, N], weight [N]): the variant's BLOCK_N where it has one (the
    interpreter's 256-wide tiles otherwise), no programmatic dependent launch (the plan's variants are built
    without it)."""
    if x.shape[-1] != N:
        raise ValueError(f"rmsnorm: x {tuple(x.shape)} is not [M, {N}] as the call's key N says")
    return _launch(x, None, weight, eps, pdl=False, block=BLOCK_N or None)[0]


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                pdl: bool | None = None):
    if residual.shape != x.shape:
        raise ValueError(f"add_rmsnorm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    return _launch(x, residual, weight, eps, pdl)


# ============================================================================ ahead-of-time variants


def _variants(target: str, residual: bool, widths=PUBLISHED) -> list:
    if target_traits(target) is None:
        return []
    types = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "s_ptr": "*bf16", "eps": "fp32"}
    out = []
    for name, N in norm_widths(widths).items():
        if residual and name != "hidden":
            continue
        B = triton.next_power_of_2(N)
        nw = 8 if B >= 4096 else 4 if B >= 1024 else 2
        ce = {"N": N, "BLOCK_N": B, "HAS_WEIGHT": True, "HAS_RESIDUAL": residual, "PDL": False}
        out.append(aot_spec(rmsnorm_kernel, f"{name}_n{N}", types, ce, nw, 1, {"norm": name, "act": "bf16", **ce}))
    return out


register(KernelTemplate(
    name="rmsnorm", module=__name__, summary="weighted/unweighted RMSNorm, fp32 statistics, output in x's dtype",
    keys=("norm", "N", "act", "BLOCK_N", "HAS_WEIGHT", "HAS_RESIDUAL", "PDL"), reference=rmsnorm_reference, launch=rmsnorm,
    specializations=lambda t, widths=PUBLISHED: _variants(t, False, widths)))
register(KernelTemplate(
    name="add_rmsnorm", module=__name__, summary="s = x + residual (written) then RMSNorm(s)",
    keys=("norm", "N", "act", "BLOCK_N", "HAS_WEIGHT", "HAS_RESIDUAL", "PDL"), reference=add_rmsnorm_reference, launch=add_rmsnorm,
    specializations=lambda t, widths=PUBLISHED: _variants(t, True, widths)))
