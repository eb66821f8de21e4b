"""Explicit serving state of one sequence (the reference's KV caches, spec §3.2–3.4, §3.11).

Everything a prefill chunk or a decode step needs from earlier tokens, and nothing else:

- `pos` (int): tokens processed so far = the next position.
- `window[L]` per backbone layer: [min(pos, W-1), head_dim] model dtype — the last W-1
  window KV rows (post-RoPE, FP8 fake-quantized), positions pos-n .. pos-1.
- `comp_kv[g]` per KV group (keyed by its source layer id): [N_g, head_dim] model dtype —
  compressed entries, rotated at position ratio·t, FP4 fake-quantized.
- `index_k[g]` per KV group: [N_g, index_head_dim] model dtype — the entries' indexer keys.
- `buf_kv[g]`, `buf_gate[g]` per ratio>1 group: [pos mod ratio, head_dim] fp32 (fp64 in the
  float64 mode) — projected kv / gate rows of the incomplete group.
- `tokens_tail`: [≤ max_ngram-1] int64 — the last token ids (Engram look-back).
- `dspark_ctx`: [≤ W, hidden] model dtype — DSpark context rows main_norm(main_proj(taps))
  of the last W positions.

Top-k selections and candidate masks are NOT state: each query recomputes them from the
group's keys in the same forward (HF's per-forward `shared` dict). W-1 window rows suffice
because a query at p sees p-W+1..p and its own row comes from the current chunk.

`clone()` is a deep copy, used to snapshot before speculative verification (rollback =
restore the snapshot). Known gaps: one sequence (no batch); storage grows with the
sequence (no paging), which is all a reference needs.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch


@dataclass
class State:
    pos: int = 0
    window: list = field(default_factory=list)
    comp_kv: dict = field(default_factory=dict)
    index_k: dict = field(default_factory=dict)
    buf_kv: dict = field(default_factory=dict)
    buf_gate: dict = field(default_factory=dict)
    tokens_tail: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    dspark_ctx: torch.Tensor | None = None

    def n_entries(self, group: int) -> int:
        return int(self.comp_kv[group].shape[0])

    def clone(self) -> "State":
        return copy.deepcopy(self)


def new_state(n_layers: int, groups: dict, head_dim: int, index_head_dim: int, hidden: int,
              dtype: torch.dtype, acc: torch.dtype) -> State:
    """Empty state. groups: {source layer id: ratio}."""
    st = State()
    st.window = [torch.zeros(0, head_dim, dtype=dtype) for _ in range(n_layers)]
    for g, ratio in groups.items():
        st.comp_kv[g] = torch.zeros(0, head_dim, dtype=dtype)
        st.index_k[g] = torch.zeros(0, index_head_dim, dtype=dtype)
        if ratio > 1:
            st.buf_kv[g] = torch.zeros(0, head_dim, dtype=acc)
            st.buf_gate[g] = torch.zeros(0, head_dim, dtype=acc)
    st.dspark_ctx = torch.zeros(0, hidden, dtype=dtype)
    return st
