"""The `dsv41c` command line.

Each subcommand's arguments are declared here; its work is done by a `cmd_<name>`
function in the component that owns it (imported lazily, so `dsv41c plan` does not import
Triton). Argument values are parsed by `dsv41c/argtypes.py` (`type=`), so a bad value fails
before any work; output paths are checked by `dsv41c/outputs.py` before any work too.

`main` is the one place that turns failures into what the user reads, always one line on
stderr (`dsv41c <command>: error: ...`) and never a traceback:
- bad arguments (argparse's errors, printed without the usage block), bad input (the
  components' error classes listed in `_USER_ERROR_NAMES`: config, checkpoint, artifact,
  ids, IR, passes, outputs), and operating-system errors (`OSError`: a missing file,
  permission denied, disk full, read-only file system, ...): exit status 2;
- Ctrl-C: `interrupted; nothing written` (or the outputs that were complete and kept),
  exit status 130;
- anything else is a bug in dsv41c: one line naming the exception, exit status 1;
  `DSV41C_TRACEBACK=1` lets its traceback through.
A value that starts with '-' (`--ids -2,3`) is taken as the option's value, not as an
unknown option.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from dsv41c import argtypes

# subcommand -> "module:function" (the function takes the parsed args, returns an exit code)
HANDLERS = {
    "init-checkpoint": "dsv41c.frontend.checkpoint_cli:cmd_init_checkpoint",
    "plan": "dsv41c.frontend.commands:cmd_plan",
    "reference": "dsv41c.frontend.model.cli:cmd_reference",
    "generate": "dsv41c.frontend.model.cli:cmd_generate",
    "compile": "dsv41c.driver:cmd_compile",
    "opt": "dsv41c.passes.commands:cmd_opt",
    "run": "dsv41c.runtime.commands:cmd_run",
    "inspect": "dsv41c.runtime.commands:cmd_inspect",
    "kernels": "dsv41c.codegen.commands:cmd_kernels",
    "bench": "dsv41c.bench_e2e:cmd_bench",
    "bisect": "dsv41c.bisect:cmd_bisect",
}


# (subcommand, option) -> the handler that does the work when the option is given: `inspect --graph` parses the
# plan's IR, which the runtime's `inspect` never imports
OPTION_HANDLERS = {
    ("inspect", "graph"): "dsv41c.plan_graph:cmd_inspect_graph",
}


class UserError(Exception):
    """An error caused by the user's input; printed as one line, exit status 2."""


