"""Test helpers for IR and passes: random well-typed modules, inputs, output comparison.

`random_module(seed)` builds a verified module through the registry's shape rules: a
`prefill` function over `f32[T, D]` inputs (T symbolic) with a random mix of elementwise
ops (with scalar or tensor operands), matmuls, reductions, softmax, views and the chains
the cleanup passes target on purpose: identity reshapes/permutes/casts, `x*1`/`x+0`,
exact duplicates (CSE), dead ops (DCE), and `sym_size` feeding a `?` view (fold-shapes).
`random_inputs(module, fn, seed, T=3)` makes matching inputs; `same_outputs(a, b)`
compares lists of tensors bit for bit (NaNs equal). Every pass's numeric test runs
`interpret` before and after the pass on these. Deterministic in `seed` (random.Random).
"""
from __future__ import annotations

import random

import torch

from dsv41c.ir.attrs import DYN
from dsv41c.ir.builder import Builder
from dsv41c.ir.core import Module
from dsv41c.ir.symbolic import sym
from dsv41c.ir.types import TensorType, f32, f64

_UNARY = ["aten.neg", "aten.exp", "aten.relu", "aten.sigmoid", "aten.tanh", "aten.abs", "aten.sin"]
_BINARY = ["aten.add", "aten.sub", "aten.mul", "aten.maximum", "aten.minimum"]


def random_module(seed: int, n_ops: int = 24, width: int = 8) -> Module:
    rng = random.Random(seed)
    T = sym("T")
    m = Module()
    f = m.add_function("prefill", [("x", TensorType(f32, (T, width))), ("y", TensorType(f32, (T, width))),
                                   ("w", TensorType(f32, (width, width)))])
    b = Builder(f)
    pool = list(f.args[:2])  # values of type f32[T, width]
    w = f.args[2]
    made = []  # (name, operands, attrs) of ops made, for exact duplicates

    def emit(name, *operands, **attrs):
        v = b.op(name, *operands, **attrs)
        made.append((name, operands, attrs))
        return v

    for i in range(n_ops):
        kind = rng.choice(["unary", "binary", "scalar", "mm", "reduce", "softmax", "view", "permute", "cast",
                           "identity", "dup", "dead", "dyn"])
        x = rng.choice(pool)
        with b.at(f"layers.{i}"):
            if kind == "unary":
                v = emit(rng.choice(_UNARY), x)
            elif kind == "binary":
                v = emit(rng.choice(_BINARY), x, rng.choice(pool))
            elif kind == "scalar":
                v = emit(rng.choice(["aten.add", "aten.mul", "aten.sub"]), x, other=rng.choice([0.5, 2.0, -1.25, 3]))
            elif kind == "mm":
                v = emit("aten.mm", x, w)
            elif kind == "reduce":
                r = emit(rng.choice(["aten.sum", "aten.amax", "aten.mean"]), x, dim=(1,), keepdim=True)
                v = emit("aten.sub", x, r)
            elif kind == "softmax":
                v = emit("aten.softmax", x, dim=-1)
            elif kind == "view":
                h = emit("aten.view", x, size=(T, 2, width // 2))
                h = emit("aten.reshape", h, size=(T * 2, width // 2))
                v = emit("aten.view", h, size=(T, width))
            elif kind == "permute":
                p = emit("aten.permute", x, dims=(1, 0))
                v = emit("aten.transpose", p, dim0=0, dim1=1)
            elif kind == "cast":
                c = emit("aten.to", x, dtype=f64)
                v = emit("aten.to", c, dtype=f32)
            elif kind == "identity":
                v = emit(*rng.choice([("aten.mul", x), ("aten.add", x), ("aten.div", x)]),
                         other=0 if rng.random() < 0.3 else 1)
                if made[-1][0] == "aten.add" and made[-1][2]["other"] == 1:
                    v = emit("aten.sub", v, other=1)
            elif kind == "dup" and made:
                name, ops, attrs = rng.choice(made)
                v = b.op(name, *ops, **attrs)
                if not (isinstance(v, type(x)) and v.type == x.type):
                    continue
            elif kind == "dead":
                emit(rng.choice(_UNARY), x)
                continue
            else:  # dyn: sym_size feeding a `?` view
                n = emit("aten.sym_size", x, dim=0)
                v = b.op("aten.view", x, n, size=(DYN, width),
                         result_types=[TensorType(f32, (T, width))])
        if getattr(v, "type", None) == TensorType(f32, (T, width)):
            pool.append(v)
    outs = rng.sample(pool[2:], k=min(2, len(pool) - 2)) if len(pool) > 2 else pool[:1]
    b.ret(*outs)
    return m


def random_inputs(module: Module, fn: str, seed: int = 0, **sizes) -> list:
    """Random tensors for fn's arguments; symbols from `sizes` (default 3 each)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for a in module.functions[fn].args:
        t = a.type
        env = {s: sizes.get(s, 3) for s in t.free_symbols()}
        shape = [d if isinstance(d, int) else d.evaluate(env) for d in t.shape]
        if t.dtype.is_float:
            out.append(torch.randn(shape, generator=g, dtype=torch.float64).to(t.dtype.torch))
        elif t.dtype.name == "bool":
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 7, shape, generator=g).to(t.dtype.torch))
    return out


def same_outputs(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if x.dtype.itemsize == 1 and x.is_floating_point():  # fp8 / e8m0 storage: the bytes (no nan_to_num)
                if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
                    return False
            elif not torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)):
                return False
        elif x != y:
            return False
    return True
