"""`dsv41c kernels`: print the kernel matrix, or build every kernel ahead of time.

    dsv41c kernels --matrix [--json]
    dsv41c kernels --build --targets cuda:sm80,cuda:sm90,rocm:gfx942,rocm:gfx1100 -o DIR [-j N]
                   [--templates REGEX] [--no-cache] [--json]

`--matrix` prints `codegen/matrix.py`'s table (every registered template × every target,
the emitted HIP/AscendC rows, gaps listed at the end) or its JSON. `--build` runs
`codegen/aot.py` through the kernel cache (a progress bar on a terminal, else one line per
kernel, on stderr), prints a summary, and exits 1
when any kernel failed (the output directory is still written, failures recorded in it).
Bad input raises KernelBuildError (printed by the CLI as one line, exit status 2).
"""
from __future__ import annotations

import json
import os
import sys

from dsv41c.codegen.matrix import KernelBuildError, parse_targets
from dsv41c.outputs import OutputError, check_output_dir, note_kept, reason


def _is_kernel_build(path: str) -> bool:
    try:
        with open(os.path.join(path, "manifest.json")) as f:
            return json.load(f).get("kind") == "dsv41c-kernels"  # aot.KIND, without importing triton
    except (OSError, ValueError, AttributeError):
        return False


def cmd_kernels(args) -> int:
    if getattr(args, "build", False):
        return _build(args)
    return _matrix(args)


def _matrix(args) -> int:
    from dsv41c.codegen.matrix import KernelMatrix

    m = KernelMatrix.build()
    sys.stdout.write(m.dumps() if args.json else m.render())
    return 0


def _build(args) -> int:
    if not args.output:
        raise KernelBuildError("--build needs -o DIR (the output directory)")
    targets = parse_targets(args.targets)  # before importing triton: bad input fails fast
    # the path too: an earlier kernel build is replaced, nothing else (aot.py checks the same, after triton loads)
    check_output_dir(args.output, "-o", force=True, replaceable=_is_kernel_build, kind="dsv41c kernel build",
                     force_option=None)
    if "triton" not in sys.modules:
        # an AOT build needs the real compiler: kernels must be defined as JITFunctions
        os.environ["TRITON_INTERPRET"] = "0"
    from dsv41c.codegen import aot

    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 1:
        raise KernelBuildError(f"-j {jobs}: the number of jobs must be at least 1")
    try:
        manifest = aot.build(targets, args.output, log=sys.stderr, jobs=jobs,
                             cache=not getattr(args, "no_cache", False), template_filter=getattr(args, "templates", None))
    except OSError as e:  # disk full and the like, met in aot's temporary directory beside -o
        raise OutputError(f"-o {args.output}: cannot write the kernel build ({reason(e)}); nothing written") from None
    note_kept(args.output)
    s = manifest["summary"]
    if args.json:
        sys.stdout.write(json.dumps(s, indent=1, sort_keys=True) + "\n")
    else:
        print(f"kernels: {s['built']} built, {s['failed']} failed, {s['sources_emitted']} sources emitted "
              f"-> {args.output}")
        for t, p in s["per_target"].items():
            checks = ", ".join(f"{k} {v}" for k, v in sorted(p["matrix_check"].items())) or "-"
            print(f"  {t}: {p['built']} built, {p['failed']} failed, {p['sources']} sources; matrix check: {checks}")
        for f in s["failures"]:
            print(f"  FAILED {f}")
    return 1 if s["failed"] else 0
