"""Every registered op: its shape rule agrees with its reference implementation.

For each op a sample (operand types, attributes) is built through the Builder (types from
the shape rule), verified, and run by the interpreter on random inputs with T=3; the
interpreter checks each result's dtype and shape against the declared type. A test fails
if a core op (aten/sym/kernel/stream) is registered without a sample here, so the table
cannot fall behind the registry. Also: symbolic costs, dtype promotion vs torch.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from dsv41c.ir.builder import Builder
from dsv41c.ir.core import Module, Value
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.ops_aten import _BINARY, _UNARY
from dsv41c.ir.ops_runtime import Event
from dsv41c.ir.parser import Parser, parse_type
from dsv41c.ir.registry import all_ops, get
from dsv41c.ir.shape_rules import result_dtype
from dsv41c.ir.symbolic import ANY, sym
from dsv41c.ir.types import DTYPES, TensorType, tensor
from dsv41c.ir.verifier import verify

F = "f32[T, 4]"
I = "i64[T, 4]"
SAMPLES = {
    "aten.gelu": [(F, "{approximate = \"tanh\"}")], "aten.softplus": [(F, "{beta = 2}")],
    "aten.clamp": [(F, "{min = -0.5, max = 0.5}"), (f"{F}, f32[4]", "{min = none}"), (F, "{min = 0}")],
    "aten.where": [(f"bool[T, 4], {F}, f32[4]", ""), ("bool[T, 4]", "{self = 1.0, other = 0}"),
                   (f"bool[T, 4], {I}", "{other = 2.5}")],
    "aten.masked_fill": [(f"{F}, bool[4]", "{value = -1.0}")],
    "aten.pow": [(F, "{exponent = 2}"), (F, "{self = 2.0}"), (f"{F}, {F}", "")],
    "aten.div": [(I, "{other = 2, rounding_mode = \"floor\"}"), (I, "{other = 2}"), (f"{F}, f32[]", "")],
    "aten.sum": [(F, "{dim = [1], keepdim = true}"), (I, ""), (F, "{dim = [-1], dtype = f64}")],
    "aten.mean": [(F, "{dim = [0, 1]}"), (I, "{dtype = f32}")],
    "aten.prod": [(F, "{dim = 1}"), (I, "")], "aten.var": [(F, "{dim = [1], correction = 0}")],
    "aten.amax": [(F, "{dim = [1]}"), (I, "")], "aten.amin": [(F, "{dim = [0], keepdim = true}")],
    "aten.argmax": [(F, "{dim = 1}"), (F, "")], "aten.argmin": [(F, "{dim = 0, keepdim = true}")],
    "aten.any": [("bool[T, 4]", "{dim = [1]}")], "aten.all": [("bool[T, 4]", "")],
    "aten.logsumexp": [(F, "{dim = [1]}")], "aten.max": [(F, "{dim = 1}")], "aten.min": [(F, "{dim = 0}")],
    "aten.linalg_vector_norm": [(F, "{dim = [1]}")],
    "aten.softmax": [(F, "{dim = -1}"), ("bf16[T, 4]", "{dim = 1, dtype = f32}")],
    "aten.log_softmax": [(F, "{dim = 0}")], "aten.cumsum": [(I, "{dim = 1}")], "aten.cumprod": [(F, "{dim = 0}")],
    "aten.mm": [("f32[T, 4], f32[4, 5]", "")], "aten.bmm": [("f32[2, T, 4], f32[2, 4, 3]", "")],
    "aten.addmm": [("f32[5], f32[T, 4], f32[4, 5]", "{beta = 0.5}")],
    "aten.matmul": [("f32[2, T, 4], f32[4, 3]", ""), ("f32[4], f32[2, 4, 3]", ""), ("f32[T, 4], f32[4]", "")],
    "aten.linear": [("f32[2, T, 4], f32[6, 4], f32[6]", ""), ("f32[T, 4], f32[6, 4]", "")],
    "aten.einsum": [("f32[T, 4], f32[4, 5]", "{equation = \"tk,kn->tn\"}"),
                    ("f32[2, T, 4], f32[2, 4]", "{equation = \"btk,bk->bt\"}")],
    "aten.to": [(F, "{dtype = bf16}"), (F, "{dtype = fp8e4m3}"), (I, "{dtype = f32}")],
    "aten.type_as": [(f"{F}, bf16[2]", "")],
    "aten.view_dtype": [(F, "{dtype = i32}"), ("f32[T, 4]", "{dtype = bf16}"), ("u8[T, 8]", "{dtype = bf16}")],
    "aten.view": [(F, "{size = [2, -1, 2]}"), (f"{F}, index", "{size = [?, 4]}")],
    "aten.reshape": [(F, "{size = [4*T]}")], "aten.permute": [("f32[2, T, 4]", "{dims = [2, 0, 1]}")],
    "aten.transpose": [(F, "{dim0 = 0, dim1 = -1}")], "aten.t": [(F, "")],
    "aten.unsqueeze": [(F, "{dim = -1}")], "aten.squeeze": [("f32[1, T, 1]", ""), ("f32[1, T, 1]", "{dim = [0]}")],
    "aten.expand": [("f32[T, 1]", "{size = [2, -1, 4]}")], "aten.broadcast_to": [("f32[1, 4]", "{size = [T, 4]}")],
    "aten.flatten": [("f32[2, T, 4]", "{start_dim = 1}")],
    "aten.cat": [(f"{F}, f32[2, 4]", "{dim = 0}"), (f"{F}, {F}, {F}", "{dim = 1}")],
    "aten.stack": [(f"{F}, {F}", "{dim = 1}")],
    "aten.split_with_sizes": [(F, "{split_sizes = [1, 3], dim = 1}")], "aten.split": [("f32[5, T]", "{split_size = 2}")],
    "aten.chunk": [("f32[T, 6]", "{chunks = 4, dim = 1}")], "aten.unbind": [(F, "{dim = 1}")],
    "aten.slice": [(F, "{dim = 1, start = 1, end = 9223372036854775807}"), (F, "{start = 1, end = T}"),
                   (F, "{dim = 1, start = -3, step = 2}")],
    "aten.select": [(F, "{dim = 1, index = -1}")], "aten.narrow": [(F, "{dim = 0, start = 1, length = 2}")],
    "aten.repeat": [(F, "{repeats = [2, 1, 2]}")], "aten.flip": [(F, "{dims = [0]}")],
    "aten.roll": [(F, "{shifts = [1], dims = [1]}")], "aten.tril": [(F, "")], "aten.triu": [(F, "{diagonal = 1}")],
    "aten.arange": [("", "{end = T}"), ("", "{start = 1, end = 2*T, step = 3, dtype = f32}"),
                    ("", "{start = 5, end = 0, step = -2}")],
    "aten.full": [("", "{size = [T, 2], fill_value = 1.5}"), ("", "{size = [2], fill_value = 3}"),
                  ("index", "{size = [?, 2], fill_value = true}")],
    "aten.full_like": [(F, "{fill_value = 2, dtype = i32}")],
    "aten.index_select": [(f"{F}, i64[2]", "{dim = 1}")], "aten.gather": [(f"{F}, i64[T, 2]", "{dim = 1}")],
    "aten.scatter": [(f"{F}, i64[T, 2], f32[T, 2]", "{dim = 1}"), (f"{F}, i64[T, 2]", "{dim = 1, src = 0.5}")],
    "aten.scatter_add": [(f"{F}, i64[T, 2], f32[T, 2]", "{dim = 1}")],
    "aten.scatter_reduce": [(f"{F}, i64[T, 2], f32[T, 2]", "{dim = 1, reduce = \"amax\"}")],
    "aten.index_add": [(f"{F}, i64[2], f32[2, 4]", "{dim = 0}")],
    "aten.index": [(f"{F}, i64[5]", ""), ("f32[2, T, 4], i64[5]", "{positions = [1]}"),
                   ("f32[2, T, 4], i64[5], i64[5]", "{positions = [0, 2]}")],
    "aten.index_put": [(f"{F}, i64[2], f32[2, 4]", ""), (f"{F}, i64[2], f32[4]", "{accumulate = true, positions = [0]}")],
    "aten.embedding": [("f32[10, 4], i64[T, 2]", "")], "aten.one_hot": [(I, "{num_classes = 5}")],
    "aten.nonzero": [(F, "")],
    "aten.topk": [(F, "{k = 2}"), (F, "{k = 2, dim = 0, largest = false}")],
    "aten.sort": [(F, "{descending = true}")], "aten.argsort": [(F, "{dim = 0, stable = true}")],
    "aten.sym_size": [(F, "{dim = 0}")], "aten.sym_numel": [(F, "")],
    "aten.scalar_tensor": [("index", "{dtype = i64}"), ("", "{s = 2.5}")],
    "sym.const": [("", "{value = 2*T}")], "sym.add": [("index", "{b = 3}")], "sym.sub": [("index, index", "")],
    "sym.mul": [("", "{a = T, b = 4}")], "sym.floordiv": [("index", "{b = 2}")],
    "kernel.call": [("f32[T, 4], f32[4, 5]", "{op = \"aten.mm\", template = \"gemm\", variant = \"v0\", "
                                             "target = \"cpu\"}")],
    "stream.record": [("", "{stream = 0}")], "stream.wait": [("event", "{stream = 0}")],
}
for _n in ("zeros", "ones", "empty"):
    SAMPLES[f"aten.{_n}"] = [("", "{size = [T, 3]}")]
    SAMPLES[f"aten.{_n}_like"] = [(F, "{dtype = bf16}")]
    SAMPLES[f"aten.new_{_n}"] = [(F, "{size = [2, T]}")]
for _fam, _names in _UNARY.items():
    for _n in _names:
        if _n == "bitwise_not":
            SAMPLES.setdefault(f"aten.{_n}", [(I, ""), ("bool[T]", "")])
        elif _n == "logical_not":
            SAMPLES.setdefault(f"aten.{_n}", [("bool[T]", ""), (F, "")])
        else:
            SAMPLES.setdefault(f"aten.{_n}", [(F, ""), ("bf16[T]", "")] + ([(I, "")] if _fam != "float_only" else []))
for _n in _BINARY:
    if _n.startswith(("bitwise", "logical")):
        SAMPLES.setdefault(f"aten.{_n}", [(f"{I}, i64[4]", ""), ("i32[T], i64[]", "")])
    elif _n != "pow":
        SAMPLES.setdefault(f"aten.{_n}", [(f"{F}, f32[4]", ""), (f"{I}, bf16[T, 1]", "")] +
                           ([(F, "{other = 2}"), (I, "{other = 1.5}")] if "other" in _BINARY[_n][0].split("|")[-1]
                            and "Scalar" in _BINARY[_n][0] else []))
for _n in ("clone", "alias", "detach", "contiguous"):
    SAMPLES[f"aten.{_n}"] = [(F, "")]


def _inputs(types, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in types:
        if not isinstance(t, TensorType):
            out.append(3 if str(t) == "index" else Event(1))
            continue
        shape = [d if isinstance(d, int) else d.evaluate({"T": 3}) for d in t.shape]
        if t.dtype.is_float:
            out.append(torch.randn(shape, generator=g).to(t.dtype.torch))
        elif t.dtype.name == "bool":
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 2, shape, generator=g).to(t.dtype.torch))
    return out


def _split_types(text):
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [parse_type(t) for t in out + [cur.strip()] if t]


def _build(name, types_text, attrs_text):
    """f(operands..., %t: f32[T]) -> results; %t only binds T for ops that take no tensor."""
    types = _split_types(types_text) + [tensor("f32", "T")]
    attrs = Parser(attrs_text).attr_dict() if attrs_text else {}
    m = Module()
    f = m.add_function("f", [(f"a{i}", t) for i, t in enumerate(types)])
    b = Builder(f)
    args = f.args[:-1]
    inferred = get(name).infer(args, attrs)
    fresh = (sym(f"N{i}") for i in itertools.count())
    rtypes = [TensorType(t.dtype, tuple(next(fresh) if d is ANY else d for d in t.shape))
              if isinstance(t, TensorType) else t for t in inferred]
    out = b.op(name, *args, result_types=rtypes, **attrs)
    outs = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    b.ret(*outs)
    return m, types


CASES = [(name, i, s) for name in sorted(SAMPLES) for i, s in enumerate(SAMPLES[name])]


@pytest.mark.parametrize("name, i, sample", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_shape_rule_matches_reference(name, i, sample):
    m, types = _build(name, *sample)
    verify(m)
    outs = interpret(m, "f", _inputs(types, seed=i))  # checks dtypes and shapes of every result
    assert len(outs) == len(m.functions["f"].returns)
    op = m.functions["f"].ops[0]
    cost = get(op.name).cost(op.operands, op.attrs, [r.type for r in op.results])
    assert cost.flops is not None and cost.bytes is not None


def test_every_registered_core_op_has_a_sample():
    # dsv41.* domain ops (ir/ops_dsv41.py) are sampled by that file's own tests.
    core = {n for n in all_ops() if n.split(".")[0] in ("aten", "sym", "kernel", "stream")}
    assert sorted(core - set(SAMPLES)) == []


def test_costs_are_symbolic():
    m, _ = _build("aten.mm", "bf16[T, 5120], bf16[5120, 1280]", "")
    op = m.functions["f"].ops[0]
    cost = get("aten.mm").cost(op.operands, op.attrs, [op.results[0].type])
    T = sym("T")
    assert cost.flops == 2 * T * 5120 * 1280
    assert cost.bytes == 2 * (T * 5120 + 5120 * 1280 + T * 1280)
    v = get("aten.view").cost([Value(tensor("f32", "T", 4))], {"size": (-1,)}, [tensor("f32", "4*T")])
    assert (v.flops, v.bytes) == (0, 0)


def test_side_effects_are_marked():
    assert get("stream.record").has_side_effects and get("stream.wait").has_side_effects
    assert not get("aten.add").has_side_effects and not get("aten.index_put").has_side_effects


ARITH = [d for d in DTYPES.values() if d.category != "quant" and d.name != "u8"]


@pytest.mark.parametrize("a, b", list(itertools.product(ARITH, ARITH)))
def test_promotion_matches_torch(a, b):
    for ra, rb in ((1, 1), (1, 0), (0, 1)):
        x = torch.zeros((2,) * ra, dtype=a.torch)
        y = torch.zeros((2,) * rb, dtype=b.torch)
        want = torch.result_type(x, y)
        got = result_dtype(TensorType(a, (2,) * ra), TensorType(b, (2,) * rb))
        assert got.torch == want, (a, b, ra, rb)
    for s in (True, 3, 2.5):
        assert result_dtype(TensorType(a, (2,)), s).torch == torch.result_type(torch.zeros(2, dtype=a.torch), s)
