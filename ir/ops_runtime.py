"""Ops for sizes, kernels and streams: `sym.*`/`aten.sym_size`, `kernel.call`, `stream.*`.

- Sizes: `aten.sym_size(%x) {dim}` / `aten.sym_numel` give an `index` (torch.export's
  SymInt nodes); `sym.const {value = T*64}` and `sym.add/sub/mul/floordiv` do size
  arithmetic (each operand an `index` value or a `Dim` attribute). `fold-shapes` turns
  them into dims of the ops that use them.
- `kernel.call(%a, %b) {template, variant, target[, op], key.K = ...}` is what specialize-kernels
  leaves: a launch of a codegen template variant for one target, its specialization keys as
  `key.*` attributes. With `op = "dsv41.x"` the call stands for that registered op (the other
  attributes are that op's), so its result types and reference come from it. Without `op` the
  template's kernel contract (`ir/kernel_contracts.py`) checks the operands, gives the result
  types (the verifier compares them with the declared ones) and the reference the interpreter
  runs; a template with no contract is an error, unless a test registered a reference for it
  in `KERNEL_REFERENCES` (`register_kernel_reference`; the IR never imports codegen).
- `stream.record() {stream = 1} -> event` and `stream.wait(%e) {stream = 0}` order work
  across streams; both are `sync` (side effects: never removed, never merged). Any op may
  carry `stream = N` (a global attribute) to say which stream runs it.

Known gaps: the interpreter runs every stream in program order (which is a valid schedule).
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch

from dsv41c.ir.registry import ShapeError, get, register
from dsv41c.ir.shape_rules import need_tensor, norm_dim
from dsv41c.ir.symbolic import floordiv
from dsv41c.ir.types import EVENT, INDEX, TensorType

KERNEL_ATTRS = ("template", "variant", "target", "op")
KERNEL_REFERENCES: dict = {}


def register_kernel_reference(template: str, fn) -> None:
    """fn(*inputs, **attrs) -> tensor(s): the reference a bare kernel.call of `template` runs."""
    KERNEL_REFERENCES[template] = fn


def _index(a):
    return INDEX


def _sym_bin(fn):
    return lambda a: fn(a.a, a.b)


def _floordiv(x, y):
    if isinstance(y, int) and y <= 0:
        raise ShapeError(f"sym.floordiv by {y}")
    return floordiv(x, y) if not isinstance(x, int) or not isinstance(y, int) else x // y


register("sym.const(Dim value) -> Index", shape=_index, impl=lambda a: a.value)
register("sym.add(Index|Dim a, Index|Dim b) -> Index", shape=_index, impl=_sym_bin(lambda x, y: x + y))
register("sym.sub(Index|Dim a, Index|Dim b) -> Index", shape=_index, impl=_sym_bin(lambda x, y: x - y))
register("sym.mul(Index|Dim a, Index|Dim b) -> Index", shape=_index, impl=_sym_bin(lambda x, y: x * y))
register("sym.floordiv(Index|Dim a, Index|Dim b) -> Index", shape=_index, impl=_sym_bin(_floordiv))


def _sym_size(a):
    t = need_tensor(a.self)
    norm_dim(a.dim, t.rank)
    return INDEX


register("aten.sym_size(Tensor self, int dim) -> Index", shape=_sym_size, impl=lambda a: int(a.self.shape[a.dim]))
register("aten.sym_numel(Tensor self) -> Index", shape=lambda a: (need_tensor(a.self), INDEX)[1],
         impl=lambda a: int(a.self.numel()))
register("aten.scalar_tensor(Index|Scalar s, dtype dtype=f32) -> Tensor", shape=lambda a: TensorType(a.dtype, ()),
         impl=lambda a: torch.tensor(a.s, dtype=a.dtype))


# ---------------------------------------------------------------------------- kernels
def inner_attrs(attrs: dict) -> dict:
    return {k: v for k, v in attrs.items() if k not in KERNEL_ATTRS}


def effective(name: str, attrs: dict):
    """(OpDef, attrs) an op runs as: a kernel.call with `op` runs as that op."""
    if name == "kernel.call" and attrs.get("op"):
        return get(attrs["op"]), inner_attrs(attrs)
    return get(name), attrs


def _kernel_shape(a):
    if a.op is None:  # a template's call: its kernel contract gives (and checks) the types
        from dsv41c.ir.kernel_contracts import ContractError, check_call

        attrs = {k: v for k, v in dict.items(a) if k not in ("inputs", "template", "variant", "target", "op")}
        try:
            return check_call(a.template, list(a.inputs), attrs)
        except ContractError as e:
            raise ShapeError(str(e)) from None
    from dsv41c.ir.core import Value

    inner = get(a.op)
    attrs = inner_attrs({k: v for k, v in dict.items(a) if k != "inputs" and v is not None})
    return inner.infer([Value(t) for t in a.inputs], attrs)


def _kernel_impl(a):
    from dsv41c.ir.kernel_contracts import KEY_PREFIX, contract_of, reference_call

    if contract_of(a.template) is not None:
        return reference_call(a.template, list(a.inputs), dict(a))
    fn = KERNEL_REFERENCES.get(a.template)
    if fn is None:
        raise NotImplementedError(f"kernel.call: no reference for template '{a.template}' (give the call an `op` "
                                  "attribute, or register_kernel_reference it)")
    extra = {k: v for k, v in dict.items(a) if k not in KERNEL_ATTRS and k != "inputs" and not k.startswith(KEY_PREFIX)}
    return fn(*a.inputs, **extra)


register("kernel.call(Any[] inputs, str template, str variant, str target, str? op=none, **extra) -> Any[]",
         shape=_kernel_shape, impl=_kernel_impl)


# ---------------------------------------------------------------------------- streams
class Event:
    """The interpreter's stand-in for a recorded stream event."""

    __slots__ = ("stream",)

    def __init__(self, stream):
        self.stream = stream

    def __repr__(self):
        return f"<event on stream {self.stream}>"


register("stream.record(int stream) -> Event", shape=lambda a: EVENT, impl=lambda a: Event(a.stream), sync=True)
register("stream.wait(Event event, int stream) -> ()", shape=lambda a: (), impl=lambda a: None, sync=True)
