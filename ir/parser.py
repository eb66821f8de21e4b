"""The IR text parser: the inverse of `ir/printer.py` (syntax in `ir/__init__.py`).

A regex lexer and a recursive-descent parser; no registry lookups, so any op name parses
and the verifier judges it. Errors raise `IRParseError` as `FILE:LINE:COL: message`.

Uses of a value before its definition in the same function parse (the use is patched when
the definition appears) so that the verifier, not the parser, reports use-before-def with
the op's name and location; a name never defined is a parse error. The operand types
printed after `:` must equal the operands' types (the text is redundant on purpose, so a
reader sees types at each use; the parser checks the redundancy).
"""
from __future__ import annotations

import re

from dsv41c.ir.attrs import DYN
from dsv41c.ir.core import Function, Module, Op, Value
from dsv41c.ir.symbolic import RESERVED, add, floordiv, mul, neg, sym
from dsv41c.ir.types import DTYPES, EVENT, INDEX, TensorType


class IRParseError(ValueError):
    """IR text that does not parse; the message starts with FILE:LINE:COL."""


_LEX = re.compile(r"""
  (?P<ws>\s+|\#[^\n]*)
| (?P<value>%[A-Za-z0-9_.]+)
| (?P<func>@[A-Za-z0-9_.]+)
| (?P<string>"(?:[^"\\]|\\.)*")
| (?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
| (?P<int>\d+)
| (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
| (?P<punct>->|//|[-+*()\[\]{},:=?])
""", re.VERBOSE | re.DOTALL)

_UNESC = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_ESC_RE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)


def decode_string(lit: str) -> str:
    def rep(m):
        if m.group(1) or m.group(2):
            return chr(int(m.group(1) or m.group(2), 16))
        ch = m.group(3)
        if ch not in _UNESC:
            raise ValueError(f"unknown escape \\{ch}")
        return _UNESC[ch]

    return _ESC_RE.sub(rep, lit[1:-1])


class _Tok:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind, text, pos):
        self.kind, self.text, self.pos = kind, text, pos

    def __repr__(self):
        return f"{self.text!r}"


