"""Parser errors say FILE:LINE:COL and what was expected; symbolic dims parse and print."""
from __future__ import annotations

import pytest

from dsv41c.ir.parser import IRParseError, parse_attr, parse_module, parse_type
from dsv41c.ir.symbolic import ANY, exact_div, floordiv, parse_dim, sym
from dsv41c.ir.types import tensor

GOOD = "func @f(%x: f32[T, 8]) -> (f32[T, 8]) {\n  %y = aten.neg(%x) : (f32[T, 8]) -> f32[T, 8]\n  return %y\n}\n"


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("f32[T, 8]) -> (", "f33[T, 8]) -> ("),
     "t.ir:1:13: unknown type 'f33' (dtypes: f64, f32, bf16, f16, fp8e4m3, e8m0, fp4e2m1x2, i8, u8, i32, i64, "
     "bool; or index, event)"),
    (GOOD.replace("aten.neg(%x)", "aten.neg(%q)"), "t.ir:2:17: use of undefined value %q in @f"),
    (GOOD.replace("  return %y", "  %y = aten.neg(%x) : (f32[T, 8]) -> f32[T, 8]\n  return %y"),
     "t.ir:3:3: redefinition of value %y"),
    (GOOD.replace(": (f32[T, 8]) -> f32[T, 8]\n", ": (f32[T, 9]) -> f32[T, 8]\n"),
     "t.ir:2:17: %x has type f32[T, 8] but the op's signature says f32[T, 9]"),
    (GOOD.replace("f32[T, 8]) -> (", "f32[T//L, 8]) -> ("), "t.ir:1:18: the divisor of // must be a positive "
                                                             "integer, got L"),
    (GOOD + GOOD, "t.ir:5:6: redefinition of function @f"),
    (GOOD.replace("  return %y\n", "  return %y\n  %z = aten.neg(%y) : (f32[T, 8]) -> f32[T, 8]\n"),
     "t.ir:4:3: op after 'return' in @f"),
    (GOOD[:-2], "t.ir:4:1: missing '}' at the end of @f"),
    (GOOD.replace("aten.neg(%x) :", "aten.neg(%x) {a = 1, a = 2} :"), "t.ir:2:29: duplicate attribute 'a'"),
    (GOOD.replace("aten.neg(%x) :", 'aten.neg(%x) {s = "\\q"} :'), "t.ir:2:26: unknown escape \\q"),
    (GOOD.replace("-> f32[T, 8]\n", "-> (f32[T, 8], f32[T, 8])\n"),
     "t.ir:2:8: aten.neg defines 1 results but its signature lists 2 types"),
    (GOOD.replace("%x: f32[T, 8]", "%x: f32[inf, 8]"), "t.ir:1:17: 'inf' cannot name a symbolic dimension"),
    ("func @f() -> () {\n  return\n}\n$", "t.ir:4:1: unexpected character '$'"),
])
def test_parse_errors_point_at_the_problem(text, message):
    with pytest.raises(IRParseError) as ei:
        parse_module(text, "t.ir")
    assert str(ei.value) == message


def test_comments_and_blank_lines_are_ignored():
    m = parse_module("# RUN: dsv41c opt %s -p dce\n\n" + GOOD.replace("  return", "  # a comment\n  return"))
    assert len(m.functions["f"].ops) == 1


def test_attribute_literals():
    assert parse_attr("[1, -2.5, true, none, bf16, T*2, ?, \"a\\\"b\", -inf]")[0:3] == (1, -2.5, True)
    assert parse_attr("(L+1)//2") == floordiv(sym("L") + 1, 2)
    assert parse_attr("-T") == -sym("T")
    assert parse_attr("1e-20") == 1e-20 and isinstance(parse_attr("1e+20"), float)
    assert parse_type("fp4e2m1x2[L, 256]") == tensor("fp4e2m1x2", "L", 256)


@pytest.mark.parametrize("text", ["T", "64*T", "2*T+1", "L*T+2*T-3", "L//2", "(L+1)//2", "3*(L//2)", "T*(L//2)",
                                  "-T+5", "T+(T+1)//2", "T//4", "-(L//2)", "T-(L//2)", "T*T"])
def test_dims_print_in_one_canonical_form(text):
    assert str(parse_dim(text)) == text


def test_dim_algebra():
    T, L = sym("T"), sym("L")
    assert (T + 1) * 2 - 2 == 2 * T and isinstance(T - T, int)
    assert floordiv(2 * T + 1, 2) == T and floordiv(floordiv(T, 2), 2) == floordiv(T, 4)
    assert floordiv(3 * T + 1, 2) == T + floordiv(T + 1, 2)
    assert exact_div(T * 64 * 512, 32768) == T and exact_div(T * 64, L) is None
    assert (T * L).subs({"T": 2}) == 2 * L and floordiv(L + 1, 2).evaluate({"L": 7}) == 4
    assert ANY + T is ANY and ANY * 3 is ANY
    with pytest.raises(ValueError):
        sym("bf16")
