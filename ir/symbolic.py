"""Symbolic dimensions: integer polynomials over named symbols and floor divisions.

A dimension (`Dim`) is a Python `int` or a `SymExpr`. A `SymExpr` is a polynomial with
integer coefficients whose "atoms" are symbol names (`T`, `L`, ...) or `FloorDiv(expr, k)`
nodes (k > 1 an int). Every construction normalizes, so two equal polynomials are equal
structurally (`==`, `hash`) and print the same; a polynomial with no atoms is returned as
a plain `int`, never as a `SymExpr`. That is what lets the printer/parser round-trip and
the verifier compare shapes by `==`.

Algorithm: a polynomial is a sorted tuple of (monomial, coefficient) where a monomial is a
sorted tuple of atoms (repeated for powers, `T*T`). `FloorDiv(p, k)` pulls out every
multiple of k (floor((k*a + r)/k) = a + floor(r/k) for integer a), keeping remainders with
coefficients in [0, k); a remainder that is a constant folds to an int, and a floor
division of a lone floor division multiplies the divisors (`(T//2)//2` = `T//4`).

Text form (used in types and attributes): `T`, `2*T+1`, `T*L`, `L//2`, `(L+1)//2`,
`3*(L//2)`. Terms are ordered by degree (highest first) then by atom names; the constant
comes last.

Known gaps: no `Mod`, `Min`/`Max` or ceil-division atoms; equality is structural, so
`2*(L//2)` and `L` differ even where L is even (callers treat such pairs as "unknown", not
as unequal, where it matters); `exact_div` divides only by a single term.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Words the text form gives another meaning; they cannot name a symbol.
RESERVED = frozenset({"index", "event", "inf", "nan", "true", "false", "none", "loc", "func", "return", "module",
                      "f64", "f32", "bf16", "f16", "fp8e4m3", "e8m0", "fp4e2m1x2", "i8", "u8", "i32", "i64", "bool"})


@dataclass(frozen=True)
class FloorDiv:
    """The atom `num // den` (den > 1), kept only when it does not simplify."""

    num: "SymExpr"
    den: int

    def sort_key(self):
        return (1, str(self))

    def __str__(self):
        inner = str(self.num)
        return f"{inner}//{self.den}" if _is_symbol(self.num) else f"({inner})//{self.den}"

    def subs(self, env):
        return floordiv(self.num.subs(env), self.den)


def _atom_key(a):
    return (0, a) if isinstance(a, str) else a.sort_key()


def _mono_key(mono):
    return (-len(mono), tuple(_atom_key(a) for a in mono))


class SymExpr:
    """A normalized integer polynomial over symbols and FloorDiv atoms (immutable)."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms):
        # terms: tuple of (monomial: tuple[atom], coeff: int), normalized by `_make`.
        self.terms = terms
        self._hash = hash(terms)

    # ------------------------------------------------------------------ building
    @staticmethod
    def symbol(name: str) -> "SymExpr":
        if not SYMBOL_RE.match(name) or name in RESERVED:
            raise ValueError(f"bad symbol name {name!r}: use an identifier that is not a keyword or dtype name")
        return SymExpr((((name,), 1),))

    # ------------------------------------------------------------------ queries
    def free_symbols(self) -> frozenset:
        out = set()
        for mono, _ in self.terms:
            for a in mono:
                if isinstance(a, str):
                    out.add(a)
                else:
                    out |= a.num.free_symbols()
        return frozenset(out)

    def has_floordiv(self) -> bool:
        return any(not isinstance(a, str) for mono, _ in self.terms for a in mono)

    def subs(self, env: dict) -> "Dim":
        """Substitute symbols (name -> Dim); unknown symbols stay symbolic."""
        total = 0
        for mono, c in self.terms:
            prod = c
            for a in mono:
                val = (env[a] if a in env else SymExpr.symbol(a)) if isinstance(a, str) else a.subs(env)
                prod = mul(prod, val)
            total = add(total, prod)
        return total

    def evaluate(self, env: dict) -> int:
        out = self.subs(env)
        if not isinstance(out, int):
            missing = sorted(out.free_symbols())
            raise KeyError(f"unbound symbol(s) {', '.join(missing)} in {self}")
        return out

    # ------------------------------------------------------------------ dunder
    def __eq__(self, other):
        return isinstance(other, SymExpr) and self.terms == other.terms

    def __hash__(self):
        return self._hash

    def __add__(self, o):
        return add(self, o)

    __radd__ = __add__

    def __sub__(self, o):
        return add(self, neg(o))

    def __rsub__(self, o):
        return add(o, neg(self))

    def __mul__(self, o):
        return mul(self, o)

    __rmul__ = __mul__

    def __neg__(self):
        return neg(self)

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __str__(self):
        parts = []
        for i, (mono, c) in enumerate(self.terms):
            sign = "-" if c < 0 else ("+" if i else "")
            a = abs(c)
            if not mono:
                body = str(a)
            else:
                alone = c == 1 and len(mono) == 1
                factors = [_fmt_atom(x, alone) for x in mono]
                body = "*".join(([str(a)] if a != 1 else []) + factors)
            parts.append(sign + body)
        return "".join(parts)

    def __repr__(self):
        return f"SymExpr({str(self)!r})"