class Parser:
    def __init__(self, text: str, filename: str = "<ir>"):
        self.text, self.filename = text, filename
        self.toks: list[_Tok] = []
        pos = 0
        while pos < len(text):
            m = _LEX.match(text, pos)
            if not m:
                self.pos_error(pos, f"unexpected character {text[pos]!r}")
            if m.lastgroup != "ws":
                self.toks.append(_Tok(m.lastgroup, m.group(), pos))
            pos = m.end()
        self.toks.append(_Tok("eof", "<end of input>", len(text)))
        self.i = 0

    # ------------------------------------------------------------------ tokens
    def pos_error(self, pos, msg):
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        raise IRParseError(f"{self.filename}:{line}:{col}: {msg}")

    def error(self, msg, tok=None):
        self.pos_error((tok or self.peek()).pos, msg)

    def peek(self, k=0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i = min(self.i + 1, len(self.toks) - 1)
        return t

    def at(self, text, k=0) -> bool:
        t = self.peek(k)
        return t.kind in ("punct", "ident") and t.text == text

    def expect(self, text) -> _Tok:
        if not self.at(text):
            self.error(f"expected '{text}', got {self.peek().text!r}")
        return self.take()

    def accept(self, text) -> bool:
        if self.at(text):
            self.take()
            return True
        return False

    def expect_kind(self, kind, what) -> _Tok:
        if self.peek().kind != kind:
            self.error(f"expected {what}, got {self.peek().text!r}")
        return self.take()

    # ------------------------------------------------------------------ module
    def module(self) -> Module:
        m = Module()
        if self.accept("module"):
            m.attrs = self.attr_dict()
        while self.peek().kind != "eof":
            if not self.at("func"):
                self.error(f"expected 'func', got {self.peek().text!r}")
            tok = self.peek(1)
            f = self.function()
            if f.name in m.functions:
                self.error(f"redefinition of function @{f.name}", tok)
            m.add(f)
        return m

    def function(self) -> Function:
        self.expect("func")
        name = self.expect_kind("func", "a function name '@name'").text[1:]
        self.scope: dict[str, Value] = {}
        self.pending: dict[str, list] = {}  # name -> [(token, patch callback, printed type)]
        f = Function(name)
        self.expect("(")
        while not self.at(")"):
            tok = self.expect_kind("value", "an argument '%name'")
            self.expect(":")
            v = f.add_arg(tok.text[1:], self.type(), None)
            if self.at("{"):
                v.attrs = self.attr_dict()
            self.define(tok, v)
            if not self.accept(","):
                break
        self.expect(")")
        self.expect("->")
        f.result_types = self.type_list()
        self.expect("{")
        while not self.at("}"):
            if self.peek().kind == "eof":
                self.error(f"missing '}}' at the end of @{name}")
            if f.returns is not None:
                self.error(f"op after 'return' in @{name}")
            if self.at("return"):
                self.take()
                f.returns = []
                if self.peek().kind == "value":
                    while True:
                        idx = len(f.returns)
                        f.returns.append(self.use(lambda v, i=idx: f.returns.__setitem__(i, v), None))
                        if not self.accept(","):
                            break
            else:
                f.ops.append(self.op())
        self.expect("}")
        for nm, uses in self.pending.items():
            self.error(f"use of undefined value %{nm} in @{name}", uses[0][0])
        return f

    # ------------------------------------------------------------------ values
    def define(self, tok, v: Value):
        nm = tok.text[1:]
        if nm in self.scope:
            self.error(f"redefinition of value %{nm}", tok)
        self.scope[nm] = v
        for use_tok, patch, ty in self.pending.pop(nm, []):
            self.check_type(use_tok, v, ty)
            patch(v)

    def check_type(self, tok, v, ty):
        if ty is not None and ty != v.type:
            self.error(f"{tok.text} has type {v.type} but the op's signature says {ty}", tok)

    def use(self, patch, ty):
        tok = self.expect_kind("value", "a value '%name'")
        v = self.scope.get(tok.text[1:])
        if v is not None:
            return v
        placeholder = Value(ty or INDEX, tok.text[1:])
        self.pending.setdefault(tok.text[1:], []).append((tok, patch, ty))
        return placeholder

    # ------------------------------------------------------------------ ops
    def op(self) -> Op:
        result_toks, result_attrs = [], []
        if self.peek().kind == "value":
            while True:
                result_toks.append(self.expect_kind("value", "a result '%name'"))
                result_attrs.append(self.attr_dict() if self.at("{") else {})
                if not self.accept(","):
                    break
            self.expect("=")
        name_tok = self.expect_kind("ident", "an op name")
        self.expect("(")
        operand_toks = []
        while not self.at(")"):
            operand_toks.append(self.i)
            self.expect_kind("value", "an operand '%name'")
            if not self.accept(","):
                break
        self.expect(")")
        attrs = self.attr_dict() if self.at("{") else {}
        self.expect(":")
        in_types = self.type_list()
        self.expect("->")
        out_types = self.type_list() if self.at("(") else [self.type()]
        if len(in_types) != len(operand_toks):
            self.error(f"{name_tok.text} has {len(operand_toks)} operands but its signature lists {len(in_types)} types",
                       name_tok)
        if len(out_types) != len(result_toks):
            self.error(f"{name_tok.text} defines {len(result_toks)} results but its signature lists {len(out_types)} "
                       "types", name_tok)
        loc = None
        if self.accept("loc"):
            self.expect("(")
            loc = self.string()
            self.expect(")")
        op = Op(name_tok.text, [], out_types, attrs, loc, [t.text[1:] for t in result_toks])
        end = self.i
        for k, (tok_i, ty) in enumerate(zip(operand_toks, in_types)):
            self.i = tok_i
            v = self.use(lambda v, k=k: op.operands.__setitem__(k, v), ty)
            if self.scope.get(v.name) is v:
                self.check_type(self.toks[tok_i], v, ty)
            op.operands.append(v)
        self.i = end
        for tok, r, ra in zip(result_toks, op.results, result_attrs):
            r.attrs = ra
            self.define(tok, r)
        return op

    # ------------------------------------------------------------------ types
    def type_list(self) -> list:
        self.expect("(")
        out = []
        while not self.at(")"):
            out.append(self.type())
            if not self.accept(","):
                break
        self.expect(")")
        return out

    def type(self):
        tok = self.expect_kind("ident", "a type")
        if tok.text == "index":
            return INDEX
        if tok.text == "event":
            return EVENT
        if tok.text not in DTYPES:
            self.error(f"unknown type {tok.text!r} (dtypes: {', '.join(DTYPES)}; or index, event)", tok)
        self.expect("[")
        dims = []
        while not self.at("]"):
            dims.append(self.dim())
            if not self.accept(","):
                break
        self.expect("]")
        return TensorType(DTYPES[tok.text], tuple(dims))

    # ------------------------------------------------------------------ dims: + - * // over ints and symbols
    def dim(self):
        out = self.dim_term()
        while self.at("+") or self.at("-"):
            op = self.take().text
            rhs = self.dim_term()
            out = add(out, rhs) if op == "+" else add(out, neg(rhs))
        return out

    def dim_term(self):
        out = self.dim_unary()
        while self.at("*") or self.at("//"):
            tok = self.take()
            rhs = self.dim_unary()
            if tok.text == "*":
                out = mul(out, rhs)
            elif not isinstance(rhs, int) or rhs <= 0:
                self.error(f"the divisor of // must be a positive integer, got {rhs}", tok)
            else:
                out = floordiv(out, rhs)
        return out

    def dim_unary(self):
        if self.accept("-"):
            return neg(self.dim_unary())
        tok = self.take()
        if tok.kind == "int":
            return int(tok.text)
        if tok.kind == "ident":
            if tok.text in RESERVED or "." in tok.text:
                self.error(f"{tok.text!r} cannot name a symbolic dimension", tok)
            return sym(tok.text)
        if tok.kind == "punct" and tok.text == "(":
            out = self.dim()
            self.expect(")")
            return out
        self.error(f"expected a dimension, got {tok.text!r}", tok)

    # ------------------------------------------------------------------ attributes
    def attr_dict(self) -> dict:
        self.expect("{")
        out = {}
        while not self.at("}"):
            key = self.expect_kind("ident", "an attribute name")
            if key.text in out:
                self.error(f"duplicate attribute {key.text!r}", key)
            self.expect("=")
            out[key.text] = self.attr()
            if not self.accept(","):
                break
        self.expect("}")
        return out

    def string(self) -> str:
        tok = self.expect_kind("string", "a string")
        try:
            return decode_string(tok.text)
        except ValueError as e:
            self.error(str(e), tok)

    def attr(self):
        t = self.peek()
        if t.kind == "string":
            return self.string()
        if t.kind == "float":
            return float(self.take().text)
        if self.accept("?"):
            return DYN
        if self.accept("["):
            out = []
            while not self.at("]"):
                out.append(self.attr())
                if not self.accept(","):
                    break
            self.expect("]")
            return tuple(out)
        if self.at("-") and (self.peek(1).kind == "float" or self.at("inf", 1) or self.at("nan", 1)):
            self.take()
            return -float(self.take().text)
        if t.kind == "ident":
            words = {"true": True, "false": False, "none": None}
            if t.text in words:
                return words[self.take().text]
            if t.text in ("inf", "nan"):
                return float(self.take().text)
            if t.text in DTYPES:
                return DTYPES[self.take().text]
        if t.kind in ("int", "ident") or self.at("-") or self.at("("):
            return self.dim()
        self.error(f"expected an attribute value, got {t.text!r}")


def parse_module(text: str, filename: str = "<ir>") -> Module:
    return Parser(text, filename).module()


def parse_attr(text: str):
    """One attribute value from text (schema defaults, pass options)."""
    p = Parser(text, "<attr>")
    out = p.attr()
    if p.peek().kind != "eof":
        p.error(f"unexpected {p.peek().text!r} after the value")
    return out


def parse_type(text: str):
    p = Parser(text, "<type>")
    out = p.type()
    if p.peek().kind != "eof":
        p.error(f"unexpected {p.peek().text!r} after the type")
    return out
