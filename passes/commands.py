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

`dsv41c compile` is driven by dsv41c/driver.py, above this package.
"""
from __future__ import annotations

import sys

from dsv41c.outputs import check_dir_to_fill, check_output_file, write_file_atomic


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
                     dump_dir=dump_dir, dump_filter=getattr(args, "dump_filter", None), progress=sys.stderr)
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
