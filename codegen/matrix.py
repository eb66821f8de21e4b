"""The kernel matrix: every kernel template × every hardware target, as data.

Rows are the Triton templates of the registry (`codegen/templates.py`) plus the kernels
emitted as HIP or AscendC source (`codegen/hip/`, `codegen/ascend/`). Columns are the
targets in `TARGETS`. A cell says which variant a target gets:

- `native`  — variants specialized for the target (each with the keys it fixes);
- `generic` — only a fallback variant exists there, with the template's stated reason
  (e.g. gfx1100 has no FP8 matrix instructions: its FP8/FP4 GEMM dequantizes to fp16);
- `missing` — no variant at all (the reason says why where one is known);
- `error`   — the template's `specializations(target)` raised (a bug, shown, not hidden);
- `n/a`     — an emitted-source row on a target of another toolchain (HIP on CUDA).

Emitted-source rows carry a build state as well: `built`, `source emitted, not built (no
hipcc)`, `source emitted, not built (no CANN toolchain)` or `failed: ...`. An ahead-of-time
build (`codegen/aot.py`) overlays its results (`built` / `failed`) with `apply_build`.
The matrix renders as a table whose last lines list every gap (`missing: ...`), and
round-trips through JSON (`to_json` / `from_json`).

Known gaps: the target facts below are the public ISA facts as of writing; a template's
own `generic_on` reasons are taken as given, not checked against them.
"""
from __future__ import annotations

import importlib
import json
import re
from dataclasses import asdict, dataclass, field


class KernelBuildError(Exception):
    """Bad input to `dsv41c kernels` (unknown target, bad output directory, ...)."""


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    name: str  # "cuda:sm90"
    backend: str  # "cuda" | "rocm" | "ascend"
    arch: str  # "sm90" | "gfx942" | "a5"
    hardware: str
    warp_size: int  # threads per warp / wavefront (0: not a SIMT target)
    matrix_unit: str  # the matrix instruction family Triton (or the cube) uses there
    fp8_matrix: bool  # FP8 inputs to the matrix unit
    fp4_matrix: bool  # FP4 (E2M1) inputs to the matrix unit
    triton: bool  # Triton compiles for it ahead of time on this machine
    note: str = ""


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("cuda:sm80", "cuda", "sm80", "A100 (Ampere)", 32, "mma.sync", False, False, True,
           "no FP8/FP4 tensor-core inputs: FP8/FP4 operands are upcast to bf16/fp16"),
    Target("cuda:sm90", "cuda", "sm90", "H100/H200 (Hopper)", 32, "wgmma", True, False, True,
           "FP8 wgmma; FP4 operands are upcast"),
    Target("cuda:sm100", "cuda", "sm100", "B200/GB200 (Blackwell)", 32, "tcgen05.mma", True, True, True,
           "FP8 and block-scaled FP4 (tcgen05.mma kind::mxf4)"),
    Target("rocm:gfx942", "rocm", "gfx942", "MI300X/MI325X (CDNA3)", 64, "v_mfma", True, False, True,
           "FP8 MFMA uses the FNUZ encodings (OCP E4M3 inputs are converted); no FP4 MFMA"),
    Target("rocm:gfx950", "rocm", "gfx950", "MI350X/MI355X (CDNA4)", 64, "v_mfma", True, True, True,
           "OCP FP8 and scaled FP4/FP6 MFMA (v_mfma_scale_f32_*_f8f6f4)"),
    Target("rocm:gfx1100", "rocm", "gfx1100", "W7900 / RX 7900 (RDNA3)", 32, "v_wmma", False, False, True,
           "WMMA takes fp16/bf16/iu8/iu4 only: no FP8/FP4 matrix instructions"),
    Target("ascend:a2", "ascend", "a2", "Atlas A2 (Ascend 910B)", 0, "cube (fp16/bf16/int8)", False, False, False,
           "no Triton backend here; cube has no FP8/FP4 inputs"),
    Target("ascend:a3", "ascend", "a3", "Atlas A3 (Ascend 910C)", 0, "cube (fp16/bf16/int8)", False, False, False,
           "no Triton backend here; same AI-core ISA as A2 (two A2 dies)"),
    Target("ascend:a5", "ascend", "a5", "Ascend 950PR/950DT", 0, "cube (+ MXFP8/MXFP4, HiF8)", True, True, False,
           "no Triton backend here; cube takes MX-scaled FP8/FP4 (E8M0 per 32)"),
)}


