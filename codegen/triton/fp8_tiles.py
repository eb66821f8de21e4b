"""The FP8 linears' decode plan: tile shapes, K splits, weight decoder and the activation's k order, per shape and
device (host side; fp8_gemm.py's `_gemm` asks, the ahead-of-time variants ask the same with the target's traits).

- `_split_k`: the largest K split whose grid still fits ONE wave of the GPU's resident program slots
  (DECODE_PROGRAMS_PER_SM × SMs), at least MIN_SPLIT_STEPS k tiles a split; splits need not divide K/BK.
- `_decode_tile`: the M <= 16 tensor-core tile: on sm90 (`mma_sync_decode_for`) with the per-element decoder,
  2 warps and 32 weight rows so that Triton emits mma.sync; else 4 warps, 64 rows (wgmma).
- `_tiles`: (BM, BN, BK, GROUP_M, SPLIT_K, num_warps, num_stages) for any M.
- `_decode_w`: the weight decoder, 0 (per element) or 1 (bf16x2 words, from DECODE_W_MIN_WEIGHTS weights on);
  `k_order_w` / `permute_k_w` / `_decoder_x`: the activation column order decoder 1 needs.
- `_stack`, `_spf`: the gated linear's stacked tile and the k loop's scale prefetch defaults.
- `_check_w`, `_byte_distance`: the launchers' checks of the weight tensors.
Every default cites its measurement in the comment above it.
"""
from __future__ import annotations

import torch
import triton

from dsv41c.codegen.triton.targets import N_SMS_HINT, interpreting, ptx_for


# Resident programs per SM of each decode kernel on sm90 (Triton 3.6): the gemv 63 registers × 128 threads with
# its segment sums (GEMV_SEG 16; 122 with one accumulator per element: 4 an SM) -> 8; the tensor-core decode tile
# of 2 warps (BN 32, mma.sync on sm90, `_decode_tile`) 95 registers (-> 10 an SM; Triton 3.6 SASS) and, at the
# JIT's 3 stages, 16.5 KB of shared memory (two buffers; Triton 3.9 metadata), gated 24.7 KB (-> 9), where the
# splits are planned for 10 and 6 (H200, tuning/tune_fp8_mma_conf.json, each twice, L2-cold: wo_b 19.4-19.8 µs at
# 10 (split 8), 20.3-20.4 at 8 (split 6), 20.9-21.1 at 9 (split 7); shared w2 the other way, 10.3-10.4 / 9.7-9.9 /
# 11.4-11.5; wq_a capped at 20 splits either way; shared w13 14.1-14.2 at 6 (split 11), 14.5-14.9 at 5, 16.1 at 7):
# 10, one wave for wo_b. The 4-warp tile (BN 64, wgmma; the word decoder's): 95 registers and 41 KB -> 5, gated
# 66 KB -> 3 (at 4 cp.async stages; `_tiles` runs 3, smaller, and keeps these splits,
# the ones its stage sweep was timed at).
# The stacked gated tile (GATED 2, `_stack`) is the 2-warp tile over 2N rows; its split is planned for 8 an SM, which
# at the shared w1/w3's width is 7 splits (tuning/tune_fp8_stack*.json, L2-cold: 13.0-13.2 µs over three runs at 7,
# 13.5 at 8, 14.0-14.1 at 6, 14.2-14.7 at 9 = the plain tile's 10 an SM).
DECODE_PROGRAMS_PER_SM = {"gemv": 8, "mma": 10, "mma_gated": 6, "mma_stacked": 8, "mma_4w": 5, "mma_4w_gated": 3}

MIN_SPLIT_STEPS = 2  # k tiles per split at least: below it the partials' round trip costs more than it spreads

DECODE_BK = 128  # decode (M <= 16) k tile

FOLD_SPLIT_K = True  # split-K epilogue by the last-arriving program (one launch) rather than a reduce kernel


