"""Verifier negative tests: each rule's message names the op, its index, result and loc."""
from __future__ import annotations

import pytest

from dsv41c.ir.core import Function, Module, Op
from dsv41c.ir.parser import parse_module
from dsv41c.ir.types import tensor
from dsv41c.ir.verifier import VerifyError, verify, verify_errors

HEAD = "func @f(%x: f32[T, 8], %w: f32[8, 4]) -> ({rt}) {{\n"


def errors_of(body: str, rt: str = "f32[T, 8]") -> list[str]:
    return verify_errors(parse_module(HEAD.format(rt=rt) + body + "\n}\n"))


@pytest.mark.parametrize("body, rt, message", [
    ('  %y = aten.frobnicate(%x) : (f32[T, 8]) -> f32[T, 8] loc("layers.1.mlp")\n  return %y', "f32[T, 8]",
     '@f: op #0 aten.frobnicate (%y) at loc("layers.1.mlp"): unknown op \'aten.frobnicate\''),
    ("  %a = aten.neg(%b) : (f32[T, 8]) -> f32[T, 8]\n  %b = aten.neg(%x) : (f32[T, 8]) -> f32[T, 8]\n  return %a",
     "f32[T, 8]", "@f: op #0 aten.neg (%a): use of %b (operand 0) before its definition at op #1"),
    ('  %y = aten.mm(%x, %w) : (f32[T, 8], f32[8, 4]) -> f32[T, 5] loc("layers.0.attn.wq_a")\n  return %y',
     "f32[T, 5]", '@f: op #0 aten.mm (%y) at loc("layers.0.attn.wq_a"): result %y has type f32[T, 5], '
                  "the shape rule gives f32[T, 4]"),
    ("  %y = aten.mm(%w, %x) : (f32[8, 4], f32[T, 8]) -> f32[8, 8]\n  return %y", "f32[8, 8]",
     "@f: op #0 aten.mm (%y): shape rule: mm: inner dims differ: 4 vs T"),
    ('  %y = aten.sum(%x) {dim = "a"} : (f32[T, 8]) -> f32[]\n  return %y', "f32[]",
     "@f: op #0 aten.sum (%y): attribute 'dim': expected a list of int, got str \"a\" (schema: aten.sum(Tensor "
     "self, int[]? dim=none, bool keepdim=false, dtype? dtype=none) -> Tensor)"),
    ("  %y = aten.softmax(%x) {dim = 1.5} : (f32[T, 8]) -> f32[T, 8]\n  return %y", "f32[T, 8]",
     "@f: op #0 aten.softmax (%y): attribute 'dim': expected int, got float 1.5 (schema: "
     "aten.softmax(Tensor self, int dim, dtype? dtype=none) -> Tensor)"),
    ("  %y = aten.softmax(%x) : (f32[T, 8]) -> f32[T, 8]\n  return %y", "f32[T, 8]",
     "@f: op #0 aten.softmax (%y): missing attribute 'dim' (int) (schema: aten.softmax(Tensor self, int dim, "
     "dtype? dtype=none) -> Tensor)"),
    ("  %y = aten.neg(%x) {alpha = 2} : (f32[T, 8]) -> f32[T, 8]\n  return %y", "f32[T, 8]",
     "@f: op #0 aten.neg (%y): unknown attribute 'alpha' = int 2 (known: none) (schema: aten.neg(Tensor self) "
     "-> Tensor)"),
    ("  %y = aten.mm(%x) : (f32[T, 8]) -> f32[T, 4]\n  return %y", "f32[T, 4]",
     "@f: op #0 aten.mm (%y): expects 2 operand(s) (self, mat2), got 1 (schema: aten.mm(Tensor self, "
     "Tensor mat2) -> Tensor)"),
    ("  %a, %b = aten.neg(%x) : (f32[T, 8]) -> (f32[T, 8], f32[T, 8])\n  return %a", "f32[T, 8]",
     "@f: op #0 aten.neg (%a, %b): has 2 result(s), the schema has 1 (schema: aten.neg(Tensor self) -> Tensor)"),
    ("  stream.wait(%x) {stream = 0} : (f32[T, 8]) -> ()\n  return %x", "f32[T, 8]",
     "@f: op #0 stream.wait: operand 'event' must be event, got f32[T, 8] (schema: stream.wait(Event event, "
     "int stream) -> ())"),
    ("  %y = aten.neg(%x) : (f32[T, 8]) -> f32[T, 8]", "f32[T, 8]", "@f: missing return"),
    ("  %y = aten.sum(%x) {dim = [1]} : (f32[T, 8]) -> f32[T]\n  return %y", "f32[T, 8]",
     "@f: return value 0 (%y) has type f32[T], the signature declares f32[T, 8]"),
    ("  return %x, %x", "f32[T, 8]", "@f: returns 2 value(s) but the signature declares 1"),
    ("  %z = aten.zeros() {size = [Q, 2]} : () -> f32[Q, 2]\n  return %x", "f32[T, 8]",
     "@f: op #0 aten.zeros (%z): result %z: symbol(s) Q not bound by the function's arguments"),
    ("  %y {arena_offset = -64} = aten.neg(%x) : (f32[T, 8]) -> f32[T, 8]\n  return %y", "f32[T, 8]",
     "@f: op #0 aten.neg (%y): result %y: arena_offset must be >= 0, got -64"),
    ('  %y {placement = "heap"} = aten.neg(%x) : (f32[T, 8]) -> f32[T, 8]\n  return %y', "f32[T, 8]",
     "@f: op #0 aten.neg (%y): result %y: placement must be one of persistent, transient, got 'heap'"),
    ("  %y = aten.view(%x) {size = [?, 8]} : (f32[T, 8]) -> f32[T, 8]\n  return %y", "f32[T, 8]",
     "@f: op #0 aten.view (%y): a '?' dimension takes an index operand, got f32[T, 8] (schema: "
     "aten.view(Tensor self, Dim[] size) -> Tensor)"),
    ("  %y = aten.add(%x) {other = 1, stream = 1.5} : (f32[T, 8]) -> f32[T, 8]\n  return %y", "f32[T, 8]",
     "@f: op #0 aten.add (%y): attribute 'stream': expected int, got float 1.5 (schema: aten.add(Tensor self, "
     "Tensor|Scalar other, Scalar alpha=1) -> Tensor)"),
])
def test_each_rule_has_a_precise_message(body, rt, message):
    errs = errors_of(body, rt)
    assert errs == [message]