_ids = argtypes.token_ids
_onoff = argtypes.on_off


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block): `dsv41c compile: error: ...`."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dsv41c", description="Ahead-of-time compiler and runtime for DeepSeek-V4.1-Flash.")
    p.add_argument("--version", action="store_true", help="print versions and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("init-checkpoint", help="write a seeded random checkpoint in the official format")
    s.add_argument("--preset", required=True, help="tiny | mini | bench | full")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="the checkpoint directory to write")
    s.add_argument("--seed", type=argtypes.seed, default=0, help="random seed of the weights (default 0)")
    s.add_argument("--force", action="store_true", help="replace DIR if it is a checkpoint (nothing else is replaced)")

    s = sub.add_parser("plan", help="print the layer plan of a checkpoint or preset")
    s.add_argument("checkpoint", nargs="?", metavar="CKPT_DIR", help="a checkpoint directory (its config.json)")
    s.add_argument("--preset", help="tiny | mini | bench | full, instead of CKPT_DIR")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    def model_args(s):
        s.add_argument("checkpoint", metavar="CKPT_DIR")
        s.add_argument("--ids", type=_ids, required=True, help="comma-separated token ids")
        s.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
        s.add_argument("--kv-quant", type=_onoff, default=True, metavar="on|off",
                       help="FP8/FP4 fake quantization of the KV path (off: numerics debugging, spec §7.3)")

    s = sub.add_parser("reference", help="logits of one prefill from position 0 on the eager reference")
    model_args(s)
    s.add_argument("--out", required=True, metavar="FILE.npy", help="where to write the logits")

    s = sub.add_parser("generate", help="greedy generation on the eager reference")
    model_args(s)
    s.add_argument("--max-new-tokens", type=argtypes.count, default=16, help="tokens to generate (default 16)")
    s.add_argument("--dspark", action="store_true", help="speculative decoding with the DSpark drafter")
    s.add_argument("--chunk", type=argtypes.count, default=0, help="prefill chunk size (0: one chunk)")

    s = sub.add_parser("compile", help="compile a checkpoint or preset into an artifact")
    s.add_argument("checkpoint", nargs="?", metavar="CKPT_DIR", help="the checkpoint to compile")
    s.add_argument("--preset", help="tiny | mini | bench | full: an embedded config and seeded random weights")
    s.add_argument("-o", "--output", required=True, metavar="OUT", help="the artifact to write")
    s.add_argument("--target", default="cpu", metavar="T",
                   help="cpu (reference ops), cuda:sm80|sm90|sm100, rocm:gfx942|gfx950|gfx1100 (kernel calls, their "
                        "binaries built in), ascend:a2|a3|a5 (the plan; its kernels are not built here) (default cpu)")
    s.add_argument("--activation-dtype", choices=("float32", "bfloat16"),
                   help="activations' dtype (default: float32 for cpu, bfloat16 for a GPU target; float32 on a GPU "
                        "target is the verification build)")
    s.add_argument("--no-kernels", action="store_true",
                   help="write the plan without building its kernel binaries")
    s.add_argument("--kv-quant", type=_onoff, default=True, metavar="on|off",
                   help="FP8/FP4 KV cache (default on; off: numerics debugging)")
    s.add_argument("--max-context", type=argtypes.positive, metavar="N",
                   help="positions a session holds: the state caches get ceil(N / ratio) rows each "
                        "(default: the model's max_position_embeddings)")
    s.add_argument("--dump-dir", metavar="D", help="write the IR before and after each pass (with diffs) into D")
    s.add_argument("--dump-filter", type=argtypes.regex, metavar="RE", help="dump only the passes whose name matches RE")
    s.add_argument("--timings", action="store_true", help="print each pass's wall time")
    s.add_argument("--verify-each", action="store_true", help="verify the IR after every pass")
    s.add_argument("--seed", type=argtypes.seed, default=0, help="weights' seed for --preset (default 0)")
    s.add_argument("--force", action="store_true", help="replace OUT if it is an artifact (nothing else is replaced)")
    s.add_argument("--memory-budget", type=argtypes.size, metavar="SIZE",
                   help="device memory for weights + state + arena (e.g. 80GiB): the prefill chunk is the largest "
                        "that fits (plan-chunks; reports/chunks.json)")
    s.add_argument("--ced-split", action="store_true",
                   help="also plan @prefill_encoder: a long prompt's prefix runs the encoder only, the exact decoder "
                        "suffix the full prefill (split-ced-prefill; reports/ced_split.json)")
    s.add_argument("--emit", nargs=2, action="append", metavar=("FORMAT", "PATH"),
                   help="also write an export: `mlir DIR` (each traced segment, torch-mlir), `onnx FILE` (the "
                        "target-independent @prefill, dsv41 ops as ONNX functions); repeatable")

    s = sub.add_parser("opt", help="run passes over an IR text file")
    s.add_argument("input", metavar="IN.ir", help="an IR text file")
    s.add_argument("-p", "--passes", required=True, metavar="PASS[,PASS...]", help="the pipeline, comma-separated")
    s.add_argument("-o", "--output", metavar="OUT.ir", help="write the result here (default: stdout)")
    s.add_argument("--dump-dir", metavar="D", help="write the IR before and after each pass (with diffs) into D")
    s.add_argument("--dump-filter", type=argtypes.regex, metavar="RE")
    s.add_argument("--timings", action="store_true")
    s.add_argument("--verify-each", action="store_true")

    s = sub.add_parser("run", help="load an artifact and generate")
    s.add_argument("artifact", metavar="ARTIFACT", help="an artifact written by `dsv41c compile`")
    s.add_argument("--checkpoint", metavar="DIR", help="the checkpoint to bind (default: the one the artifact names; checked against its inventory)")
    s.add_argument("--ids", type=_ids, required=True, help="comma-separated prompt token ids")
    s.add_argument("--max-new-tokens", type=argtypes.count, default=16,
                   help="tokens to generate (default 16; the prompt plus these must fit the model's context)")
    s.add_argument("--logits-out", metavar="FILE.npy", help="write the prefill's logits (the prompt's) here")
    s.add_argument("--device", type=argtypes.device_name,
                   help="device to run on (default: the artifact target's own, cpu for a cpu artifact)")
    s.add_argument("--interpret", action="store_true",
                   help="run a GPU artifact's kernel calls in Triton's interpreter on the CPU")

    s.add_argument("--seeded-weights", type=argtypes.count, metavar="SEED",
                   help="no checkpoint: generate every weight on the device from SEED, in the stored formats")

    s = sub.add_parser("bisect", help="name the first kernel call of a plan whose output leaves its tolerance")
    s.add_argument("artifact", metavar="ARTIFACT", help="an artifact written by `dsv41c compile`")
    s.add_argument("--ids", type=_ids, required=True, help="comma-separated prompt token ids")
    s.add_argument("--decode-steps", type=argtypes.count, default=0, help="greedy decode steps after the prompt")
    s.add_argument("--checkpoint", metavar="DIR", help="the checkpoint to bind (default: the artifact's)")
    s.add_argument("--device", type=argtypes.device_name, help="device to run on (default: the target's own)")
    s.add_argument("--interpret", action="store_true", help="run the kernel calls in Triton's interpreter")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser("bench", help="end-to-end prefill and decode: eager PyTorch, torch.compile and an artifact")
    s.add_argument("--preset", default="bench", help="the model (default bench: official widths, 32 experts)")
    s.add_argument("--artifact", metavar="ARTIFACT", help="the dsv41c artifact of the same preset")
    s.add_argument("--systems", default="eager,compile,dsv41c", help="which systems (default %(default)s)")
    s.add_argument("--prefill", default="8192,32768,131072", help="cold prefill lengths (default %(default)s)")
    s.add_argument("--decode-context", default="8192,32768", help="decode contexts (default %(default)s)")
    s.add_argument("--decode-steps", type=argtypes.positive, default=32, help="timed decode steps (default 32)")
    s.add_argument("--seed", type=argtypes.count, default=0, help="weights' and prompts' seed (default 0)")
    s.add_argument("--device", type=argtypes.device_name, help="default: cuda where there is one, else cpu")
    s.add_argument("--timeout", type=argtypes.positive, default=3000, help="seconds per system (default 3000)")
    s.add_argument("--out", required=True, metavar="FILE.json", help="the results")
    s.add_argument("--worker", choices=("eager", "compile", "dsv41c"), help=argparse.SUPPRESS)

    s = sub.add_parser("inspect", help="describe an artifact")
    s.add_argument("artifact", metavar="ARTIFACT", help="an artifact written by `dsv41c compile`")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--memory", action="store_true", help="the memory plan: arena vs lower bound, timeline pictures")
    s.add_argument("--graph", type=argtypes.count, metavar="LAYER",
                   help="draw layer LAYER's scheduled plan into -o FILE.svg: its ops on one lane per stream, data "
                        "dependencies and cross-stream events as arrows")
    s.add_argument("--function", metavar="NAME", help="for --graph: prefill | decode (default decode)")
    s.add_argument("-o", "--output", metavar="FILE.svg", help="for --graph: the SVG to write")

    s = sub.add_parser("kernels", help="the kernel matrix and ahead-of-time kernel builds")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--matrix", action="store_true",
                   help="print which template has which variant on which target, with the gaps")
    g.add_argument("--build", action="store_true",
                   help="compile every specialization for --targets ahead of time into -o DIR (no GPU needed)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--targets", default="cuda:sm80,cuda:sm90,rocm:gfx942,rocm:gfx1100", metavar="T[,T...]",
                   help="for --build: cuda:sm80|sm90|sm100, rocm:gfx942|gfx950|gfx1100, ascend:a2|a3|a5 "
                        "(default %(default)s)")
    s.add_argument("-o", "--output", metavar="DIR", help="for --build: the output directory")
    s.add_argument("-j", "--jobs", type=argtypes.positive, metavar="N", help="for --build: kernels compiled at once (default: the core count)")
    s.add_argument("--templates", type=argtypes.regex, metavar="REGEX", help="for --build: only the templates whose name matches REGEX")
    s.add_argument("--no-cache", action="store_true",
                   help="for --build: compile everything, bypassing the kernel cache ($DSV41C_CACHE_DIR or ~/.cache/dsv41c)")
    return p


