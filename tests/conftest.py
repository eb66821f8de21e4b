"""Test set-up shared by every tier.

Kernel tests run in Triton's interpreter on machines without a GPU: TRITON_INTERPRET must
be set before triton is first imported, so it is set here, at collection start. On a CUDA
machine (the GPU tier) it is left alone and `gpu`-marked tests run for real.

Compiled artifacts (`tiny_off`, `mini_off`, `mini_on`) are session-wide fixtures: each is
built on first request and reused by every test module.
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


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _artifact(tmp_path_factory, preset, kv_quant):
    from dsv41c.codegen.build import build_artifact

    path = tmp_path_factory.getbasetemp() / f"{preset}-{'on' if kv_quant else 'off'}.dsv41c"
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
