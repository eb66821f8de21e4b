"""MoE in Triton: grouped FP4 expert GEMMs, combine, and the whole FFN (router in moe_router.py).

One file: the dispatched (sorted) expert path — alignment, gate/up, down and combine kernels, their launchers and
the FFN that strings them with the shared expert — shares one slot layout and one set of decoders, so its parts
change together; the decode path without dispatch is moe_decode.py.

What (spec §3.5, §3.13, §7.1):
- Router: see moe_router.py (re-exported here as `router`, `router_reference`).
- Routed experts, MXFP4 weights (E2M1 packed two per byte, low nibble = even k, one UE8M0 scale
  per 32 along k) decoded in the kernel: g = x·w1ᵀ, u = x·w3ᵀ (fp32), u = clamp(u, ±limit),
  g = min(g, limit), h = silu(g)·u·w_route (rounded to `inter_dtype`), y_slot = h·w2ᵀ (rounded
  to `partial_dtype`), y = Σ_slots y_slot (+ the shared expert) in fp32 -> x's dtype.
- Shared expert: the FP8 GEMMs of fp8_gemm.py (`fp8_gemm_swiglu`, `fp8_gemm`).
- `act_quant=True`: the dynamic per-32 FP8 fake quant of x before w1/w3 and of h before w2.

Algorithm:
- Dispatch (`moe_align`, plain torch, no host sync, CUDA-graph capturable): slots t·k+j are
  stably sorted by expert; each expert's rows are cut into tiles of BM rows; a tile table
  (expert, first row) sized for the worst case lets one launch cover every expert, and programs
  past the real tile count exit at once. Experts with no tokens get no tiles.
- Grouped GEMMs, "swap AB": the decoded weight tile [BN, BK] is the dot's left operand and the
  gathered activations xᵀ [BK, BM] the right one (wgmma's M is the weight rows, its N the
  tokens, so decode tiles of 16 tokens waste nothing). The weight tile comes from either
  `tl.dot_scaled` (Triton's own FP4 upcast; with a bf16 right operand it still lowers to a bf16
  MMA — wgmma, tcgen05 kind::f16, MFMA bf16 — on every target) or one of the bit-arithmetic
  decoders of fp4_unpack.py feeding tl.dot (`DECODE`: 0 "join" = fp4_tile_to_f32 per element,
  1 "nibbles", 2 "words": 32-bit words, one mask/shift pair places a nibble of each 16-bit half
  straight into a bf16x2 operand register, the UE8M0 scale applied by two exact bf16x2 multiplies).
  Decoders 1/2 produce the tile's columns in their own k order (fp4_unpack.k_order), so the
  activations are permuted to match instead of the weights being shuffled in the k loop: x once
  per gate/up call on the host (`permute_k`, one pass over x), h in registers before the gate/up
  kernel stores it (`permute_cols_tile`, `h_order` = the down kernel's (DECODE, BK)). Scales are
  too small for the cp.async pipeline and are prefetched one k block ahead by hand. Gate/up share
  one pass over x; the down GEMM reads h in expert order and scatters each row to its slot;
  `moe_combine_kernel` sums a token's k slots in slot order (deterministic: no atomics).
- `_default_decoder` is the one place that picks the decoder: tl.dot_scaled (decode shapes on
  sm90, everything on sm100/gfx950) reads natural order (0); CUDA otherwise 2; ROCm 0 (its bf16
  products run in float32, where a flush-to-zero of the 0.5·2^-126 intermediates is not ruled out).

Specialization keys: E (384 routed; 128 for DSpark), TOPK (6; 3), hidden 5120, inter 2304,
mode (decode: BM=16 with tl.dot_scaled on sm90; prefill: BM=128 with the bit decode), BN, BK,
DOT_SCALED, DECODE, H_BK/H_DECODE (h's k order), PTX (inline PTX allowed: CUDA), H_QUANT. K and
N are constexpr so that the ahead-of-time build knows every stride.

Measured (H200, torch 2.11 / triton 3.6; benchmarks/tuning/tune_moe_prefill.json and
kernels_ffn.json), 8192 tokens top-6 over 384 experts: decoder 2 runs gate/up in
7.0 ms and down (128×256 tiles) in 3.3 ms with router-like routing (decoder 0: 17.4 / 7.8 ms),
5.0 / 2.6 ms with 128 balanced rows per expert. The whole routed step (dispatch, x permutation,
both GEMMs, combine) is 11.0 ms routed / 8.3 ms balanced: 63% / 82% of cuBLAS bf16 bmm at the
same expert shapes in the same run, 42% / 56% of an 8192³ bf16 matmul's rate. Static evidence
for decoder 2 (triton 3.6, sm90, 128×128×128 tiles, 8 warps; `tune_moe_prefill.py --sass`): the
main loop has 670 SASS instructions for gate/up (5.2 per weight element and thread; decoder 0:
1896, 14.8, with I2FP/F2FP conversions and LDS.S8 byte loads) and 399 for down (6.2; decoder 0:
1121, 17.5), no local-memory traffic in the loop, HGMMA 64×128×16 with register A operands. On
sm100/gfx950 the next step is feeding `tl.dot_scaled` MX-format activations (the act_quant E4M3 +
UE8M0/32 codes, which are exactly MXFP8) so that it selects the native mxf8f6f4 / scaled-MFMA
instructions.

Known gaps: dispatch runs as torch ops (argsort/scatter_add/cumsum/searchsorted), not a Triton
kernel; the tile table is sized for the worst case, so prefill launches up to E idle programs;
BM-row tiles pad each expert's rows up to a multiple of BM (random routing around 128 rows per
expert wastes ~1/3 of the MMA work at BM=128); at <= moe_decode.MAX_SLOTS slots moe_experts and
moe_forward take moe_decode.py's GEMV path instead of these kernels; the shared expert is not
fused into the routed launch; x is permuted by a separate pass per gate/up call (the previous
kernel could write it in that order); moe_down called without `h_order` reorders h on the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c.codegen.triton.fp8_gemm import act_quant_fp8, fp8_gemm, fp8_gemm_swiglu
from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.codecs import fake_quant_e4m3_pow2
from dsv41c.codegen.triton.fp8_reference import act_quant_fp8_reference, fp8_gemm_reference, fp8_gemm_swiglu_reference
from dsv41c.codegen.triton.targets import as_u8, dot_f32_for, interpreting, target_traits
from dsv41c.codegen.triton.fp4_unpack import DECODERS, fp4_tile, permute_cols_tile, permute_k, unpermute_k
from dsv41c.codegen.triton import moe_decode as md
from dsv41c.codegen.triton.moe_reference import (moe_combine_reference, moe_experts_reference,  # noqa: F401
                                                moe_forward_reference, shared_expert_reference)
from dsv41c.codegen.triton.moe_router import ROUTERS, router, router_reference, routers  # noqa: F401 (re-exported)
from dsv41c.codegen.triton.streams import side_stream
from dsv41c import formats



# ============================================================================ expert kernels


@triton.jit
def _weight_rows(w_ptr, s_ptr, e64, rn, N: tl.constexpr, K: tl.constexpr, DECODE: tl.constexpr):
    """Row pointers of expert e64's rows rn: packed weights (uint32 words for DECODE 2, else bytes), scales."""
    KS: tl.constexpr = K // 32
    s_rows = s_ptr + e64 * N * KS + rn[:, None] * KS
    if DECODE == 2:
        KW: tl.constexpr = K // 8
        w_rows = w_ptr.to(tl.pointer_type(tl.uint32)) + e64 * N * KW + rn[:, None].to(tl.int64) * KW
    else:
        KH: tl.constexpr = K // 2
        w_rows = w_ptr + e64 * N * KH + rn[:, None].to(tl.int64) * KH
    return w_rows, s_rows