def _versions() -> str:
    import dsv41c

    parts = [f"dsv41c {dsv41c.__version__}"]
    for mod in ("torch", "triton"):
        try:
            parts.append(f"{mod} {importlib.import_module(mod).__version__}")
        except Exception:  # noqa: BLE001 - optional at this point
            parts.append(f"{mod} (not installed)")
    return ", ".join(parts)


def _one_line(msg) -> str:
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    return "; ".join(lines) if lines else ""


def _value_options(parser, argv) -> set:
    """Option strings of the chosen subcommand that take one value (where '-2,3' is a value)."""
    subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    cmd = next((t for t in argv if not t.startswith("-")), None)
    sp = subs.choices.get(cmd) if subs is not None and cmd else None
    out = set()
    for a in (sp or parser)._actions:
        if a.option_strings and a.nargs is None and not isinstance(a, (argparse._StoreConstAction,
                                                                       argparse._HelpAction)):
            out.update(a.option_strings)
    return out


def _join_negative_values(parser, argv: list) -> list:
    """`--ids -2,3` -> `--ids=-2,3`: argparse reads a value starting with '-' as an unknown option."""
    opts = _value_options(parser, argv)
    out, i = [], 0
    while i < len(argv):
        t = argv[i]
        if t in opts and i + 1 < len(argv) and re.match(r"-[\d.,\s]", argv[i + 1]):
            out.append(f"{t}={argv[i + 1]}")
            i += 2
            continue
        out.append(t)
        i += 1
    return out


