"""The IR text printer (the syntax is documented in `ir/__init__.py`).

`print_module(m)` is deterministic: functions in module order, ops in list order,
attribute dictionaries sorted by key, floats as `repr` (the shortest text that reads back to
the same double: `1e-20`, `0.1`, `-0.0`, `inf`, `nan`), strings in double quotes with
`\\" \\\\ \\n \\t \\r` and `\\uXXXX`/`\\UXXXXXXXX` for every other non-printable character.

Value names: each function prints its values as `%<name hint>` when the hint is a valid
name not used yet in that function; every other value gets a number above the largest
numeric name the function already holds (`%0`, `%1`, ... in a fresh trace), in definition
order. The parser keeps the printed names as hints, so print(parse(print(m))) == print(m).

Stable names across passes: `name_values(m)` writes those names back as the values' hints.
The pass manager calls it before the pipeline and after every pass, so a value keeps its
name until a pass replaces it, and a value a pass creates takes a number no surviving value
holds: a pass's `.diff` shows the ops it changed and nothing renumbered. Because a parsed
dump carries the same names, `dsv41c opt` run on a dump prints what the compile printed.
Known gap: a value created outside the pass manager keeps no name until the next print.
"""
from __future__ import annotations

import re

from dsv41c.ir.attrs import format_attr, format_string  # noqa: F401 (format_string re-exported)

NAME_RE = re.compile(r"[A-Za-z0-9_.]+\Z")


def format_attr_dict(attrs: dict) -> str:
    if not attrs:
        return ""
    return "{" + ", ".join(f"{k} = {format_attr(attrs[k])}" for k in sorted(attrs)) + "}"


def assign_names(f) -> dict:
    """id(value) -> name for f's arguments and op results (the algorithm in the docstring)."""
    order = list(f.args) + [r for op in f.ops for r in op.results]
    names: dict[int, str] = {}
    used: set[str] = set()
    top = -1
    for v in order:
        hint = v.name
        if hint is not None and NAME_RE.match(hint) and hint not in used and id(v) not in names:
            used.add(hint)
            names[id(v)] = hint
            if hint.isdigit():
                top = max(top, int(hint))
    # str(n) for n > top cannot equal a kept hint: kept digit strings are <= top (or have leading zeros).
    n = top + 1
    for v in order:
        if id(v) not in names:
            names[id(v)] = str(n)
            used.add(str(n))
            n += 1
    return names


def name_values(module) -> None:
    """Write each function's printed names back as its values' hints (stable across passes)."""
    for f in module.functions.values():
        names = assign_names(f)
        for v in list(f.args) + [r for op in f.ops for r in op.results]:
            v.name = names[id(v)]


class Namer:
    def __init__(self, names: dict | None = None):
        self.names: dict[int, str] = dict(names or {})
        self.used: set[str] = set(self.names.values())
        self.counter = 0

    def define(self, v) -> str:
        name = self.names.get(id(v))
        if name is not None:
            return name
        hint = v.name
        if hint is not None and NAME_RE.match(hint) and hint not in self.used:
            name = hint
        else:
            while str(self.counter) in self.used:
                self.counter += 1
            name = str(self.counter)
        self.used.add(name)
        self.names[id(v)] = name
        return name

    def __call__(self, v) -> str:
        name = self.names.get(id(v))
        if name is None:  # used before defined (invalid IR); print it so the verifier's report can be read
            name = self.define(v)
        return "%" + name


def function_namer(f) -> "Namer":
    """The names `print_function` gives f's values (for messages that quote the text)."""
    return Namer(assign_names(f))


def _value_decl(namer, v) -> str:
    s = namer(v)
    if v.attrs:
        s += " " + format_attr_dict(v.attrs)
    return s


def format_types(types) -> str:
    return "(" + ", ".join(str(t) for t in types) + ")"


def print_function(f) -> str:
    # Every name is fixed up front so a use-before-def still prints the definition's name.
    namer = function_namer(f)
    args = []
    for a in f.args:
        decl = f"{namer(a)}: {a.type}"
        if a.attrs:
            decl += " " + format_attr_dict(a.attrs)
        args.append(decl)
    lines = [f"func @{f.name}({', '.join(args)}) -> {format_types(f.result_types)} {{"]
    for op in f.ops:
        lines.append("  " + format_op(op, namer))
    if f.returns is not None:
        lines.append("  return" + ("" if not f.returns else " " + ", ".join(namer(v) for v in f.returns)))
    lines.append("}")
    return "\n".join(lines)


def format_op(op, namer=None) -> str:
    namer = namer or Namer()
    head = ""
    if op.results:
        head = ", ".join(_value_decl(namer, r) for r in op.results) + " = "
    attrs = format_attr_dict(op.attrs)
    rtypes = str(op.results[0].type) if len(op.results) == 1 else format_types(r.type for r in op.results)
    s = (f"{head}{op.name}({', '.join(namer(v) for v in op.operands)})"
         f"{' ' + attrs if attrs else ''} : {format_types(v.type for v in op.operands)} -> {rtypes}")
    if op.loc is not None:
        s += f" loc({format_string(op.loc)})"
    return s


def print_module(m) -> str:
    parts = []
    if m.attrs:
        parts.append(f"module {format_attr_dict(m.attrs)}")
    parts.extend(print_function(f) for f in m.functions.values())
    return "\n\n".join(parts) + "\n"