def test_value_from_another_function_or_erased_op():
    m = parse_module("func @f(%x: f32[3]) -> (f32[3]) {\n  %y = aten.neg(%x) : (f32[3]) -> f32[3]\n  return %y\n}\n"
                     "func @g(%x: f32[3]) -> (f32[3]) {\n  return %x\n}\n")
    f, g = m.functions["f"], m.functions["g"]
    g.ops.append(Op("aten.exp", [f.ops[0].results[0]], [tensor("f32", 3)], result_names=["z"]))
    assert verify_errors(m) == ["@g: op #0 aten.exp (%z): operand 0 (%y) is not defined in @g"]


def test_argument_value_attributes_are_checked():
    f = Function("f", [("kv", tensor("bf16", "L", 512), {"placement": "persistent", "color": 1})])
    f.returns, f.result_types = [f.args[0]], [f.args[0].type]
    assert verify_errors(Module([f])) == ["@f: argument %kv: unknown value attribute 'color' (known: arena_offset, "
                                          "placement, stack_of, stack_count)"]


def test_verify_raises_with_first_message_and_count():
    m = parse_module("func @f(%x: f32[3]) -> (f32[3]) {\n  %a = aten.nope(%x) : (f32[3]) -> f32[3]\n"
                     "  %b = aten.nada(%x) : (f32[3]) -> f32[3]\n}\n")
    with pytest.raises(VerifyError) as ei:
        verify(m)
    assert str(ei.value) == "@f: op #0 aten.nope (%a): unknown op 'aten.nope' (and 2 more)"
    assert len(ei.value.errors) == 3 and ei.value.errors[2] == "@f: missing return"


def test_data_dependent_dims_introduce_symbols():
    text = ("func @f(%x: f32[T, 4]) -> (i64[N, 2]) {\n  %n = aten.nonzero(%x) : (f32[T, 4]) -> i64[N, 2]\n"
            "  %z = aten.zeros() {size = [N]} : () -> f32[N]\n  return %n\n}\n")
    assert verify_errors(parse_module(text)) == []


def test_kernel_call_delegates_to_its_op():
    ok = ('func @f(%x: f32[T, 8], %w: f32[8, 4]) -> (f32[T, 4]) {\n  %y = kernel.call(%x, %w) {op = "aten.mm", '
          'target = "cuda:sm90", template = "gemm", variant = "bm64"} : (f32[T, 8], f32[8, 4]) -> f32[T, 4]\n'
          "  return %y\n}\n")
    assert verify_errors(parse_module(ok)) == []
    bad = ok.replace("-> f32[T, 4]\n", "-> f32[T, 3]\n").replace("-> (f32[T, 4])", "-> (f32[T, 3])")
    assert verify_errors(parse_module(bad)) == [
        "@f: op #0 kernel.call (%y): result %y has type f32[T, 3], the shape rule gives f32[T, 4]"]
    bare = ok.replace('op = "aten.mm", ', "")  # no op: the template's kernel contract decides, and 'gemm' has none
    assert verify_errors(parse_module(bare)) == [
        "@f: op #0 kernel.call (%y): shape rule: template 'gemm' has no kernel contract (ir/kernel_contracts.py)"]