def _handler(args) -> str:
    """The "module:function" that runs `args`: an option's own handler (OPTION_HANDLERS) or the subcommand's."""
    for (cmd, opt), handler in OPTION_HANDLERS.items():
        if args.command == cmd and getattr(args, opt, None) is not None:
            return handler
    if args.command == "inspect" and (args.output is not None or args.function is not None):
        raise UserError("-o and --function go with --graph LAYER")
    return HANDLERS[args.command]


def _os_error(e: OSError) -> str:
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = e.strerror or _one_line(e) or type(e).__name__
    return f"{where}: {what}" if where else what


def _interrupted(e: KeyboardInterrupt, since: int) -> str:
    from dsv41c.outputs import kept

    done = kept(since)
    when = f" {_one_line(e)}" if str(e) else ""
    return f"interrupted{when}; " + (f"kept {', '.join(done)} (complete)" if done else "nothing written")


def main(argv=None) -> int:
    from dsv41c.outputs import kept

    cmd, since = "dsv41c", len(kept())
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(_join_negative_values(parser, argv))
        if args.version:
            print(_versions())
            return 0
        if not args.command:
            parser.print_help()
            return 2
        cmd = f"dsv41c {args.command}"
        mod_name, fn_name = _handler(args).split(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        return int(fn(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        print(f"{cmd}: {_interrupted(e, since)}", file=sys.stderr)
        return 130
    except UserError as e:
        print(f"{cmd}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a missing file, permission denied, disk full, read-only, ...
        if type(e).__name__ in _USER_ERROR_NAMES and e.strerror is None:
            print(f"{cmd}: error: {_one_line(e)}", file=sys.stderr)
        else:
            print(f"{cmd}: error: {_os_error(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{cmd}: error: out of memory", file=sys.stderr)
        return 2
    except Exception as e:  # errors of bad input carry the class name of a known user error
        if type(e).__name__ in _USER_ERROR_NAMES:
            print(f"{cmd}: error: {_one_line(e)}", file=sys.stderr)
            return 2
        if os.environ.get("DSV41C_TRACEBACK"):
            raise
        print(f"{cmd}: internal error (a bug in dsv41c): {type(e).__name__}: {_one_line(e)} "
              f"(DSV41C_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1


# Exceptions raised by the components for bad input (they do not import this module).
_USER_ERROR_NAMES = {"ConfigError", "CheckpointError", "ArtifactError", "InputError", "PlanError", "IRParseError",
                     "VerifyError", "PassError", "KernelBuildError", "ExportError", "OutputError", "RequestError", "FileExistsError",
                     "FileNotFoundError"}


if __name__ == "__main__":
    raise SystemExit(main())
