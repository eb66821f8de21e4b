"""Progress bars for the long steps of a command, on a terminal only.

    bar = progress_bar(sys.stderr, total=84, desc="tracing", unit="segment")
    bar.set_postfix_str("@prefill layers.3"); bar.update(1)
    bar.write("  exported Attend ...")       # a log line, printed above the bar
    bar.close()

`progress_bar(stream, ...)` is a tqdm bar on `stream` when `stream` is a terminal, and a
`NoBar` otherwise (a log file, a pipe, a test's captured stderr): its `write` prints the line
exactly as a plain `print` would and everything else does nothing, so a log reads the same
whether or not a bar exists. The bar does not stay once closed (`leave=False`): the terminal
keeps the same lines as the log. `DSV41C_PROGRESS=0` turns bars off on a terminal too.

A leaf module (the standard library and tqdm): the frontend, the passes and the codegen use it.
Known gaps: the bar counts units of work (segments stamped, passes run), not time; a pass
that takes most of the pipeline's time shows as one slow step.
"""
from __future__ import annotations

import os


class NoBar:
    """What `progress_bar` returns off a terminal: lines go through as they are, nothing else shows."""

    def __init__(self, stream=None):
        self.stream = stream

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def write(self, line: str) -> None:
        if self.stream is not None:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        pass


class _Bar:
    """A tqdm bar whose `write` prints above it on the same stream."""

    def __init__(self, stream, total, desc, unit):
        from tqdm import tqdm

        self.stream = stream
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=False)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.bar.set_postfix_str(s, refresh=refresh)

    def write(self, line: str) -> None:
        self.bar.write(line, file=self.stream)

    def close(self) -> None:
        self.bar.close()


def on_terminal(stream) -> bool:
    """Whether a bar would show on `stream`."""
    if stream is None or os.environ.get("DSV41C_PROGRESS", "1") == "0":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(stream, total: int, desc: str, unit: str = "it"):
    """A tqdm bar on `stream` if it is a terminal, else a `NoBar` (see the module docstring)."""
    return _Bar(stream, total, desc, unit) if on_terminal(stream) else NoBar(stream)