# weight decoder of the M <= 16 tensor-core path on CUDA (0: per element via fp32; 1: bf16x2 words). H200,
# L2-cold graph replay (tuning/tune_fp8_prefetch.json): the words decoder wins only where the
# decode's issue time dominates, the largest linear: engram wkv (25600×6144) at 8 tokens 63.4 vs 73.5 µs; it
# loses on the others (wo_b 31.3 vs 25.2, wq_a 18.3 vs 9.0, shared w2 18.6 vs 10.9, shared w13 29.8 vs 20.0 µs:
# the host-side permutation of x is one more launch, and the scale scan adds a round trip). So it is the
# default from DECODE_W_MIN_WEIGHTS weight elements on (engram wkv; mtp_main_proj, 79 M, stays per element).
DECODE_W_CUDA = 1

DECODE_W_MIN_WEIGHTS = 100_000_000


# the tensor-core k loop loads the next k tile's scale bytes one iteration ahead (`_mma_k_loop`'s SPF), except in
# the gated decode tile. H200, 8 tokens, L2-cold graph replay, each twice, interleaved (tuning/tune_fp8_spf.json):
# wo_b 19.2-19.3 -> 17.4-17.5 µs, shared w2 10.3-10.5 -> 9.4-9.6, wq_a 8.6-8.8 -> 8.8-9.0, engram wkv 55.5-55.6 ->
# 55.1-55.3 (wq_a within its spread; it keeps the prefetch); but the gated shared w1/w3 14.6 -> 16.6-16.7 (the same
# 128 registers in its sm90 SASS; why it loses was not profiled), so `_spf` leaves it off there.
SCALE_PREFETCH = True


# The gated linear's 2-warp decode tile (sm90): stacked (GATED 2: 16 rows of w1 and the same 16 of w3 in one 32-row
# tile, one dot, planned as a linear of 2N rows) rather than paired (GATED 1: 32 rows of each, two dots, 24.7 KB of
# shared memory and 6 programs an SM). Static sm90 SASS (Triton 3.9): 381 instructions a k step for 32 weight rows
# (the plain tile: 362) against 664 for 64; 16.9 KB. H200, 8 tokens, L2-cold graph replay, interleaved
# (tuning/tune_fp8_stack*.json): paired 14.3-14.8 µs (its split 11; 13.9 at 7), stacked 13.0-13.2 at 7 splits.
STACK_GATED_DECODE = True


def _stack(stack, gated: bool, M: int, words: bool, mma_sync: bool, name: str = "fp8_gemm") -> bool:
    """Whether the gated mma path runs the stacked tile: explicit stack, else STACK_GATED_DECODE for M <= 16 where the
    2-warp tile runs (`mma_sync_decode_for`: the only chip it was measured on); never with the word decoder
    (DECODE_W 1) or without w3."""
    if stack is None:
        return gated and not words and M <= 16 and mma_sync and STACK_GATED_DECODE
    if stack and (not gated or words):
        raise ValueError(f"{name}: stack=True needs the gated linear (w3) and no word decoder (decode_w 0 or 2)")
    return bool(stack)


def _byte_distance(b: torch.Tensor, a: torch.Tensor, multiple: int, name: str) -> int:
    """b's first byte minus a's (the stacked tile addresses W3 from W's pointer); must be a multiple of `multiple`."""
    d = b.data_ptr() - a.data_ptr()
    if d % multiple:
        raise ValueError(f"{name}: w1 and w3 start {d} bytes apart, not a multiple of {multiple} (stacked tile)")
    return d


def _spf(spf, decode: bool, gated: bool) -> bool:
    """The k loop's scale prefetch: explicit spf, else SCALE_PREFETCH except for the paired gated decode tile (M <= 16;
    the launcher passes gated False for the stacked one)."""
    if spf is not None:
        return bool(spf)
    return SCALE_PREFETCH and not (gated and decode)


