"""Exact integer index scores over FP4 (E2M1 + UE8M0 per 32) queries and keys, equal to the float path.

What: the same scores as `prims.indexer.index_scores` (spec §3.4: I[s, t] = Σ_h w[s, h]·ReLU(q[s, h]·k[t])·d^-0.5,
-inf where entry t is not visible), bit for bit, with every dot product q[s, h]·k[t] that can be computed as
an integer computed as one.

Algorithm (the indexer kernel's, codegen/triton/indexer_score.py, in PyTorch):
1. Decompose each 128-channel row (a query head, a key) into FP4: per 32-channel block the UE8M0 exponent
   the quantizer picks for its values (`formats.quant_fp4_ue8m0`) and the E2M1 codes x2 (integers in
   [-12, 12]); a row whose decomposition does not give its values back exactly is off the FP4 grid.
2. Range proof per row: the codes are shifted left to the row's smallest non-zero-block exponent e_min,
   so the row is v = c·2^(e_min-1) with integer c; the row fits INT8 when every |c| <= 127.
3. For a (query head, key) pair whose two rows are on the grid and fit INT8, the dot is the integer
   A = Σ c_q·c_k (int64 matmul, |A| <= d·127² < 2^24) times 2^(eq_min+ek_min-2), applied after: exact
   when that unit is not below the dtype's smallest subnormal. Every partial sum of the float path's dot
   is then a multiple of the unit below 2^24 units, so the float path computes this same number in any
   order: the two agree bit for bit.
4. Fallback: every other pair (a row that fails the proof: "per-head fallback" for a query head,
   "whole-tile fallback" for the key tile holding a failing key; off-grid rows; a zero dot, whose
   sign the float path's summation decides) takes the float path's own dot (the same einsum call on the
   same operands), so the scores equal the float path's whatever the data.
5. The rest is the float path's arithmetic in its order: ReLU, · d^-0.5, · w, the sum over heads,
   the visibility mask.

Fallback counts, by the kernel's tiling rules (a per-head fallback counts once per (head, key tile,
block of `block_q` queries); a whole-tile fallback once per (key tile, query block)), are added to
every open `count_fallbacks()` sink: `fallback_heads`, `fallback_head_tiles`, `fallback_tiles`,
`off_grid_rows`, `pairs_integer`, `pairs_float`, `calls`.

Known gaps: the exponents are those the values imply; the kernel reads the stored exponents, which can be
one above them in a block whose largest code is 3 (both decompose the same values, so the scores agree,
but the kernel can report fewer fallbacks). The float path's dot for the fallback pairs is the full einsum,
computed once per call when any pair needs it.

On a GPU (`static`, the default there) the call reads nothing back to the host, so a decode step that
scores can be captured as a CUDA graph: every cache row is scored (the rows past the visible count are
masked to -inf at the end, as before) and the float path's dots are always computed and taken where the
integer path proves nothing. The visible entries' scores are the same numbers; the fallback pairs' float
dots come from the einsum over all N rows rather than the visible n.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch

from dsv41c import formats

_SINKS: list = []


@contextmanager
def count_fallbacks():
    """Counter of the fallback counts of every `index_scores_int8` call made inside the block."""
    c = Counter()
    _SINKS.append(c)
    try:
        yield c
    finally:
        _SINKS.remove(c)


def fp4_rows(x: torch.Tensor, block: int = 32):
    """x [..., d] -> (integer codes c [..., d] int64 with x = c·2^(e_min-1) per row, e_min [...] int64,
    on_grid [...] bool (the decomposition gives x back exactly), fits_int8 [...] bool)."""
    d = x.shape[-1]
    if d % block:
        raise ValueError(f"index_scores_int8: the head dim {d} is not a multiple of the FP4 block {block}")
    packed, ebytes = formats.quant_fp4_ue8m0(x.float(), block)
    c2 = (formats.e2m1_decode(formats.unpack_fp4(packed)) * 2).to(torch.int64)  # [..., d], in [-12, 12]
    e = ebytes.to(torch.int64) - 127  # block scale 2^e; value = c2 · 2^(e-1)
    back = torch.ldexp(c2.to(x.dtype), (e - 1).repeat_interleave(block, -1))
    on_grid = (back == x).all(-1)
    nz = c2.unflatten(-1, (-1, block)).abs().amax(-1) > 0
    big = torch.iinfo(torch.int64).max
    e_min = torch.where(nz, e, big).amin(-1)
    e_min = torch.where(e_min == big, 0, e_min)
    shift = torch.where(nz, e - e_min[..., None], 0)
    c = c2 << shift.repeat_interleave(block, -1)
    fits = c.abs().amax(-1) <= 127
    return c, e_min, on_grid, fits


# per dtype: (mantissa bits, smallest subnormal exponent, largest unit with 2^(unit + mantissa) finite)
_LIMITS = {torch.float32: (24, -149, 103), torch.float64: (53, -1074, 970)}


def _pow2(k: torch.Tensor, dtype) -> torch.Tensor:
    """2^k exactly, for k in the dtype's normal range (built from the exponent bits)."""
    if dtype == torch.float32:
        return ((k + 127) << 23).to(torch.int32).view(torch.float32)
    return ((k + 1023) << 52).to(torch.int64).view(torch.float64)


