"""The kernel template registry: one entry per hot operation.

A template is a Triton kernel (or a small family of them) with a pure-PyTorch reference
and the specialization keys the compiler may fix per target (tile sizes, head count,
ratio, ...). Each kernel module under `codegen/triton/` registers its templates with
`register(...)` at import time; `all_templates()` imports every kernel module and returns
the registry. The kernel matrix (`codegen/matrix.py`) and the ahead-of-time builder
(`codegen/aot.py`) read only this registry, so adding a kernel is one file.

`specializations(target)` returns the concrete variants to build for a target: each is an
`AotSpec` with the Triton signature (argument name -> type string such as "*bf16", "i32",
or "constexpr"), the constexpr values, and launch options. It returns [] when the template
has no variant for that target (the matrix then shows a fallback or a gap).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

# Every kernel module; importing one registers its templates.
KERNEL_MODULES = (
    "dsv41c.codegen.triton.compressor",
    "dsv41c.codegen.triton.kv_quant",
    "dsv41c.codegen.triton.indexer",
    "dsv41c.codegen.triton.sparse_attention",
    "dsv41c.codegen.triton.sparse_attention_ws",
    "dsv41c.codegen.triton.mhc",
    "dsv41c.codegen.triton.moe",
    "dsv41c.codegen.triton.moe_router",
    "dsv41c.codegen.triton.moe_decode",
    "dsv41c.codegen.triton.moe_ffn",
    "dsv41c.codegen.triton.fp8_gemm",
    "dsv41c.codegen.triton.fp8_warp_split",
    "dsv41c.codegen.triton.rmsnorm",
    "dsv41c.codegen.triton.engram",
)


@dataclass(frozen=True)
class AotSpec:
    """One concrete kernel to compile ahead of time."""

    kernel: Callable  # the @triton.jit function
    variant: str  # short name, e.g. "h64_bk128"
    signature: dict  # arg name -> "*bf16" | "*fp32" | "*u8" | "i32" | "fp32" | "constexpr" ...
    constexprs: dict  # constexpr arg name -> value
    num_warps: int = 4
    num_stages: int = 2
    keys: dict = field(default_factory=dict)  # the specialization keys this variant fixes
    # the matrix-instruction family this variant is meant to use where it is not the target's usual one (the FP8
    # decode tile's 2 warps ask for mma.sync on sm90); None: the target's (aot_compat.EXPECTED)
    matrix: str | None = None
    # integer arguments the caller promises to be multiples of a number (name -> divisor), compiled in as Triton's
    # divisibility hint (pointers always get 16 bytes: aot_compat.POINTER_ALIGNMENT)
    divisible: dict = field(default_factory=dict)


@dataclass(frozen=True)
class KernelTemplate:
    name: str  # e.g. "indexer_score"
    module: str  # the module that defines it
    summary: str  # one line: what it computes
    keys: tuple  # names of the specialization keys
    reference: Callable  # pure-PyTorch reference with the same call signature as `launch`
    launch: Callable  # host wrapper that launches the Triton kernel(s) on torch tensors
    specializations: Callable[[str], list]  # target string ("cuda:sm90", ...) -> [AotSpec]
    # targets where only a generic (unspecialized) variant exists, with the reason
    generic_on: dict = field(default_factory=dict)
    # targets with no variant on purpose, with the reason the matrix shows for the gap
    missing_on: dict = field(default_factory=dict)


def aot_spec(kernel, variant, types: dict, constexprs: dict, num_warps=4, num_stages=2, keys=None,
             matrix=None, divisible=None) -> AotSpec:
    """AotSpec with the signature in the kernel's argument order; every argument must be typed. divisible: integer
    arguments (name -> divisor) that every launch passes as multiples of it."""
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in types:
            sig[name] = types[name]
        else:
            raise ValueError(f"aot_spec({kernel.__name__}, {variant}): argument '{name}' has no type")
    extra = set(constexprs) - set(kernel.arg_names)
    if extra:
        raise ValueError(f"aot_spec({kernel.__name__}, {variant}): unknown constexprs {sorted(extra)}")
    bad = [n for n in (divisible or {}) if n not in sig or sig[n] not in ("i32", "i64")]
    if bad:
        raise ValueError(f"aot_spec({kernel.__name__}, {variant}): divisible names non-integer arguments {bad}")
    return AotSpec(kernel=kernel, variant=variant, signature=sig, constexprs=dict(constexprs),
                   num_warps=num_warps, num_stages=num_stages, keys=dict(keys if keys is not None else constexprs),
                   matrix=matrix, divisible=dict(divisible or {}))


_REGISTRY: dict[str, KernelTemplate] = {}


def register(t: KernelTemplate) -> KernelTemplate:
    if t.name in _REGISTRY and _REGISTRY[t.name].module != t.module:
        raise ValueError(f"kernel template '{t.name}' registered twice ({_REGISTRY[t.name].module}, {t.module})")
    _REGISTRY[t.name] = t
    return t


def all_templates() -> dict[str, KernelTemplate]:
    for m in KERNEL_MODULES:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            if e.name != m:  # a real import error inside the module
                raise
    return dict(sorted(_REGISTRY.items()))
