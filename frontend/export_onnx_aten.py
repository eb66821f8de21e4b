"""The ATen half of the ONNX export's op table: each `aten.*` IR op as standard ONNX nodes.

`ATEN[name](cx, op, a) -> [output names]`: `cx` is the graph converter (`export_onnx.Graph`: ONNX
names of IR values, their ONNX dtypes, symbolic dims as shape tensors), `a` the op's bound arguments
(operands as Values, attributes as values). Dtypes follow the IR: each operand of an arithmetic op is
cast to the IR result's dtype (or, for a comparison, to the wider of its operands), which is what
torch's type promotion produced when the graph was traced; shapes that depend on symbols are built
at run time from the IR's declared result type (`cx.shape_of`).

Mapping (beyond the one-to-one elementwise ops): rsqrt = Reciprocal(Sqrt), square = Mul(x, x),
floor_divide and remainder on integers as floor division (Mod with fmod=0, the sign of the divisor),
on floats through Floor; view / flatten / expand / new_zeros / full_like from the result type;
slice = Slice (symbolic bounds as shape tensors); stack = Unsqueeze + Concat; index with one index
tensor = Gather; arange = Range; einsum = Einsum (the same equation).
Known gaps: `aten.index` with several index tensors, and every ATen op not listed in `ATEN` (the
exporter names it and refuses the module); see export_onnx.py.
"""
from __future__ import annotations

from onnx import TensorProto as TP

from dsv41c.frontend.onnx_builder import FLOATS, onnx_dtype

_RANK = [TP.BOOL, TP.UINT8, TP.INT8, TP.INT32, TP.INT64, TP.FLOAT16, TP.BFLOAT16, TP.FLOAT, TP.DOUBLE]


def _out(op, i: int = 0) -> int:
    return onnx_dtype(op.results[i].type.dtype)


def _wider(cx, a, b) -> int:
    """The dtype a comparison of a and b runs in (torch's promotion: a float operand wins, then the wider)."""
    vals = [cx.dtype(x) for x in (a, b) if cx.is_value(x)]
    floats = [t for t in vals if t in FLOATS]
    if floats:
        return max(floats, key=_RANK.index)
    if any(isinstance(x, float) for x in (a, b)):
        return TP.FLOAT
    return max(vals, key=_RANK.index)


def _binary(onnx_op):
    def f(cx, op, a):
        t = _out(op)
        return [cx.n.op(onnx_op, cx.operand(a.self, t), cx.operand(a.other, t))]
    return f


def _alpha(cx, a, t):
    other = cx.operand(a.other, t)
    return other if a.get("alpha", 1) == 1 else cx.n.op("Mul", other, cx.n.scalar(a.alpha, t))


def _add(cx, op, a):
    t = _out(op)
    return [cx.n.op("Add", cx.operand(a.self, t), _alpha(cx, a, t))]


def _sub(cx, op, a):
    t = _out(op)
    return [cx.n.op("Sub", cx.operand(a.self, t), _alpha(cx, a, t))]


def _rsub(cx, op, a):
    t = _out(op)
    return [cx.n.op("Sub", _alpha(cx, a, t), cx.operand(a.self, t))]


def _compare(onnx_op, negate=False):
    def f(cx, op, a):
        t = _wider(cx, a.self, a.other)
        r = cx.n.op(onnx_op, cx.operand(a.self, t), cx.operand(a.other, t))
        return [cx.n.op("Not", r) if negate else r]
    return f


def _unary(onnx_op):
    def f(cx, op, a):
        return [cx.n.op(onnx_op, cx.operand(a.self, _out(op)))]
    return f


def floor_div(n, x, y, t):
    """floor(x / y) in dtype t (integers: exact, through the divisor-signed remainder)."""
    if t in FLOATS:
        return n.op("Floor", n.op("Div", x, y))
    return n.op("Div", n.op("Sub", x, n.op("Mod", x, y, fmod=0)), y)


def _floor_divide(cx, op, a):
    t = _out(op)
    return [floor_div(cx.n, cx.operand(a.self, t), cx.operand(a.other, t), t)]


