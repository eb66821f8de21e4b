"""The eager reference model of DeepSeek-V4.1-Flash: the numerical oracle of the compiler.

Public API (see model.py, generate.py, dspark.py, cli.py):
- `ReferenceModel(cfg, state_dict, dtype=torch.float32, kv_quant=True)`
  `.forward_full(ids)`, `.new_state()`, `.prefill(state, ids)`, `.decode(state, token)`
- `load_reference(checkpoint_dir, dtype, kv_quant)` -> ReferenceModel
- `greedy_generate`, `dspark_generate` (generate.py); `DSparkDrafter` (dspark.py)
- `InputError`: bad user input (token ids out of range, ...), printed as one line by the CLI.

The submodules are imported lazily so that `import dsv41c.frontend.model` stays cheap.
"""
from __future__ import annotations

from dsv41c.frontend.model.errors import InputError  # noqa: F401 (re-exported)


def __getattr__(name):
    if name in ("ReferenceModel", "load_reference"):
        from dsv41c.frontend.model import model as _m

        return getattr(_m, name)
    if name in ("greedy_generate", "dspark_generate"):
        from dsv41c.frontend.model import generate as _g

        return getattr(_g, name)
    if name == "DSparkDrafter":
        from dsv41c.frontend.model.dspark import DSparkDrafter

        return DSparkDrafter
    raise AttributeError(name)
