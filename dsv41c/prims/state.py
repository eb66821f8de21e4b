"""Writes into the fixed-capacity serving state: a cache append at a row, a window ring append.

The serving state of one sequence is a set of buffers allocated once (`frontend/step.py`):
- a per-KV-group cache (compressed KV, indexer keys, or their packed codes and scales) of
  C rows, where C = ceil(max_context / ratio); the rows below the entry count (pos // ratio)
  are valid, the rest are zero and masked by every reader;
- a per-layer window ring of R = W - 1 rows: position p lives in slot p % R.

`cache_append_(cache, rows, at, ...)` writes rows [n, ...] into cache[at : at + n] in place;
`ring_append_(ring, rows, pos)` writes the rows of positions pos .. pos + n - 1 into their
slots, only the last R of them (an older row of the same call would be overwritten anyway).
Both write through a uint8 view for one-byte element types (FP8 / E8M0 / packed FP4 codes),
which torch's CPU indexing does not support directly, and return the buffer they wrote.
`ring_window_indices(positions, pos, R, W)` gives each query's window keys as rows of the
pool `cat([ring, new rows])` (-1 before position 0), the layout `sparse_attention` reads.

An append past the capacity raises `StateCapacityError` naming the buffer, its capacity and
the position: never a silent overwrite or wrap.

Device positions: the row and slot indices are made where the position lives (`index_copy_` /
index assignment), and where `at` / `pos` is a tensor on a GPU nothing is read back to the
host, so a
decode step that appends can be captured as a CUDA graph. There the capacity check is the
runtime's, made once per step from the session's host-side position (`runtime/loader.py`), and
only the shapes are checked here. `masked_rows(cache, rows, at, keep)` is the branch-free form of
"append only if": rows where `keep`, else the cache's own rows at `at` (written back unchanged).
Known gaps: one sequence (no batch axis, no paged layout).
"""
from __future__ import annotations

import torch


class StateCapacityError(ValueError):
    """A cache append that does not fit the capacity the artifact was compiled for."""


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


def _on_device(x) -> bool:
    """A position held on a GPU: reading it would stall the host (and break a graph capture)."""
    return isinstance(x, torch.Tensor) and x.device.type != "cpu"


def _row_index(at: torch.Tensor, n: int) -> torch.Tensor:
    """Rows at .. at + n - 1 of a device position, made on its device."""
    return at.reshape(()).to(torch.int64) + torch.arange(n, device=at.device)


def masked_rows(cache: torch.Tensor, rows: torch.Tensor, at, keep: torch.Tensor) -> torch.Tensor:
    """rows [n, ...] where `keep` (a bool scalar tensor), else cache[at : at + n] as it is: appending the
    result writes `rows` only if `keep`, with no branch on the host."""
    idx = _row_index(at if isinstance(at, torch.Tensor) else torch.tensor(at), rows.shape[0]).to(cache.device)
    old = _bytes(cache).index_select(0, idx)
    return torch.where(keep.reshape([1] * rows.dim()), _bytes(rows), old).view(rows.dtype)


def cache_append_(cache: torch.Tensor, rows: torch.Tensor, at, ratio: int = 1, name: str = "cache") -> torch.Tensor:
    """cache[at : at + n] = rows, in place; -> cache. `at` is the entry count before the append."""
    if rows.shape[1:] != cache.shape[1:] or rows.dtype != cache.dtype:
        raise ValueError(f"cache_append {name}: rows {rows.dtype}{list(rows.shape)} do not fit the cache "
                         f"{cache.dtype}{list(cache.shape)}")
    n, cap = int(rows.shape[0]), int(cache.shape[0])
    if not _on_device(at):  # on a GPU the runtime checked the capacity for the step (no host read here)
        a = int(at)
        if a < 0 or a + n > cap:
            raise StateCapacityError(
                f"{name}: appending {n} entr{'y' if n == 1 else 'ies'} at row {a} (tokens up to position "
                f"{(a + n) * ratio - 1}) exceeds its capacity of {cap} rows ({cap * ratio} positions at ratio "
                f"{ratio}); compile with a larger --max-context")
    if n:
        idx = _row_index(at if isinstance(at, torch.Tensor) else torch.tensor(at), n).to(cache.device)
        _bytes(cache).index_copy_(0, idx, _bytes(rows))
    return cache


def ring_append_(ring: torch.Tensor, rows: torch.Tensor, pos, name: str = "ring") -> torch.Tensor:
    """ring[(pos + i) % R] = rows[i] for the last min(n, R) rows, in place; -> ring."""
    n, R = int(rows.shape[0]), int(ring.shape[0])
    if rows.shape[1:] != ring.shape[1:] or rows.dtype != ring.dtype:
        raise ValueError(f"ring_append {name}: rows {rows.dtype}{list(rows.shape)} do not fit the ring "
                         f"{ring.dtype}{list(ring.shape)}")
    if not _on_device(pos) and int(pos) < 0:  # on a GPU the slots are made there with no host read
        raise ValueError(f"ring_append {name}: position {int(pos)} < 0")
    if isinstance(pos, torch.Tensor):
        pos = pos.reshape(()).to(device=ring.device, dtype=torch.int64)
    keep = min(n, R)
    if keep and R:
        slots = (pos + (n - keep) + torch.arange(keep, device=ring.device)) % R
        _bytes(ring)[slots] = _bytes(rows)[n - keep:]
    return ring


def ring_window_indices(positions: torch.Tensor, pos, ring_rows: int, window: int) -> torch.Tensor:
    """[T, W] rows of the pool cat([ring, new rows]) holding the window of each query (-1 before 0).

    Window key of query p: position k = p - W + 1 + i; k < pos is in ring slot k % R, k >= pos is new row
    R + (k - pos). Keys older than pos - R are never asked for (the window reaches back W - 1 = R)."""
    k = positions[:, None] - (window - 1) + torch.arange(window, device=positions.device)[None, :]
    old = k.remainder(ring_rows) if ring_rows else k
    idx = torch.where(k < pos, old, ring_rows + (k - pos))
    return torch.where(k >= 0, idx, torch.full_like(k, -1))
