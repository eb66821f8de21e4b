"""The artifact's kernel binaries on the device: all loaded before the first step, then served to the launchers.

`load_binaries(path, manifest, device)`:
1. For every kernel the manifest lists as built for its target, refuses in one line naming the
   kernel and both sides: a binary from another Triton ABI than the installed one (the ABI is
   Triton's major.minor: its kernel parameter conventions change between minor versions), or
   for another architecture than the device's (`cuda:sm90` needs compute capability 9.0;
   `rocm:gfx942` needs that gcnArchName). The files' sha256 were checked by `read_manifest`.
2. Loads each binary through `gpu_driver.py` (cubin on CUDA, HSACO on ROCm) and works out its
   parameter list: the signature's non-constexpr arguments in order, then the scratch pointers
   this Triton appends (global scratch since 3.2, profile scratch since 3.5); on CUDA the count
   is checked against the `.entry` of the PTX beside the cubin.
`install()` puts, in each kernel-library module that holds one of the binaries' JIT functions, a
`BinaryKernel` in its place: `kernel[grid](*args, **kw)` from a launcher then runs the binary
whose constexprs, launch options, argument dtypes, pointer alignment and divisibility match the
call, and otherwise the JIT function itself (a *miss*, counted with its reason in `stats()`), so
the tuned launchers keep working unchanged and every launch the binaries can serve is served
without compiling. `DSV41C_BINARIES=strict` makes a miss an error instead.

Why misses exist: the launchers still choose paths and tiles from the shapes and the live device
(the plan does not yet hand them the variant), and float32 verification builds reuse the bf16
variants' binaries, which take bf16 pointers; both show up as misses with their reason.
Known gaps: cluster launches (num_ctas > 1) and PDL launches are misses; global scratch is
allocated per launch through torch's caching allocator, not from the plan's arena.
"""
from __future__ import annotations

import ctypes
import inspect
import os
import re
from collections import Counter

import torch

from dsv41c.runtime.gpu_driver import DriverError, driver
from dsv41c.runtime.manifest import ArtifactError

_LIBRARY = "dsv41c.codegen.triton"
POINTER_ALIGNMENT = 16  # what the ahead-of-time builds assume of every pointer (codegen/aot_compat.py)

_PTR_DTYPES = {
    "*bf16": (torch.bfloat16,), "*fp16": (torch.float16,), "*fp32": (torch.float32,), "*fp64": (torch.float64,),
    "*i8": (torch.int8,), "*u8": (torch.uint8,), "*i16": (torch.int16,), "*i32": (torch.int32,),
    "*i64": (torch.int64,), "*i1": (torch.bool, torch.int8), "*fp8e4nv": (torch.float8_e4m3fn,),
}
_SCALARS = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
            "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
            "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "fp64": ctypes.c_double}
_INT_RANGE = {"i8": 8, "i16": 16, "i32": 32, "i64": 64}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl", "launch_cooperative_grid", "maxnreg")


