"""Test set-up shared by every tier.

Kernel tests run in Triton's interpreter on machines without a GPU: TRITON_INTERPRET must
be set before triton is first imported, so it is set here, at collection start. On a CUDA
machine (the GPU tier) it is left alone and `gpu`-marked tests run for real.
"""
import os

import pytest
import torch

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
