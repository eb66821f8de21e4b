"""Which variant of a kernel template a call gets on a target: the kernel matrix, asked per call.

    spec = select_variant("fp8_gemm", "cuda:sm90", {"N": 2048, "K": 5120, "mode": "gemv", "act": "bf16"}, widths)

A template's `specializations(target, widths)` lists the variants it builds for the model's widths
(`codegen/triton/widths.py`, from the config); the call's keys pick one: every key the call fixes
must equal the variant's key of the same name (`linear`, a variant's name for its weight, is not
compared: one variant serves every linear of its shape). `None`: the matrix has no such variant,
which `specialize-kernels` reports (or refuses) naming the op, its loc and the target.

Activation dtypes: the built variants are bf16 (their `act` key); a verification build with
float32 activations is served by the same kernels run through a float32 launch in the interpreter,
and the matrix names it so (`act` is not compared for "f32": the kernels upcast their operands and
accumulate in float32; a compiled float32 variant is not built yet).
Known gaps: a template without a `widths` parameter is asked with the published widths only.
"""
from __future__ import annotations

import inspect

from dsv41c.codegen.templates import all_templates

_IGNORED = ("linear",)
# (template, target, widths) -> its variants: a plan asks per call (thousands on `full`), and building a template's
# AotSpecs is the same work every time (the widths are a frozen dataclass; the registry is fixed once imported)
_VARIANTS: dict = {}


def variants(template: str, target: str, widths=None) -> list:
    """The variants of `template` on `target` for `widths` (do not modify the list: it is shared)."""
    key = (template, target, widths)
    if key not in _VARIANTS:
        t = all_templates().get(template)
        if t is None:
            raise KeyError(f"unknown kernel template '{template}'")
        _VARIANTS[key] = template_variants(t, target, widths)
    return _VARIANTS[key]


def template_variants(t, target: str, widths=None) -> list:
    """`t.specializations(target)` for `widths` where the template takes them (published widths otherwise)."""
    if widths is not None and "widths" in inspect.signature(t.specializations).parameters:
        return list(t.specializations(target, widths=widths) or [])
    return list(t.specializations(target) or [])


def select_variant(template: str, target: str, keys: dict, widths=None):
    """The variant of `template` on `target` whose keys agree with `keys` (see the module doc), the one built for
    the same `linear` first; None where the matrix has none."""
    found = [s for s in variants(template, target, widths) if _agrees(s, keys)]
    same = [s for s in found if s.keys.get("linear") == keys.get("linear")]
    return (same or found or [None])[0]


def _agrees(spec, keys: dict) -> bool:
    vk = spec.keys
    for k, v in keys.items():
        if k in _IGNORED or k not in vk:
            continue
        if k == "act" and v == "f32":
            continue  # the float32 verification build: same kernels, float32 launch (module doc)
        if vk[k] != v:
            return False
    return True
