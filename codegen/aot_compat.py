"""Triton ahead-of-time compile of one kernel variant for one target: the version shim.

`compile_spec(spec, target)` runs `triton.compile(ASTSource(fn, signature=..., constexprs=...,
attrs=...), target=GPUTarget(...))` and returns the assembly and launch metadata;
`matrix_instructions` counts the matrix instructions in the assembly.

triton 3.6 and 3.9 share this API: `ASTSource(fn, signature, constexprs=None, attrs=None)`
with the signature keyed by argument NAME (constexpr arguments typed "constexpr"), the
constexprs keyed by name, attrs keyed by argument-index tuples (`{(i,): [["tt.divisibility",
16]]}`), and `GPUTarget(backend, arch, warp_size)` ("cuda", 90, 32) / ("hip", "gfx942", 64).
Older releases (< 3.3: `constants=`, index-keyed signatures) are refused with a clear error.
Pointer arguments are compiled as 16-byte aligned, as Triton's JIT specializes them.

Kernels created while TRITON_INTERPRET=1 are `InterpretedFunction`s, and so are
triton.language's own jitted helpers (tl.sum, tl.cdiv, ...). For the compile, every
InterpretedFunction reachable by name (module globals, tensor member functions) is swapped
for a JITFunction and the interpreter knob is off; in-process this is undone afterwards.
The builtins an interpreted launch left patched on triton.language are put back for the compile too
(`triton/interpreter_leaks.py`: triton 3.9's interpreter leaks them from jitted helpers such as tl.sum).
Known gap: an InterpretedFunction held only in a container or a closure is not converted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
import re
import sys
import types

from dsv41c.codegen.triton import interpreter_leaks
from dsv41c.codegen.matrix import KernelBuildError, Target

POINTER_ALIGNMENT = 16

# The matrix instruction families, as they appear in PTX / AMDGCN.
_MATRIX_RE = re.compile(r"\b(wgmma\.mma_async[\w.:]*|tcgen05\.mma[\w.:]*|mma\.sync[\w.:]*|"
                        r"v_mfma\w*|v_smfmac\w*|v_wmma\w*|v_swmmac\w*)")
EXPECTED = {"sm80": "mma.sync", "sm90": "wgmma", "sm100": "tcgen05.mma",
            "gfx942": "v_mfma", "gfx950": "v_mfma", "gfx1100": "v_wmma"}
_FAMILIES = ("wgmma", "tcgen05.mma", "mma.sync", "v_mfma", "v_smfmac", "v_wmma", "v_swmmac")
# AotSpec.keys named like these Triton compile options are passed as options.
OPTION_KEYS = ("enable_fp_fusion", "maxnreg", "num_ctas", "waves_per_eu", "matrix_instr_nonkdim", "kpack",
               "launch_cooperative_grid", "launch_pdl")


def gpu_target(target: Target):
    from triton.backends.compiler import GPUTarget

    if target.backend == "cuda":
        return GPUTarget("cuda", int(target.arch[2:]), target.warp_size)
    if target.backend == "rocm":
        return GPUTarget("hip", target.arch, target.warp_size)
    raise KernelBuildError(f"{target.name}: Triton has no backend for {target.backend}")


_JIT_CACHE: dict = {}


def as_jit_function(fn):
    """A JITFunction for `fn`; an InterpretedFunction (TRITON_INTERPRET=1) is rebuilt as one."""
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction):
        return fn
    py = getattr(fn, "fn", None)
    if not isinstance(py, types.FunctionType):
        raise KernelBuildError(f"{fn!r} is not a @triton.jit kernel")
    if id(fn) not in _JIT_CACHE:
        kwargs = getattr(fn, "kwargs", {}) or {}
        params = inspect.signature(JITFunction.__init__).parameters
        _JIT_CACHE[id(fn)] = (fn, JITFunction(py, **{k: v for k, v in kwargs.items() if k in params and v is not None}))
    return _JIT_CACHE[id(fn)][1]


def _devirtualize() -> list:
    """Replace every InterpretedFunction reachable by name (module globals, tensor member functions)
    with its JITFunction, so the code generator sees a jitted world; returns the undo list.

    Under TRITON_INTERPRET=1 triton.language's own jitted helpers (tl.sum, tl.cdiv, ...) and every
    kernel module's helpers are InterpretedFunctions, which the compiler cannot call.
    """
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover
        return []
    from triton.language import core

    undo = []
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            if issubclass(type(v), InterpretedFunction):  # type(): no __class__ access on lazy proxies
                undo.append((d, k, v))
                d[k] = as_jit_function(v)
    for cls in (core.tensor,):
        for k, v in list(vars(cls).items()):
            inner = v
            if isinstance(v, types.FunctionType) and v.__closure__:  # _tensor_member_fn's wrapper
                inner = next((c.cell_contents for c in v.__closure__
                              if isinstance(c.cell_contents, InterpretedFunction)), v)
            if isinstance(inner, InterpretedFunction):
                undo.append((cls, k, v))
                setattr(cls, k, as_jit_function(inner))
    return undo


def _undo(undo: list) -> None:
    for owner, k, v in reversed(undo):
        if isinstance(owner, dict):
            owner[k] = v
        else:
            setattr(owner, k, v)


@contextlib.contextmanager
def _compile_mode(restore: bool = True, kernel=None):
    """A jitted world, interpreter off, line info off (unless DSV41C_AOT_LINE_INFO=1)."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    saved = (knobs.runtime.interpret, knobs.compilation.disable_line_info)
    # only a process that imported triton.language with the interpreter on needs the swap
    from triton.language import standard

    interpreted = not issubclass(type(standard.sum), JITFunction) or (
        kernel is not None and not issubclass(type(kernel), JITFunction))
    leaks = interpreter_leaks.unleak()  # builtins an interpreted launch left patched (interpreter_leaks.py)
    undo = _devirtualize() if interpreted else []
    knobs.runtime.interpret = False
    knobs.compilation.disable_line_info = os.environ.get("DSV41C_AOT_LINE_INFO", "0") != "1"
    import triton.compiler.code_generator  # noqa: F401 - its first import asserts a jitted triton.language
    try:
        yield
    finally:
        if restore:
            _undo(undo)
            interpreter_leaks.restore(leaks)
            knobs.runtime.interpret, knobs.compilation.disable_line_info = saved


