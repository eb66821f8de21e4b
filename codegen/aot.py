"""Ahead-of-time kernel builds: every specialization of every template, for several targets, on a GPU-less machine.

For each Triton target (`cuda:sm80/sm90/sm100`, `rocm:gfx942/gfx950/gfx1100`) and each
`AotSpec` a template returns for it, `triton.compile(ASTSource(fn, signature, constexprs),
target=GPUTarget(...))` produces PTX + cubin (CUDA) or AMDGCN + HSACO (ROCm). The matrix
instructions in the assembly are counted and compared with what the target should use
(mma.sync on sm80, wgmma on sm90, tcgen05.mma on sm100, v_mfma on CDNA, v_wmma on RDNA3);
a `tl.dot` that lowered to something else is reported, not failed. HIP and AscendC kernels
are emitted as source beside the binaries (built with hipcc where present; HIP sources are
checked with a HIP-capable clang where one exists).

Output directory (written under a temporary name and renamed into place):
    manifest.json            per kernel: template, variant, target, keys, source hash, triton
                             version, files (+ sha256), entry name, launch metadata, the matrix
                             instructions found; per emitted source: its state
    kernel_matrix.json/.txt  the kernel matrix of the built targets with the build results
    <backend>-<arch>/        e.g. cuda-sm90/fp8_gemm.wq_a_decode.{ptx,cubin}
A kernel that fails to compile is recorded as failed (with the error) and the build goes on;
the caller exits non-zero at the end. Names and contents are deterministic: no timestamps,
line info off (it would embed absolute source paths; DSV41C_AOT_LINE_INFO=1 keeps it).

The Triton version shim and the JITFunction conversion for interpreter-mode processes live in
`aot_compat.py`; running the compiles (cache lookups, `jobs` forked workers with a per-kernel
time limit, the progress bar) in `aot_jobs.py`; the content-addressed cache of built kernels in
`kernel_cache.py`. `build(..., template_filter=RE)` builds only the templates whose name
matches RE. `build_variants(requests, out_dir)` builds a given list of (template, variant,
target) through the same cache: what the compile driver calls for the variants a plan uses.
Known gaps: HIP/AscendC builds need toolchains absent here; emitted sources are not cached
(emission is fast).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time

from dsv41c.codegen.aot_compat import POINTER_ALIGNMENT, compile_spec, matrix_instructions, source_hash
from dsv41c.codegen.aot_jobs import run_jobs
from dsv41c.codegen.matrix import TARGETS, KernelBuildError, KernelMatrix, Target, load_templates, parse_targets

FORMAT = 1
KIND = "dsv41c-kernels"


def target_dir(target: str) -> str:
    return target.replace(":", "-")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the build


def _log(log, text):
    if log is not None:
        print(text, file=log, flush=True)


def _plan(templates, targets):
    """[(template name, template, target, spec)] in a fixed order; specializations() errors as failures."""
    jobs, errors = [], []
    for tg in targets:
        if not tg.triton:
            continue
        for name, t in sorted(templates.items()):
            try:
                specs = list(t.specializations(tg.name) or [])
            except Exception as e:  # noqa: BLE001 - recorded, the build goes on
                errors.append({"template": name, "target": tg.name, "variant": "*", "status": "failed",
                               "error": f"specializations({tg.name!r}) raised {type(e).__name__}: {e}"})
                continue
            seen = set()
            for s in specs:
                if s.variant in seen:
                    errors.append({"template": name, "target": tg.name, "variant": s.variant, "status": "failed",
                                   "error": f"duplicate variant name {s.variant!r}"})
                    continue
                seen.add(s.variant)
                jobs.append((name, t, tg, s))
    return jobs, errors


def _build_one(name, t, tg: Target, spec, tmp: str, restore: bool = True) -> dict:
    import triton

    entry = {"template": name, "module": t.module, "variant": spec.variant, "target": tg.name,
             "keys": json.loads(json.dumps(spec.keys or {}, default=str)),
             "signature": dict(spec.signature), "constexprs": json.loads(json.dumps(spec.constexprs, default=str)),
             **({"divisible": dict(spec.divisible)} if spec.divisible else {}),
             "triton": triton.__version__, "kernel": getattr(spec.kernel, "__name__", "?"),
             "kernel_module": getattr(getattr(spec.kernel, "fn", spec.kernel), "__module__", t.module)}
    try:
        entry["source_hash"] = source_hash(spec.kernel)
        out = compile_spec(spec, tg, restore)
    except Exception as e:  # noqa: BLE001 - recorded, the build goes on
        msg = f"{type(e).__name__}: {e}".strip()
        entry.update(status="failed", error=msg[:4000])
        return entry
    asm = out["asm"]
    text_ext, bin_ext = ("ptx", "cubin") if tg.backend == "cuda" else ("amdgcn", "hsaco")
    d = target_dir(tg.name)
    os.makedirs(os.path.join(tmp, d), exist_ok=True)
    files, sums = {}, {}
    for ext in (text_ext, bin_ext):
        data = asm[ext].encode() if isinstance(asm[ext], str) else bytes(asm[ext])
        rel = f"{d}/{_safe(name)}.{_safe(spec.variant)}.{ext}"
        with open(os.path.join(tmp, rel), "wb") as f:
            f.write(data)
        files[ext], sums[ext] = rel, _sha256(data)
    entry.update(status="built", files=files, sha256=sums, entry=out["metadata"].get("name"),
                 metadata=out["metadata"], options=out["options"],
                 matrix_instructions=matrix_instructions(tg, asm.get("ttir") or asm.get("ttgir", ""), asm[text_ext],
                                                         getattr(spec, "matrix", None)))
    return entry


def _emit_sources(targets, cfg, tmp: str, log, template_filter: str | None = None) -> list:
    from dsv41c.codegen import hip
    from dsv41c.codegen.matrix import source_kernels

    clang, tidy = hip.find_hip_clang(), hip.find_clang_tidy()
    out = []
    for tg in targets:
        for sk in source_kernels():
            if template_filter and not re.search(template_filter, sk.name):
                continue
            if sk.variant_for(tg, cfg) is None:
                continue
            try:
                es = sk.emit(tg, cfg)
            except Exception as e:  # noqa: BLE001 - recorded, the build goes on
                out.append({"template": sk.name, "target": tg.name, "variant": "?", "status": "failed",
                            "error": f"emission failed: {type(e).__name__}: {e}"})
                continue
            rel = f"{target_dir(tg.name)}/{sk.language}/{es.filename}"
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(es.text)
            e = {"template": sk.name, "target": tg.name, "variant": es.variant.variant, "language": sk.language,
                 "keys": json.loads(json.dumps(es.variant.keys)), "kind": es.variant.status,
                 "files": {"source": rel}, "sha256": {"source": _sha256(es.text.encode())},
                 "status": sk.toolchain_status()}
            if sk.language == "hip":
                if hip.hipcc():
                    hsaco = rel.rsplit(".", 1)[0] + ".hsaco"
                    st, err = hip.build_with_hipcc(os.path.join(tmp, rel), tg.arch, os.path.join(tmp, hsaco))
                    e["status"] = st
                    if st == "built":
                        e["files"]["hsaco"] = hsaco
                    if err:
                        e["error"] = err
                src, why = os.path.join(tmp, rel), "no HIP-capable clang" if not clang else f"clang lacks {tg.arch}"
                if clang and tg.arch in hip._clang_offload_archs(clang, (tg.arch,)):
                    ok, err = hip.clang_check(clang, src, tg.arch, werror=False)
                    e["clang_check"] = {"clang": hip.clang_version(clang), "ok": ok}
                elif tidy and hip.tidy_knows(tidy, tg.arch):  # front end only: parse and types, no assembly
                    ok, err = hip.tidy_check(tidy, src, tg.arch, werror=False)
                    e["clang_check"] = {"clang": hip.tidy_version(tidy), "ok": ok, "front_end_only": True, "why": why}
                else:
                    ok, err = None, ""
                    e["clang_check"] = {"clang": hip.clang_version(clang) if clang else None, "ok": None, "why": why}
                if ok is False:
                    e["status"], e["error"] = "failed", err[:4000]
            _log(log, f"[src] {tg.name} {sk.name}/{es.variant.variant}: {e['status']}"
                      + (f" ({'front-end' if e['clang_check'].get('front_end_only') else 'clang'} check "
                         f"{'ok' if e['clang_check']['ok'] else 'FAILED'})"
                         if e.get("clang_check", {}).get("ok") is not None else ""))
            out.append(e)
    return out


def _prepare_output(out_dir: str) -> tuple[str, str]:
    out = os.path.abspath(out_dir)
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise KernelBuildError(f"{out_dir}: exists and is not a directory")
        if os.listdir(out) and not _is_kernel_build(out):
            raise KernelBuildError(f"{out_dir}: exists and is not a dsv41c kernel build; remove it or choose another -o")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    os.chmod(tmp, 0o755)
    return out, tmp


def _is_kernel_build(path: str) -> bool:
    try:
        with open(os.path.join(path, "manifest.json")) as f:
            return json.load(f).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def _commit(tmp: str, out: str) -> None:
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rmdir(old)
        os.rename(out, old)
    os.rename(tmp, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _targets(targets) -> list:
    return parse_targets(targets) if isinstance(targets, str) else [
        TARGETS[t] if isinstance(t, str) else t for t in targets]


def _filter(templates: dict, template_filter: str | None) -> dict:
    if not template_filter:
        return templates
    try:
        rx = re.compile(template_filter)
    except re.error as e:
        raise KernelBuildError(f"--templates {template_filter!r} is not a regular expression: {e}") from None
    chosen = {n: t for n, t in templates.items() if rx.search(n)}
    if not chosen:
        raise KernelBuildError(f"--templates {template_filter!r} matches no template (templates: "
                               f"{', '.join(sorted(templates))})")
    return chosen


def _cache(cache):
    """None/False: no cache; True: the default directory; a path; or a KernelCache."""
    from dsv41c.codegen.kernel_cache import KernelCache

    if cache is None or cache is False:
        return None
    if cache is True:
        return KernelCache()
    return cache if isinstance(cache, KernelCache) else KernelCache(cache)


def build(targets, out_dir: str, templates=None, config=None, log=sys.stderr, sources: bool = True,
          jobs: int | None = None, cache=None, template_filter: str | None = None) -> dict:
    """Build every specialization for `targets` into `out_dir`; returns the manifest.

    `jobs`: compiles at once (default: the CPU count); `cache`: see `_cache` (the CLI passes
    True); `template_filter`: a regular expression on template names. Failures are recorded
    (manifest["summary"]["failed"] > 0), never raised; bad input (unknown target, a filter
    matching nothing, unusable output directory) raises KernelBuildError before any work.
    """
    import triton

    import dsv41c
    tlist = _targets(targets)
    if templates is None:
        templates, _, broken = load_templates()
        for m, err in broken.items():
            _log(log, f"[plan] kernel module {m} does not import: {err}")
    templates = _filter(templates, template_filter)
    kc = _cache(cache)
    if config is None:
        from dsv41c.frontend.config import preset

        config = preset("full")
    out, tmp = _prepare_output(out_dir)
    restore = _terminate_as_exit()
    try:
        jobs_n = jobs
        jobs, results = _plan(templates, tlist)
        for r in results:
            _log(log, f"[plan] {r['target']} {r['template']}/{r['variant']}: FAILED {r['error']}")
        t0 = time.time()
        results += run_jobs(jobs, _build_one, tmp, log, parallel=jobs_n, cache=kc)
        if kc is not None:
            _log(log, f"[cache] {kc.hits} cached, {kc.misses} compiled ({kc.stored} stored) in "
                      f"{time.time() - t0:.1f} s; {kc.root}")
        emitted = _emit_sources(tlist, config, tmp, log, template_filter) if sources else []
        results.sort(key=lambda r: (r["target"], r["template"], r["variant"]))
        failed = [r for r in results + emitted if r["status"] == "failed"]
        manifest = {
            "format": FORMAT, "kind": KIND, "dsv41c": dsv41c.__version__, "triton": triton.__version__,
            "targets": [t.name for t in tlist], "config": {"name": config.name, "hash": config.hash()},
            "pointer_alignment": POINTER_ALIGNMENT,
            "line_info": os.environ.get("DSV41C_AOT_LINE_INFO", "0") == "1",
            "kernels": results, "sources": emitted,
            "summary": _summary(tlist, results, emitted, failed),
        }
        m = KernelMatrix.build([t.name for t in tlist], templates=templates, config=config)
        m.apply_build(results + emitted)
        _write(tmp, "kernel_matrix.json", m.dumps())
        _write(tmp, "kernel_matrix.txt", m.render())
        _write(tmp, "manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        restore()
    return manifest


def build_variants(requests, out_dir: str, *, jobs: int | None = None, cache=True, log=None,
                   templates=None, widths=None) -> list:
    """Build each (template name, variant name, target name) of `requests` into `out_dir` through the cache.

    Files land at `out_dir/<target dir>/<template>.<variant>.<ext>` (target dir: `cuda-sm90`),
    the paths in each returned entry's "files" are relative to `out_dir`; entries come back
    sorted by (target, template, variant), one per distinct request, with status "built" or
    "failed" (+ "error"): a failed compile is reported, not raised. An unknown template,
    variant or target raises KernelBuildError before any compile. `cache`: True (default:
    $DSV41C_CACHE_DIR or ~/.cache/dsv41c), a directory, a KernelCache, or None (no cache).
    `widths`: the model widths the variants are specialized for (a plan's config; default the published one).
    """
    from dsv41c.codegen.kernel_select import template_variants

    broken = {}
    if templates is None:
        templates, _, broken = load_templates()
    work = []
    for name, variant, target in sorted(set(map(tuple, requests)), key=lambda r: (r[2], r[0], r[1])):
        tg = TARGETS.get(target)
        if tg is None or not tg.triton:
            raise KernelBuildError(f"kernel {name}/{variant}: target {target!r} is not a Triton target "
                                   f"({', '.join(n for n, t in TARGETS.items() if t.triton)})")
        t = templates.get(name)
        if t is None:
            why = "; ".join(f"{m} does not import: {e}" for m, e in broken.items())
            raise KernelBuildError(f"kernel {name}/{variant} on {target}: no template {name!r}" + (f" ({why})" if why else ""))
        specs = {s.variant: s for s in template_variants(t, target, widths)}
        if variant not in specs:
            raise KernelBuildError(f"kernel {name}/{variant} on {target}: the template has no such variant "
                                   f"(variants: {', '.join(sorted(specs)) or 'none'})")
        work.append((name, t, tg, specs[variant]))
    os.makedirs(out_dir, exist_ok=True)
    restore = _terminate_as_exit()
    try:
        results = run_jobs(work, _build_one, out_dir, log, parallel=jobs, cache=_cache(cache))
    finally:
        restore()
    return sorted(results, key=lambda r: (r["target"], r["template"], r["variant"]))


def _terminate_as_exit():
    """SIGTERM raises SystemExit during a build, so the temporary directory is removed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() == pid:  # not in a forked compiler child
            raise SystemExit(128 + signum)
        os._exit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


def _write(root, rel, text):
    with open(os.path.join(root, rel), "w") as f:
        f.write(text)


def _summary(tlist, results, emitted, failed) -> dict:
    per = {}
    for t in tlist:
        rs = [r for r in results if r["target"] == t.name]
        checks: dict = {}
        for r in rs:
            if r["status"] == "built":
                c = r["matrix_instructions"]["check"].split(":")[0]
                checks[c] = checks.get(c, 0) + 1
        per[t.name] = {"built": sum(r["status"] == "built" for r in rs),
                       "failed": sum(r["status"] == "failed" for r in rs), "matrix_check": checks,
                       "sources": sum(e["target"] == t.name for e in emitted)}
    return {"built": sum(r["status"] == "built" for r in results), "failed": len(failed),
            "sources_emitted": len(emitted), "per_target": per,
            "failures": [f"{r['target']} {r['template']}/{r['variant']}: {r.get('error', '').splitlines()[0]}"
                         for r in failed]}