Dim = Union[int, SymExpr]


class _Any(SymExpr):
    """The wildcard dim a shape rule returns where only the op's declared type knows the size
    (a `?` dimension fed by an `index` operand, data-dependent sizes). Absorbs arithmetic;
    never appears in a printed type."""

    def __init__(self):
        super().__init__((((("?",), 1),)))

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return hash("ANY")

    def free_symbols(self):
        return frozenset()

    def subs(self, env):
        return self

    def __str__(self):
        return "?"

    def __repr__(self):
        return "ANY"


ANY = _Any()


def _fmt_atom(a, alone):
    if isinstance(a, str):
        return a
    return str(a) if alone else f"({a})"


def _is_symbol(e) -> bool:
    return isinstance(e, SymExpr) and len(e.terms) == 1 and e.terms[0][1] == 1 and len(e.terms[0][0]) == 1 \
        and isinstance(e.terms[0][0][0], str)


def _as_terms(x) -> dict:
    if isinstance(x, bool):
        raise TypeError("a dimension cannot be a bool")
    if isinstance(x, int):
        return {(): x} if x else {}
    if isinstance(x, SymExpr):
        return dict(x.terms)
    raise TypeError(f"not a dimension: {x!r}")


def _make(d: dict) -> Dim:
    items = [(m, c) for m, c in d.items() if c != 0]
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    items.sort(key=lambda mc: _mono_key(mc[0]))
    return SymExpr(tuple(items))


def add(a, b) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a is ANY or b is ANY:
        return ANY
    d = _as_terms(a)
    for m, c in _as_terms(b).items():
        d[m] = d.get(m, 0) + c
    return _make(d)


def neg(a) -> Dim:
    if isinstance(a, int):
        return -a
    if a is ANY:
        return ANY
    return _make({m: -c for m, c in _as_terms(a).items()})


def mul(a, b) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a is ANY or b is ANY:
        return ANY
    d = {}
    for m1, c1 in _as_terms(a).items():
        for m2, c2 in _as_terms(b).items():
            m = tuple(sorted(m1 + m2, key=_atom_key))
            d[m] = d.get(m, 0) + c1 * c2
    return _make(d)


