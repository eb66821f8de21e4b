"""The interpreter: binds symbols from inputs, runs references, checks declared types."""
from __future__ import annotations

import pytest
import torch

from dsv41c.ir.interpreter import InterpreterError, interpret
from dsv41c.ir.ops_runtime import KERNEL_REFERENCES, register_kernel_reference
from dsv41c.ir.parser import parse_module


def test_symbols_bind_from_inputs_including_linear_dims():
    m = parse_module("func @f(%x: f32[2*T+1, 4], %y: f32[T]) -> (f32[T, 4]) {\n"
                     "  %s = aten.slice(%x) {start = 1, end = T+1} : (f32[2*T+1, 4]) -> f32[T, 4]\n"
                     "  return %s\n}\n")
    x = torch.arange(28.0).reshape(7, 4)
    (out,) = interpret(m, "f", {"x": x, "y": torch.zeros(3)})
    assert torch.equal(out, x[1:4])
    with pytest.raises(InterpreterError, match=r"@f: inputs: dim T = 3 but the tensor has 4"):
        interpret(m, "f", [x, torch.zeros(4)])


def test_input_checks():
    m = parse_module("func @f(%x: bf16[T]) -> (bf16[T]) {\n  return %x\n}\n")
    with pytest.raises(InterpreterError, match=r"@f takes 1 inputs, got 2"):
        interpret(m, "f", [torch.zeros(2), torch.zeros(2)])
    with pytest.raises(InterpreterError, match=r"input %x: expected dtype bf16 \(torch.bfloat16\), got torch.float32"):
        interpret(m, "f", [torch.zeros(2)])
    with pytest.raises(InterpreterError, match=r"no function @g \(have: f\)"):
        interpret(m, "g", [])


def test_declared_types_are_checked_and_failures_name_the_op():
    m = parse_module('func @f(%x: f32[T, 4], %i: i64[2]) -> (f32[2, 4]) {\n'
                     '  %g = aten.index_select(%x, %i) {dim = 0} : (f32[T, 4], i64[2]) -> f32[2, 4] loc("layers.3.moe")\n'
                     '  return %g\n}\n')
    with pytest.raises(InterpreterError, match=r'@f: op #0 aten.index_select \(%g\) at loc\("layers.3.moe"\): '
                                               r'reference failed: IndexError'):
        interpret(m, "f", [torch.zeros(3, 4), torch.tensor([0, 9])])


def test_data_dependent_sizes_bind_when_produced():
    m = parse_module("func @f(%x: f32[T]) -> (i64[N, 1], f32[N]) {\n"
                     "  %n = aten.nonzero(%x) : (f32[T]) -> i64[N, 1]\n"
                     "  %z = aten.zeros() {size = [N]} : () -> f32[N]\n  return %n, %z\n}\n")
    n, z = interpret(m, "f", [torch.tensor([0.0, 1.0, 2.0, 0.0])])
    assert n.shape == (2, 1) and z.shape == (2,)


def test_index_values_and_dynamic_dims():
    m = parse_module("func @f(%x: f32[T, 6]) -> (f32[T, 2, 3], index) {\n"
                     "  %n = aten.sym_size(%x) {dim = 0} : (f32[T, 6]) -> index\n"
                     "  %m = sym.mul(%n) {b = 6} : (index) -> index\n"
                     "  %v = aten.view(%x, %n) {size = [?, 2, 3]} : (f32[T, 6], index) -> f32[T, 2, 3]\n"
                     "  return %v, %m\n}\n")
    v, numel = interpret(m, "f", [torch.ones(5, 6)])
    assert v.shape == (5, 2, 3) and numel == 30


def test_kernel_calls_run_their_op_or_a_registered_reference():
    text = ('func @f(%x: f32[T, 8], %w: f32[8, 4]) -> (f32[T, 4]) {\n  %y = kernel.call(%x, %w) {OP'
            'target = "cuda:sm90", template = "gemm_t", variant = "bm64"} : (f32[T, 8], f32[8, 4]) -> f32[T, 4]\n'
            "  return %y\n}\n")
    x, w = torch.randn(3, 8), torch.randn(8, 4)
    (y,) = interpret(parse_module(text.replace("OP", 'op = "aten.mm", ')), "f", [x, w])
    assert torch.equal(y, x @ w)
    bare = parse_module(text.replace("OP", ""))
    with pytest.raises(InterpreterError, match=r"no reference for template 'gemm_t'"):
        interpret(bare, "f", [x, w])
    register_kernel_reference("gemm_t", lambda a, b: a @ b)
    try:
        assert torch.equal(interpret(bare, "f", [x, w])[0], x @ w)
    finally:
        KERNEL_REFERENCES.pop("gemm_t")


def test_fp4_storage_and_the_op_hook():
    m = parse_module('func @f(%kv: fp4e2m1x2[L, 4] {placement = "persistent"}) -> (u8[L, 4]) {\n'
                     "  %b = aten.view_dtype(%kv) {dtype = u8} : (fp4e2m1x2[L, 4]) -> u8[L, 4]\n  return %b\n}\n")
    raw = torch.arange(8, dtype=torch.uint8).reshape(2, 4)
    seen = []
    (b,) = interpret(m, "f", [raw.view(torch.float4_e2m1fn_x2)], on_op=lambda op, outs: seen.append(op.name))
    assert torch.equal(b, raw) and seen == ["aten.view_dtype"]


def test_stream_ops_run_in_program_order():
    m = parse_module("func @f(%x: f32[3]) -> (f32[3]) {\n  %e = stream.record() {stream = 1} : () -> event\n"
                     "  %y = aten.neg(%x) {stream = 1} : (f32[3]) -> f32[3]\n"
                     "  stream.wait(%e) {stream = 0} : (event) -> ()\n  return %y\n}\n")
    assert torch.equal(interpret(m, "f", [torch.ones(3)])[0], -torch.ones(3))
