"""Side effects: ops that write (cache appends) or order streams limit what passes may do.

A test-only op `test.cache_append(Tensor cache, Tensor x) -> ()` writes its cache operand in
place (registered with `writes=("cache",)`, as the domain cache appends are).
"""
from __future__ import annotations

import pytest
import torch

from dsv41c.ir import registry
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.printer import print_module
from dsv41c.ir.verifier import verify
from dsv41c.passes.registry import parse_pipeline


def _append(a):
    a.cache.copy_(torch.cat([a.cache[1:], a.x]))


@pytest.fixture
def cache_append(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.all_ops()))
    return registry.register("test.cache_append(Tensor cache, Tensor x) -> ()", shape=lambda a: (),
                             impl=_append, writes=("cache",))


TEXT = """func @decode(%kv: f32[4, 2] {placement = "persistent"}, %x: f32[1, 2]) -> (f32[2], f32[2], f32[4, 2]) {
  %c = aten.clone(%kv) : (f32[4, 2]) -> f32[4, 2]
  %before = aten.sum(%kv) {dim = [0]} : (f32[4, 2]) -> f32[2]
  test.cache_append(%kv, %x) : (f32[4, 2], f32[1, 2]) -> ()
  %after = aten.sum(%kv) {dim = [0]} : (f32[4, 2]) -> f32[2]
  %unused = aten.neg(%x) : (f32[1, 2]) -> f32[1, 2]
  return %before, %after, %c
}
"""


def test_writes_are_barriers_and_never_dead(cache_append):
    assert cache_append.has_side_effects
    m = parse_module(TEXT)
    verify(m)
    kv, x = torch.arange(8.0).reshape(4, 2), torch.full((1, 2), 100.0)
    want = interpret(m.clone(), "decode", [kv.clone(), x])
    for p in parse_pipeline("canonicalize,cse,dce"):
        m = p.run(m).module
    text = print_module(m)
    assert "%after = aten.sum(%kv)" in text  # not merged with %before across the write
    assert "test.cache_append(%kv, %x)" in text  # no results, still kept
    assert "%c = aten.clone(%kv)" in text  # the copy of a written value is not folded away
    assert "%unused" not in text
    got = interpret(m, "decode", [kv.clone(), x])
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and not torch.equal(want[0], want[1])


def test_writes_must_name_an_operand(cache_append):
    with pytest.raises(ValueError, match=r"writes='y' is not an operand"):
        registry.register("test.bad(Tensor x) -> ()", shape=lambda a: (), impl=lambda a: None, writes=("y",))
