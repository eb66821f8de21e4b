"""Test set-up shared by every tier.

Kernel tests run in Triton's interpreter on machines without a GPU: TRITON_INTERPRET must
be set before triton is first imported, so it is set here, at collection start. On a CUDA
machine (the GPU tier) it is left alone and `gpu`-marked tests run for real.

Compiled artifacts (`tiny_off`, `mini_off`, `mini_on`) are session-wide fixtures: each is
built on first request and reused by every test module (and every pytest-xdist worker).

Interpreter speed: Triton's interpreter re-patches all of `triton.language` (an
`inspect.getmembers` over several modules) on every call of a jitted helper, inside every
program; in the kernel tests that was most of their time. `_skip_repatching` makes a helper call
skip that when the language modules it sees are already patched for the running launch, which
leaves them exactly as the call would have (the patches depend only on which modules are
patched). Off on a GPU, where nothing is interpreted; a Triton without these internals is left
alone.
"""
import os
import sys

import pytest
import torch

# Test modules import shared builders from tests/kernel_helpers.py (importlib mode puts no test
# folder on sys.path by itself).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests run small tensors on one intra-op thread (test modules set torch.set_num_threads(1); the CLI's run does
# too); the scripts and commands they start as subprocesses inherit the same through OMP_NUM_THREADS, so they
# do not pay thread start-up per op, nor spin against each other and the test process on a loaded machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _skip_repatching():
    """Helper calls inside an interpreted launch skip re-patching modules the launch already patched."""
    try:
        import inspect

        from triton.runtime import interpreter as ti
        grid_call, fn_call, lang = ti.GridExecutor.__call__, ti.InterpretedFunction.__call__, (ti.tl, ti.tl.core)
        error = ti.InterpreterError
    except (ImportError, AttributeError):
        return
    patched = []  # per running launch: the ids of the language modules patched for it
    seen = {}  # id(globals) -> (their size, the language modules in them)

    def langs(fn):  # what `_patch_lang(fn)` patches: the triton.language modules in fn's globals
        g = fn.__globals__
        hit = seen.get(id(g))
        if hit is None or hit[0] != len(g):
            hit = seen[id(g)] = (len(g), frozenset(id(v) for v in g.values() if inspect.ismodule(v)
                                                   and any(v is m for m in lang)))
        return hit[1]

    def launch(self, *args, **kwargs):
        patched.append(langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def helper(self, *args, **kwargs):
        if patched:
            need = langs(self.fn)
            if need <= patched[-1]:
                try:
                    return self.rewrite()(*args, **kwargs)
                except Exception as e:  # as InterpretedFunction.__call__ reports it
                    raise error(repr(e)) from e
            patched[-1] |= need
        return fn_call(self, *args, **kwargs)

    ti.GridExecutor.__call__, ti.InterpretedFunction.__call__ = launch, helper

    # the numpy dtype of a Triton type: the interpreter builds its 18-entry table again on every call (per op)
    get_np_dtype, tl = ti._get_np_dtype, ti.tl
    names = ("int1 float16 float32 float64 int8 uint8 int16 uint16 int32 uint32 int64 uint64 bfloat16 float8e5 "
             "float8e5b16 float8e4nv float8e4b8 float8e4b15").split()
    table = {getattr(tl, n): get_np_dtype(getattr(tl, n)) for n in names if hasattr(tl, n)}
    u64 = get_np_dtype(tl.pointer_type(tl.int8))

    def np_dtype(t):
        if isinstance(t, tl.pointer_type):
            return u64
        if isinstance(t, tl.block_type):
            if isinstance(t.element_ty, tl.pointer_type):
                return u64
            t = t.element_ty
        hit = table.get(t)
        return hit if hit is not None else get_np_dtype(t)

    ti._get_np_dtype = np_dtype


if os.environ.get("TRITON_INTERPRET") == "1":
    _skip_repatching()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _artifact(tmp_path_factory, preset, kv_quant):
    """Built once per run: under pytest-xdist the workers share the parent of their temporary folders, and the
    first to ask builds it there under a file lock while the others wait."""
    from filelock import FileLock

    from dsv41c.driver import build_artifact

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / f"{preset}-{'on' if kv_quant else 'off'}.dsv41c"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            build_artifact(str(path), preset=preset, kv_quant=kv_quant)
    return str(path)


@pytest.fixture(scope="session")
def tiny_off(tmp_path_factory):
    return _artifact(tmp_path_factory, "tiny", False)


@pytest.fixture(scope="session")
def mini_off(tmp_path_factory):
    return _artifact(tmp_path_factory, "mini", False)


@pytest.fixture(scope="session")
def mini_on(tmp_path_factory):
    return _artifact(tmp_path_factory, "mini", True)


@pytest.fixture
def sparse_fp4_experts():
    """Factory for MXFP4 routed experts at real widths where only the `used` experts hold random codes
    (the rest zero), so 384 experts cost little to build: -> (w1, s1, w3, s3, w2, s2)."""
    import torch

    def make(E, D, I, used, gen, device, random_scales=True):
        w1 = torch.zeros(E, I, D // 2, dtype=torch.int8, device=device)
        w3, w2 = torch.zeros_like(w1), torch.zeros(E, D, I // 2, dtype=torch.int8, device=device)
        s1 = torch.full((E, I, D // 32), 120, dtype=torch.uint8, device=device)
        s3, s2 = s1.clone(), torch.full((E, D, I // 32), 120, dtype=torch.uint8, device=device)
        for t_ in (w1, w3, w2):
            t_[used] = torch.randint(-128, 128, t_[used].shape, generator=gen, device=device, dtype=torch.int8)
        if random_scales:
            for t_ in (s1, s3, s2):
                t_[used] = torch.randint(116, 124, t_[used].shape, generator=gen, device=device, dtype=torch.uint8)
        return w1, s1, w3, s3, w2, s2
    return make