def make_ast_source(fn, signature: dict, constexprs: dict, divisible: dict | None = None):
    """ASTSource across triton versions: names for signature/constexprs, 16-byte pointer hints, and the
    divisibility hints of the integer arguments named in `divisible` (name -> divisor)."""
    from triton.compiler import ASTSource

    source_cls = ASTSource
    try:  # a Gluon kernel (triton.experimental.gluon) compiles from its own AST source
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
        if isinstance(fn, GluonJITFunction):
            source_cls = GluonASTSource
    except ImportError:  # pragma: no cover - a Triton without Gluon
        pass
    params = inspect.signature(ASTSource.__init__).parameters
    if "constexprs" not in params:
        import triton

        raise KernelBuildError(f"triton {triton.__version__}: ASTSource has no 'constexprs' (dsv41c needs triton >= 3.3)")
    names = list(fn.arg_names)
    sig = {}
    for n in names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in signature and signature[n] != "constexpr":
            sig[n] = signature[n]
        else:
            raise KernelBuildError(f"{fn.__name__}: argument '{n}' has no type in the signature and no constexpr value")
    extra = (set(signature) | set(constexprs)) - set(names)
    if extra:
        raise KernelBuildError(f"{fn.__name__}: signature/constexprs name unknown arguments {sorted(extra)}")
    attrs = {(i,): [["tt.divisibility", POINTER_ALIGNMENT]] for i, n in enumerate(names)
             if isinstance(sig[n], str) and sig[n].startswith("*")}
    attrs.update({(names.index(n),): [["tt.divisibility", int(d)]] for n, d in (divisible or {}).items()})
    return source_cls(fn, signature=sig, constexprs=dict(constexprs), attrs=attrs)


def _options(spec, backend) -> dict:
    fields = {f.name for f in dataclasses.fields(backend.parse_options({"enable_fp_fusion": True}))}
    opts = {"num_warps": spec.num_warps, "num_stages": spec.num_stages, "enable_fp_fusion": True}
    for k in OPTION_KEYS:
        if k in (spec.keys or {}) and k in fields:
            opts[k] = spec.keys[k]
    return opts


def source_hash(fn) -> str:
    src = getattr(fn, "src", None)
    if src is None:
        src = inspect.getsource(getattr(fn, "fn", fn))
    return hashlib.sha256(src.encode()).hexdigest()


def matrix_instructions(target: Target, ttir: str, asm: str, chosen: str | None = None) -> dict:
    """The matrix instructions in `asm` against the family expected on `target`, or against `chosen` where the
    variant asks for another one on purpose (AotSpec.matrix; recorded as "chosen" in the result)."""
    found: dict = {}
    for m in _MATRIX_RE.finditer(asm):
        found[m.group(1)] = found.get(m.group(1), 0) + 1
    # Triton's tt.dot; a Gluon kernel has no TTIR and names its MMAs in TTGIR (warpgroup / tcgen05 MMA ops)
    dots = len(re.findall(r"\btt\.dot(?:_scaled)?\b|\bttng\.(?:warp_group_dot|tc_gen5_mma)\b", ttir))
    expected = chosen or EXPECTED.get(target.arch, "")
    families = sorted({f for f in _FAMILIES for name in found if name.startswith(f)})
    if dots == 0:
        check = "no tl.dot"
    elif expected in families:
        check = "ok"
    elif families:
        check = f"fallback: {','.join(families)} instead of {expected}"
    else:
        check = f"none: tl.dot lowered without matrix instructions (expected {expected})"
    out = {"expected": expected, "dots": dots, "found": dict(sorted(found.items())), "check": check}
    if chosen and chosen != EXPECTED.get(target.arch, ""):
        out["chosen"] = f"{chosen} chosen by the variant over the target's {EXPECTED.get(target.arch, '?')}"
    return out


_META_KEYS = ("name", "num_warps", "num_ctas", "num_stages", "shared", "tmem_size", "global_scratch_size",
              "global_scratch_align", "profile_scratch_size", "profile_scratch_align", "cluster_dims",
              "launch_cooperative_grid", "launch_pdl", "warp_size")


def compile_spec(spec, target: Target, restore: bool = True) -> dict:
    """Compile one AotSpec for one target: {"asm": {ext: str|bytes}, "metadata": {...}, "options": {...}}.

    restore=False leaves the process in the jitted world (a forked compiler child).
    """
    import triton
    from triton.compiler import make_backend

    gt = gpu_target(target)
    with _compile_mode(restore, spec.kernel):
        fn = as_jit_function(spec.kernel)
        src = make_ast_source(fn, dict(spec.signature), dict(spec.constexprs), dict(spec.divisible))
        opts = _options(spec, make_backend(gt))
        k = triton.compile(src, target=gt, options=opts)
    md = k.metadata._asdict() if hasattr(k.metadata, "_asdict") else dict(vars(k.metadata))
    meta = {key: _plain(md[key]) for key in _META_KEYS if key in md}
    return {"asm": dict(k.asm), "metadata": meta, "options": opts}


def _plain(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)
