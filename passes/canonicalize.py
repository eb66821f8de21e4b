"""canonicalize: local simplifications to one canonical form, each a named rewrite.

The patterns below are applied by one driver (`passes/rewrite.py`: forward sweeps until
nothing changes); stats count each rewrite by its name. Every rewrite keeps the value
bit-exact and the result type identical (the driver checks the type), except that
`fold-add-zero` ignores the sign of zero (-0.0 + 0 is +0.0), as torch's own compilers do.
After the sweeps, ops left without uses are erased (`erased-dead`), like MLIR's greedy
driver, so a folded chain does not leave its head behind.

Rewrites: fold-view-of-view (a view of any reshape-like op: view, reshape, unsqueeze,
squeeze, flatten, expand that broadcasts nothing), fold-identity-view (view/reshape/expand/broadcast_to to the
same type), fold-identity-permute, fold-permute-of-permute, fold-identity-transpose,
fold-transpose-of-transpose, fold-identity-slice, fold-squeeze-of-unsqueeze,
fold-neg-neg, fold-mul-one, fold-div-one, fold-add-zero (add/sub of 0),
fold-to-same-dtype (to/type_as), fold-cast-roundtrip (A -> wider B -> A, where B holds
every A exactly), fold-copy (clone/alias/detach/contiguous of a value no op writes), and
drop-default-attrs (an attribute equal to its schema default is dropped).

Known gaps: no constant folding of tensor arithmetic (the IR holds no tensor constants);
`x * ones` is folded only for a ones tensor made by aten.ones/full in the same function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.attrs import attr_key
from dsv41c.ir.registry import lookup
from dsv41c.ir.ops_aten_shape import BIG
from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import Pattern, apply_patterns, erase_dead_ops, producer

VIEWS = ("aten.view", "aten.reshape")


def _identity_if_same_type(op, x):
    return [x] if x.type == op.results[0].type else None


# Ops that only reinterpret row-major data (expand only when it broadcasts nothing).
_RESHAPE_LIKE = VIEWS + ("aten.unsqueeze", "aten.squeeze", "aten.flatten", "aten.expand")


def _view_of_view(op, rw):
    inner = producer(op.operands[0], *_RESHAPE_LIKE)
    if inner is None or len(inner.operands) != 1:
        return None
    src = inner.operands[0]
    if inner.name == "aten.expand" and src.type.numel != inner.results[0].type.numel:
        return None
    op.operands[0] = src
    return True


def _identity_view(op, rw):
    if len(op.operands) != 1:  # `?` dims: fold-shapes resolves them first
        return None
    return _identity_if_same_type(op, op.operands[0])


def _norm(dims, rank):
    return [d % max(rank, 1) for d in dims]


def _identity_permute(op, rw):
    x = op.operands[0]
    if _norm(op.attrs["dims"], x.type.rank) == list(range(x.type.rank)):
        return _identity_if_same_type(op, x)
    return None


def _permute_of_permute(op, rw):
    inner = producer(op.operands[0], "aten.permute")
    if inner is None:
        return None
    rank = op.operands[0].type.rank
    p1, p2 = _norm(inner.attrs["dims"], rank), _norm(op.attrs["dims"], rank)
    op.operands[0] = inner.operands[0]
    op.attrs = {**op.attrs, "dims": tuple(p1[i] for i in p2)}
    return True


def _identity_transpose(op, rw):
    x = op.operands[0]
    r = x.type.rank
    if op.attrs["dim0"] % max(r, 1) == op.attrs["dim1"] % max(r, 1):
        return _identity_if_same_type(op, x)
    return None


def _transpose_of_transpose(op, rw):
    inner = producer(op.operands[0], "aten.transpose")
    if inner is None:
        return None
    r = op.operands[0].type.rank
    pair = {op.attrs["dim0"] % max(r, 1), op.attrs["dim1"] % max(r, 1)}
    if pair == {inner.attrs["dim0"] % max(r, 1), inner.attrs["dim1"] % max(r, 1)}:
        return _identity_if_same_type(op, inner.operands[0])
    return None


def _identity_slice(op, rw):
    if len(op.operands) != 1:
        return None
    x = op.operands[0]
    start, end, step = op.attrs.get("start"), op.attrs.get("end"), op.attrs.get("step", 1)
    size = x.type.shape[op.attrs.get("dim", 0) % max(x.type.rank, 1)]
    full_end = end is None or end == size or (isinstance(end, int) and end >= BIG)
    if start in (None, 0) and full_end and step == 1:
        return _identity_if_same_type(op, x)
    return None


def _squeeze_of_unsqueeze(op, rw):
    inner = producer(op.operands[0], "aten.unsqueeze")
    dims = op.attrs.get("dim")
    if inner is None or dims is None or len(dims) != 1:
        return None
    rank = op.operands[0].type.rank
    if dims[0] % rank == inner.attrs["dim"] % rank:
        return _identity_if_same_type(op, inner.operands[0])
    return None


def _neg_neg(op, rw):
    inner = producer(op.operands[0], "aten.neg")
    return None if inner is None else _identity_if_same_type(op, inner.operands[0])


def _is_const(v, value) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == value


def _ones_tensor(v) -> bool:
    p = producer(v, "aten.ones", "aten.ones_like", "aten.full", "aten.full_like")
    return p is not None and (p.name.startswith("aten.ones") or _is_const(p.attrs.get("fill_value"), 1))


def _mul_one(op, rw):
    a = op.operands
    if len(a) == 1 and _is_const(op.attrs.get("other"), 1):
        return _identity_if_same_type(op, a[0])
    if len(a) == 2:
        for x, y in ((a[0], a[1]), (a[1], a[0])):
            if _ones_tensor(y):
                out = _identity_if_same_type(op, x)
                if out:
                    return out
    return None


def _div_one(op, rw):
    if len(op.operands) == 1 and _is_const(op.attrs.get("other"), 1) and op.attrs.get("rounding_mode") is None:
        return _identity_if_same_type(op, op.operands[0])
    return None


def _add_zero(op, rw):
    if len(op.operands) == 1 and _is_const(op.attrs.get("other"), 0):
        return _identity_if_same_type(op, op.operands[0])
    return None


def _to_same(op, rw):
    return _identity_if_same_type(op, op.operands[0])


# (from, via) pairs where `via` holds every value of `from` exactly.
_EXACT_WIDENING = {
    ("bf16", "f32"), ("bf16", "f64"), ("f16", "f32"), ("f16", "f64"), ("f32", "f64"),
    ("fp8e4m3", "f16"), ("fp8e4m3", "bf16"), ("fp8e4m3", "f32"), ("fp8e4m3", "f64"),
    ("i8", "i32"), ("i8", "i64"), ("u8", "i32"), ("u8", "i64"), ("i32", "i64"),
    ("bool", "i8"), ("bool", "u8"), ("bool", "i32"), ("bool", "i64"),
}


def _cast_roundtrip(op, rw):
    inner = producer(op.operands[0], "aten.to")
    if inner is None:
        return None
    x = inner.operands[0]
    via = op.operands[0].type
    if (x.type.dtype.name, via.dtype.name) in _EXACT_WIDENING:
        return _identity_if_same_type(op, x)
    return None


def _copy(op, rw):
    x = op.operands[0]
    if id(x) in rw.written or id(op.results[0]) in rw.written:
        return None  # a later in-place write must hit the copy, not the original
    return _identity_if_same_type(op, x)


def _drop_defaults(op, rw):
    d = lookup(op.name)
    if d is None:
        return None
    drop = [k for k, v in op.attrs.items() if (a := d.schema.arg(k)) is not None and a.has_default
            and a.operand is None and attr_key(v) == attr_key(a.default)]
    if not drop:
        return None
    op.attrs = {k: v for k, v in op.attrs.items() if k not in drop}
    return True


PATTERNS = (
    Pattern("fold-view-of-view", VIEWS, _view_of_view),
    Pattern("fold-identity-view", VIEWS + ("aten.expand", "aten.broadcast_to"), _identity_view),
    Pattern("fold-identity-permute", ("aten.permute",), _identity_permute),
    Pattern("fold-permute-of-permute", ("aten.permute",), _permute_of_permute),
    Pattern("fold-identity-transpose", ("aten.transpose",), _identity_transpose),
    Pattern("fold-transpose-of-transpose", ("aten.transpose",), _transpose_of_transpose),
    Pattern("fold-identity-slice", ("aten.slice",), _identity_slice),
    Pattern("fold-squeeze-of-unsqueeze", ("aten.squeeze",), _squeeze_of_unsqueeze),
    Pattern("fold-neg-neg", ("aten.neg",), _neg_neg),
    Pattern("fold-mul-one", ("aten.mul",), _mul_one),
    Pattern("fold-div-one", ("aten.div",), _div_one),
    Pattern("fold-add-zero", ("aten.add", "aten.sub"), _add_zero),
    Pattern("fold-to-same-dtype", ("aten.to", "aten.type_as"), _to_same),
    Pattern("fold-cast-roundtrip", ("aten.to",), _cast_roundtrip),
    Pattern("fold-copy", ("aten.clone", "aten.alias", "aten.detach", "aten.contiguous"), _copy),
    Pattern("drop-default-attrs", ("*",), _drop_defaults),
)


@dataclass(frozen=True)
class Canonicalize(ModulePass):
    name: ClassVar[str] = "canonicalize"
    max_sweeps: int = 16

    def run(self, module) -> PassResult:
        stats: dict = {}
        for f in module.functions.values():
            local = apply_patterns(f, PATTERNS, self.max_sweeps)
            if local:
                local["erased-dead"] += sum(erase_dead_ops(f).values())
            for k, n in local.items():
                if n:
                    stats[k] = stats.get(k, 0) + n
        return PassResult(module, bool(stats), dict(sorted(stats.items())))

