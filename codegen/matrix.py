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
from dataclasses import asdict, dataclass, field

from dsv41c.codegen import ascend, hip
from dsv41c.codegen.emitted import EmittedSource, SourceKernel, SourceVariant, fill_template  # noqa: F401 (re-exported)
from dsv41c.codegen.targets import TARGETS, KernelBuildError, Target, parse_targets  # noqa: F401 (re-exported)



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
    return list(hip.KERNELS) + list(ascend.KERNELS)


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
