"""Argument value parsers for the command line, shared by every subcommand.

A leaf module (the standard library and `dsv41c.artifact_format`). Each function turns one argument's text into its
value or raises `argparse.ArgumentTypeError` with a one-line reason; argparse prefixes the
option's name (`argument --ids: ...`), and `dsv41c/cli.py` prints that as the one error
line. Use them as `type=` so bad values fail before any work:

- `token_ids("5,17,42")` -> [5, 17, 42]: comma-separated integers within int64 (the
  vocabulary range is the model's to check, once its config is read);
- `count("16")`: an integer >= 0 (`--max-new-tokens`, `--chunk`); `positive("8")`: >= 1;
- `seed("0")`: an integer torch's generator takes (0 .. 2**64-1, negatives to -2**63);
- `regex("cse|dce")`: a pattern `re` compiles (`--dump-filter`), kept as text;
- `on_off("on")` -> True;
- `size("80GiB")` -> 85899345920 bytes: an integer with an optional unit B, K/KB/KiB, M/MB/MiB,
  G/GB/GiB, T/TB/TiB (K/M/G/T alone are binary; KB/MB/GB/TB are decimal); at least one byte;
- `device_name("cuda:0")`: `kind[:index]` of a device kind some target runs on
  (`artifact_format.TARGET_DEVICES`); whether the artifact's target runs there is the
  loader's check, once the manifest is read.
"""
from __future__ import annotations

import argparse
import re

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
          "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None


def token_ids(text: str) -> list:
    items = [t.strip() for t in text.split(",")]
    if items == [""]:
        raise argparse.ArgumentTypeError("no token ids given")
    ids = []
    for i, t in enumerate(items):
        if t == "":
            raise argparse.ArgumentTypeError(f"empty token id at position {i + 1} in {text!r}")
        try:
            v = int(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"token ids must be comma-separated integers, got {t!r}") from None
        if not INT64_MIN <= v <= INT64_MAX:
            raise argparse.ArgumentTypeError(f"token id {t} is out of range (not a 64-bit integer)")
        ids.append(v)
    return ids


def count(text: str) -> int:
    v = _int(text, "the value")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    if v > INT64_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is too large")
    return v


def positive(text: str) -> int:
    v = count(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return v


def seed(text: str) -> int:
    v = _int(text, "the seed")
    if not INT64_MIN <= v < 2**64:
        raise argparse.ArgumentTypeError(f"seed {v} is out of range ({INT64_MIN} .. {2**64 - 1})")
    return v


def regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression ({e}): {text!r}") from None
    return text


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {text!r}")
    return text == "on"


def size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size like 80GiB, 512MiB or 1000000 (bytes), got {text!r}")
    v = float(m.group(1)) * _UNITS[unit] if "." in m.group(1) else int(m.group(1)) * _UNITS[unit]
    if v > INT64_MAX:
        raise argparse.ArgumentTypeError(f"size {text!r} is too large")
    if int(v) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} is less than one byte")
    return int(v)


def device_name(text: str) -> str:
    from dsv41c.artifact_format import known_device_kinds

    m = re.fullmatch(r"([a-z]+)(:\d+)?", text)
    if not m or m.group(1) not in known_device_kinds():
        kinds = ", ".join(k if k == "cpu" else f"{k}[:N]" for k in known_device_kinds())
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (devices: {kinds})")
    return text
