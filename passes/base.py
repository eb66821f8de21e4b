"""What a pass is: a frozen dataclass with a CLI `name`, options as fields, and `run`.

    @dataclass(frozen=True)
    class FoldShapes(ModulePass):
        name: ClassVar[str] = "fold-shapes"
        bind: str = ""                                   # an option: fold-shapes{bind="T=1"}

        def run(self, module) -> PassResult:
            ...
            return PassResult(module, changed=True, stats={"dynamic-dims-resolved": 3})

A pass may rewrite the module it is given in place and return it (the pass manager does
not copy; clone first where the old module is still needed). `stats` maps a counter name
(a rewrite's name, "erased", ...) to a number; the dumps and `--timings` show them.

Options: `from_options({"bind": "T=1"})` converts text by the field's declared type
(int, float, bool, str); `spec()` gives back `name{opt=value ...}` for the non-default
options, which is what the pipeline text and the artifact manifest record.

Kill switch: `DSV41C_DISABLE_<NAME>` (name upper-cased, dashes to underscores) set to
anything but "", "0", "false", "no", "off" skips the pass (`kill_switch(name)`).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import ClassVar

from dsv41c.ir.parser import decode_string
from dsv41c.ir.printer import format_string


class PassError(RuntimeError):
    """A pass that failed, left invalid IR, or was asked for with bad options."""


@dataclass
class PassResult:
    module: object
    changed: bool
    stats: dict = field(default_factory=dict)


def kill_switch(name: str) -> str:
    return "DSV41C_DISABLE_" + name.upper().replace("-", "_")


def is_disabled(name: str, env=None) -> bool:
    val = (os.environ if env is None else env).get(kill_switch(name), "")
    return val.strip().lower() not in ("", "0", "false", "no", "off")


_CONVERT = {"int": int, "float": float, "str": str,
            "bool": lambda s: {"true": True, "1": True, "false": False, "0": False}[s.lower()]}


@dataclass(frozen=True)
class ModulePass:
    name: ClassVar[str] = ""

    def run(self, module) -> PassResult:
        raise NotImplementedError

    @classmethod
    def from_options(cls, options: dict):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, text in options.items():
            if key not in fields:
                known = ", ".join(fields) or "none"
                raise PassError(f"pass '{cls.name}' has no option '{key}' (options: {known})")
            ftype = fields[key].type if isinstance(fields[key].type, str) else fields[key].type.__name__
            conv = _CONVERT.get(ftype)
            if conv is None:
                raise PassError(f"pass '{cls.name}': option '{key}' of type {ftype} cannot be set from text")
            if ftype == "str" and text.startswith('"'):
                text = decode_string(text)
            try:
                kwargs[key] = conv(text)
            except (ValueError, KeyError):
                raise PassError(f"pass '{cls.name}': option '{key}' wants a {ftype}, got {text!r}") from None
        return cls(**kwargs)

    def spec(self) -> str:
        opts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v == f.default:
                continue
            text = format_string(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
            opts.append(f"{f.name}={text}")
        return self.name + ("{" + " ".join(opts) + "}" if opts else "")