def _remainder(cx, op, a):
    t = _out(op)
    x, y = cx.operand(a.self, t), cx.operand(a.other, t)
    if t in FLOATS:
        return [cx.n.op("Sub", x, cx.n.op("Mul", floor_div(cx.n, x, y, t), y))]
    return [cx.n.op("Mod", x, y, fmod=0)]


def _div(cx, op, a):
    t = _out(op)
    x, y = cx.operand(a.self, t), cx.operand(a.other, t)
    mode = a.get("rounding_mode")
    if mode == "floor":
        return [floor_div(cx.n, x, y, t)]
    q = cx.n.op("Div", x, y)
    if mode == "trunc" and t in FLOATS:
        q = cx.n.op("Mul", cx.n.op("Sign", q), cx.n.op("Floor", cx.n.op("Abs", q)))
    return [q]


def _pow(cx, op, a):
    t = _out(op)
    return [cx.n.op("Pow", cx.operand(a.self, t), cx.operand(a.exponent, t))]


def _where(cx, op, a):
    t = _out(op)
    return [cx.n.op("Where", cx.v(a.condition), cx.operand(a.self, t), cx.operand(a.other, t))]


def _clamp(cx, op, a):
    t = _out(op)
    x = cx.operand(a.self, t)
    if a.get("min") is not None:
        x = cx.n.op("Max", x, cx.operand(a.min, t))
    if a.get("max") is not None:
        x = cx.n.op("Min", x, cx.operand(a.max, t))
    return [x]


def _reduce(onnx_op):
    def f(cx, op, a):
        t = _out(op)
        x = cx.operand(a.self, t)
        dims = a.get("dim")
        keep = int(bool(a.get("keepdim", False)))
        if dims is None or len(dims) == 0:
            return [cx.n.op(onnx_op, x, keepdims=keep)]
        return [cx.n.op(onnx_op, x, cx.n.i64(*dims), keepdims=keep)]
    return f


def _reshape_to_result(cx, op, a):
    return [cx.n.op("Reshape", cx.v(a.self), cx.shape_of(op.results[0]), allowzero=1)]


def _expand(cx, op, a):
    return [cx.n.op("Expand", cx.v(a.self), cx.shape_of(op.results[0]))]


def _filled(cx, op, value):
    t = _out(op)
    if t == TP.BFLOAT16:
        return cx.n.cast(cx.n.op("ConstantOfShape", cx.shape_of(op.results[0]),
                                 value=cx.tensor_attr(float(value), TP.FLOAT)), t)
    return cx.n.op("ConstantOfShape", cx.shape_of(op.results[0]), value=cx.tensor_attr(value, t))


def _full_like(cx, op, a):
    return [_filled(cx, op, a.fill_value)]


def _zeros(cx, op, a):
    return [_filled(cx, op, 0)]


def _slice(cx, op, a):
    x = cx.v(a.self)
    start = cx.n.i64(0) if a.get("start") is None else cx.dim(a.start)
    end = cx.n.i64(2**63 - 1) if a.get("end") is None else cx.dim(a.end)
    return [cx.n.op("Slice", x, start, end, cx.n.i64(a.get("dim", 0)), cx.n.i64(a.get("step", 1)))]


def _cat(cx, op, a):
    t = _out(op)
    return [cx.n.op("Concat", *[cx.operand(x, t) for x in a.tensors], axis=a.get("dim", 0))]


def _stack(cx, op, a):
    t, d = _out(op), a.get("dim", 0)
    return [cx.n.op("Concat", *[cx.n.op("Unsqueeze", cx.operand(x, t), cx.n.i64(d)) for x in a.tensors], axis=d)]


def _unsqueeze(cx, op, a):
    return [cx.n.op("Unsqueeze", cx.v(a.self), cx.n.i64(a.dim))]


def _permute(cx, op, a):
    rank = op.results[0].type.rank
    return [cx.n.op("Transpose", cx.v(a.self), perm=[d % rank for d in a.dims])]


def _matmul(cx, op, a):
    t = _out(op)
    return [cx.n.op("MatMul", cx.operand(a.self, t), cx.operand(a.other, t))]


def _einsum(cx, op, a):
    t = _out(op)
    return [cx.n.op("Einsum", *[cx.operand(x, t) for x in a.tensors], equation=a.equation.replace(" ", ""))]