def parse_targets(text) -> list[Target]:
    """'cuda:sm90,rocm:gfx942' (or a list) -> [Target]; unknown names are a KernelBuildError."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t and t.strip()]
    if not names:
        raise KernelBuildError(f"no targets given (choose from {', '.join(TARGETS)})")
    bad = [n for n in names if n not in TARGETS]
    if bad:
        raise KernelBuildError(f"unknown target {', '.join(map(repr, bad))} (choose from {', '.join(TARGETS)})")
    return [TARGETS[n] for n in dict.fromkeys(names)]


# ----------------------------------------------------------------------------- emitted-source kernels


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


def load_templates() -> tuple[dict, list, dict]:
    """(templates, absent modules, broken modules -> error): every kernel module imported on its own,
    so one that does not exist yet or fails to import is reported, not fatal to the rest."""
    from dsv41c.codegen import templates as registry

    absent, broken = [], {}
    for m in registry.KERNEL_MODULES:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            if e.name == m:
                absent.append(m)
            else:
                broken[m] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - a broken kernel module is a gap in the matrix
            broken[m] = f"{type(e).__name__}: {e}"
    return dict(sorted(registry._REGISTRY.items())), absent, broken


def source_kernels() -> list[SourceKernel]:
    from dsv41c.codegen.ascend import KERNELS as ascend_kernels
    from dsv41c.codegen.hip import KERNELS as hip_kernels

    return list(hip_kernels) + list(ascend_kernels)


# ----------------------------------------------------------------------------- the matrix


@dataclass
class Cell:
    status: str  # native | generic | missing | error | n/a
    variants: list = field(default_factory=list)  # [{"variant", "keys", "num_warps"?, "num_stages"?}]
    reason: str = ""
    build: str = ""  # "" | built | failed: ... | source emitted, not built (...)


@dataclass
class Row:
    name: str
    kind: str  # "triton" | "hip" | "ascendc"
    module: str
    summary: str
    keys: list
    covers: str = ""
    cells: dict = field(default_factory=dict)  # target name -> Cell


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def _triton_cell(t, target: Target) -> Cell:
    try:
        specs = list(t.specializations(target.name) or [])
    except Exception as e:  # noqa: BLE001 - a template bug is shown in the matrix, not raised
        return Cell("error", reason=f"specializations({target.name!r}) raised {type(e).__name__}: {e}")
    variants = [{"variant": s.variant, "keys": _jsonable(dict(s.keys)), "num_warps": s.num_warps,
                 "num_stages": s.num_stages} for s in specs]
    generic = (t.generic_on or {}).get(target.name)
    # a variant for a target Triton cannot compile for here is shown, but marked unbuildable
    build = "" if target.triton or not specs else f"{NO_TRITON} for {target.backend} in this toolchain)"
    if specs and generic is not None:
        return Cell("generic", variants, str(generic), build)
    if specs:
        return Cell("native", variants, build=build)
    if generic is not None:
        return Cell("missing", reason=f"declared generic ({generic}) but no variant returned")
    if not target.triton:
        return Cell("missing", reason=f"no Triton backend for {target.backend} in this toolchain")
    return Cell("missing", reason=(t.missing_on or {}).get(target.name, "no variant for this target"))


NO_TRITON = "not buildable (no Triton backend"


def _module_short(module: str) -> str:
    return module.rsplit(".", 1)[-1]


@dataclass
class KernelMatrix:
    targets: list  # target names, column order
    rows: list  # [Row]
    absent_modules: list = field(default_factory=list)  # kernel modules not written yet
    broken_modules: dict = field(default_factory=dict)  # kernel module -> its import error

    # ---- construction
    @classmethod
    def build(cls, targets=None, templates=None, config=None, sources=None) -> "KernelMatrix":
        tlist = [TARGETS[n] if isinstance(n, str) else n for n in (targets or list(TARGETS))]
        absent, broken = [], {}
        if templates is None:
            templates, absent, broken = load_templates()
        if config is None:
            from dsv41c.frontend.config import preset

            config = preset("full")
        rows = []
        for name, t in sorted(templates.items()):
            row = Row(name, "triton", t.module, t.summary, list(t.keys))
            for tg in tlist:
                row.cells[tg.name] = _triton_cell(t, tg)
            rows.append(row)
        for sk in (source_kernels() if sources is None else sources):
            row = Row(sk.name, sk.language, f"dsv41c.codegen.{'ascend' if sk.language == 'ascendc' else 'hip'}",
                      sk.summary, [], covers=sk.covers)
            for tg in tlist:
                v = sk.variant_for(tg, config)
                if v is None:
                    row.cells[tg.name] = Cell("n/a")
                else:
                    row.cells[tg.name] = Cell(v.status, [{"variant": v.variant, "keys": _jsonable(v.keys)}],
                                              v.reason, sk.toolchain_status())
            rows.append(row)
        return cls([tg.name for tg in tlist], rows, absent, broken)

    # ---- build results (from codegen/aot.py)
    def apply_build(self, results) -> None:
        """results: [{"template", "target", "variant", "status": built|failed|<source state>, "error"?}]."""
        by_cell: dict = {}
        for r in results:
            by_cell.setdefault((r["template"], r["target"]), []).append(r)
        for row in self.rows:
            for target, cell in row.cells.items():
                rs = by_cell.get((row.name, target))
                if not rs:
                    continue
                failed = [r for r in rs if r["status"] == "failed"]
                if failed:
                    cell.build = f"failed ({len(failed)}/{len(rs)}): " + "; ".join(
                        f"{r['variant']}: {r.get('error', '').splitlines()[0] if r.get('error') else '?'}"
                        for r in failed)
                elif all(r["status"] == "built" for r in rs):
                    odd = [r for r in rs if r.get("matrix_instructions", {}).get("check", "ok").startswith(
                        ("fallback", "none"))]
                    cell.build = "built" if not odd else (
                        f"built; {len(odd)}/{len(rs)} variants without the target's matrix instruction: "
                        + "; ".join(f"{r['variant']}: {r['matrix_instructions']['check']}" for r in odd))
                else:
                    cell.build = rs[0]["status"]

    # ---- gaps
    def gaps(self) -> list[str]:
        """Every cell that is not a working variant, in a fixed order, one line each."""
        covered = {}  # (module short name, target) -> emitted row names
        for row in self.rows:
            if row.kind != "triton":
                for target, cell in row.cells.items():
                    if cell.status in ("native", "generic"):
                        covered.setdefault((row.covers, target), []).append(row.name)
        # (kind, row, why) -> targets, so one line names every target a gap shares
        groups: dict = {}
        for row in self.rows:
            for target in self.targets:
                cell = row.cells[target]
                alt = covered.get((_module_short(row.module), target)) if row.kind == "triton" else None
                extra = f"; emitted source instead: {', '.join(alt)}" if alt else ""
                if cell.status in ("missing", "error"):
                    groups.setdefault((cell.status, row.name, cell.reason + extra), []).append(target)
                if cell.build.startswith("failed"):
                    groups.setdefault(("failed", row.name, cell.build), []).append(target)
                elif cell.build.startswith("built;"):
                    groups.setdefault(("matrix", row.name, cell.build[len("built; "):]), []).append(target)
                elif cell.build.startswith(("source emitted, not built", NO_TRITON)):
                    groups.setdefault(("not built", row.name, cell.build + extra), []).append(target)
        out = [f"{kind}: {name} @ {','.join(ts)} ({why})" for (kind, name, why), ts in groups.items()]
        out += [f"missing: kernel module {m} (not written yet)" for m in self.absent_modules]
        out += [f"error: kernel module {m} does not import ({e})" for m, e in sorted(self.broken_modules.items())]
        return out

    # ---- JSON
    def to_json(self) -> dict:
        return {
            "format": 1,
            "targets": list(self.targets),
            "target_info": {n: asdict(TARGETS[n]) for n in self.targets if n in TARGETS},
            "rows": [{**{k: v for k, v in asdict(r).items() if k != "cells"},
                      "cells": {t: asdict(c) for t, c in r.cells.items()}} for r in self.rows],
            "absent_modules": list(self.absent_modules),
            "broken_modules": dict(self.broken_modules),
            "gaps": self.gaps(),
        }

    @classmethod
    def from_json(cls, d: dict) -> "KernelMatrix":
        if d.get("format") != 1:
            raise KernelBuildError(f"kernel matrix JSON: unsupported format {d.get('format')!r} (expected 1)")
        rows = [Row(**{k: v for k, v in r.items() if k != "cells"},
                    cells={t: Cell(**c) for t, c in r["cells"].items()}) for r in d["rows"]]
        return cls(list(d["targets"]), rows, list(d.get("absent_modules", [])), dict(d.get("broken_modules", {})))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    # ---- text
    def render(self) -> str:
        return render_table(self)


_SHORT = {"native": "native", "generic": "generic", "missing": "MISSING", "error": "ERROR", "n/a": "-"}


def _cell_text(cell: Cell, kind: str) -> str:
    s = _SHORT.get(cell.status, cell.status)
    if cell.status in ("native", "generic") and kind == "triton":
        s += f"({len(cell.variants)})"
    if cell.build.startswith("failed"):
        return "FAILED"
    if cell.build == "built":
        return s + " built"
    if cell.build.startswith("built;"):
        return s + " built*"
    if cell.build.startswith("source emitted"):
        return s + " src"
    if cell.build.startswith(NO_TRITON):
        return s + " nobe"
    return s


def _keys_text(keys: dict) -> str:
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(keys.items())) or "-"


def render_table(m: KernelMatrix) -> str:
    names = [r.name for r in m.rows] or ["(no templates)"]
    w0 = max(len("template"), *(len(n) for n in names))
    cols = [(t, max(len(t), *(len(_cell_text(r.cells[t], r.kind)) for r in m.rows)) if m.rows else len(t))
            for t in m.targets]
    lines = ["  ".join(["template".ljust(w0)] + [t.ljust(w) for t, w in cols]).rstrip()]
    lines.append("  ".join(["-" * w0] + ["-" * w for _, w in cols]))
    for r in m.rows:
        lines.append("  ".join([r.name.ljust(w0)] + [_cell_text(r.cells[t], r.kind).ljust(w) for t, w in cols]).rstrip())
    if not m.rows:
        lines.append("(no kernel templates registered)")
    lines.append("")
    lines.append("native(n)/generic(n): n variants; generic = fallback (reason below); src = source emitted, "
                 "not built; nobe = variant declared, no backend here to build it; built/FAILED = ahead-of-time "
                 "build result (built* = a tl.dot lowered without the target's matrix instruction); "
                 "- = not this toolchain")

    # variants, grouped: the same (variant, keys) on several targets is listed once
    detail = []
    for r in m.rows:
        groups: dict = {}
        for t in m.targets:
            c = r.cells[t]
            for v in c.variants:
                key = (c.status, v["variant"], _keys_text(v.get("keys", {})), c.reason,
                       c.build if r.kind != "triton" else "")
                groups.setdefault(key, []).append(t.split(":", 1)[-1])
        for (status, variant, keys, reason, build), ts in groups.items():
            line = f"  {r.name}/{variant} {status} @ {','.join(ts)}: {keys}"
            if reason:
                line += f" -- {reason}"
            if build:
                line += f" -- {build}"
            detail.append(line)
    if detail:
        lines += ["", "variants:"] + detail
    gaps = m.gaps()
    lines.append("")
    if gaps:
        lines.append(f"gaps ({len(gaps)}):")
        lines += [f"  {g}" for g in gaps]
    else:
        lines.append("gaps: none")
    return "\n".join(lines) + "\n"
