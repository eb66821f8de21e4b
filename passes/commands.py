"""`dsv41c opt IN.ir -p PASS[,PASS...] [-o OUT.ir]`: run passes over an IR text file.

Parse, verify, run the passes through the PassManager, verify again, print (stdout, or
OUT.ir written whole through a temporary file, so a failure never leaves half a file).
Bad input raises IRParseError / VerifyError / PassError, which the CLI prints as one line.
Instruments come from the parsed args when the CLI declares them (`--verify-each`,
`--timings`, `--dump-dir D`, `--dump-filter RE`); absent flags mean off.

`dsv41c compile (CKPT_DIR | --preset P) -o OUT [--target cpu] [--kv-quant on|off] [--dump-dir D]
[--dump-filter RE] [--timings] [--verify-each]`: the whole path config -> trace -> this
pipeline -> codegen -> artifact; `cmd_compile` parses nothing itself and hands the options to
`codegen/build.py: build_artifact` (progress and the compile time go to stderr).
"""
from __future__ import annotations

import os
import sys
import tempfile


def cmd_opt(args) -> int:
    from dsv41c.ir.parser import parse_module
    from dsv41c.ir.printer import print_module
    from dsv41c.ir.verifier import VerifyError, verify
    from dsv41c.passes.base import PassError
    from dsv41c.passes.manager import PassManager
    from dsv41c.passes.registry import parse_pipeline

    passes = parse_pipeline(args.passes)  # a typo in -p fails before any work
    with open(args.input, encoding="utf-8") as fh:
        text = fh.read()
    module = parse_module(text, args.input)
    try:
        verify(module)
    except VerifyError as e:
        raise VerifyError([f"{args.input}: {m}" for m in e.errors]) from None
    pm = PassManager(passes, verify_each=getattr(args, "verify_each", False), timings=getattr(args, "timings", False),
                     dump_dir=getattr(args, "dump_dir", None), dump_filter=getattr(args, "dump_filter", None))
    result = pm.run(module)
    try:
        verify(result.module)
    except VerifyError as e:
        names = ", ".join(p.name for p in passes)
        raise PassError(f"IR invalid after the pipeline ({names}); rerun with --verify-each to find the pass: "
                        f"{e}") from e
    out = print_module(result.module)
    if args.output:
        _write_atomic(args.output, out)
    else:
        sys.stdout.write(out)
    return 0


def _write_atomic(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".opt-", suffix=".ir", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def cmd_compile(args) -> int:
    from dsv41c.codegen.build import build_artifact

    build_artifact(args.output, checkpoint=args.checkpoint, preset=args.preset, target=args.target,
                   kv_quant=args.kv_quant, seed=getattr(args, "seed", 0), dump_dir=getattr(args, "dump_dir", None),
                   dump_filter=getattr(args, "dump_filter", None), timings=getattr(args, "timings", False),
                   verify_each=getattr(args, "verify_each", False), force=getattr(args, "force", False))
    return 0