def pair_order(BK: int) -> torch.Tensor:
    """perm [BK] (int64) of the word decoders that emit two 16-bit halves per 32-bit word, byte/nibble
    pair by pair: original k = 4m + 2h + P (m = q·BK/16 + s) -> logical P·BK/2 + 2(4s + q) + h. The E4M3
    word decoder (k_order_w) and fp4_unpack's DECODE 1 (bytes of nibble pairs) share it."""
    return torch.arange(BK).view(4, BK // 16, 2, 2).permute(3, 1, 0, 2).reshape(BK)


def k_order_w(BK: int) -> torch.Tensor:
    """perm [BK]: logical column j of a BK block of the DECODE_W 1 tile is original column perm[j]."""
    if BK % 32:
        raise ValueError(f"DECODE_W 1 needs BK % 32 == 0, got {BK}")
    return pair_order(BK)

_ORDERS: dict = {}


def permute_blocks(x: torch.Tensor, BK: int, key, make_order) -> torch.Tensor:
    """x [..., K] -> each BK block of columns gathered by the [BK] permutation make_order() (cached per
    key and device; a contiguous copy). Shared by the FP8 and FP4 word decoders' activation orders."""
    K = x.shape[-1]
    if K % BK:
        raise ValueError(f"permute_blocks: K={K} is not a multiple of BK={BK} ({key})")
    ck = (key, BK, str(x.device))
    if ck not in _ORDERS:
        _ORDERS[ck] = make_order().to(x.device)
    return x.reshape(*x.shape[:-1], K // BK, BK).index_select(-1, _ORDERS[ck]).reshape(x.shape)


def permute_k_w(x: torch.Tensor, BK: int) -> torch.Tensor:
    """x [..., K] -> the same values with each BK block of columns in k_order_w(BK) (contiguous copy)."""
    return permute_blocks(x, BK, "e4m3_words", lambda: k_order_w(BK))


def _decoder_x(x2: torch.Tensor, dw: int, BK: int) -> torch.Tensor:
    """x's columns in the order the weight decoder's tile comes in: k_order_w for the word decoder (DECODE_W 1),
    natural for the per-element and the pair decoders (0, 2)."""
    return permute_k_w(x2, BK) if dw == 1 else x2


def _decode_w(decode_w, M: int, N: int, K: int, BK: int, device) -> int:
    """The mma path's weight decoder: explicit 0/1, or None = DECODE_W_CUDA for M <= 16 on CUDA where K tiles and
    the weight has at least DECODE_W_MIN_WEIGHTS elements, else 0."""
    if decode_w is None:
        if ptx_for(device) and M <= 16 and K % BK == 0 and BK % 32 == 0 and N * K >= DECODE_W_MIN_WEIGHTS:
            return DECODE_W_CUDA
        return 0
    if decode_w not in (0, 1):
        raise ValueError(f"decode_w: 0 or 1, got {decode_w!r}")
    if decode_w == 1 and (K % BK or BK % 32):
        raise ValueError(f"decode_w=1 needs K % BK == 0 and BK % 32 == 0 (K={K}, BK={BK})")
    return int(decode_w)


def _split_k(M: int, N: int, K: int, BN: int, BK: int, per_sm: int, sms: int = N_SMS_HINT) -> int:
    """Decode: the largest K split whose grid still fits the GPU's resident program slots in ONE wave
    (per_sm programs on each of `sms` SMs), with at least MIN_SPLIT_STEPS k tiles per split; splits need not
    divide K/BK (`split_bounds`). H200, L2-cold graph replay (tuning/tune_fp8_split.json): a grid that fills one wave
    beats both
    the earlier ~2 programs per SM (wo_b one token 18.7 -> 15.7 µs, shared w13 one token 15.2 -> 11.4 µs,
    wo_b 8 tokens 25.3 -> 21.6 µs) and a grid that spills past the 528 slots (wo_b one token: 480 programs
    15.7 µs, 640 programs 19.4 µs; Nsight Compute: 320 programs kept 2.4 of 16 warps per scheduler, DRAM 45 %)."""
    if M > 16 or K % BK:
        return 1
    steps, progs = K // BK, triton.cdiv(N, BN)
    return max(1, min(per_sm * sms // progs, steps // MIN_SPLIT_STEPS))


def _decode_tile(gated: bool, words: bool, mma_sync: bool, stacked: bool = False) -> tuple:
    """(BN, num_warps, DECODE_PROGRAMS_PER_SM key) of the M <= 16 tensor-core tile.

    mma_sync (sm90: `mma_sync_decode_for`) and the per-element decoder (words False): 2 warps and 32 weight rows,
    so that Triton emits mma.sync instead of wgmma. The 4-warp tile's wgmma (64 rows) waited for each of its 8
    MMAs per k step and read its weight bytes from shared memory 16 bits at a time (sm90 SASS, Triton 3.6: HGMMA
    + WARPGROUP.DEPBAR per MMA, LDS.U16; at 2 warps HMMA.16816 and LDS.64). H200, 8 tokens, L2-cold graph replay
    (tuning/tune_fp8_mma_sync.json, interleaved with the 4-warp default): wo_b 20.3 -> 19.4-20.2 µs, shared w2
    11.0 -> 9.6-10.5, wq_a 9.1 -> 8.4-8.7, shared w13 18.0 -> 14.3 (at one wave of its resident programs). The
    word decoder (DECODE_W 1: engram wkv) keeps 4 warps: 55.7-56.1 µs against 58.2-75.4 at 1-2 warps. Elsewhere
    (sm80, sm100, ROCm, the interpreter) the 4-warp tile stays: the 2-warp one was not measured there.
    stacked: the gated linear's stacked tile (GATED 2, `_stack`), the 2-warp tile with its own split plan."""
    if words or not mma_sync:
        return 64, 4, "mma_4w_gated" if gated else "mma_4w"
    if stacked:
        return 32, 2, "mma_stacked"
    return 32, 2, "mma_gated" if gated else "mma"


def _tiles(M: int, N: int, K: int, gated: bool = False, sms: int = N_SMS_HINT, words: bool = False,
           mma_sync: bool = False, stacked: bool = False):
    """(BM, BN, BK, GROUP_M, SPLIT_K, num_warps, num_stages) for a shape on the running device (words: the
    word decoder DECODE_W 1 will run; mma_sync: `mma_sync_decode_for` the device; stacked: the stacked gated tile,
    N then is its 2N weight rows; all three only shape M <= 16)."""
    if interpreting():
        return 16, 32, 64, 4, (2 if K % 128 == 0 and M <= 16 else 1), 4, 1
    if M <= 16:  # H200 sweep (benchmarks/tune_fp8_decode.py): BK 128 beat 256 on every decode linear;
        # 3 cp.async stages, not 4 (tuning/tune_fp8_stages_ns3.json, 8 tokens, L2-cold, each timed twice):
        # engram wkv 61.7 -> 55.0 µs, wo_b 21.1 -> 20.4, shared w13 18.5 -> 18.1, shared w2 / wq_a equal
        BN, nw, kind = _decode_tile(gated, words, mma_sync, stacked)
        return 16, BN, DECODE_BK, 1, _split_k(M, N, K, BN, DECODE_BK, DECODE_PROGRAMS_PER_SM[kind], sms), nw, 3
    if M <= 64:
        return 64, 128, 128, 8, 1, 4, 3
    return 128, 128, 64, 8, 1, 8, 3


def _check_w(w, scale, K, name):
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"{name}: weight {tuple(w.shape)} does not match K={K}")
    want = (triton.cdiv(w.shape[0], 32), triton.cdiv(K, 32))
    if tuple(scale.shape) != want:
        raise ValueError(f"{name}: scale {tuple(scale.shape)} != {want} (32×32 blocks of {tuple(w.shape)})")