@triton.jit
def _scales(s_rows, k0, n_ok, K: tl.constexpr, BK: tl.constexpr):
    """UE8M0 bytes [BN, BK/32] of the k block at k0 (127 = 1.0 past K, for the prefetch after the last block)."""
    ks = k0 // 32 + tl.arange(0, BK // 32)
    return tl.load(s_rows + ks[None, :], mask=n_ok[:, None] & (ks < K // 32)[None, :], other=127)


@triton.jit
def _fp4_dot(acc, w_rows, sc, k0, n_ok, xt, BN: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr,
             DOT_SCALED: tl.constexpr, DECODE: tl.constexpr, PTX: tl.constexpr):
    """acc [BN, BM] += dequant(W[rows, k0 : k0+BK], sc) · xt [BM, BK]ᵀ (xt's columns in DECODE's k order)."""
    tl.static_assert(DECODE == 0 or not DOT_SCALED, "tl.dot_scaled reads bytes in natural k order (DECODE 0)")
    if DECODE == 2:
        wp = tl.load(w_rows + (k0 // 8 + tl.arange(0, BK // 8))[None, :], mask=n_ok[:, None], other=0)
    else:
        wp = tl.load(w_rows + (k0 // 2 + tl.arange(0, BK // 2))[None, :], mask=n_ok[:, None], other=0)
    if DOT_SCALED:
        return tl.dot_scaled(wp, sc, "e2m1", tl.trans(xt.to(tl.bfloat16)), None, "bf16", acc)
    else:
        wt = fp4_tile(wp, sc, BN, BK, DECODE, PTX, DOT_F32)
        if DOT_F32:
            return tl.dot(wt, tl.trans(xt.to(tl.float32)), acc, input_precision="ieee")
        else:
            return tl.dot(wt, tl.trans(xt.to(tl.bfloat16)), acc)


@triton.jit
def moe_gate_up_kernel(x_ptr, slots_ptr, rw_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr,
                       w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, limit, K: tl.constexpr, N: tl.constexpr,
                       TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       DOT_F32: tl.constexpr, DOT_SCALED: tl.constexpr, H_QUANT: tl.constexpr,
                       DECODE: tl.constexpr, H_BK: tl.constexpr, H_DECODE: tl.constexpr, PTX: tl.constexpr):
    """h[row] = silu(min(x·w1ᵀ, L))·clamp(x·w3ᵀ, ±L)·w_route for the BM sorted rows of one tile.

    x [T, K] has its columns in DECODE's k order; h's columns are stored in k_order(H_BK, H_DECODE)."""
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_expert_ptr + pid_t)
    if e < 0:
        return
    row0 = tl.load(tile_row_ptr + pid_t)
    row_end = tl.load(offsets_ptr + e + 1)
    rows = row0 + tl.arange(0, BM)
    r_ok = rows < row_end
    slot = tl.load(slots_ptr + rows, mask=r_ok, other=0)
    tok = (slot // TOPK).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    e64 = e.to(tl.int64)
    w1_rows, s1_rows = _weight_rows(w1_ptr, s1_ptr, e64, rn, N, K, DECODE)
    w3_rows, s3_rows = _weight_rows(w3_ptr, s3_ptr, e64, rn, N, K, DECODE)
    x_rows = x_ptr + tok[:, None] * K
    acc1 = tl.zeros((BN, BM), dtype=tl.float32)
    acc3 = tl.zeros((BN, BM), dtype=tl.float32)
    # scales are too small a load for the cp.async pipeline: prefetch them one k block ahead by hand
    sc1 = _scales(s1_rows, 0, n_ok, K, BK)
    sc3 = _scales(s3_rows, 0, n_ok, K, BK)
    for k0 in range(0, K, BK):
        sc1_next = _scales(s1_rows, k0 + BK, n_ok, K, BK)
        sc3_next = _scales(s3_rows, k0 + BK, n_ok, K, BK)
        xt = tl.load(x_rows + (k0 + tl.arange(0, BK))[None, :], mask=r_ok[:, None], other=0.0)
        acc1 = _fp4_dot(acc1, w1_rows, sc1, k0, n_ok, xt, BN, BK, DOT_F32, DOT_SCALED, DECODE, PTX)
        acc3 = _fp4_dot(acc3, w3_rows, sc3, k0, n_ok, xt, BN, BK, DOT_F32, DOT_SCALED, DECODE, PTX)
        sc1 = sc1_next
        sc3 = sc3_next
    rw = tl.load(rw_ptr + slot, mask=r_ok, other=0.0)
    g = tl.minimum(acc1, limit)
    u = tl.minimum(tl.maximum(acc3, -limit), limit)
    h = tl.trans(g / (1.0 + tl.exp(-g)) * u * rw[None, :])  # [BM, BN]
    h = h.to(h_ptr.dtype.element_ty)
    if H_QUANT:
        h = fake_quant_e4m3_pow2(h.to(tl.float32), BM, BN).to(h_ptr.dtype.element_ty)
    # the down GEMM reads h in its own k order: permute the columns here (once per tile), not there
    h = permute_cols_tile(h, BM, BN, H_BK, H_DECODE)
    tl.store(h_ptr + rows[:, None].to(tl.int64) * N + rn[None, :], h, mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_down_kernel(h_ptr, slots_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr, w2_ptr, s2_ptr, out_ptr,
                    K: tl.constexpr, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    DOT_F32: tl.constexpr, DOT_SCALED: tl.constexpr, DECODE: tl.constexpr, PTX: tl.constexpr):
    """out[slot(row)] = h[row]·w2ᵀ for the BM sorted rows of one tile.

    h is in expert order, its columns in DECODE's k order."""
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_expert_ptr + pid_t)
    if e < 0:
        return
    row0 = tl.load(tile_row_ptr + pid_t)
    row_end = tl.load(offsets_ptr + e + 1)
    rows = row0 + tl.arange(0, BM)
    r_ok = rows < row_end
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    w_rows, s_rows = _weight_rows(w2_ptr, s2_ptr, e.to(tl.int64), rn, N, K, DECODE)
    h_rows = h_ptr + rows[:, None].to(tl.int64) * K
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    sc = _scales(s_rows, 0, n_ok, K, BK)
    for k0 in range(0, K, BK):
        sc_next = _scales(s_rows, k0 + BK, n_ok, K, BK)  # prefetched by hand, as in moe_gate_up_kernel
        ht = tl.load(h_rows + (k0 + tl.arange(0, BK))[None, :], mask=r_ok[:, None], other=0.0)
        acc = _fp4_dot(acc, w_rows, sc, k0, n_ok, ht, BN, BK, DOT_F32, DOT_SCALED, DECODE, PTX)
        sc = sc_next
    slot = tl.load(slots_ptr + rows, mask=r_ok, other=0).to(tl.int64)
    tl.store(out_ptr + slot[:, None] * N + rn[None, :], tl.trans(acc).to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_combine_kernel(part_ptr, shared_ptr, y_ptr, N: tl.constexpr,
                       TOPK: tl.constexpr, BN: tl.constexpr, HAS_SHARED: tl.constexpr):
    """y[t] = Σ_j part[t·k + j] (slot order) + shared[t], fp32 -> y's dtype (all [., N] contiguous)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = cols < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(part_ptr + (t * TOPK + j) * N + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_SHARED:
        acc += tl.load(shared_ptr + t * N + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * N + cols, acc.to(y_ptr.dtype.element_ty), mask=ok)


# ============================================================================ launchers


def moe_align(topk_idx: torch.Tensor, n_experts: int, block_m: int) -> dict:
    """Expert-grouped dispatch plan for slots t·k+j (torch ops only; no host synchronization).

    sorted_slots [T·k] int32: slots stably sorted by expert; offsets [E+1] int32: the first sorted
    row of each expert; tile_expert / tile_row [n_tiles_max] int32: each BM-row tile's expert
    (-1: unused tile) and first sorted row.
    """
    T, k = topk_idx.shape
    R = T * k
    dev = topk_idx.device
    flat = topk_idx.reshape(-1).to(torch.int64)
    sorted_slots = torch.argsort(flat, stable=True).to(torch.int32)
    # scatter_add, not bincount: bincount reads the max id back to the host (a sync; breaks graph capture)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.zeros(n_experts + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(counts, 0)
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    n_max = max(1, min(R, triton.cdiv(R, block_m) + n_experts))
    t = torch.arange(n_max, device=dev)
    e = torch.searchsorted(tile_end, t, right=True).clamp(max=n_experts - 1)
    valid = t < tile_end[-1]
    row = offsets[e] + (t - (tile_end[e] - tiles[e])) * block_m
    return {"sorted_slots": sorted_slots, "offsets": offsets.to(torch.int32),
            "tile_expert": torch.where(valid, e, -1).to(torch.int32),
            "tile_row": torch.where(valid, row, 0).to(torch.int32), "block_m": block_m, "top_k": k, "T": T}


def _expert_tiles(R: int, K: int, N: int = 0):
    """(BM, BN, BK, num_warps, num_stages) for a grouped GEMM with R routed rows, reduction K, N outputs.

    From the H200 sweeps (triton 3.6): decode (grouped path, now only for > moe_decode.MAX_SLOTS
    slots or when asked) with tl.dot_scaled and 128-row weight tiles; prefill with decoder 2 at
    128×128×128 for gate/up and 128×256×128 for down (`benchmarks/tune_moe_prefill.py`, tuning/tune_moe_prefill.json:
    down 3.34 ms vs 4.18 ms at 128×128). The interpreter's BN = BK lets the gate/up kernel store h
    in the down kernel's k order. BK is halved (not below 64, what decoders 1/2 need) until it divides
    K, so narrow test widths (I = 64) compile with the same kernels as the real ones (I = 2048)."""
    if interpreting():
        return 16, 64, 64, 4, 1
    if R <= 128:
        BM, BN, BK, nw, ns = 16, 128, 128, 4, 4
    elif N >= 4096:  # the down GEMM (N = hidden 5120): wider weight tiles win (H200 sweep, decoder 2)
        BM, BN, BK, nw, ns = 128, 256, 128, 8, 3
    else:
        BM, BN, BK, nw, ns = 128, 128, 128, 8, 3
    while BK > 64 and K % BK:
        BK //= 2
    return BM, BN, BK, nw, ns


def _dot_scaled_default(R: int) -> bool:
    return R <= 128 and not interpreting()


def _default_decoder(kind: str, dot_scaled: bool) -> int:
    """THE choice of FP4 decoder (fp4_unpack.DECODERS) per target kind ("cuda", "rocm", "interpreter").

    tl.dot_scaled reads the natural k order (0). CUDA: "words" (2), ~5 SASS instructions per weight
    element in the sm90 main loop against ~15 for "join" (0). ROCm keeps "join": its bf16 multiplies
    run in float32 there, and a flush-to-zero of the 0.5·2^-126 intermediates is not ruled out."""
    if dot_scaled or kind == "rocm":
        return 0
    return 2


def _device_kind(device) -> str:
    if interpreting() or device.type != "cuda":
        return "interpreter"
    return "rocm" if torch.version.hip is not None else "cuda"


def _decode(decode, dot_scaled: bool, device, BK: int) -> int:
    d = _default_decoder(_device_kind(device), dot_scaled) if decode is None else int(decode)
    if d not in DECODERS or (dot_scaled and d) or (d and BK % 64):
        raise ValueError(f"FP4 decoder {decode!r}: one of {sorted(DECODERS)}; 0 with tl.dot_scaled; "
                         f"1/2 need BK % 64 == 0 (BK={BK})")
    return d


def _ptx_for(device) -> bool:
    """Inline PTX (the bf16x2 multiplies of decoders 1/2) compiles on CUDA only, not in the interpreter."""
    return _device_kind(device) == "cuda"


def _order(decode: int, BK: int):
    """The column order of an activation feeding a kernel with this decoder and BK (None: natural)."""
    return (decode, BK) if decode else None


def _check_experts(w, s, N, K, name, decode):
    E = w.shape[0]
    if tuple(w.shape) != (E, N, K // 2) or tuple(s.shape) != (E, N, K // 32):
        raise ValueError(f"{name}: weight {tuple(w.shape)} / scale {tuple(s.shape)} are not "
                         f"[E, {N}, {K // 2}] / [E, {N}, {K // 32}] packed MXFP4")
    if decode == 2 and w.data_ptr() % 4:
        raise ValueError(f"{name}: decoder 2 reads the packed weights as 32-bit words (4-byte alignment)")


def moe_gate_up(x, plan, topk_w, w1, s1, w3, s3, limit: float, act_quant: bool = False, inter_dtype=None,
                dot_scaled=None, tiles=None, decode=None, h_order=None, x_order=None):
    """h [T·k, I] in expert-sorted row order (rows of `plan`).

    h_order = (decoder, BK) of the down GEMM that will read h: its columns are then stored in that
    k order (fp4_unpack.k_order; None: natural order). Needs BN % BK == 0 and I % BK == 0.
    x_order: the k order x's columns are already in (None: natural); x is permuted here otherwise."""
    T, D = x.shape
    I = w1.shape[1]
    R = plan["sorted_slots"].numel()
    BM, BN, BK, nw, ns = tiles or _expert_tiles(R, D)
    ds = _dot_scaled_default(R) if dot_scaled is None else dot_scaled
    dec = _decode(decode, ds, x.device, BK)
    _check_experts(w1, s1, I, D, "moe_gate_up w1", dec)
    _check_experts(w3, s3, I, D, "moe_gate_up w3", dec)
    if BM != plan["block_m"] or D % BK:
        raise ValueError(f"moe_gate_up: tiles BM={BM}/BK={BK} do not fit plan BM={plan['block_m']} / D={D}")
    h_dec, h_bk = h_order or (0, BN)
    if h_dec and (BN % h_bk or I % h_bk):
        raise ValueError(f"moe_gate_up: h_order BK={h_bk} must divide BN={BN} and I={I}")
    inter_dtype = inter_dtype or x.dtype
    h = torch.empty(R, I, dtype=inter_dtype, device=x.device)
    if R == 0:
        return h
    if x_order is not None and (act_quant or x_order != _order(dec, BK)):
        x, x_order = unpermute_k(x, *x_order), None  # the fake quant groups 32 natural columns
    xa = act_quant_fp8(x) if act_quant else x
    if x_order is None:
        xa = permute_k(xa, BK, dec)
    grid = (plan["tile_expert"].numel(), triton.cdiv(I, BN))
    moe_gate_up_kernel[grid](xa, plan["sorted_slots"], topk_w.float().contiguous(), plan["tile_expert"],
                             plan["tile_row"], plan["offsets"], as_u8(w1), as_u8(s1), as_u8(w3), as_u8(s3), h,
                             float(limit), K=D, N=I, TOPK=plan["top_k"], BM=BM, BN=BN, BK=BK,
                             DOT_F32=dot_f32_for(xa) and not ds, DOT_SCALED=ds, H_QUANT=act_quant, DECODE=dec,
                             H_BK=h_bk, H_DECODE=h_dec, PTX=_ptx_for(x.device), num_warps=nw, num_stages=ns)
    return h


def moe_down(h, plan, w2, s2, partial_dtype=None, dot_scaled=None, tiles=None, decode=None, h_order=None):
    """Partial outputs [T·k, D] indexed by slot t·k+j; h_order: the k order h's columns are in (moe_gate_up's)."""
    R, I = h.shape
    D = w2.shape[1]
    BM, BN, BK, nw, ns = tiles or _expert_tiles(R, I, D)
    ds = _dot_scaled_default(R) if dot_scaled is None else dot_scaled
    dec = _decode(decode, ds, h.device, BK)
    _check_experts(w2, s2, D, I, "moe_down w2", dec)
    if BM != plan["block_m"] or I % BK:
        raise ValueError(f"moe_down: tiles BM={BM}/BK={BK} do not fit plan BM={plan['block_m']} / I={I}")
    out = torch.empty(R, D, dtype=partial_dtype or h.dtype, device=h.device)
    if R == 0:
        return out
    if h_order != _order(dec, BK):  # h was not stored for this kernel: reorder it here (one pass over h)
        h = permute_k(unpermute_k(h, *h_order) if h_order else h, BK, dec)
    grid = (plan["tile_expert"].numel(), triton.cdiv(D, BN))
    moe_down_kernel[grid](h.contiguous(), plan["sorted_slots"], plan["tile_expert"], plan["tile_row"],
                          plan["offsets"], as_u8(w2), as_u8(s2), out, K=I, N=D, BM=BM, BN=BN, BK=BK,
                          DOT_F32=dot_f32_for(h) and not ds, DOT_SCALED=ds, DECODE=dec, PTX=_ptx_for(h.device),
                          num_warps=nw, num_stages=ns)
    return out


def _routed_partials(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit, act_quant, inter_dtype, partial_dtype,
                     dot_scaled, decode):
    """Dispatch + gate/up + down: slot outputs [T·k, D]; h is written in the down kernel's k order."""
    R, D, I = topk_idx.numel(), x.shape[1], w1.shape[1]
    t_gu, t_dn = _expert_tiles(R, D), _expert_tiles(R, I, D)
    plan = moe_align(topk_idx, w1.shape[0], t_gu[0])
    ds = _dot_scaled_default(R) if dot_scaled is None else dot_scaled
    h_order = _order(_decode(decode, ds, x.device, t_dn[2]), t_dn[2])
    if h_order and (t_gu[1] % t_dn[2] or I % t_dn[2]):
        h_order = None  # the gate/up tile cannot hold whole BK blocks: moe_down reorders h instead
    h = moe_gate_up(x, plan, topk_w, w1, s1, w3, s3, limit, act_quant, inter_dtype, ds, t_gu, decode, h_order)
    return moe_down(h, plan, w2, s2, partial_dtype, ds, t_dn, decode, h_order)


def moe_combine(partials, top_k: int, shared=None, out_dtype=torch.float32):
    """y [T, D] = Σ_j partials[t·k + j] + shared[t]."""
    R, D = partials.shape
    T = R // top_k
    y = torch.empty(T, D, dtype=out_dtype, device=partials.device)
    if T == 0:
        return y
    BN = 256 if interpreting() else 1024
    sh = shared.contiguous() if shared is not None else y
    moe_combine_kernel[(T, triton.cdiv(D, BN))](partials.contiguous(), sh, y, N=D, TOPK=top_k, BN=BN,
                                               HAS_SHARED=shared is not None, num_warps=4)
    return y


def _shared_expert(x, shared, limit, act_quant):
    sw1, ss1, sw3, ss3, sw2, ss2 = shared
    return fp8_gemm(fp8_gemm_swiglu(x, sw1, ss1, sw3, ss3, limit, act_quant), sw2, ss2, act_quant)


def _small_batch(slots: int, small_batch, dot_scaled=None, decode=None) -> bool:
    """THE dispatch between the decode path (moe_decode.py) and the grouped GEMMs: auto (None) takes the
    decode path for at most moe_decode.MAX_SLOTS routed slots (tokens × top-k) unless a grouped-GEMM decoder
    was asked for."""
    if small_batch is not None:
        return bool(small_batch)
    return dot_scaled is None and decode is None and slots <= md.MAX_SLOTS


def moe_experts(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit: float, act_quant: bool = False,
                inter_dtype=None, partial_dtype=None, compute_dtype=torch.float32, dot_scaled=None, decode=None,
                small_batch=None):
    """Routed experts only (Triton): -> Σ_j expert(x)·w, fp32 [T, D] (compute_dtype must be fp32).

    small_batch: None = auto (few slots -> moe_decode's GEMV path), True / False forces a path."""
    if compute_dtype != torch.float32:
        raise ValueError("moe_experts: the kernels accumulate in float32 only")
    if _small_batch(topk_idx.numel(), small_batch, dot_scaled, decode):
        return md.moe_experts_decode(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit, act_quant, inter_dtype,
                                     partial_dtype or x.dtype)
    part = _routed_partials(x, topk_idx, topk_w, w1, s1, w3, s3, w2, s2, limit, act_quant, inter_dtype,
                            partial_dtype or x.dtype, dot_scaled, decode)
    return moe_combine(part, topk_idx.shape[1])


# Decode: run the shared expert on a second CUDA stream, concurrently with the router and the routed
# experts' prep and gate/up kernels; the down kernel (which adds it) waits for it. On by default up to
# OVERLAP_SHARED_MAX_T tokens, from the H200 (benchmarks/tune_moe_ffn_overlap.py, CUDA-graph replay, same
# bits both ways). Two-launch router (tuning/tune_moe_ffn_overlap.json): one token 80.4 -> 76.3 µs L2-cold;
# eight tokens 406 -> 387 µs warm but 404 -> 417 µs cold. With the one-launch router (tuning/
# tune_moe_ffn_chain_fused_router.json, two repeats each): one token 78.3 -> 72.9 µs cold, eight tokens 399.8 ->
# 419.2 µs cold (407 -> 386 warm): so on at one token, off at eight.
OVERLAP_SHARED_MAX_T = 1


def moe_forward(x, gate_w, bias, w1, s1, w3, s3, w2, s2, shared, *, top_k: int, route_scale: float,
                limit: float, gate_temp: float = 1.0, bias_vl=None, image_mask=None, act_quant: bool = False,
                small_batch=None, overlap_shared=None):
    """The whole FFN in Triton kernels: router, dispatch, gate/up, down, shared expert, combine
    (small_batch as in moe_experts: few tokens take moe_decode's path).

    overlap_shared (None: on up to OVERLAP_SHARED_MAX_T tokens; CUDA, decode path, shared expert): its two
    GEMMs run on a side stream forked after x is ready, joined just before the routed down kernel, which adds
    their output; same kernels, same inputs, same bits. Memory: every side-stream use starts by waiting for
    the main stream, and the main stream waits for the side before the down kernel, so neither stream's
    allocator can hand out a block the other still reads (no record_stream needed, also under graph capture).
    That holds while each device's FFNs are called from one stream (or streams ordered with each other): the
    side stream is shared per device, like arrival.py's counters."""
    small = _small_batch(x.shape[0] * top_k, small_batch)
    side = None
    overlap = x.shape[0] <= OVERLAP_SHARED_MAX_T if overlap_shared is None else overlap_shared
    if shared is not None and small and x.is_cuda and overlap:
        side = side_stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
    sh = None
    if side is not None:
        with torch.cuda.stream(side):
            sh = _shared_expert(x, shared, limit, act_quant)
    tw, ti = router(x, gate_w, bias, top_k, route_scale, gate_temp, bias_vl, image_mask)
    if shared is not None and side is None:
        sh = _shared_expert(x, shared, limit, act_quant)
    if small:
        y = md.moe_experts_decode(x, ti, tw, w1, s1, w3, s3, w2, s2, limit, act_quant, None, x.dtype, shared=sh,
                                  out_dtype=x.dtype, shared_stream=side)
        if side is not None:  # joined before the down kernel already; again for the T = 0 early return
            torch.cuda.current_stream(x.device).wait_stream(side)
        return y
    part = _routed_partials(x, ti, tw, w1, s1, w3, s3, w2, s2, limit, act_quant, None, x.dtype, None, None)
    return moe_combine(part, top_k, sh, x.dtype)


# ============================================================================ ahead-of-time variants


def _expert_modes(tr):
    if tr["big_tiles"]:
        return {"decode": ({"BM": 16, "BN": 128, "BK": 128}, 4, 4), "prefill": ({"BM": 128, "BN": 128, "BK": 128}, 8, 3)}
    return {"decode": ({"BM": 16, "BN": 64, "BK": 128}, 4, 2), "prefill": ({"BM": 64, "BN": 64, "BK": 64}, 4, 2)}


def _dot_scaled_on(tr, mode) -> bool:
    # sm90 (H200 sweep): Triton's own upcast is faster at decode, the bit-arithmetic upcast at prefill.
    # sm100 / gfx950 have MX tensor cores; with bf16 activations dot_scaled still lowers to a bf16 MMA
    # there, but it leaves the conversion to the backend that knows the chip (not measured).
    if (tr["kind"] == "cuda" and tr["arch"] >= 100) or tr["arch"] == "gfx950":
        return True
    return tr["kind"] == "cuda" and tr["arch"] == 90 and mode == "decode"


def _decoding_on(tr, mode, t) -> dict:
    """The decoder constexprs of a target/mode; the gate/up kernel stores h in the down kernel's k order."""
    ds = _dot_scaled_on(tr, mode)
    dec = _default_decoder(tr["kind"], ds)
    return {"DOT_SCALED": ds, "DECODE": dec, "PTX": tr["kind"] == "cuda",
            "H_BK": t["BK"], "H_DECODE": dec if t["BN"] % t["BK"] == 0 else 0}


def _gate_up_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    types = {"x_ptr": "*bf16", "slots_ptr": "*i32", "rw_ptr": "*fp32", "tile_expert_ptr": "*i32",
             "tile_row_ptr": "*i32", "offsets_ptr": "*i32", "w1_ptr": "*u8", "s1_ptr": "*u8", "w3_ptr": "*u8",
             "s3_ptr": "*u8", "h_ptr": "*bf16", "limit": "fp32"}
    out = []
    for name, (E, k) in routers(widths).items():
        for mode, (t, nw, ns) in _expert_modes(tr).items():
            for hq in (False, True):
                ce = {"K": widths.hidden_size, "N": widths.moe_intermediate_size, "TOPK": k, **t, "DOT_F32": False, "H_QUANT": hq,
                      **_decoding_on(tr, mode, t)}
                v = f"{name}_{mode}" + ("_aq" if hq else "")
                out.append(aot_spec(moe_gate_up_kernel, v, types, ce, nw, ns,
                                    {"router": name, "E": E, "D": widths.hidden_size, "I": widths.moe_intermediate_size, "mode": mode, **ce}))
    return out


def _down_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    types = {"h_ptr": "*bf16", "slots_ptr": "*i32", "tile_expert_ptr": "*i32", "tile_row_ptr": "*i32",
             "offsets_ptr": "*i32", "w2_ptr": "*u8", "s2_ptr": "*u8", "out_ptr": "*bf16"}
    out = []
    for mode, (t, nw, ns) in _expert_modes(tr).items():
        dc = _decoding_on(tr, mode, t)
        if tr["big_tiles"] and mode == "prefill":
            t = {**t, "BN": 256}  # as _expert_tiles for the down GEMM
        ce = {"K": widths.moe_intermediate_size, "N": widths.hidden_size, **t, "DOT_F32": False, "DOT_SCALED": dc["DOT_SCALED"],
              "DECODE": dc["DECODE"], "PTX": dc["PTX"]}
        out.append(aot_spec(moe_down_kernel, mode, types, ce, nw, ns, {"D": widths.hidden_size, "I": widths.moe_intermediate_size, "mode": mode, **ce}))
    return out


def _combine_variants(target: str, widths=PUBLISHED) -> list:
    if target_traits(target) is None:
        return []
    types = {"part_ptr": "*bf16", "shared_ptr": "*bf16", "y_ptr": "*bf16"}
    out = []
    for name, (E, k) in routers(widths).items():
        ce = {"N": widths.hidden_size, "TOPK": k, "BN": 1024, "HAS_SHARED": True}
        out.append(aot_spec(moe_combine_kernel, f"{name}_k{k}", types, ce, 4, 1, {"router": name, **ce}))
    return out


register(KernelTemplate(
    name="moe_gate_up_fp4", module=__name__,
    summary="grouped MXFP4 w1/w3 GEMM over expert-sorted rows + clamped SwiGLU × routing weight",
    keys=("router", "E", "D", "I", "K", "N", "TOPK", "mode", "BM", "BN", "BK", "DOT_SCALED", "DOT_F32", "H_QUANT",
          "DECODE", "H_BK", "H_DECODE", "PTX"),
    reference=moe_experts_reference, launch=moe_experts, specializations=_gate_up_variants))
register(KernelTemplate(
    name="moe_down_fp4", module=__name__,
    summary="grouped MXFP4 w2 GEMM over expert-sorted rows, scattered to slots",
    keys=("D", "I", "K", "N", "mode", "BM", "BN", "BK", "DOT_SCALED", "DOT_F32", "DECODE", "PTX"),
    reference=moe_experts_reference, launch=moe_experts, specializations=_down_variants))
register(KernelTemplate(
    name="moe_combine", module=__name__, summary="Σ of a token's k slot outputs (+ shared expert), fp32",
    keys=("router", "N", "TOPK", "BN", "HAS_SHARED"), reference=moe_combine_reference, launch=moe_combine,
    specializations=_combine_variants))
