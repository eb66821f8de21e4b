"""State ops `dsv41.*`: the writes into the fixed-capacity serving state, and the packed KV formats.

- `dsv41.cache_append(%cache, %rows, %at) {ratio, name}`: a KV group's cache [C, ...] with
  `rows` [n, ...] written at rows at .. at + n - 1 (`at` a 0-d integer tensor, the entry count
  before the append, pos // ratio). Writes `cache`; result 0 is that buffer after the write.
- `dsv41.ring_append(%ring, %rows, %pos) {name}`: a layer's window ring [R, ...] with the rows of
  positions pos .. pos + n - 1 at slot p % R. Writes `ring`; result 0 is the ring after the write.
- `dsv41.kv_pack(%x) {fmt} -> (codes, scales)`, `dsv41.kv_unpack(%codes, %scales) {fmt, dtype}`:
  the packed KV formats (`dsv41c/prims/kv_pack.py`): `fp4_e4m3` (compressed KV: fp4e2m1x2
  [.., C/2] + fp8e4m3 [.., C/16]), `fp4_ue8m0` (indexer: fp4e2m1x2 [.., C/2] + e8m0 [.., C/32]),
  `fp8_ue8m0` (window KV: fp8e4m3 [.., C] + e8m0 [.., C/32]). unpack(pack(x)) is the fake
  quantizer of that format, bit for bit.

The appends are functional in form and in place in effect (registry `writes` + `updates`): a
pass may treat the result as a new value, the runtime writes the buffer it was given, and
`ir/verify_state.py` rejects a plan that reads a buffer's old value after the write replaced it.
Costs: an append moves its rows twice (read, write), not the whole buffer.
Known gaps: no capacity check at compile time (the capacity is static, the position is not: the
runtime checks each append).
"""
from __future__ import annotations

from dsv41c.ir.registry import Cost, ShapeError, register
from dsv41c.ir.shape_rules import memory_cost, need_tensor
from dsv41c.ir.types import DTYPES, TensorType, e8m0, fp4e2m1x2, fp8e4m3

_BLOCK = {"fp4_e4m3": 16, "fp4_ue8m0": 32, "fp8_ue8m0": 32}
_SCALE = {"fp4_e4m3": fp8e4m3, "fp4_ue8m0": e8m0, "fp8_ue8m0": e8m0}
_CODES = {"fp4_e4m3": fp4e2m1x2, "fp4_ue8m0": fp4e2m1x2, "fp8_ue8m0": fp8e4m3}


def _impl(name, *names):
    def impl(a):
        import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)
        from dsv41c.ir.lazy_torch import torch

        return getattr(torch.ops.dsv41, name)(*(a[n] for n in names))

    impl.__name__ = f"dsv41_{name}"
    return impl


def _append_shape(what, buf_name):
    def rule(a):
        buf, rows = need_tensor(a[buf_name]), need_tensor(a.rows)
        at = need_tensor(a.at if "at" in a else a.pos)
        if buf.rank < 1 or rows.rank != buf.rank:
            raise ShapeError(f"{what}: {buf_name} [C, ...] and rows [n, ...] of the same rank; got {buf}, {rows}")
        if rows.dtype != buf.dtype or tuple(rows.shape[1:]) != tuple(buf.shape[1:]):
            raise ShapeError(f"{what}: rows {rows} do not fit {buf_name} {buf} (same dtype and row shape)")
        if at.rank != 0 or at.dtype.category != "int":
            raise ShapeError(f"{what}: the position must be a 0-d integer tensor, got {at}")
        return buf
    return rule


def _append_cost(a, r):
    return Cost(0, 2 * need_tensor(a.rows).nbytes)


register("dsv41.cache_append(Tensor cache, Tensor rows, Tensor at, int ratio, str name) -> Tensor",
         shape=_append_shape("cache_append", "cache"), impl=_impl("cache_append", "cache", "rows", "at", "ratio", "name"),
         cost=_append_cost, writes=("cache",), updates=(("cache", 0),))
register("dsv41.ring_append(Tensor ring, Tensor rows, Tensor pos, str name) -> Tensor",
         shape=_append_shape("ring_append", "ring"), impl=_impl("ring_append", "ring", "rows", "pos", "name"),
         cost=_append_cost, writes=("ring",), updates=(("ring", 0),))


def _fmt(fmt, what):
    if fmt not in _BLOCK:
        raise ShapeError(f"{what}: unknown format {fmt!r} (known: {', '.join(_BLOCK)})")
    return _BLOCK[fmt]


def packed_types(x: TensorType, fmt: str):
    """(codes type, scales type) of x [..., C] packed in `fmt`."""
    block = _fmt(fmt, "kv_pack")
    C = x.shape[-1] if x.rank else None
    if not isinstance(C, int) or C % block or C % 2:
        raise ShapeError(f"kv_pack {{fmt = {fmt}}}: the last dim must be a static multiple of {block}, got {x}")
    lead = tuple(x.shape[:-1])
    codes = TensorType(_CODES[fmt], lead + ((C,) if fmt == "fp8_ue8m0" else (C // 2,)))
    return codes, TensorType(_SCALE[fmt], lead + (C // block,))


def _pack_shape(a):
    x = need_tensor(a.x)
    if not x.dtype.is_float:
        raise ShapeError(f"kv_pack: x must be a float tensor, got {x}")
    return packed_types(x, a.fmt)


def _unpack_shape(a):
    codes, scales = need_tensor(a.codes), need_tensor(a.scales)
    block = _fmt(a.fmt, "kv_unpack")
    C = codes.shape[-1] * (1 if a.fmt == "fp8_ue8m0" else 2) if codes.rank else None
    out = TensorType(a.dtype if not isinstance(a.dtype, str) else DTYPES[a.dtype], tuple(codes.shape[:-1]) + (C,))
    want = packed_types(out, a.fmt) if isinstance(C, int) and C % block == 0 else None
    if want is None or codes.dtype != want[0].dtype or scales != TensorType(want[1].dtype, tuple(want[1].shape)):
        raise ShapeError(f"kv_unpack {{fmt = {a.fmt}}}: codes {codes} and scales {scales} are not one packed tensor"
                         + (f" (want {want[0]} and {want[1]})" if want else ""))
    return out


register("dsv41.kv_pack(Tensor x, str fmt) -> (Tensor, Tensor)", shape=_pack_shape, impl=_impl("kv_pack", "x", "fmt"),
         cost=lambda a, r: Cost(8 * need_tensor(a.x).numel, memory_cost(a, r).bytes))
register("dsv41.kv_unpack(Tensor codes, Tensor scales, str fmt, dtype dtype) -> Tensor", shape=_unpack_shape,
         impl=_impl("kv_unpack", "codes", "scales", "fmt", "dtype"),
         cost=lambda a, r: Cost(2 * r[0].numel, memory_cost(a, r).bytes))
