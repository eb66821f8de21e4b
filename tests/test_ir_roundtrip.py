"""Printer/parser round-trip: print(parse(print(m))) == print(m), and structural equality.

Property-tested with hypothesis over random modules built from the registry's op names:
random shapes with symbolic dims (incl. floor divisions), every dtype, attributes of every
kind (floats incl. nan/inf/-0.0/subnormals that must come back bit-exact, strings with
quotes, backslashes, control and non-BMP characters, nested lists, dims, `?`), value
attributes, locations, multi-result and zero-result ops. The random modules need not
verify: the text form is independent of the verifier. A second property checks random
*well-typed* modules (ir/testing.py) also verify after the round trip.
"""
from __future__ import annotations

import math
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv41c.ir.attrs import DYN
from dsv41c.ir.core import Function, Module, Op
from dsv41c.ir.parser import parse_module
from dsv41c.ir.printer import print_module
from dsv41c.ir.registry import all_ops
from dsv41c.ir.symbolic import floordiv, sym
from dsv41c.ir.testing import random_module
from dsv41c.ir.types import DTYPES, EVENT, INDEX, TensorType
from dsv41c.ir.verifier import verify

OP_NAMES = sorted(all_ops())
SYMBOLS = ["T", "L", "B", "S_1", "n"]
_LOWER = "abcdefghijklmnopqrstuvwxyz_"
ident = st.builds(lambda a, b: a + b, st.sampled_from(_LOWER), st.text(_LOWER + "0123456789", max_size=5))
value_name = st.none() | st.text(_LOWER + "ABCXYZ0123456789.", min_size=1, max_size=6)


leaf_dims = st.integers(0, 70000) | st.sampled_from(SYMBOLS).map(sym)


@st.composite
def dims(draw):
    """A leaf, or one of + - * // over two leaves (nesting comes from the algebra)."""
    a = draw(leaf_dims)
    op = draw(st.sampled_from(["", "", "+", "-", "*", "//"]))
    if op == "//":
        return floordiv(a, draw(st.integers(2, 5)))
    b = draw(leaf_dims)
    return a if not op else a + b if op == "+" else a - b if op == "-" else a * b


symbolic_dims = st.builds(lambda d, s, k: floordiv(d + s, k), dims(), st.sampled_from(SYMBOLS).map(sym),
                          st.integers(1, 3))


types = st.one_of(
    st.builds(TensorType, st.sampled_from(list(DTYPES.values())), st.lists(dims(), max_size=3).map(tuple)),
    st.just(INDEX), st.just(EVENT))
scalars = st.one_of(
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=12), st.sampled_from(list(DTYPES.values())), symbolic_dims,
    st.just(DYN))
attr_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=5)
attr_dicts = st.dictionaries(ident, attr_values, max_size=3)


@st.composite
def modules(draw):
    m = Module(attrs=draw(st.dictionaries(ident, attr_values, max_size=2)))
    for fname in draw(st.lists(ident, min_size=1, max_size=2, unique=True)):
        f = Function(fname)
        for _ in range(draw(st.integers(0, 3))):
            v = f.add_arg(draw(value_name), draw(types))
            v.attrs = draw(st.dictionaries(ident, attr_values, max_size=2))
        defined = list(f.args)
        for _ in range(draw(st.integers(0, 6))):
            operands = draw(st.lists(st.sampled_from(defined), max_size=3)) if defined else []
            rtypes = draw(st.lists(types, max_size=3))
            op = Op(draw(st.sampled_from(OP_NAMES)), operands, rtypes, draw(attr_dicts),
                    draw(st.none() | st.text(max_size=12)), [draw(value_name) for _ in rtypes])
            for r in op.results:
                r.attrs = draw(st.dictionaries(ident, attr_values, max_size=2))
            f.ops.append(op)
            defined += op.results
        if draw(st.booleans()) or not defined:
            f.returns = draw(st.lists(st.sampled_from(defined), max_size=3)) if defined else []
            f.result_types = [v.type for v in f.returns]
        else:
            f.returns = None
            f.result_types = draw(st.lists(types, max_size=2))
        m.add(f)
    return m


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules())
def test_print_parse_print_is_identity(m):
    text = print_module(m)
    back = parse_module(text)
    assert print_module(back) == text
    assert back == m  # structural: same ops, types, attrs (floats bit-exact), def-use, locs


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_typed_random_modules_round_trip_and_verify(seed):
    m = random_module(seed)
    verify(m)
    back = parse_module(print_module(m))
    verify(back)
    assert back == m and print_module(back) == print_module(m)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_float_attributes_come_back_bit_exact(x):
    f = Function("f", [], [])
    f.ops.append(Op("sym.const", [], [INDEX], {"value": 1, "x": x}))
    f.returns = []
    y = parse_module(print_module(Module([f]))).functions["f"].ops[0].attrs["x"]
    assert isinstance(y, float)
    if math.isnan(x):
        assert math.isnan(y)
    else:
        assert struct.pack("<d", x) == struct.pack("<d", y)


@given(st.text())
def test_string_attributes_and_locations_round_trip(s):
    f = Function("f", [], [])
    f.ops.append(Op("sym.const", [], [INDEX], {"value": 1, "s": s}, loc=s))
    f.returns = []
    op = parse_module(print_module(Module([f]))).functions["f"].ops[0]
    assert op.attrs["s"] == s and op.loc == s


def test_names_are_kept_and_made_unique():
    f = Function("f", [("x", TensorType(DTYPES["f32"], (3,))), ("x", TensorType(DTYPES["f32"], (3,)))], [])
    op = Op("aten.add", [f.args[0], f.args[1]], [f.args[0].type], result_names=["1"])
    op2 = Op("aten.neg", [op.results[0]], [f.args[0].type])  # no hint: a number above every numeric name
    f.ops += [op, op2]
    f.returns = [op2.results[0]]
    f.result_types = [op2.results[0].type]
    text = print_module(Module([f]))
    assert "func @f(%x: f32[3], %2: f32[3])" in text
    assert "%1 = aten.add(%x, %2)" in text and "%3 = aten.neg(%1)" in text
    assert print_module(parse_module(text)) == text
