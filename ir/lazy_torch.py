"""`torch`, imported on first use: parsing, verifying and most passes never need it.

`dsv41c opt` reads IR, runs shape rules and rewrites, and prints: no tensor is made, so
importing torch (seconds) would be pure start-up cost. The op tables and types refer to
`torch.xxx` only inside reference implementations and dtype conversions, which run in the
interpreter, so they import this proxy instead; the first attribute access imports torch.
"""
from __future__ import annotations


class _LazyTorch:
    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    def __repr__(self):
        return "<torch, imported on first use>"


torch = _LazyTorch()
