"""Shared by the CSA2 pass tests: traced plans and stored weights, made once per test run (each costs seconds)."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def _traced(preset_name: str, kv_quant: bool):
    from dsv41c.frontend.config import preset
    from dsv41c.frontend.trace import trace

    m, _ = trace(preset(preset_name), kv_quant=kv_quant, progress=None)
    return m


def traced(preset_name: str, kv_quant: bool = True):
    """A fresh copy of the traced module of the preset (passes rewrite modules in place)."""
    return _traced(preset_name, kv_quant).clone()


@functools.lru_cache(maxsize=None)
def weights(preset_name: str, seed: int = 2) -> dict:
    """The preset's random checkpoint as stored (name -> tensor); read-only by convention."""
    from dsv41c.frontend.config import preset
    from dsv41c.frontend.model.weights import stored_state_dict

    return stored_state_dict(preset(preset_name), seed=seed)
