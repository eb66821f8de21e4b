"""The content-addressed cache of ahead-of-time kernel builds.

One compiled kernel (a template's variant for one target) is stored under the key
    sha256(template name, variant, its keys/signature/constexprs/divisibility/warps/stages,
           target, Triton version, the template's source hash, the AOT driver's source hash)
as `<root>/<key[:2]>/<key>/` holding `entry.json` (the build manifest's entry) and the binary
and assembly files. The root is `$DSV41C_CACHE_DIR`, else `~/.cache/dsv41c`; it is shared by
`dsv41c kernels --build` and the compile driver.

The template's source hash covers the module defining the template and, transitively, every
`dsv41c.codegen` module whose names it imports (helper `@triton.jit` functions live in
sibling modules), so editing a helper invalidates the kernels that call it. The AOT driver's
own source (`aot.py`, `aot_compat.py`: compile options, pointer alignment) is in the key too.

Writes are atomic: an entry is written into a temporary directory beside its final place and
renamed in; a concurrent writer of the same key loses the rename and keeps the winner's copy.
Only built kernels are stored (a failure may be a transient timeout). Known gaps: no size
limit or eviction (remove the directory to clear it); the hash does not follow imports
outside `dsv41c.codegen` (the Triton version covers Triton itself).
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
import types

LAYOUT = 1  # bump when the entry layout changes


def default_cache_dir() -> str:
    return os.environ.get("DSV41C_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dsv41c")


def _module_text(mod) -> bytes:
    try:
        return inspect.getsource(mod).encode()
    except (OSError, TypeError):
        return repr(mod).encode()


def module_closure(module_name: str, prefix: str = "dsv41c.codegen") -> list:
    """`module_name` and every `prefix` module its globals come from, transitively, sorted."""
    seen, todo = set(), [module_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        mod = sys.modules.get(name)
        if mod is None:
            __import__(name)
            mod = sys.modules[name]
        for v in vars(mod).values():
            dep = v.__name__ if isinstance(v, types.ModuleType) else getattr(v, "__module__", None)
            if not isinstance(dep, str):
                dep = getattr(getattr(v, "fn", None), "__module__", None)  # a JITFunction wraps its Python function
            if isinstance(dep, str) and dep.startswith(prefix) and dep not in seen:
                todo.append(dep)
    return sorted(seen)


def module_closure_hash(module_name: str, prefix: str = "dsv41c.codegen") -> str:
    """sha256 over the sources of `module_closure(module_name, prefix)`."""
    h = hashlib.sha256()
    for name in module_closure(module_name, prefix):
        h.update(name.encode() + b"\0" + hashlib.sha256(_module_text(sys.modules[name])).digest())
    return h.hexdigest()


_DRIVER_HASH = None


def _driver_hash() -> str:
    global _DRIVER_HASH
    if _DRIVER_HASH is None:
        # the build driver's source, read from its files by module name: importing aot here would close an import
        # cycle (aot imports this module)
        text = b"".join(open(importlib.util.find_spec(m).origin, "rb").read()
                        for m in ("dsv41c.codegen.aot", "dsv41c.codegen.aot_compat"))
        _DRIVER_HASH = hashlib.sha256(text).hexdigest()
    return _DRIVER_HASH


def kernel_key(template_name: str, module: str, spec, target: str, triton_version: str,
               template_hash: str | None = None) -> str:
    """The cache key of one specialization (see the module docstring)."""
    desc = {
        "layout": LAYOUT, "template": template_name, "variant": spec.variant, "target": target,
        "triton": triton_version, "template_source": template_hash or module_closure_hash(module),
        "driver": _driver_hash(), "kernel": getattr(spec.kernel, "__name__", "?"),
        "keys": spec.keys or {}, "signature": dict(spec.signature), "constexprs": spec.constexprs,
        "divisible": dict(spec.divisible or {}), "num_warps": spec.num_warps, "num_stages": spec.num_stages,
        "matrix": getattr(spec, "matrix", None), "line_info": os.environ.get("DSV41C_AOT_LINE_INFO", "0"),
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()


class KernelCache:
    def __init__(self, root: str | None = None):
        self.root = os.path.abspath(root or default_cache_dir())
        self.hits = self.misses = self.stored = 0

    def _dir(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key)

    def fetch(self, key: str, dest_root: str) -> dict | None:
        """Copy a cached kernel's files into dest_root (at the entry's relative paths); its entry, or None."""
        d = self._dir(key)
        try:
            with open(os.path.join(d, "entry.json")) as f:
                entry = json.load(f)
            for rel in entry["files"].values():
                out = os.path.join(dest_root, rel)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                shutil.copyfile(os.path.join(d, os.path.basename(rel)), out)
        except (OSError, ValueError, KeyError):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def store(self, key: str, entry: dict, src_root: str) -> None:
        """Store a built entry whose files lie under src_root; an unwritable cache is not an error."""
        final = self._dir(key)
        if os.path.isdir(final):
            return
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".{key[:12]}.tmp-", dir=os.path.dirname(final))
        except OSError:
            return
        try:
            for rel in entry["files"].values():
                shutil.copyfile(os.path.join(src_root, rel), os.path.join(tmp, os.path.basename(rel)))
            with open(os.path.join(tmp, "entry.json"), "w") as f:
                json.dump(entry, f, sort_keys=True)
            os.rename(tmp, final)
            self.stored += 1
        except OSError:  # another process stored the same key first, or the disk is full
            shutil.rmtree(tmp, ignore_errors=True)
