"""Kernels emitted as source text (HIP, AscendC) beside the Triton ones: the records a source kernel gives the
kernel matrix (`SourceKernel`, `SourceVariant`, `EmittedSource`) and the placeholder filler of its templates."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceVariant:
    """What an emitted-source kernel does on one target."""

    status: str  # "native" | "generic"
    variant: str
    keys: dict
    reason: str = ""


@dataclass(frozen=True)
class EmittedSource:
    filename: str  # e.g. "indexer_score_fp4.d128.hip"
    text: str
    variant: SourceVariant


@dataclass(frozen=True)
class SourceKernel:
    """A kernel emitted as HIP or AscendC source from a template filled from the config."""

    name: str  # row name, e.g. "hip:indexer_score_fp4"
    language: str  # "hip" | "ascendc"
    covers: str  # the Triton kernel module it stands beside ("indexer", "sparse_attention", ...)
    summary: str
    variant_for: object  # (Target, ModelConfig) -> SourceVariant | None (None: not for this target)
    emit: object  # (Target, ModelConfig) -> EmittedSource
    toolchain_status: object  # () -> str: the build state without building

_PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")


def fill_template(text: str, values: dict, where: str) -> str:
    """Replace every @NAME@; a placeholder without a value, or a value never used, is a bug."""
    used = set(_PLACEHOLDER.findall(text))
    missing, unused = used - set(values), set(values) - used
    if missing or unused:
        raise ValueError(f"{where}: placeholders without values {sorted(missing)}, values never used {sorted(unused)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)