def _abi(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


def device_arch(device) -> str:
    """'sm90' / 'gfx942': the architecture name of `device` as targets spell it."""
    props = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        return str(getattr(props, "gcnArchName", "?")).split(":")[0]
    return f"sm{props.major}{props.minor}"


def _scratch_params(metadata: dict) -> int:
    return ("global_scratch_size" in metadata) + ("profile_scratch_size" in metadata)


def _ptx_params(ptx: str, entry: str) -> int | None:
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    return None if m is None else len(re.findall(r"\.param\s", m.group(1)))


class Binary:
    """One loaded variant: its function handle and how to pack a call for it."""

    def __init__(self, entry: dict, fn, keep, arg_names: list):
        self.entry, self.fn, self._keep = entry, fn, keep
        self.name = f"{entry['template']}/{entry['variant']}"
        sig = entry["signature"]
        self.constexprs = entry.get("constexprs", {})
        self.runtime = [(i, n, sig[n]) for i, n in enumerate(arg_names) if sig.get(n) != "constexpr"]
        self.divisible = {k: int(v) for k, v in (entry.get("divisible") or {}).items()}
        md = entry.get("metadata", {})
        self.num_warps = int(md.get("num_warps", entry.get("options", {}).get("num_warps", 4)))
        self.num_stages = int(entry.get("options", {}).get("num_stages", md.get("num_stages", 3)))
        self.block = self.num_warps * int(md.get("warp_size", 32))
        self.shared = int(md.get("shared", 0))
        self.global_scratch = int(md.get("global_scratch_size", 0))
        self.global_align = int(md.get("global_scratch_align", 1))
        self.extra = _scratch_params(md)
        self.unsupported = ("cluster launch" if int(md.get("num_ctas", 1)) > 1 else
                            "PDL launch" if md.get("launch_pdl") else
                            "cooperative launch" if md.get("launch_cooperative_grid") else None)

    def matches(self, values: dict, options: dict) -> str | None:
        """None if this binary serves a call with argument `values` (name -> value) and launch `options`,
        else why not."""
        if self.unsupported:
            return self.unsupported
        for k, v in self.constexprs.items():
            if values.get(k) != v:
                return f"constexpr {k}={values.get(k)!r}, binaries have {v!r}"
        if options.get("num_warps", self.num_warps) != self.num_warps:
            return f"num_warps={options['num_warps']}, binary {self.num_warps}"
        if options.get("num_stages", self.num_stages) != self.num_stages:
            return f"num_stages={options['num_stages']}, binary {self.num_stages}"
        for k in ("launch_pdl", "launch_cooperative_grid", "maxnreg"):
            if options.get(k):
                return f"{k}={options[k]}"
        if options.get("num_ctas", 1) != 1:
            return f"num_ctas={options['num_ctas']}"
        for _, n, ty in self.runtime:
            v = values.get(n)
            if ty.startswith("*"):
                if not isinstance(v, torch.Tensor):
                    return f"{n} is {type(v).__name__}, the binary takes a pointer"
                if v.dtype not in _PTR_DTYPES.get(ty, ()):
                    return f"{n} is {v.dtype}, the binary takes {ty}"
                if v.data_ptr() % POINTER_ALIGNMENT:
                    return f"{n} is not {POINTER_ALIGNMENT}-byte aligned"
            elif ty in _SCALARS:
                if isinstance(v, torch.Tensor) or v is None:
                    return f"{n} is {type(v).__name__}, the binary takes {ty}"
                if ty in _INT_RANGE and not -(1 << (_INT_RANGE[ty] - 1)) <= int(v) < (1 << (_INT_RANGE[ty] - 1)):
                    return f"{n}={v} does not fit {ty}"
                if n in self.divisible and int(v) % self.divisible[n]:
                    return f"{n}={v} is not a multiple of {self.divisible[n]}"
            else:
                return f"argument type {ty} of {n}"
        return None

    def launch(self, grid, values: dict, device):
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        params = []
        for _, n, ty in self.runtime:
            v = values[n]
            params.append(ctypes.c_uint64(v.data_ptr()) if ty.startswith("*") else _SCALARS[ty](v))
        scratch = None
        if self.extra >= 1:
            if self.global_scratch:
                n = grid[0] * grid[1] * grid[2] * self.global_scratch
                scratch = torch.empty(n + self.global_align, dtype=torch.uint8, device=device)
                p = scratch.data_ptr()
                params.append(ctypes.c_uint64(p + (-p) % self.global_align))
            else:
                params.append(ctypes.c_uint64(0))
        if self.extra >= 2:
            params.append(ctypes.c_uint64(0))  # profile scratch: no instrumentation
        stream = torch.cuda.current_stream(device).cuda_stream
        driver().launch(self.fn, grid, self.block, self.shared, stream, params, self.name)
        return scratch


class BinaryKernel:
    """Stands in for a JITFunction in the kernel library: serves `[grid](...)` from binaries when they match."""

    def __init__(self, jit, binaries: list, stats: Counter, misses: dict, strict: bool):
        self.jit, self.binaries, self._stats, self._misses, self.strict = jit, binaries, stats, misses, strict
        self.arg_names = list(jit.arg_names)
        self._defaults = {p.name: p.default for p in getattr(jit, "params", [])
                          if getattr(p, "default", inspect.Parameter.empty) is not inspect.Parameter.empty}

    def __getattr__(self, name):  # .fn, .src, .arg_names ... of the JIT function
        return getattr(self.jit, name)

    def __getitem__(self, grid):
        def run(*args, **kw):
            values = dict(self._defaults)
            values.update(zip(self.arg_names, args))
            options = {k: kw.pop(k) for k in list(kw) if k in _LAUNCH_OPTIONS}
            values.update(kw)
            g = grid(values) if callable(grid) else grid
            g = (g,) if isinstance(g, int) else tuple(g)
            why = None
            for b in self.binaries:
                why = b.matches(values, options)
                if why is None:
                    dev = next((v.device for _, n, ty in b.runtime if ty.startswith("*")
                                for v in [values[n]] if isinstance(v, torch.Tensor)), None)
                    b.launch(g, values, dev)
                    self._stats[b.name] += 1
                    return None
            key = self.jit.__name__
            if self.strict:
                raise ArtifactError(f"kernel {key}: no binary of the artifact serves this launch ({why})")
            self._stats["jit:" + key] += 1
            self._misses.setdefault(key, why)
            return self.jit[grid](*args, **kw, **options)
        return run


class KernelBinaries:
    def __init__(self, by_kernel: dict, loaded: int):
        self.by_kernel, self.loaded = by_kernel, loaded
        self.launches: Counter = Counter()
        self.misses: dict = {}
        self._installed = []

    def install(self, strict: bool | None = None):
        """Serve the kernel library's launches from the binaries (see the module docstring)."""
        import importlib
        import sys

        strict = os.environ.get("DSV41C_BINARIES") == "strict" if strict is None else strict
        for (module, kernel), bins in self.by_kernel.items():
            jit = getattr(importlib.import_module(module), kernel, None)
            if jit is None or not hasattr(jit, "arg_names"):
                raise ArtifactError(f"kernel {kernel}: module {module} of this runtime has no such Triton kernel")
            wrapper = BinaryKernel(jit, bins, self.launches, self.misses, strict)
            for name, mod in list(sys.modules.items()):
                if name.startswith(_LIBRARY) and mod is not None:
                    for attr, val in list(vars(mod).items()):
                        if val is jit:
                            setattr(mod, attr, wrapper)
                            self._installed.append((mod, attr, jit))
        return self

    def uninstall(self):
        for mod, attr, jit in self._installed:
            setattr(mod, attr, jit)
        self._installed.clear()

    def stats(self) -> dict:
        served = sum(v for k, v in self.launches.items() if not k.startswith("jit:"))
        return {"binaries_loaded": self.loaded, "binary_launches": served,
                "jit_launches": sum(v for k, v in self.launches.items() if k.startswith("jit:")),
                "per_kernel": dict(sorted(self.launches.items())), "misses": dict(sorted(self.misses.items()))}


def find_jit(entry: dict):
    """The JIT function a manifest entry was built from: in the template's module, in the module that defines
    it (`kernel_module`), or in any module of the kernel library the template's module imported."""
    import importlib
    import sys

    name = f"{entry.get('template')}/{entry.get('variant')}"
    mods = [m for m in (entry.get("kernel_module"), entry.get("module")) if m]
    for m in mods:
        if not str(m).startswith(_LIBRARY + "."):
            raise ArtifactError(f"kernel {name}: module {m!r} is not in the kernel library")
    for m in mods:
        jit = getattr(importlib.import_module(m), entry["kernel"], None)
        if hasattr(jit, "arg_names"):
            return jit
    for m, mod in list(sys.modules.items()):
        jit = getattr(mod, entry["kernel"], None) if m.startswith(_LIBRARY + ".") and mod is not None else None
        if hasattr(jit, "arg_names"):
            return jit
    raise ArtifactError(f"kernel {name}: this runtime's kernel library has no Triton kernel '{entry['kernel']}'")


def check_entry(entry: dict, target: str, triton_version: str, arch: str) -> str:
    """The kernel's name if its binary can run here: built by this Triton ABI, for this architecture."""
    name = f"{entry.get('template')}/{entry.get('variant')}"
    built = entry.get("triton", "?")
    if _abi(built) != _abi(triton_version):
        raise ArtifactError(f"kernel {name}: built by Triton {built}, this runtime has Triton {triton_version} "
                            f"(another kernel ABI: rebuild the artifact with this Triton)")
    want = target.split(":", 1)[1] if ":" in target else target
    if want != arch:
        raise ArtifactError(f"kernel {name}: built for {want}, the device is {arch}")
    return name


def load_binaries(path: str, manifest: dict, device) -> KernelBinaries:
    """Load every built kernel of `manifest` onto `device` (see the module docstring)."""
    import triton

    target = manifest["target"]
    have_arch = device_arch(device)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)  # the primary context exists and is current before the first module load
    by_kernel: dict = {}
    loaded = 0
    for e in manifest.get("kernels") or []:
        if e.get("status") != "built" or e.get("target") != target:
            continue
        name = check_entry(e, target, triton.__version__, have_arch)
        files = e.get("files", {})
        bin_ext = "hsaco" if target.startswith("rocm") else "cubin"
        if bin_ext not in files:
            raise ArtifactError(f"kernel {name}: the manifest lists no {bin_ext} file")
        with open(os.path.join(path, "kernels", files[bin_ext]), "rb") as f:
            image = f.read()
        jit = find_jit(e)
        arg_names = list(jit.arg_names)
        if set(arg_names) != set(e["signature"]):
            raise ArtifactError(f"kernel {name}: its signature names {sorted(e['signature'])}, this runtime's "
                                f"{e['kernel']} takes {arg_names} (the kernel source changed since the build)")
        try:
            fn, keep = driver().load(image, e.get("entry") or e["kernel"],
                                     int(e.get("metadata", {}).get("shared", 0)), f"kernel {name} ({files[bin_ext]})")
        except DriverError as err:  # a binary the driver refuses is the artifact's fault, not the runtime's
            raise ArtifactError(f"{path}: {err} (the binary is corrupt or not for {have_arch}: rebuild the "
                                f"artifact)") from None
        b = Binary(e, fn, keep, arg_names)
        if "ptx" in files:
            with open(os.path.join(path, "kernels", files["ptx"])) as f:
                n = _ptx_params(f.read(), e.get("entry") or e["kernel"])
            # the PTX entry is the truth about the trailing scratch pointers of this Triton's convention
            if n is not None and 0 <= n - len(b.runtime) <= 2:
                b.extra = n - len(b.runtime)
            elif n is not None:
                raise ArtifactError(f"kernel {name}: the binary takes {n} parameters, its signature has "
                                    f"{len(b.runtime)} (Triton {e.get('triton')}'s calling convention differs from "
                                    f"what this runtime knows)")
        jit_module = getattr(getattr(jit, "fn", jit), "__module__", e["module"])
        by_kernel.setdefault((jit_module, e["kernel"]), []).append(b)
        loaded += 1
    return KernelBinaries(by_kernel, loaded)
