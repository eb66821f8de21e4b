"""IR types: element dtypes, tensor types with symbolic dims, and the scalar kinds.

- `DType`: the element types of the model's tensors, each with its bit width, a category
  (`float`, `int`, `bool`, or `quant` for the storage-only formats) and the torch dtype the
  interpreter stores it in. `fp4e2m1x2` is packed: one element = one byte = two FP4 values,
  so a `fp4e2m1x2[L, 256]` tensor holds 512 FP4 numbers per row; the interpreter keeps it
  as uint8 (torch's `float4_e2m1fn_x2` has no CPU kernels) and accepts either on input.
- `TensorType(dtype, shape)`: dims are ints or `SymExpr`s (`ir/symbolic.py`); printed
  `bf16[T, 5120]`, a 0-d tensor `f32[]`.
- `IndexType` (`index`): a host integer (a torch SymInt: sizes and size arithmetic).
- `EventType` (`event`): a stream event (`stream.record` makes one, `stream.wait` takes one).

Known gaps: no complex dtypes (RoPE must be written with real pairs), no unsigned types
beyond u8, no layouts/strides (every tensor is logically dense).
"""
from __future__ import annotations

from dataclasses import dataclass

from dsv41c.ir.lazy_torch import torch

from dsv41c.ir.symbolic import Dim, SymExpr, free_symbols, is_dim, product, subs


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    category: str  # "float" | "int" | "bool" | "quant" (storage-only formats: no arithmetic)
    torch_name: str

    @property
    def torch(self):
        return getattr(torch, self.torch_name)

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.category == "float"

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"DType({self.name})"


f64 = DType("f64", 64, "float", "float64")
f32 = DType("f32", 32, "float", "float32")
bf16 = DType("bf16", 16, "float", "bfloat16")
f16 = DType("f16", 16, "float", "float16")
fp8e4m3 = DType("fp8e4m3", 8, "quant", "float8_e4m3fn")
e8m0 = DType("e8m0", 8, "quant", "float8_e8m0fnu")
fp4e2m1x2 = DType("fp4e2m1x2", 8, "quant", "uint8")  # packed pair, stored as bytes
i8 = DType("i8", 8, "int", "int8")
u8 = DType("u8", 8, "int", "uint8")
i32 = DType("i32", 32, "int", "int32")
i64 = DType("i64", 64, "int", "int64")
bool_ = DType("bool", 8, "bool", "bool")

DTYPES = {d.name: d for d in (f64, f32, bf16, f16, fp8e4m3, e8m0, fp4e2m1x2, i8, u8, i32, i64, bool_)}
_FROM_TORCH: dict = {}  # built on first use: building it imports torch


def dtype_from_torch(dt) -> DType:
    if not _FROM_TORCH:
        _FROM_TORCH.update({d.torch: d for d in DTYPES.values() if d is not fp4e2m1x2})  # plain uint8 is u8
        if hasattr(torch, "float4_e2m1fn_x2"):
            _FROM_TORCH[torch.float4_e2m1fn_x2] = fp4e2m1x2
    try:
        return _FROM_TORCH[dt]
    except KeyError:
        raise TypeError(f"torch dtype {dt} has no IR dtype (supported: {', '.join(DTYPES)})") from None


def dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


class Type:
    """Base of the IR types (immutable, compared structurally)."""

    def subs(self, env: dict) -> "Type":
        return self

    def free_symbols(self) -> frozenset:
        return frozenset()


@dataclass(frozen=True)
class TensorType(Type):
    dtype: DType
    shape: tuple

    def __post_init__(self):
        shape = tuple(self.shape)
        for d in shape:
            if not is_dim(d):
                raise TypeError(f"tensor dim must be an int or a SymExpr, got {d!r}")
        object.__setattr__(self, "shape", shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return product(self.shape)

    @property
    def nbytes(self) -> Dim:
        return product(self.shape) * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dt: DType) -> "TensorType":
        return TensorType(dt, self.shape)

    def subs(self, env: dict) -> "TensorType":
        return TensorType(self.dtype, tuple(subs(d, env) for d in self.shape))

    def free_symbols(self) -> frozenset:
        out = frozenset()
        for d in self.shape:
            out |= free_symbols(d)
        return out

    def __str__(self):
        return f"{self.dtype.name}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class IndexType(Type):
    def __str__(self):
        return "index"


@dataclass(frozen=True)
class EventType(Type):
    def __str__(self):
        return "event"


INDEX = IndexType()
EVENT = EventType()


def tensor(dt, *shape) -> TensorType:
    """Shorthand: `tensor(bf16, "T", 5120)`; strings are parsed as dims."""
    from dsv41c.ir.symbolic import parse_dim

    if isinstance(dt, str):
        dt = dtype(dt)
    return TensorType(dt, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


__all__ = ["DType", "DTYPES", "dtype", "dtype_from_torch", "Type", "TensorType", "IndexType", "EventType",
           "INDEX", "EVENT", "tensor", "SymExpr", "f64", "f32", "bf16", "f16", "fp8e4m3", "e8m0", "fp4e2m1x2",
           "i8", "u8", "i32", "i64", "bool_"]
