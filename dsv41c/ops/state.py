"""Domain ops of the serving state: cache and ring appends, and the packed KV formats.

- `cache_append(cache, rows, at, ratio, name)`: the cache with `rows` written at rows
  [at, at + n) (a KV group's compressed KV, indexer keys, or their packed codes / scales);
- `ring_append(ring, rows, pos, name)`: the window ring with the rows of positions
  pos .. pos + n - 1 written at slot p % R;
- `kv_pack(x, fmt) -> (codes, scales)` and `kv_unpack(codes, scales, fmt, dtype)`: the packed
  KV formats of `prims/kv_pack.py` (the fake quantizers split in two).

The appends are functional in form (they return the updated buffer, so torch.export and the
IR interpreter see plain values), but they are state WRITES: the IR registers them as writing
their buffer operand, the verifier checks no one reads the old value afterwards, and the cpu
runtime runs them in place (`runtime/executor.py`, on the same prims). `name` is the state
buffer's name (`state.comp_kv.2`), carried so that an append past the capacity says which.
Known gaps: the functional eager form copies the buffer once per append (the runtime does not).
"""
from __future__ import annotations

import torch

from dsv41c.prims.kv_pack import kv_pack as _kv_pack, kv_unpack as _kv_unpack
from dsv41c.prims.state import cache_append_, ring_append_


@torch.library.custom_op("dsv41::cache_append", mutates_args=())
def cache_append(cache: torch.Tensor, rows: torch.Tensor, at: torch.Tensor, ratio: int, name: str) -> torch.Tensor:
    """cache [C, ...] with rows [n, ...] written at rows at .. at + n - 1 (an error past C)."""
    return cache_append_(cache.clone(), rows, at, ratio, name)


@cache_append.register_fake
def _(cache, rows, at, ratio, name):
    return torch.empty_like(cache)


@torch.library.custom_op("dsv41::ring_append", mutates_args=())
def ring_append(ring: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, name: str) -> torch.Tensor:
    """ring [R, ...] with rows [n, ...] of positions pos.. written at slot p % R (the last R of them)."""
    return ring_append_(ring.clone(), rows, pos, name)


@ring_append.register_fake
def _(ring, rows, pos, name):
    return torch.empty_like(ring)


@torch.library.custom_op("dsv41::kv_pack", mutates_args=())
def kv_pack(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., C] -> (codes, scales) of the packed format fmt (fp4_e4m3 | fp4_ue8m0 | fp8_ue8m0)."""
    return _kv_pack(x, fmt)


@kv_pack.register_fake
def _(x, fmt):
    from dsv41c.prims.kv_pack import block_of

    C = x.shape[-1]
    fp8 = fmt == "fp8_ue8m0"
    codes = x.new_empty(*x.shape[:-1], C if fp8 else C // 2, dtype=torch.float8_e4m3fn if fp8 else torch.uint8)
    sdt = torch.float8_e4m3fn if fmt == "fp4_e4m3" else torch.float8_e8m0fnu
    return codes, x.new_empty(*x.shape[:-1], C // block_of(fmt), dtype=sdt)


@torch.library.custom_op("dsv41::kv_unpack", mutates_args=())
def kv_unpack(codes: torch.Tensor, scales: torch.Tensor, fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """(codes, scales) of format fmt -> values [..., C] in dtype."""
    return _kv_unpack(codes, scales, fmt, dtype)


@kv_unpack.register_fake
def _(codes, scales, fmt, dtype):
    C = codes.shape[-1] * (1 if fmt == "fp8_ue8m0" else 2)
    return codes.new_empty(*codes.shape[:-1], C, dtype=dtype)
