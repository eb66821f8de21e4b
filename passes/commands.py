"""`dsv41c opt IN.ir -p PASS[,PASS...] [-o OUT.ir]`: run passes over an IR text file.

Order (nothing is worked on before the check above it passed): the pipeline text, the
output paths (`-o` must be a writable file path, `--dump-dir` a directory we can write in:
`dsv41c/outputs.py`), then IN.ir: read as bytes, decoded as UTF-8 (binary input is refused
naming the offset of the first bad byte), parsed, refused when it holds no function (an
empty file), verified. Then the passes through the PassManager, a final verify, and the
print (stdout, or OUT.ir written whole through a temporary file, so a failure never
leaves half a file and never shows the temporary name). Bad input raises IRParseError /
VerifyError / PassError / OutputError, which the CLI prints as one line. Instruments come
from the parsed args when the CLI declares them (`--verify-each`, `--timings`,
`--dump-dir D`, `--dump-filter RE`); absent flags mean off.

`dsv41c compile (CKPT_DIR | --preset P) -o OUT [--target cpu] [--kv-quant on|off] [--dump-dir D]
[--dump-filter RE] [--timings] [--verify-each]`: the whole path config -> trace -> this
pipeline -> codegen -> artifact. `cmd_compile` checks OUT (`--force` replaces an artifact,
nothing else) and D before it hands the options to `codegen/build.py: build_artifact`
(progress and the compile time go to stderr), so a bad path fails in milliseconds, not
after the trace. A write that fails on the way (disk full, ...) is reported against OUT.
"""
from __future__ import annotations

import os
import re
import sys

from dsv41c.outputs import OutputError, check_dir_to_fill, check_output_dir, check_output_file, kept, reason
from dsv41c.outputs import write_file_atomic


def read_ir_text(path: str):
    """The module in IR text file `path`; IRParseError for binary, empty or malformed input."""
    from dsv41c.ir.parser import IRParseError, parse_module

    with open(path, "rb") as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise IRParseError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                           f"an IR file is text as `dsv41c opt` or --dump-dir writes it") from None
    module = parse_module(text, path)
    if not module.functions:
        why = "an empty file" if not text.strip() else "only comments or module attributes"
        raise IRParseError(f"{path}: no function in it ({why})")
    return module


def cmd_opt(args) -> int:
    from dsv41c.ir.printer import print_module
    from dsv41c.ir.verifier import VerifyError, verify
    from dsv41c.passes.base import PassError
    from dsv41c.passes.manager import PassManager
    from dsv41c.passes.registry import parse_pipeline

    passes = parse_pipeline(args.passes)  # a typo in -p fails before any work
    if args.output:
        check_output_file(args.output, "-o")
    dump_dir = getattr(args, "dump_dir", None)
    if dump_dir:
        check_dir_to_fill(dump_dir, "--dump-dir")
    module = read_ir_text(args.input)
    try:
        verify(module)
    except VerifyError as e:
        raise VerifyError([f"{args.input}: {m}" for m in e.errors]) from None
    pm = PassManager(passes, verify_each=getattr(args, "verify_each", False), timings=getattr(args, "timings", False),
                     dump_dir=dump_dir, dump_filter=getattr(args, "dump_filter", None))
    result = pm.run(module)
    try:
        verify(result.module)
    except VerifyError as e:
        names = ", ".join(p.name for p in passes)
        raise PassError(f"IR invalid after the pipeline ({names}); rerun with --verify-each to find the pass: "
                        f"{e}") from e
    out = print_module(result.module)
    if args.output:
        write_file_atomic(args.output, out, "-o")
    else:
        sys.stdout.write(out)
    return 0


def _scrub(text: str, parent: str, out: str) -> str:
    """`text` with the hidden temporaries beside OUT (`.ckpt-…`, `.tmp-…`) named as OUT."""
    return re.sub(re.escape(parent.rstrip(os.sep) + os.sep) + r"\.[^\s:'\"]*", lambda m: out, text)


def _ours(filename, parent: str) -> bool:
    """Whether an OSError's file is one of the hidden temporaries the compile writes beside OUT."""
    if not filename:
        return False
    rel = os.path.relpath(os.path.abspath(os.fspath(filename)), parent)
    return not rel.startswith("..") and rel.startswith(".")


def cmd_compile(args) -> int:
    from dsv41c.artifact_format import is_artifact
    from dsv41c.codegen.build import build_artifact

    out = check_output_dir(args.output, "-o", force=getattr(args, "force", False), replaceable=is_artifact)
    if getattr(args, "dump_dir", None):
        check_dir_to_fill(args.dump_dir, "--dump-dir")
    emits = getattr(args, "emit", None)
    if emits:
        from dsv41c.frontend.exports import check_emits

        check_emits(emits)  # an unknown format or unusable path fails before the compile
    parent, since = os.path.dirname(out), len(kept())
    try:
        build_artifact(args.output, checkpoint=args.checkpoint, preset=args.preset, target=args.target,
                       kv_quant=args.kv_quant, seed=getattr(args, "seed", 0), dump_dir=getattr(args, "dump_dir", None),
                       dump_filter=getattr(args, "dump_filter", None), timings=getattr(args, "timings", False),
                       verify_each=getattr(args, "verify_each", False), force=getattr(args, "force", False),
                       activation_dtype=getattr(args, "activation_dtype", None),
                       kernels=not getattr(args, "no_kernels", False),
                       max_context=getattr(args, "max_context", None),
                       memory_budget=getattr(args, "memory_budget", None),
                       ced_split=getattr(args, "ced_split", False))
    except OSError as e:
        if _ours(e.filename, parent) or _ours(e.filename2, parent):
            raise OutputError(f"-o {args.output}: cannot write the artifact ({reason(e)}); nothing written") from None
        raise
    except Exception as e:  # a user error about the checkpoint written beside OUT names OUT, not the temporary
        msg = str(e)
        if type(e).__name__ in ("CheckpointError", "OutputError") and _scrub(msg, parent, args.output) != msg:
            raise OutputError(_scrub(msg, parent, args.output)) from None
        raise
    except KeyboardInterrupt:
        if out in kept(since):  # the artifact was complete and in place: not a failure
            print(f"compile: wrote {out} (interrupted after it was complete)", file=sys.stderr)
            return 0
        raise
    if emits:
        from dsv41c.frontend.config import load_config, preset
        from dsv41c.frontend.exports import run_emits

        cfg = preset(args.preset) if args.preset else load_config(args.checkpoint)
        run_emits(emits, cfg, kv_quant=args.kv_quant, log=sys.stderr)
    return 0