def _times_pow2(a: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """a · 2^k, exact where the result is representable (a subnormal result takes two steps, each exact)."""
    low = k < -100
    out = a * _pow2(torch.where(low, k + 32, k), a.dtype)
    return torch.where(low, out * _pow2(torch.full_like(k, -32), a.dtype), out)


def _counts(q_ok, k_ok, nvis, block_q: int, block_t: int) -> dict:
    S = q_ok.shape[0]
    n = k_ok.shape[0]
    head_tiles = tiles = 0
    for q0 in range(0, S, block_q):
        hv = int(nvis[q0:q0 + block_q].max()) if S else 0
        bad_heads = int((~q_ok[q0:q0 + block_q]).any(0).sum())
        for t0 in range(0, min(hv, n), block_t):
            if bool(k_ok[t0:t0 + block_t].all()):
                head_tiles += bad_heads
            else:
                tiles += 1
    return {"fallback_heads": int((~q_ok).sum()), "fallback_head_tiles": head_tiles, "fallback_tiles": tiles}


def index_scores_int8(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, ratio: int,
                      block_q: int = 16, block_t: int = 128, static: bool | None = None) -> torch.Tensor:
    """I [T, N], equal to `prims.indexer.index_scores(q, w, keys, positions, ratio)`; see the module docstring.
    `static` (default: on a GPU): no host read, no data-dependent shape."""
    acc = w.dtype
    d, N = q.shape[-1], keys.shape[0]
    static = q.device.type != "cpu" if static is None else static
    if static:
        n = N
    else:
        n = min(int((positions.max() + 1) // ratio), N) if positions.numel() else 0
    qa, ka = q.to(acc), keys[:n].to(acc)
    qc, qe, q_grid, q_fit = fp4_rows(qa)  # [T, h, d], [T, h]
    kc, ke, k_grid, k_fit = fp4_rows(ka)  # [n, d], [n]
    q_ok, k_ok = q_grid & q_fit, k_grid & k_fit
    unit = (qe[..., None] - 1) + (ke[None, None, :] - 1)  # [T, h, n]
    # exact integer dots, taken in float64: |A| < 2^24 is exact there, and CUDA has no int64 matmul
    A = torch.matmul(qc.flatten(0, 1).double(), kc.T.double()).to(torch.int64).unflatten(0, qc.shape[:2])
    if acc not in _LIMITS:
        raise ValueError(f"index_scores_int8: scores in {acc} are not supported (float32 or float64)")
    bits, lo, hi = _LIMITS[acc]
    exact = q_ok[..., None] & k_ok[None, None, :] & (unit >= lo) & (unit <= hi) & (A != 0)
    if d * 127 * 127 >= 2 ** bits:  # the integer sum itself might not be representable
        exact = torch.zeros_like(exact)
    dots = _times_pow2(A.to(acc), torch.where(exact, unit, 0))
    n_float = None if static else int((~exact).sum())
    if static or n_float:  # the float path's own dots where the integer path proves nothing
        dots = torch.where(exact, dots, torch.einsum("thd,nd->thn", qa, ka))
    s = dots.relu() * d**-0.5
    scores = (s * w.unsqueeze(-1)).sum(dim=1)
    if n < N:
        scores = torch.cat([scores, scores.new_full((scores.shape[0], N - n), float("-inf"))], dim=-1)
    visible = torch.arange(N, device=q.device)[None, :] < ((positions[:, None] + 1) // ratio)
    if _SINKS:
        nvis = torch.clamp((positions + 1) // ratio, max=n)
        c = _counts(q_ok, k_ok, nvis, block_q, block_t)
        c.update(off_grid_rows=int((~q_grid).sum() + (~k_grid).sum()), pairs_integer=int(exact.sum()),
                 pairs_float=int((~exact).sum()), calls=1)
        for sink in _SINKS:
            sink.update(c)
    return scores.masked_fill(~visible, float("-inf"))
