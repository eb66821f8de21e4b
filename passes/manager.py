"""The pass manager: runs passes in order with instruments between them.

    pm = PassManager(parse_pipeline("fold-shapes,canonicalize,cse,dce"),
                     verify_each=True, timings=True, dump_dir="dumps", dump_filter="cse|dce")
    result = pm.run(module)          # PipelineResult(module, records)
    print(format_timings(result.records))

For each pass (numbered from 1): the kill switch (`DSV41C_DISABLE_<PASS>`) skips it and
records `{"disabled": True}`; otherwise its wall time, `changed` flag and stats are
recorded in a `PassRecord`. Instruments (xDSL's callback between passes) see each record:
- `VerifyEach`: verifies after every pass; a failure raises `PassError` naming the pass
  and the passes that ran before it;
- `Dump`: writes `00_input.ir`, then `NN_<pass>.ir` and `NN_<pass>.diff` (unified diff
  against the IR before that pass, named by the pass that made it) for passes whose name
  matches `dump_filter`
  (re.search; all when None), and `index.json` listing every pass with its changed flag,
  stats, seconds, and the files written (also when a pass fails: `"failed"` names it).
  Each file is written whole through a temporary name and renamed (`outputs.write_file_atomic`):
  a full disk leaves no truncated dump, and the error (`OutputError`) names the dump file.
- `NumericOracle(inputs, atol, rtol)`: interprets every function on fixed inputs before
  the pipeline and after each pass that changed the IR; a pass whose outputs differ is
  named in a PassError (pass it in `instruments=`).
- `ShowProgress(stream)` (`progress=stream`): a tqdm bar of the passes, naming the running
  one, where `stream` is a terminal; nothing in a log.
A pass that raises gets a note naming it and the passes before it; nothing is swallowed.
Timing is always recorded (it costs two clock reads); `timings=True` prints the table
to `timings_stream` (stderr) at the end.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field

from dsv41c.outputs import OutputError, reason, write_file_atomic
from dsv41c.progress import NoBar, progress_bar
from dsv41c.passes.base import PassError, PassResult, is_disabled


@dataclass
class PassRecord:
    index: int
    name: str
    spec: str
    changed: bool = False
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    disabled: bool = False
    files: list = field(default_factory=list)


@dataclass
class PipelineResult:
    module: object
    records: list

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.records)


class Instrument:
    def before_pipeline(self, module, passes):
        pass

    def after_pass(self, record: PassRecord, module, ran_before: list):
        pass

    def after_pipeline(self, module, records, failed: str | None = None):
        pass


def _history(ran_before: list) -> str:
    return ", ".join(ran_before) if ran_before else "none (it was the first)"


class VerifyEach(Instrument):
    def after_pass(self, record, module, ran_before):
        from dsv41c.ir.verifier import VerifyError, verify

        if record.disabled:
            return
        try:
            verify(module)
        except VerifyError as e:
            raise PassError(f"IR invalid after pass '{record.name}' (#{record.index}; ran before: "
                            f"{_history(ran_before)}): {e}") from e


class Dump(Instrument):
    """Numbered IR dumps, per-pass diffs and an index.json under `dump_dir`."""

    _OURS = re.compile(r"\d{2,}_[\w.-]+\.(ir|diff)\Z")

    def __init__(self, dump_dir: str, dump_filter: str | None = None):
        self.dir = dump_dir
        try:
            self.filter = re.compile(dump_filter) if dump_filter else None
        except re.error as e:
            raise PassError(f"dump filter {dump_filter!r} is not a regular expression ({e})") from None
        self.prev_text = ""
        self.prev_file = "00_input.ir"
        self.width = 2

    def before_pipeline(self, module, passes):
        from dsv41c.ir.printer import print_module

        try:
            os.makedirs(self.dir, exist_ok=True)
            for name in os.listdir(self.dir):  # stale dumps of an earlier run would read as this run's
                if self._OURS.match(name) or name == "index.json":
                    os.remove(os.path.join(self.dir, name))
        except OSError as e:
            raise OutputError(f"dump directory {self.dir}: {reason(e)}") from None
        self.width = max(2, len(str(len(passes))))
        self.prev_text = print_module(module)
        self.input_file = "0" * self.width + "_input.ir"
        self.prev_file = self.input_file
        self._write(self.input_file, self.prev_text)

    def _write(self, name, text):
        write_file_atomic(os.path.join(self.dir, name), text)

    def after_pass(self, record, module, ran_before):
        from dsv41c.ir.printer import print_module

        text = print_module(module) if not record.disabled else self.prev_text
        stem = f"{record.index:0{self.width}d}_{record.name}"
        if self.filter is None or self.filter.search(record.name):
            diff = difflib.unified_diff(self.prev_text.splitlines(keepends=True), text.splitlines(keepends=True),
                                        fromfile=self.prev_file, tofile=stem + ".ir")
            self._write(stem + ".ir", text)
            self._write(stem + ".diff", "".join(diff))
            record.files = [stem + ".ir", stem + ".diff"]
        self.prev_file = stem + ".ir"  # names the IR state even where its file was filtered out
        self.prev_text = text

    def after_pipeline(self, module, records, failed=None):
        index = {"input": self.input_file, "failed": failed,
                 "total_seconds": sum(r.seconds for r in records),
                 "passes": [asdict(r) for r in records]}
        self._write("index.json", json.dumps(index, indent=2, default=str) + "\n")


class NumericOracle(Instrument):
    """Interprets the module before the pipeline and after each pass on fixed inputs
    (`inputs`: function name -> list of inputs) and raises PassError naming the first pass
    whose outputs differ (exactly, or beyond atol/rtol for passes that change numerics)."""

    def __init__(self, inputs: dict, atol: float = 0.0, rtol: float = 0.0):
        self.inputs, self.atol, self.rtol = inputs, atol, rtol
        self.reference: dict = {}

    def _run(self, module):
        from dsv41c.ir.interpreter import interpret

        # inputs are cloned: ops that write (cache appends) mutate their operands in place
        return {fn: interpret(module, fn, [x.clone() if hasattr(x, "clone") else x for x in ins])
                for fn, ins in self.inputs.items()}

    def before_pipeline(self, module, passes):
        self.reference = self._run(module)

    def after_pass(self, record, module, ran_before):
        import torch

        if record.disabled or not record.changed:
            return
        for fn, outs in self._run(module).items():
            for k, (want, got) in enumerate(zip(self.reference[fn], outs)):
                same = want.shape == got.shape and want.dtype == got.dtype and torch.allclose(
                    got.double(), want.double(), atol=self.atol, rtol=self.rtol, equal_nan=True) \
                    if isinstance(want, torch.Tensor) else want == got
                if not same:
                    raise PassError(f"pass '{record.name}' (#{record.index}; ran before: {_history(ran_before)}) "
                                    f"changed output {k} of @{fn} (numeric oracle, atol={self.atol}, "
                                    f"rtol={self.rtol})")


class ShowProgress(Instrument):
    """A bar of the passes run, the running pass's name beside it, on `stream` where that is a terminal
    (`dsv41c/progress.py`); nothing elsewhere. Last among the instruments: a step ends once the pass's
    verification and dumps are done too."""

    def __init__(self, stream):
        self.stream, self.bar, self.names = stream, NoBar(), []

    def before_pipeline(self, module, passes):
        self.names = [p.name for p in passes]
        self.bar = progress_bar(self.stream, len(self.names), "passes", unit="pass")
        if self.names:
            self.bar.set_postfix_str(self.names[0])

    def after_pass(self, record, module, ran_before):
        self.bar.update(1)
        if record.index < len(self.names):
            self.bar.set_postfix_str(self.names[record.index])

    def after_pipeline(self, module, records, failed=None):
        self.bar.close()


def format_timings(records) -> str:
    width = max([len(r.name) for r in records] + [4])
    lines = ["pass timings (wall clock):", f"  {'#':>3}  {'pass':<{width}}  {'seconds':>9}  changed  stats"]
    for r in records:
        stats = ", ".join(f"{k}={v}" for k, v in r.stats.items())
        flag = "off" if r.disabled else "yes" if r.changed else "no"
        lines.append(f"  {r.index:>3}  {r.name:<{width}}  {r.seconds:>9.4f}  {flag:<7}  {stats}".rstrip())
    lines.append(f"  {'':>3}  {'total':<{width}}  {sum(r.seconds for r in records):>9.4f}")
    return "\n".join(lines)


class PassManager:
    def __init__(self, passes, *, verify_each: bool = False, timings: bool = False, dump_dir: str | None = None,
                 dump_filter: str | None = None, instruments=(), env=None, timings_stream=None, progress=None):
        self.passes = list(passes)
        self.instruments = list(instruments)
        if verify_each:
            self.instruments.append(VerifyEach())
        if dump_dir:
            self.instruments.append(Dump(dump_dir, dump_filter))
        if progress is not None:
            self.instruments.append(ShowProgress(progress))
        self.timings = timings
        self.timings_stream = timings_stream
        self.env = env

    def run(self, module) -> PipelineResult:
        from dsv41c.ir.printer import name_values

        records: list[PassRecord] = []
        name_values(module)  # stable value names: a dump's diff shows only what a pass changed
        for inst in self.instruments:
            inst.before_pipeline(module, self.passes)
        failed = None
        try:
            for i, p in enumerate(self.passes, 1):
                failed = p.name
                module = self._run_one(i, p, module, records)
            failed = None
        finally:
            for inst in self.instruments:
                inst.after_pipeline(module, records, failed)
            if self.timings:
                print(format_timings(records), file=self.timings_stream or sys.stderr)
        return PipelineResult(module, records)

    def _run_one(self, i, p, module, records):
        ran_before = [r.name for r in records if not r.disabled]
        rec = PassRecord(i, p.name, p.spec())
        if is_disabled(p.name, self.env):
            rec.disabled, rec.stats = True, {"disabled": True}
        else:
            t0 = time.perf_counter()
            try:
                res = p.run(module)
            except PassError as e:
                raise PassError(f"pass '{p.name}' (#{i}; ran before: {_history(ran_before)}) failed: {e}") from e
            except Exception as e:
                if hasattr(e, "add_note"):  # Python >= 3.11
                    e.add_note(f"in pass '{p.name}' (#{i}; ran before: {_history(ran_before)})")
                raise
            rec.seconds = time.perf_counter() - t0
            if not isinstance(res, PassResult):
                raise PassError(f"pass '{p.name}' returned {type(res).__name__}, not a PassResult")
            module, rec.changed, rec.stats = res.module, bool(res.changed), dict(res.stats)
            from dsv41c.ir.printer import name_values

            name_values(module)
        records.append(rec)
        for inst in self.instruments:
            inst.after_pass(rec, module, ran_before)
        return module
