"""Core ATen ops, part 1: elementwise math, reductions, softmax, matmuls, casts.

Registered from tables: each row gives the op name, its schema tail and its rule family;
the reference implementation is `torch.ops.aten.<name>` unless a row says otherwise. The
schemas keep ATen's argument names so the torch.export converter maps arguments by name;
a Python number where ATen takes `Tensor|Scalar` becomes an attribute of that name.

Names drop ATen overload suffixes (`aten.add` covers add.Tensor/add.Scalar; `aten.softmax`
covers `_softmax`/`softmax.int`; `aten.to` covers `_to_copy` with a dtype).

Known gaps: no complex dtypes; `einsum` without `...`; `matmul` follows torch's rules for
rank >= 1 operands; integer overflow is not modelled in costs.
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch

from dsv41c.ir.registry import Cost, ShapeError, register
from dsv41c.ir.shape_rules import (aten, broadcast, category, elementwise_cost, eq_dims, memory_cost, need_float,
                                   need_rank, need_tensor, norm_dim, promote, reduce_shape, reduction_cost,
                                   result_dtype)
from dsv41c.ir.types import TensorType, bool_, f32, fp4e2m1x2, i64


def _operands(*items):
    return [x for x in items if x is not None]


# ---------------------------------------------------------------------------- unary
def _same(a):
    t = need_tensor(a.self)
    category(t.dtype)
    return t


def _to_float(a):
    t = _same(a)
    return t if t.dtype.is_float else t.with_dtype(f32)


def _float_only(a):
    return need_float(_same(a), "this op")


def _to_bool(a):
    return _same(a).with_dtype(bool_)


_UNARY = {
    "same": ["neg", "abs", "sign", "relu", "floor", "ceil", "round", "trunc", "square", "bitwise_not"],
    "to_float": ["exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sigmoid", "tanh", "sin", "cos",
                 "reciprocal", "erf"],
    "float_only": ["silu"],
    "to_bool": ["isnan", "isinf", "isfinite", "logical_not"],
}
_UNARY_RULE = {"same": _same, "to_float": _to_float, "float_only": _float_only, "to_bool": _to_bool}
for _fam, _names in _UNARY.items():
    for _n in _names:
        register(f"aten.{_n}(Tensor self) -> Tensor", shape=_UNARY_RULE[_fam], impl=aten(_n), cost=elementwise_cost)

register("aten.gelu(Tensor self, str approximate=\"none\") -> Tensor", shape=_float_only, impl=aten("gelu"),
         cost=elementwise_cost)
register("aten.softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor", shape=_float_only,
         impl=aten("softplus"), cost=elementwise_cost)


def _clamp(a):
    _same(a)
    dts = _operands(a.self, a.min, a.max)
    return TensorType(result_dtype(*dts), broadcast(*(x.shape for x in dts if isinstance(x, TensorType))))


register("aten.clamp(Tensor self, Tensor|Scalar? min=none, Tensor|Scalar? max=none) -> Tensor", shape=_clamp,
         impl=aten("clamp"), cost=elementwise_cost)
del _clamp


# ---------------------------------------------------------------------------- binary
def _binary_shape(*items):
    tensors = [x for x in items if isinstance(x, TensorType)]
    if not tensors:
        raise ShapeError("needs at least one tensor operand")
    return broadcast(*(t.shape for t in tensors))


def _arith(a):
    return TensorType(result_dtype(a.self, a.other), _binary_shape(a.self, a.other))


def _true_div(a):
    dt = result_dtype(a.self, a.other)
    if a.get("rounding_mode") is None and not dt.is_float:
        dt = f32
    return TensorType(dt, _binary_shape(a.self, a.other))


def _compare(a):
    result_dtype(a.self, a.other)  # checks the operands can be compared
    return TensorType(bool_, _binary_shape(a.self, a.other))


def _pow(a):
    return TensorType(result_dtype(a.self, a.exponent), _binary_shape(a.self, a.exponent))


_BINARY = {
    "add": ("Tensor self, Tensor|Scalar other, Scalar alpha=1", _arith),
    "sub": ("Tensor self, Tensor|Scalar other, Scalar alpha=1", _arith),
    "rsub": ("Tensor self, Tensor|Scalar other, Scalar alpha=1", _arith),
    "mul": ("Tensor self, Tensor|Scalar other", _arith),
    "div": ("Tensor self, Tensor|Scalar other, str? rounding_mode=none", _true_div),
    "maximum": ("Tensor self, Tensor other", _arith),
    "minimum": ("Tensor self, Tensor other", _arith),
    "fmod": ("Tensor self, Tensor|Scalar other", _arith),
    "remainder": ("Tensor self, Tensor|Scalar other", _arith),
    "floor_divide": ("Tensor self, Tensor|Scalar other", _arith),
    "atan2": ("Tensor self, Tensor other", _true_div),
    "bitwise_and": ("Tensor self, Tensor|Scalar other", _arith),
    "bitwise_or": ("Tensor self, Tensor|Scalar other", _arith),
    "bitwise_xor": ("Tensor self, Tensor|Scalar other", _arith),
    "bitwise_left_shift": ("Tensor self, Tensor|Scalar other", _arith),
    "bitwise_right_shift": ("Tensor self, Tensor|Scalar other", _arith),
    "logical_and": ("Tensor self, Tensor other", _compare),
    "logical_or": ("Tensor self, Tensor other", _compare),
    "logical_xor": ("Tensor self, Tensor other", _compare),
    "eq": ("Tensor self, Tensor|Scalar other", _compare),
    "ne": ("Tensor self, Tensor|Scalar other", _compare),
    "lt": ("Tensor self, Tensor|Scalar other", _compare),
    "le": ("Tensor self, Tensor|Scalar other", _compare),
    "gt": ("Tensor self, Tensor|Scalar other", _compare),
    "ge": ("Tensor self, Tensor|Scalar other", _compare),
    "pow": ("Tensor|Scalar self, Tensor|Scalar exponent", _pow),
}
for _n, (_sig, _rule) in _BINARY.items():
    register(f"aten.{_n}({_sig}) -> Tensor", shape=_rule, impl=aten(_n), cost=elementwise_cost)


def _where(a):
    return TensorType(result_dtype(a.self, a.other), _binary_shape(a.condition, a.self, a.other))


register("aten.where(Tensor condition, Tensor|Scalar self, Tensor|Scalar other) -> Tensor", shape=_where,
         impl=aten("where"), cost=elementwise_cost)


def _masked_fill(a):
    t = need_tensor(a.self)
    if broadcast(t.shape, a.mask.shape) != t.shape:
        raise ShapeError(f"mask {a.mask} does not broadcast to {t}")
    return t


register("aten.masked_fill(Tensor self, Tensor mask, Tensor|Scalar value) -> Tensor", shape=_masked_fill,
         impl=aten("masked_fill"), cost=elementwise_cost)


# ---------------------------------------------------------------------------- reductions
def _sum_like(a):
    t = need_tensor(a.self)
    dt = a.dtype or (t.dtype if t.dtype.is_float else i64)
    return TensorType(dt, reduce_shape(t.shape, a.dim, a.keepdim))


def _mean(a):
    t = need_tensor(a.self)
    if a.dtype is None:
        need_float(t, "mean")
    return TensorType(a.dtype or t.dtype, reduce_shape(t.shape, a.dim, a.keepdim))


def _extreme(a):
    t = need_tensor(a.self)
    return t.with_shape(reduce_shape(t.shape, a.dim, a.keepdim))


def _max_dim(a):
    t = need_tensor(a.self)
    shape = reduce_shape(t.shape, (a.dim,), a.keepdim)
    return t.with_shape(shape), TensorType(i64, shape)


def _arg_extreme(a):
    t = need_tensor(a.self)
    return TensorType(i64, reduce_shape(t.shape, None if a.dim is None else (a.dim,), a.keepdim))


def _any_all(a):
    t = need_tensor(a.self)
    return TensorType(bool_, reduce_shape(t.shape, a.dim, a.keepdim))


def _var(a):
    return need_float(_extreme(a), "var")


def _prod_impl(a):
    if a.dim is None:
        return torch.prod(a.self, dtype=a.dtype)
    return torch.prod(a.self, a.dim, keepdim=a.keepdim, dtype=a.dtype)


def _prod(a):
    t = need_tensor(a.self)
    dt = a.dtype or (t.dtype if t.dtype.is_float else i64)
    return TensorType(dt, reduce_shape(t.shape, None if a.dim is None else (a.dim,), a.keepdim))


_RED = [
    ("sum", "Tensor self, int[]? dim=none, bool keepdim=false, dtype? dtype=none", _sum_like, aten("sum")),
    ("mean", "Tensor self, int[]? dim=none, bool keepdim=false, dtype? dtype=none", _mean, aten("mean")),
    ("prod", "Tensor self, int? dim=none, bool keepdim=false, dtype? dtype=none", _prod, _prod_impl),
    ("amax", "Tensor self, int[] dim=[], bool keepdim=false", _extreme, aten("amax")),
    ("amin", "Tensor self, int[] dim=[], bool keepdim=false", _extreme, aten("amin")),
    ("argmax", "Tensor self, int? dim=none, bool keepdim=false", _arg_extreme, aten("argmax")),
    ("argmin", "Tensor self, int? dim=none, bool keepdim=false", _arg_extreme, aten("argmin")),
    ("any", "Tensor self, int[]? dim=none, bool keepdim=false", _any_all, aten("any")),
    ("all", "Tensor self, int[]? dim=none, bool keepdim=false", _any_all, aten("all")),
    ("var", "Tensor self, int[]? dim=none, Scalar? correction=none, bool keepdim=false", _var, aten("var")),
    ("logsumexp", "Tensor self, int[] dim, bool keepdim=false", _var, aten("logsumexp")),
]
for _n, _sig, _rule, _impl in _RED:
    register(f"aten.{_n}({_sig}) -> Tensor", shape=_rule, impl=_impl, cost=reduction_cost)
register("aten.max(Tensor self, int dim, bool keepdim=false) -> (Tensor, Tensor)", shape=_max_dim, impl=aten("max"),
         cost=reduction_cost)
register("aten.min(Tensor self, int dim, bool keepdim=false) -> (Tensor, Tensor)", shape=_max_dim, impl=aten("min"),
         cost=reduction_cost)


def _norm(a):
    t = need_float(need_tensor(a.self), "linalg_vector_norm")
    return TensorType(a.dtype or t.dtype, reduce_shape(t.shape, a.dim, a.keepdim))


register("aten.linalg_vector_norm(Tensor self, Scalar ord=2, int[]? dim=none, bool keepdim=false, "
         "dtype? dtype=none) -> Tensor", shape=_norm, impl=aten("linalg_vector_norm"), cost=reduction_cost)


def _softmax(a):
    t = need_tensor(a.self)
    norm_dim(a.dim, t.rank)
    return need_float(t.with_dtype(a.dtype or t.dtype), "softmax")


def _cumsum(a):
    t = need_tensor(a.self)
    norm_dim(a.dim, t.rank)
    return t.with_dtype(a.dtype or (t.dtype if t.dtype.is_float else i64))


for _n in ("softmax", "log_softmax"):
    register(f"aten.{_n}(Tensor self, int dim, dtype? dtype=none) -> Tensor", shape=_softmax, impl=aten(_n),
             cost=lambda a, r: Cost(5 * r[0].numel, memory_cost(a, r).bytes))
for _n in ("cumsum", "cumprod"):
    register(f"aten.{_n}(Tensor self, int dim, dtype? dtype=none) -> Tensor", shape=_cumsum, impl=aten(_n),
             cost=reduction_cost)


# ---------------------------------------------------------------------------- matmuls
def _mm_dtype(x, y):
    if x.dtype != y.dtype:
        raise ShapeError(f"matmul operands must have one dtype, got {x.dtype} and {y.dtype}")
    return x.dtype


def _mm(a):
    x, y = need_tensor(a.self), need_tensor(a.mat2)
    need_rank(x, 2, "mm", "self")
    need_rank(y, 2, "mm", "mat2")
    eq_dims(x.shape[1], y.shape[0], "mm: inner dims differ")
    return TensorType(_mm_dtype(x, y), (x.shape[0], y.shape[1]))


def _bmm(a):
    x, y = need_tensor(a.self), need_tensor(a.mat2)
    need_rank(x, 3, "bmm", "self")
    need_rank(y, 3, "bmm", "mat2")
    eq_dims(x.shape[0], y.shape[0], "bmm: batch dims differ")
    eq_dims(x.shape[2], y.shape[1], "bmm: inner dims differ")
    return TensorType(_mm_dtype(x, y), (x.shape[0], x.shape[1], y.shape[2]))


def _addmm(a):
    out = _mm(type(a)(self=a.mat1, mat2=a.mat2))
    if broadcast(a.self.shape, out.shape) != out.shape:
        raise ShapeError(f"addmm: {a.self} does not broadcast to {out}")
    return out


def _matmul(a):
    x, y = need_tensor(a.self), need_tensor(a.other)
    if x.rank == 0 or y.rank == 0:
        raise ShapeError("matmul needs operands of rank >= 1")
    xs = x.shape if x.rank > 1 else (1,) + x.shape
    ys = y.shape if y.rank > 1 else y.shape + (1,)
    eq_dims(xs[-1], ys[-2], "matmul: inner dims differ")
    batch = broadcast(xs[:-2], ys[:-2])
    shape = batch + ((xs[-2],) if x.rank > 1 else ()) + ((ys[-1],) if y.rank > 1 else ())
    return TensorType(_mm_dtype(x, y), shape)


def _linear(a):
    x, w = need_tensor(a.input), need_tensor(a.weight)
    need_rank(w, 2, "linear", "weight")
    if x.rank < 1:
        raise ShapeError("linear: input must have rank >= 1")
    eq_dims(x.shape[-1], w.shape[1], "linear: in-features differ")
    if a.bias is not None and broadcast(a.bias.shape, (w.shape[0],)) != (w.shape[0],):
        raise ShapeError(f"linear: bias {a.bias} does not match {w.shape[0]} out-features")
    return TensorType(_mm_dtype(x, w), x.shape[:-1] + (w.shape[0],))


def _matmul_cost(k_of):
    def cost(a, results):
        return Cost(2 * results[0].numel * k_of(a), memory_cost(a, results).bytes)

    return cost


register("aten.mm(Tensor self, Tensor mat2) -> Tensor", shape=_mm, impl=aten("mm"),
         cost=_matmul_cost(lambda a: a.mat2.shape[0]))
register("aten.bmm(Tensor self, Tensor mat2) -> Tensor", shape=_bmm, impl=aten("bmm"),
         cost=_matmul_cost(lambda a: a.mat2.shape[1]))
register("aten.addmm(Tensor self, Tensor mat1, Tensor mat2, Scalar beta=1, Scalar alpha=1) -> Tensor", shape=_addmm,
         impl=aten("addmm"), cost=_matmul_cost(lambda a: a.mat2.shape[0]))
register("aten.matmul(Tensor self, Tensor other) -> Tensor", shape=_matmul, impl=aten("matmul"),
         cost=_matmul_cost(lambda a: a.self.shape[-1]))
register("aten.linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor", shape=_linear, impl=aten("linear"),
         cost=_matmul_cost(lambda a: a.weight.shape[1]))


def _einsum(a):
    eq = a.equation.replace(" ", "")
    if "." in eq:
        raise ShapeError("einsum with '...' is not supported; spell the dims out")
    lhs, arrow, rhs = eq.partition("->")
    specs = lhs.split(",")
    if len(specs) != len(a.tensors):
        raise ShapeError(f"einsum '{a.equation}' names {len(specs)} operands, got {len(a.tensors)}")
    sizes = {}
    for spec, t in zip(specs, a.tensors):
        if len(spec) != t.rank:
            raise ShapeError(f"einsum '{a.equation}': '{spec}' does not fit {t}")
        for ch, d in zip(spec, t.shape):
            if ch in sizes and sizes[ch] != 1 and d != 1:
                eq_dims(sizes[ch], d, f"einsum '{a.equation}': dim '{ch}' differs")
            if ch not in sizes or sizes[ch] == 1:
                sizes[ch] = d
    if not arrow:
        rhs = "".join(sorted(ch for ch in sizes if lhs.count(ch) == 1))
    dt = a.tensors[0].dtype
    for t in a.tensors[1:]:
        dt = promote(dt, t.dtype)
    return TensorType(dt, tuple(sizes[ch] for ch in rhs))


def _einsum_cost(a, results):
    shape_all = 1
    seen = {}
    for spec, t in zip(a.equation.replace(" ", "").split("->")[0].split(","), a.tensors):
        for ch, d in zip(spec, t.shape):
            seen[ch] = d
    for d in seen.values():
        shape_all = shape_all * d
    return Cost(2 * shape_all, memory_cost(a, results).bytes)


register("aten.einsum(str equation, Tensor[] tensors) -> Tensor", shape=_einsum, impl=aten("einsum", positional=2),
         cost=_einsum_cost)


# ---------------------------------------------------------------------------- casts
def _to(a):
    t = need_tensor(a.self)
    if a.dtype is fp4e2m1x2 or t.dtype is fp4e2m1x2:
        raise ShapeError("fp4e2m1x2 is packed: use the pack/unpack ops, not a cast")
    return t.with_dtype(a.dtype)


register("aten.to(Tensor self, dtype dtype) -> Tensor", shape=_to, impl=lambda a: a.self.to(a.dtype),
         cost=memory_cost)
register("aten.type_as(Tensor self, Tensor other) -> Tensor",
         shape=lambda a: _to(type(a)(self=a.self, dtype=a.other.dtype)), impl=lambda a: a.self.to(a.other.dtype),
         cost=memory_cost)


def _view_dtype(a):
    t = need_tensor(a.self)
    old, new = t.dtype.bits, a.dtype.bits
    if old == new:
        return t.with_dtype(a.dtype)
    if t.rank == 0:
        raise ShapeError("view_dtype to another width needs rank >= 1")
    last = t.shape[-1]
    if new < old:
        last = last * (old // new)
    else:
        if isinstance(last, int) and last % (new // old):
            raise ShapeError(f"view_dtype: last dim {last} is not a multiple of {new // old}")
        last = last // (new // old)
    return TensorType(a.dtype, t.shape[:-1] + (last,))


register("aten.view_dtype(Tensor self, dtype dtype) -> Tensor", shape=_view_dtype, impl=lambda a: a.self.view(a.dtype),
         cost=lambda a, r: Cost(0, 0))
