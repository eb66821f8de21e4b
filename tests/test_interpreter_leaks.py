"""A compile after an interpreted launch in the same process (codegen/triton/interpreter_leaks.py).

Triton 3.9's interpreter leaves triton.language.core's builtins patched after a kernel that calls a jitted helper
such as tl.sum; a real compile in that process then failed inside `tensor.__mul__` wherever Triton's cache did not
already hold the kernel (CI's fresh machine: the Gluon kernel's sm90 build after the attention tests). Here the
compile runs with an empty cache directory, after such a launch.
"""
import pytest
import torch
import triton
import triton.language as tl

from dsv41c.codegen import aot_compat
from dsv41c.codegen.triton import interpreter_leaks
from dsv41c.codegen.matrix import TARGETS
from dsv41c.codegen.templates import AotSpec
from dsv41c.codegen.triton.targets import interpreting


@triton.jit
def _row_sum(x_ptr, y_ptr, N: tl.constexpr):
    tl.store(y_ptr, tl.sum(tl.load(x_ptr + tl.arange(0, N)), axis=0))


@triton.jit
def _scaled_index(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * n + tl.arange(0, BLOCK)  # an int x int product: core.mul in the code generator
    tl.store(x_ptr + i, tl.load(x_ptr + i) * 2.0)


def test_compile_after_an_interpreted_launch(tmp_path, monkeypatch):
    if not interpreting():
        pytest.skip("the CPU tier (TRITON_INTERPRET=1) leaves the patches")
    x = torch.arange(8, dtype=torch.float32)
    y = torch.zeros(1)
    _row_sum[(1,)](x, y, N=8)
    assert y.item() == 28.0
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # nothing cached: the code generator runs
    spec = AotSpec(_scaled_index, "b128", {"x_ptr": "*fp32", "n": "i32"}, {"BLOCK": 128}, keys={"BLOCK": 128})
    compiled = aot_compat.compile_spec(spec, TARGETS["cuda:sm90"])
    assert ".entry _scaled_index" in compiled["asm"]["ptx"]
    # the interpreter finds what it left, and still runs kernels afterwards
    _row_sum[(1,)](x * 2, y, N=8)
    assert y.item() == 56.0


def test_unleak_puts_back_the_builtins_and_restore_undoes_it():
    if not interpreting():
        pytest.skip("the CPU tier (TRITON_INTERPRET=1) leaves the patches")
    x, y = torch.ones(4), torch.zeros(1)
    _row_sum[(1,)](x, y, N=4)
    before = dict(vars(tl.core))
    undo = interpreter_leaks.unleak()
    for obj, name, _ in undo:
        now = getattr(obj, name, None)
        assert now is None or not interpreter_leaks._made_by_interpreter(now), name
    assert tl.core.mul.__module__ == "triton.language.core"
    interpreter_leaks.restore(undo)
    assert dict(vars(tl.core)) == before
