"""Undo what Triton's interpreter leaves patched on triton.language, for a compile in the same process.

Why: to run a kernel, the interpreter (TRITON_INTERPRET=1) swaps triton.language's builtins (`core.mul`,
`tensor.__mul__`, ...) and a few hooks (`range`, `static_range`, `dtype.to_ir`, `tensor.__bool__`, ...) for numpy
versions, and restores them when the launch ends. A jitted helper called inside the kernel (`tl.sum` and the other
helpers of `triton.language.standard`, whose globals hold `triton.language.core`) patches again through
`InterpretedFunction.__call__`, whose scope is never restored: `core`'s builtins then stay patched for the rest of
the process (triton 3.9). A later real compile in that process (the ahead-of-time builds, the Gluon kernel's sm90
build in the CPU tests) then calls the interpreter's `mul` from `tensor.__mul__` and fails with "'value' object has
no attribute 'dtype'" — only where Triton's cache does not already hold the kernel, as on a fresh CI machine.

What: `record()` keeps each patched object's attributes as imported (called when `dsv41c.codegen.triton` is first
imported, before any launch); `unleak()` puts back every attribute that now holds something the interpreter made
(a function of `triton.runtime.interpreter`, a property or partial around one, `print` for `static_print`) and
removes ones it added, returning the undo list for `aot_compat`'s compile mode. Without a record, the builtin
wrappers are still undone (each keeps the original as its `member` default); the other hooks are then left alone.

Known gap: objects other than those `_patch_lang` touches in triton 3.6 / 3.9 are not looked at.
"""
from __future__ import annotations

import functools

_INTERPRETER = "triton.runtime.interpreter"
_MISSING = object()
_UNKNOWN = object()
_RECORD: list | None = None


def _objects() -> list:
    """What the interpreter's `_patch_lang` patches (those present in this triton)."""
    import triton.language as tl

    core = tl.core
    objs = [tl, core, getattr(tl, "math", None), core.tensor, getattr(core, "condition", None), core.dtype,
            getattr(core, "tensor_descriptor_base", None)]
    return [o for o in objs if o is not None]


def record() -> None:
    """Keep the attributes of triton.language's patched objects as they are now (once a process)."""
    global _RECORD
    if _RECORD is None:
        _RECORD = [(o, {k: _original(v) for k, v in vars(o).items()}) for o in _objects()]


def _original(v):
    """v, or, for something the interpreter made (a record taken after a leak), the original a builtin wrapper
    keeps, else _UNKNOWN (left alone)."""
    if not _made_by_interpreter(v):
        return v
    return (getattr(v, "__kwdefaults__", None) or {}).get("member", _UNKNOWN)


def _made_by_interpreter(v) -> bool:
    f = v.fget if isinstance(v, property) else v.func if isinstance(v, functools.partial) else v
    return getattr(f, "__module__", None) == _INTERPRETER or f is print


def unleak() -> list:
    """Put back what the interpreter left patched; returns [(owner, name, value now)] for `restore`."""
    undo = []
    clean = dict((id(o), c) for o, c in (_RECORD or []))
    for obj in _objects():
        rec = clean.get(id(obj))
        for k, v in list(vars(obj).items()):
            if not _made_by_interpreter(v):
                continue
            orig = rec.get(k, _MISSING) if rec is not None else _original(v)  # no record: the wrappers know theirs
            if orig is v or orig is _UNKNOWN:
                continue
            undo.append((obj, k, v))
            if orig is _MISSING:
                delattr(obj, k)
            else:
                setattr(obj, k, orig)
    return undo


def restore(undo: list) -> None:
    """Undo `unleak` (the interpreter's later launches expect to find what they left)."""
    for obj, k, v in reversed(undo):
        setattr(obj, k, v)