def floordiv(a, k) -> Dim:
    if isinstance(k, SymExpr):
        raise ValueError(f"floor division by a symbolic value ({a} // {k}) is not supported")
    if k <= 0:
        raise ValueError(f"floor division by {k}")
    if isinstance(a, int):
        return a // k
    if k == 1 or a is ANY:
        return a
    terms = dict(a.terms)
    # (x//m)//k == x//(m*k): fold a lone floor-division atom.
    if len(terms) == 1:
        (mono, c), = terms.items()
        if c == 1 and len(mono) == 1 and isinstance(mono[0], FloorDiv):
            return floordiv(mono[0].num, mono[0].den * k)
    whole, rem = {}, {}
    for m, c in terms.items():
        q, r = divmod(c, k)
        if q:
            whole[m] = q
        if r:
            rem[m] = r
    rem_e = _make(rem)
    if isinstance(rem_e, int):
        return add(_make(whole), rem_e // k)
    return add(_make(whole), SymExpr((((FloorDiv(rem_e, k),), 1),)))


def exact_div(a, b) -> Dim | None:
    """a / b when b is a single term dividing every term of a exactly, else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b and a % b == 0 else None
    if a is ANY or b is ANY:
        return ANY
    bt = _as_terms(b)
    if len(bt) != 1:
        return None
    (bm, bc), = bt.items()
    if bc == 0:
        return None
    out = {}
    for m, c in _as_terms(a).items():
        rest = list(m)
        for atom in bm:
            if atom not in rest:
                return None
            rest.remove(atom)
        if c % bc:
            return None
        out[tuple(rest)] = c // bc
    return _make(out)


def product(dims) -> Dim:
    out = 1
    for d in dims:
        out = mul(out, d)
    return out


def is_dim(x) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, SymExpr)


def free_symbols(d) -> frozenset:
    return d.free_symbols() if isinstance(d, SymExpr) else frozenset()


def subs(d, env: dict) -> Dim:
    return d.subs(env) if isinstance(d, SymExpr) else d


def sym(name: str) -> SymExpr:
    return SymExpr.symbol(name)


# ---------------------------------------------------------------------------- text form
_TOK = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*()]))")


def parse_dim(text: str) -> Dim:
    """Parse the text form of a dimension (for tests and option strings)."""
    toks = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOK.match(text, pos)
        if not m:
            raise ValueError(f"bad dimension {text!r} at {pos}")
        toks.append(int(m.group(1)) if m.group(1) else (m.group(2) and ("id", m.group(2))) or m.group(3))
        pos = m.end()
    p = DimParser(toks)
    out = p.expr()
    if p.i != len(toks):
        raise ValueError(f"bad dimension {text!r}")
    return out


class DimParser:
    """Precedence climbing over tokens: int, ("id", name), or one of + - * // ( ).

    The IR parser feeds it its own tokens through `peek`/`take` overrides.
    """

    def __init__(self, toks):
        self.toks, self.i = toks, 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self):
        t = self.peek()
        self.i += 1
        return t

    def fail(self, msg):
        raise ValueError(msg)

    def expr(self):
        out = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            out = add(out, rhs) if op == "+" else add(out, neg(rhs))
        return out

    def term(self):
        out = self.unary()
        while self.peek() in ("*", "//"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                out = mul(out, rhs)
            else:
                if not isinstance(rhs, int):
                    self.fail(f"the divisor of // must be an integer, got {rhs}")
                if rhs <= 0:
                    self.fail(f"the divisor of // must be positive, got {rhs}")
                out = floordiv(out, rhs)
        return out

    def unary(self):
        if self.peek() == "-":
            self.take()
            return neg(self.unary())
        return self.primary()

    def primary(self):
        t = self.take()
        if isinstance(t, int) and not isinstance(t, bool):
            return t
        if isinstance(t, tuple) and t[0] == "id":
            if t[1] in RESERVED:
                self.fail(f"{t[1]!r} is a keyword, not a symbol")
            return sym(t[1])
        if t == "(":
            out = self.expr()
            if self.take() != ")":
                self.fail("expected ')' in dimension")
            return out
        self.fail(f"expected a dimension, got {t!r}")


def subs_attr(v, env):
    """An attribute value with symbols substituted: dims and (nested) tuples of dims."""
    if isinstance(v, SymExpr):
        return v.subs(env)
    if isinstance(v, tuple):
        return tuple(subs_attr(x, env) for x in v)
    return v