def _index(cx, op, a):
    idx = list(a.indices)
    pos = list(a.get("positions") or range(len(idx)))
    if len(idx) != 1:
        raise cx.unsupported(op, "advanced indexing with more than one index tensor has no single ONNX op here")
    return [cx.n.op("Gather", cx.v(a.self), cx.v(idx[0]), axis=pos[0])]


def _arange(cx, op, a):
    t = _out(op)
    s = [cx.n.cast(cx.n.squeeze0(cx.dim(a.get(k, d))), t, TP.INT64) for k, d in (("start", 0), ("end", None),
                                                                                    ("step", 1))]
    return [cx.n.op("Range", *s)]


def _to(cx, op, a):
    return [cx.n.cast(cx.v(a.self), _out(op), cx.dtype(a.self))]


def _scalar_tensor(cx, op, a):
    t = _out(op)
    return [cx.operand(a.s, t)]


def _sym_const(cx, op, a):
    return [cx.n.squeeze0(cx.dim(a.value))]


def _sym_size(cx, op, a):
    return [cx.n.squeeze0(cx.n.dim(cx.v(a.self), a.dim))]


def _square(cx, op, a):
    x = cx.operand(a.self, _out(op))
    return [cx.n.op("Mul", x, x)]


def _rsqrt(cx, op, a):
    return [cx.n.rsqrt(cx.operand(a.self, _out(op)))]


def _silu(cx, op, a):
    x = cx.operand(a.self, _out(op))
    return [cx.n.op("Mul", x, cx.n.op("Sigmoid", x))]


def _identity(cx, op, a):
    return [cx.n.op("Identity", cx.v(a.self))]


ATEN = {
    "aten.add": _add, "aten.sub": _sub, "aten.rsub": _rsub, "aten.mul": _binary("Mul"), "aten.div": _div,
    "aten.pow": _pow, "aten.floor_divide": _floor_divide, "aten.remainder": _remainder,
    "aten.maximum": _binary("Max"), "aten.minimum": _binary("Min"),
    "aten.eq": _compare("Equal"), "aten.ne": _compare("Equal", negate=True), "aten.lt": _compare("Less"),
    "aten.le": _compare("LessOrEqual"), "aten.gt": _compare("Greater"), "aten.ge": _compare("GreaterOrEqual"),
    "aten.neg": _unary("Neg"), "aten.cos": _unary("Cos"), "aten.sin": _unary("Sin"), "aten.exp": _unary("Exp"),
    "aten.log": _unary("Log"), "aten.sqrt": _unary("Sqrt"), "aten.abs": _unary("Abs"), "aten.tanh": _unary("Tanh"),
    "aten.sigmoid": _unary("Sigmoid"), "aten.relu": _unary("Relu"), "aten.reciprocal": _unary("Reciprocal"),
    "aten.floor": _unary("Floor"), "aten.ceil": _unary("Ceil"), "aten.sign": _unary("Sign"),
    "aten.rsqrt": _rsqrt, "aten.square": _square, "aten.silu": _silu,
    "aten.where": _where, "aten.clamp": _clamp,
    "aten.mean": _reduce("ReduceMean"), "aten.sum": _reduce("ReduceSum"), "aten.amax": _reduce("ReduceMax"),
    "aten.amin": _reduce("ReduceMin"),
    "aten.view": _reshape_to_result, "aten.reshape": _reshape_to_result, "aten.flatten": _reshape_to_result,
    "aten.squeeze": _reshape_to_result, "aten.expand": _expand, "aten.unsqueeze": _unsqueeze,
    "aten.permute": _permute, "aten.slice": _slice, "aten.cat": _cat, "aten.stack": _stack,
    "aten.full_like": _full_like, "aten.new_zeros": _zeros, "aten.zeros_like": _zeros,
    "aten.matmul": _matmul, "aten.mm": _matmul, "aten.einsum": _einsum, "aten.index": _index,
    "aten.arange": _arange, "aten.to": _to, "aten.scalar_tensor": _scalar_tensor,
    "aten.clone": _identity, "aten.alias": _identity, "aten.detach": _identity, "aten.contiguous": _identity,
    "sym.const": _sym_const, "aten.sym_size": _sym_size,
}
