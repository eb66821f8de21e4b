"""A thin layer over the GPU driver API: load a kernel binary, find its entry, launch it on a stream.

CUDA (`libcuda.so.1`: cuModuleLoadData, cuModuleGetFunction, cuFuncSetAttribute, cuLaunchKernel)
and ROCm (`libamdhip64.so`: the hipModule* functions of the same shapes) share this code path;
which library is opened follows the torch build (`torch.version.hip`). The calls go through
ctypes, so nothing is compiled at install time. The context is the one torch made current on
this thread (the runtime touches the device through torch before the first load).

Every call's status is checked; a failure raises `DriverError` with the call, the driver's own
error name and what was being done (kernel and file).

Known gaps: no cluster launches (`num_ctas` > 1) and no programmatic dependent launch: a binary
that needs either is refused by the caller (`kernel_binaries.py`), not launched wrongly. The ROCm
path cannot be run on the machines this is developed on (no AMD GPU); it is written to the HIP
API's documented signatures and tested only as far as opening the library.
"""
from __future__ import annotations

import ctypes

import torch

# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES / hipFuncAttributeMaxDynamicSharedMemorySize
_ATTR_MAX_DYNAMIC_SHARED = 8
# shared memory a kernel may use without opting in to more (both vendors)
STATIC_SHARED_LIMIT = 48 * 1024


class DriverError(RuntimeError):
    """A driver call failed (names the call, the driver's error and the kernel)."""


class Driver:
    """The driver library of this torch build, opened once (`driver()`)."""

    def __init__(self):
        self.hip = bool(getattr(torch.version, "hip", None))
        names = ("libamdhip64.so", "libamdhip64.so.6") if self.hip else ("libcuda.so.1", "libcuda.so")
        self.lib = None
        for n in names:
            try:
                self.lib = ctypes.CDLL(n)
                break
            except OSError:
                continue
        if self.lib is None:
            raise DriverError(f"cannot open the GPU driver library ({' or '.join(names)})")
        p = "hip" if self.hip else "cu"
        self._load = getattr(self.lib, f"{p}ModuleLoadData")
        self._get = getattr(self.lib, f"{p}ModuleGetFunction")
        self._set = getattr(self.lib, f"{p}FuncSetAttribute")
        self._launch = getattr(self.lib, f"{p}ModuleLaunchKernel" if self.hip else "cuLaunchKernel")
        self._err = getattr(self.lib, f"{p}GetErrorName", None)
        self._load.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        self._set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p,
                                                                            ctypes.POINTER(ctypes.c_void_p),
                                                                            ctypes.c_void_p]
        self.vendor = "rocm" if self.hip else "cuda"

    def _check(self, status: int, call: str, what: str):
        if status == 0:
            return
        name = f"error {status}"
        if self._err is not None:
            s = ctypes.c_char_p()
            if self.hip:
                self._err.restype = ctypes.c_char_p
                raw = self._err(status)
                name = raw.decode() if raw else name
            elif self._err(status, ctypes.byref(s)) == 0 and s.value:
                name = s.value.decode()
        raise DriverError(f"{what}: {call} failed ({name})")

    def load(self, image: bytes, entry: str, shared: int, what: str):
        """The function `entry` of the binary `image`; `shared` bytes of dynamic shared memory enabled."""
        torch.cuda.init()  # the primary context, made current by torch
        buf = ctypes.create_string_buffer(image, len(image))
        mod = ctypes.c_void_p()
        self._check(self._load(ctypes.byref(mod), buf), "ModuleLoadData", what)
        fn = ctypes.c_void_p()
        self._check(self._get(ctypes.byref(fn), mod, entry.encode()), f"ModuleGetFunction('{entry}')", what)
        if shared > STATIC_SHARED_LIMIT:
            self._check(self._set(fn, _ATTR_MAX_DYNAMIC_SHARED, int(shared)), "FuncSetAttribute(max shared)", what)
        # the module handle and image stay alive as long as the function is used
        return fn, (mod, buf)

    def launch(self, fn, grid, block: int, shared: int, stream: int, params, what: str):
        """Launch `fn` on `grid` (3 ints) with `block` threads; `params` are ctypes scalars, in order."""
        ptrs = (ctypes.c_void_p * max(1, len(params)))(*[ctypes.addressof(p) for p in params])
        self._check(self._launch(fn, int(grid[0]), int(grid[1]), int(grid[2]), int(block), 1, 1, int(shared),
                                 ctypes.c_void_p(stream), ptrs, None), "LaunchKernel", what)


_DRIVER: Driver | None = None


def driver() -> Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = Driver()
    return _DRIVER
