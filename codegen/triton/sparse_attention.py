"""Sparse latent attention: sliding window ∪ selected compressed entries, with sinks and inverse RoPE.

One file: the attention kernel, its split combine (which sparse_attention_ws.py's Gluon kernel also uses), the
launcher that picks between the two, the tile decoders and the reference share one partials layout and one
numerics contract, so they change together.

What (spec §3.2, §3.12 item 12 of §6): for each query (position p, 64 heads × 512, post-RoPE)
one softmax over
- the window: the W = 128 keys at positions p-127..p (those >= 0), read from a ring of R rows at
  slot (pos % R) (+ a per-query base row, for batched decode),
- the selected compressed entries idx[s, :] (-1 = padding; + a per-query base row),
- a per-head sink logit (an extra softmax column with no value),
with K = V = the shared 512-d latent, logits `q·k · scale` (scale = 512^-0.5); then the output's
last rope_dim channels are rotated by -θ(p) (V carried key-position RoPE).
KV formats: "quant" = FP8 E4M3 + UE8M0/32 window ring and FP4 E2M1 + E4M3/16 compressed cache
(the model's native formats, dequantized in-kernel, exactly, to bf16 operands) or "bf16" both.

Algorithm (flash-decoding): a program owns one query, all H heads (the MMA rows: the heads share
every key, MQA), DV output channels and a range of key blocks of BN keys. q [64, 512] is loaded
once (the compiler stages it in shared memory for the whole key loop). Window blocks and compressed
blocks run in two loops (no format branch inside a loop). Per key block the program gathers the key
rows once and dequantizes them once into a bf16 tile [BN, 512] (`_kv_tile`; quantized tiles carry K in
units of 2^-8, folded into the logit scale and the output; on CUDA the bf16x2 decoders of kv_pairs.py, elsewhere
E4M3/E2M1 codes become fp16 bit patterns, ~6 ops a value; compressed rows load as [rows, bytes], window rows as
[rows, scale groups, 32] on the per-element path so a group's scale broadcasts). Because K = V, that one tile is both MMA operands: q·K^T over all 512 channels, then,
after the online-softmax update (m, l in fp32), P·V into the [64, DV] fp32 accumulator (P rounded
to bf16 for the P·V MMA). With DV < D the QK product runs per DV-channel slice and the program's own
slice is V (still one load and dequant per key element). Pipeline stages prefetch the next blocks'
rows into shared memory (CUDA). With one split the program applies the sink, normalizes and
inverse-rotates (pairs taken apart with tl.split, put back with tl.join); with several, partial
(m, l, acc) go to scratch and are merged (sink, inverse rotation: `_combine_tile`) either
by the last-arriving split of the query in the same launch (fuse_combine: a per-(query, channel
slice) counter from codegen/triton/arrival.py, left at zero for the next launch / graph replay) or,
the default (measured faster on the H200), by `_combine_kernel` (grid query x 64-channel x HB-head
tiles); both give the same bits. The merge takes the splits NS (<= 16) at a time, the chunk's loads
unrolled and independent so that they are in flight together: running max raised to the chunk's, the
sums rescaled, the chunk's splits added in split order element by element (for n_split <= NS the
arithmetic of a two-pass merge exactly). A loop over single splits waited a round trip a split (H200,
Nsight Compute: 10.4 µs for one query's 10 splits).
FP8/FP4 decode batches (2 <= S <= SMs / 2) on CUDA sm90+ run the warp-specialized Gluon kernel of
sparse_attention_ws.py instead (`ws`, WS_ATTENTION: a producer warpgroup dequantizes while two consumer warpgroups
multiply; 64 queries 50.4 -> 34 µs on the H200), with this file's combine; a knob of this kernel (block_n, dv, ...)
keeps this one. This kernel serves one query, prefill, bf16 KV and every other target.
Decode splits: a batch of S queries runs SMs // S key splits (at least 1), so about one program per
SM is in flight: one quantized query (DV 128, 32-key blocks on CUDA) = 4 channel slices × 20 splits of
one block, 64 queries (64-key blocks) = 128 programs.

q·K^T once (qk_once, default where DV = D): Triton gives a dot whose result feeds another dot all
warps on M (warpsPerTileV3), and with H = 64 rows = one warpgroup's wgmma M, 8 warps made both
warpgroups compute the same [64, BN] scores (QK at twice its MMA work). `_qk_part` puts the product in
a runtime branch (taken when the block has a valid key; an all-padding block skips the MMA), which
hides the chain: the warpgroups split the keys. Static sm90 SASS under triton 3.6 (per warpgroup per
key block, `benchmarks/tune_sparse_attention.py --sass`): BN 64 before 64 HGMMA.64x32x16 + 4
HGMMA.64x256x16 (QK twice the minimum), stack 792 B, 45 / 164 local-memory ops in the window /
compressed loop; after 32 + 4 (the minimum), stack 328 B. The [64, 512] fp32 accumulator alone is half
the register file (128 regs/thread at 8 warps); 32-key blocks with 3 stages cut the stack to 56 B
(BN 16: no spills, but 64x8x16 wgmmas), yet the H200 sweep (`tuning/tune_sparse_attention.json`) timed them
slower than 64-key blocks with 2 stages, which stay the batch default (BATCH_BN, BATCH_STAGES).
For DV < D the per-slice products in branches spill more (440
local-memory ops in the window loop at DV 128), so qk_once defaults off there.

Specialization keys: H (64), D (512), ROPE (64), W (128), BN (key block), DV (output channels
per program), QUANT (fp8/fp4 vs bf16), SPLIT, QK_ONCE, FUSE, NS / FHB (the fused merge's split chunk and
head tile), PAIRS / PTX (kv_pairs.py's decoders, inline PTX), LAZY (the rescale's slack), PDL, CVEC (the bytes a
thread loads along a packed FP4 row: 16, or 4 / 8 for a bank-conflict-free tile store, not timed); combine: HB, CP
(head x channel tile), NS (splits a chunk), PDL.
Variants: decode (SPLIT) and prefill, each for both KV formats: CUDA DV 512, BN 64 (FP8/FP4) or
32 (bf16: its 2-stage buffers need twice the shared memory), 8 warps, 2 stages; a quantized decode
batch (2 <= S <= SMs / 2) BATCH_BN / BATCH_STAGES; gfx950 the same with one stage; gfx942/gfx1100 (64 KB LDS:
q alone would fill it) DV 128, BN 32, one stage; one quantized decode query (decode_one): DV 128 (ONE_QUERY_DV)
with ONE_QUERY_BN (32) on CUDA, the decode variant's BN on ROCm. AOT specs keep FUSE off (the runtime launches
the combine, built for any n_split with NS 8; it has no counter buffer yet).

Measured before the qk_once / fused-combine / batch-tile change (H200, torch 2.11 / triton 3.6,
benchmarks/results/kernels_attention.json; graph replay): 64 decode queries FP8/FP4 70 µs
(was 247 µs; 9× a 7.7 µs floor), one query 25.8 µs at DV 512 (was 48 µs) and 20.6 µs at DV 128 (the
one-query default), bf16 one query 19 µs; prefill 1024 queries 0.81 ms (6.6× its floor; eager
4.8 ms). After it (same GPU, `benchmarks/tuning/tune_sparse_attention.json`, graph replay): 64 decode
queries 70.8 -> 57.9 µs with qk_once at BN 64 / 2 stages (the default); the fused combine 66 µs, BN 32 /
3 stages 70 µs (75 µs with the fused combine), BN 16 89 µs; one query unchanged at 21 µs (fused combine
25.7 µs).

Profile of the 64-query batch (H200, Nsight Compute with the L2 flushed;
tuning/ncu_attn_batch_S64.txt and, per SASS instruction, tuning/ncu_attn_batch_S64_source.txt): the main kernel 52.8 µs
and the combine 9.1 µs; one 8-warp program an SM (255 registers, 214 KB of shared memory), 24 % of issue slots,
0.35 eligible warps a scheduler; samples 26 % long scoreboard (the hottest instruction, 7 %, is a spill reload at
the top of the compressed loop: the local memory misses the L1, which the shared memory leaves small), 12 % wait,
11 % no instruction (6,000 SASS instructions), 10 % barrier; 59 % of samples in the compressed loop, 17 % in the
window loop, 24 % outside (the 128 KB partial store of each program among them); the shared-memory stores of the
dequantized tile and the loads of the raw stages run 16-32-way bank conflicts (5.4 M wavefronts against 2.6 M
ideal).

The chunked combine (H200, L2-cold graph replay; tuning/tune_sparse_attention_chunked_combine*.json,
kernels_attention.json) and 32-key blocks for one quantized query: 25.6 µs (BN 64 with the chunked combine;
28.7 with the old combine) -> 15.1-15.7 µs, against torch.compile of the reference 27.4 µs (compiled_baseline.json); bf16 one
query 22.0 -> 15.1 µs; 64 queries unchanged at 60 µs (their combine merges 2 splits; Nsight Compute, L2 flushed
before each kernel: 9.2 µs, still mostly reading 16 MB of partials).

Pair decoders, row-contiguous loads and PDL (H200, L2-cold graph replay; tuning/sparse_attention_kv_pairs/*.json,
kernels_attention.json, tuning/sparse_attention_kv_pairs/ncu_attn_batch_S64*.txt,
tuning/sparse_attention_kv_pairs/sass_triton36.json): on CUDA the quantized tiles are decoded
two values a register (kv_pairs.py: the E4M3 window by fp8_gemm's byte-pair decoder at exponent e - 8, the E2M1
rows a byte a bf16x2 fma; the same bits; static sm90 SASS of the 64-query compressed loop 2,130 -> 1,554
instructions), the compressed rows load as [rows, bytes] (the [rows, groups, 8] load gave a warp's lanes
different rows: 32-way bank conflicts on its cp.async stage, 1.05 M of the kernel's 4.96 M shared-memory
wavefronts; after: 3.73 M), and both launches use PDL (pdl.py: the combine is scheduled while the attention grid
runs). 64 queries 60.5 -> 52.1-52.8 µs, one query 15.4 -> 13.2-13.5 µs, prefill 1024 queries 0.72 -> 0.58 ms
(do_bench). The E2M1 asm's final form (each byte's own scale factor copied into both halves, one prmt a byte)
came after those timings: checked on the CPU by a model of its PTX (tests/ptx_model.py) and by ptxas, not run on a
GPU. PDL without the pair decoders made one quantized query slower (16.2 against 15.4 µs); it is on with them.
What is left (the second profile): the dequantized tile's shared-memory stores still run 16-way conflicts (its register layout,
32 channels a thread and 16 lanes a row, against the wgmma operand's 128-byte swizzle: docs/KERNELS.md), a spill
reload at the top of the compressed loop, and the wgmma waits; 27 % of the samples fall outside the loops (q's
load, the partials' store).

Tried (measured slower, not kept; H200, 64 decode queries unless noted):
- a merge of the two splits by the second to arrive, from its own registers plus the other's partial: 98 µs against
  58, 6.4 k -> 9.1 k SASS instructions, and not bit-identical to the combine kernel
  (tuning/tune_sparse_attention_reg.json).
- the fused combine (FUSE_COMBINE, selectable): 66 against 58 µs, one query 26 against 21
  (tuning/tune_sparse_attention.json).
- programs with whole keys and half the output channels (DV 256, no split, no combine: q·K repeated): 112 µs
  (tuning/tune_sparse_attention_chunked_combine_before.json; stack 848 B at BN 64 under triton 3.6, 744 under 3.9).
- the lazy rescale (LAZY, selectable): level, 53.3 against 52.3 µs; 57.7 against 57.0
  (tuning/sparse_attention_kv_pairs/blocks.json, lazy_rescale.json).
- 16 warps (4 warpgroups, 128 registers): 74-85 µs against 52; they spill.
- BN 32 / 16 and 4 / 1 splits with the pair decoders: 71.8 / 84.9 and 79.6 / 89.4 µs against 57.0
  (tuning/sparse_attention_kv_pairs/blocks.json).

Known gaps: entries selected by the indexer that also lie in the window are attended twice
(as the reference does, spec §3.4 note). Window rows are trusted to hold the right positions
(the ring must be at least W + S - 1 rows for a prefill chunk of S queries). Probabilities are
rounded to bf16 for the P·V MMA on GPUs (fp32 in the interpreter). No paging (base rows only).
UE8M0 byte 0 / 255 and E4M3 NaN are not decoded specially (the quantizers never produce them).
The fused combine's counters (arrival.counters) are per device: two fused launches must not run
concurrently on different streams. BN 64 decode batches spill (320 B stack with the pair decoders; BN 32 144 B,
22 local-memory operations per compressed block under triton 3.6: tuning/sparse_attention_kv_pairs/sass_triton36.json). The pair decoders are CUDA-only (ROCm and the interpreter
keep the per-element decoder; the interpreter tests run the E2M1 pair decoder's emulation). The AOT variants are
built with PDL off.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c import formats
from dsv41c.codegen.templates import KernelTemplate, aot_spec, register
from dsv41c.codegen.triton import sparse_attention_ws as wsk
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter
from dsv41c.codegen.triton.codecs import e4m3_decode, pow2_float, round_bf16
from dsv41c.codegen.triton.kv_pairs import e2m1_tile_pairs, e4m3_tile_pairs
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c.codegen.triton.targets import interpreting, is_rocm, ptx_for, sm_count
from dsv41c.codegen.triton.widths import PUBLISHED


@triton.jit
def _f16_bits_to_f32(h):
    """The low 16 bits of int32 h read as an fp16 bit pattern -> float32 (exact, subnormals included)."""
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _kv_tile(kv_ptr, sc_ptr, rows, valid, c0, BN: tl.constexpr, N: tl.constexpr, D: tl.constexpr,
             WIN: tl.constexpr, QUANT: tl.constexpr, UPCAST: tl.constexpr, PAIRS: tl.constexpr = False,
             PTX: tl.constexpr = False, CVEC: tl.constexpr = 16):
    """Rows [BN] x channels c0..c0+N of a KV cache -> the MMA operand [BN, N] (bf16; fp32 if UPCAST),
    natural channel order, exact; quantized caches come out in units of 2^-8.

    Quantized rows load as [rows, scale groups, bytes of a group], so a group's scale broadcasts
    along the last axis (one scale load and decode per group, not per channel). A code's exponent and
    mantissa fields are moved into an fp16 bit pattern (E4M3 -> value * 2^-8, E2M1 -> value * 2^-14,
    subnormals included): a value costs ~3 integer ops, one convert and one multiply by its group
    scale. The E4M3 bias step 2^-8 stays in the tile (the kernel folds 2^8 into the logit scale and
    the output), so every UE8M0 byte 1..254 scales without overflow; E2M1 tiles match it.
    PAIRS: the bf16x2 decoders of kv_pairs.py instead (the same values): compressed tiles by inline PTX (PTX) or
    its float32 emulation, window tiles by inline PTX only (without PTX they keep this decoder).
    CVEC < 16 (compressed rows; 8 the default, CVEC_DEFAULT): the packed row's offsets are written as
    (c // CVEC)·CVEC + c % CVEC, so Triton's axis analysis proves only CVEC-byte runs and gives a thread CVEC-byte
    vectors: at 4, a thread's decoded channels are 8 consecutive ones (one
    16-byte store) and 8 lanes cover a 64-channel block, the layout that stores into wgmma's 128-byte swizzle without
    bank conflicts (16 bytes a thread put 8 lanes on 2 of a block row's 8 chunks; tuning/sparse_attention_kv_pairs/ncu_attn_batch_S64*.txt), for
    4x the cp.async and stage-load instructions."""
    r = rows.to(tl.int64)
    if QUANT:
        r3 = r[:, None, None]
        m3 = valid[:, None, None]
        if WIN and PAIRS and PTX:  # E4M3 codes [R, N], UE8M0 bytes [R, N/32]: bf16x2 pairs
            cc = c0 + tl.arange(0, N)
            c = tl.load(kv_ptr + r[:, None] * D + cc[None, :], mask=valid[:, None], other=0)
            e = tl.load(sc_ptr + r[:, None] * (D // 32) + (c0 // 32 + tl.arange(0, N // 32))[None, :],
                        mask=valid[:, None], other=127)
            v = e4m3_tile_pairs(c, e, BN, N)
        elif WIN:  # E4M3 codes [R, D] + one UE8M0 byte per 32 channels
            g = c0 // 32 + tl.arange(0, N // 32)[None, :, None]
            c = tl.load(kv_ptr + r3 * D + g * 32 + tl.arange(0, 32)[None, None, :], mask=m3, other=0).to(tl.int32)
            e = tl.load(sc_ptr + r3 * (D // 32) + g, mask=m3, other=127).to(tl.int32)
            v = _f16_bits_to_f32(((c & 0x80) << 8) | ((c & 0x7F) << 7)) * pow2_float(e - 127)
        else:  # packed E2M1 [R, D/2] (low nibble = even channel) + one E4M3 scale per 16 channels
            # rows load as [BN, N/2] bytes: the address's contiguity along the whole row gives lanes consecutive
            # 16-byte pieces of a row; a 3-D [rows, groups, 8] load put a warp's lanes on different rows, 32-way
            # bank conflicts on the pipeline's shared-memory stage (H200 profile, tuning/sparse_attention_kv_pairs/)
            cb = tl.arange(0, N // 2)
            if CVEC < 16:  # the same offsets, written so that Triton's axis analysis proves only CVEC-byte runs
                cb = cb // CVEC * CVEC + cb % CVEC
            b = tl.load(kv_ptr + r[:, None] * (D // 2) + (c0 // 2 + cb)[None, :], mask=valid[:, None], other=0)
            cs = c0 // 16 + tl.arange(0, N // 16)
            sb = tl.load(sc_ptr + r[:, None] * (D // 16) + cs[None, :], mask=valid[:, None], other=0)
            if PAIRS:
                v = e2m1_tile_pairs(b, sb, BN, N, PTX)
            else:
                b = tl.reshape(b, (BN, N // 16, 8)).to(tl.int32)
                sc = e4m3_decode(tl.reshape(sb, (BN, N // 16, 1))) * 64.0  # 2^14 (fp16 bias step) x 2^-8 (tile unit)
                lo = _f16_bits_to_f32(((b & 7) << 9) | ((b & 8) << 12)) * sc
                hi = _f16_bits_to_f32(((b & 0x70) << 5) | ((b & 0x80) << 8)) * sc
                v = tl.join(lo, hi)  # [BN, N/16, 8, 2]: channel 16g + 2i + nibble
        v = tl.reshape(v, (BN, N))
    else:
        v = tl.load(kv_ptr + r[:, None] * D + (c0 + tl.arange(0, N))[None, :], mask=valid[:, None], other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    else:
        v = v.to(tl.bfloat16)
    return v


@triton.jit
def _load_q(q_rows, c0, N: tl.constexpr, UPCAST: tl.constexpr):
    q = tl.load(q_rows + c0 + tl.arange(0, N)[None, :])
    if UPCAST:
        q = q.to(tl.float32)
    return q


@triton.jit
def _qk_part(q, kt, has_key, H: tl.constexpr, BN: tl.constexpr, QK_ONCE: tl.constexpr):
    """q·kt^T [H, BN] (fp32). QK_ONCE: the product sits in a runtime branch (taken when the block has
    a valid key; an all-padding block's logits are masked anyway), so its result reaches the P·V dot
    only through the branch's result: Triton's MMA layout choice (warpsPerTileV3: a dot whose result
    feeds another dot gets all warps on M) then no longer sees a chained dot, and with H = 64 rows and
    8 warps the two warpgroups split the BN keys instead of both computing all of them."""
    if QK_ONCE:
        if has_key:
            qk = tl.dot(q, tl.trans(kt))
        else:
            qk = tl.zeros((H, BN), tl.float32)
    else:
        qk = tl.dot(q, tl.trans(kt))
    return qk


@triton.jit
def _attend_block(q, q_rows, kv_ptr, sc_ptr, rows, valid, cv, scale, m_i, l_i, acc, H: tl.constexpr,
                  BN: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, WIN: tl.constexpr, QUANT: tl.constexpr,
                  UPCAST: tl.constexpr, QK_ONCE: tl.constexpr, PAIRS: tl.constexpr = False, PTX: tl.constexpr = False,
                  LAZY: tl.constexpr = 0.0, CVEC: tl.constexpr = 16):
    """One key block: q·K^T over all D channels, online softmax, P·V for this program's DV channels.
    K = V (the shared latent), so each key element is loaded and dequantized once: with DV = D the
    tile is both MMA operands; with DV < D the QK product runs per DV-channel slice (each slice's
    product added separately: a product accumulating into the next would be a chained dot again) and
    slice cv is V.
    LAZY > 0 (lazy rescaling): the running max m moves only when some head's block max exceeds it by more than
    LAZY (natural-log units), so most blocks skip the [H, DV] rescale of the accumulator; the probabilities are
    then exp(logit - m) <= e^LAZY, which fp32 sums and the bf16 P operand hold at the same relative precision.
    The result is the same softmax (different roundings, not bits)."""
    has_key = tl.max(valid.to(tl.int32), axis=0) > 0
    if DV == D:
        v = _kv_tile(kv_ptr, sc_ptr, rows, valid, 0, BN, D, D, WIN, QUANT, UPCAST, PAIRS, PTX, CVEC)
        qk = _qk_part(q, v, has_key, H, BN, QK_ONCE)
    else:
        qk = tl.zeros((H, BN), tl.float32)
        if UPCAST:
            v = tl.zeros((BN, DV), tl.float32)
        else:
            v = tl.zeros((BN, DV), tl.bfloat16)
        for j in tl.static_range(D // DV):
            kj = _kv_tile(kv_ptr, sc_ptr, rows, valid, j * DV, BN, DV, D, WIN, QUANT, UPCAST, PAIRS, PTX, CVEC)
            if QK_ONCE:
                qk += _qk_part(_load_q(q_rows, j * DV, DV, UPCAST), kj, has_key, H, BN, QK_ONCE)
            else:
                qk = tl.dot(_load_q(q_rows, j * DV, DV, UPCAST), tl.trans(kj), qk)
            v = tl.where(cv == j, kj, v)
    logits = tl.where(valid[None, :], qk * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    if LAZY > 0:
        # a block whose maxima all stay within LAZY of m keeps m: no rescale (the branch skips the acc multiply)
        if tl.max((m_new > m_i + LAZY).to(tl.int32), axis=0) > 0:
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
        pr = tl.exp(logits - m_use[:, None])
        l_i = l_i + tl.sum(pr, axis=1)
        acc = tl.dot(pr.to(v.dtype), v, acc)
    else:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        pr = tl.exp(logits - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = tl.dot(pr.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _inv_rope_store(acc, o_ptrs, c0, pos, cos_ptr, sin_ptr, H: tl.constexpr, N: tl.constexpr, D: tl.constexpr,
                    ROPE: tl.constexpr):
    """Rotate the channels of acc [H, N] (natural order, channels c0..c0+N) that lie in the last ROPE
    by -θ(pos), round to bf16 and store."""
    E, O = tl.split(tl.reshape(acc, (H, N // 2, 2)))
    pairs = c0 // 2 + tl.arange(0, N // 2)
    j = pairs - (D // 2 - ROPE // 2)
    on = j >= 0
    off = pos.to(tl.int64) * (ROPE // 2) + tl.where(on, j, 0)
    c = tl.load(cos_ptr + off, mask=on, other=1.0)[None, :]
    s = tl.load(sin_ptr + off, mask=on, other=0.0)[None, :]
    eR = tl.where(on[None, :], E * c + O * s, E)
    oR = tl.where(on[None, :], O * c - E * s, O)
    out = tl.reshape(tl.join(round_bf16(eR), round_bf16(oR)), (H, N))
    tl.store(o_ptrs, out.to(o_ptrs.dtype.element_ty))


@triton.jit
def _sparse_attn_kernel(q_ptr, qpos_ptr, wkv_ptr, wsc_ptr, ckv_ptr, csc_ptr, idx_ptr, wbase_ptr, cbase_ptr,
                        sink_ptr, cos_ptr, sin_ptr, o_ptr, pm_ptr, pl_ptr, pacc_ptr, cnt_ptr,
                        R, KC, has_base, blocks_per_split, n_split, scale,
                        H: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr, W: tl.constexpr, BN: tl.constexpr,
                        DV: tl.constexpr, QUANT: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,
                        QK_ONCE: tl.constexpr = False, FUSE: tl.constexpr = False, CP: tl.constexpr = 64,
                        NS: tl.constexpr = 8, FHB: tl.constexpr = 16, PAIRS: tl.constexpr = False,
                        PTX: tl.constexpr = False, LAZY: tl.constexpr = 0.0, PDL: tl.constexpr = False,
                        CVEC: tl.constexpr = 16):
    NWB: tl.constexpr = W // BN
    # PDL (pdl.py): q, the ring and the indices may be the previous kernel's; releasing at once lets the combine
    # launch be scheduled while this grid runs (it waits for this grid's completion before it reads a partial)
    grid_wait(PDL)
    grid_release(PDL)
    s = tl.program_id(0)
    cv = tl.program_id(1)
    sp = tl.program_id(2)
    s64 = s.to(tl.int64)
    hh = tl.arange(0, H)
    p = tl.load(qpos_ptr + s)
    # has_base = 0: the base pointers alias qpos (no zero tensors to fill at decode)
    wbase = tl.load(wbase_ptr + s) * has_base
    cbase = tl.load(cbase_ptr + s) * has_base
    b0 = sp * blocks_per_split
    b1 = tl.minimum(b0 + blocks_per_split, NWB + tl.cdiv(KC, BN))
    q_rows = q_ptr + (s64 * H + hh)[:, None] * D
    q = q_rows  # placeholder when DV < D (the QK slices load their own q columns)
    if DV == D:
        q = _load_q(q_rows, 0, D, UPCAST)  # loop-invariant: loaded once, not per key block
    if QUANT:
        scale = scale * 256.0  # quantized tiles hold K = V in units of 2^-8 (exact: a power of two)
    m_i = tl.full((H,), float("-inf"), tl.float32)
    l_i = tl.zeros((H,), tl.float32)
    acc = tl.zeros((H, DV), tl.float32)
    # window keys: positions p-W+1 .. p, ring slot pos % R
    for blk in range(b0, tl.minimum(b1, NWB)):
        j = p - W + 1 + blk * BN + tl.arange(0, BN)
        valid = j >= 0
        rows = wbase + tl.where(valid, j, 0) % R
        m_i, l_i, acc = _attend_block(q, q_rows, wkv_ptr, wsc_ptr, rows, valid, cv, scale, m_i, l_i, acc,
                                      H, BN, D, DV, True, QUANT, UPCAST, QK_ONCE, PAIRS, PTX, LAZY)
    # selected compressed entries (-1 = padding; columns past KC are padding too)
    for blk in range(tl.maximum(b0, NWB), b1):
        jj = (blk - NWB) * BN + tl.arange(0, BN)
        e = tl.load(idx_ptr + s64 * KC + jj, mask=jj < KC, other=-1)
        valid = e >= 0
        rows = cbase + tl.where(valid, e, 0)
        m_i, l_i, acc = _attend_block(q, q_rows, ckv_ptr, csc_ptr, rows, valid, cv, scale, m_i, l_i, acc,
                                      H, BN, D, DV, False, QUANT, UPCAST, QK_ONCE, PAIRS, PTX, LAZY, CVEC)
    if QUANT:
        acc = acc * 256.0
    cols = cv * DV + tl.arange(0, DV)
    if SPLIT:
        st = (s64 * n_split + sp) * H + hh
        tl.store(pm_ptr + st, m_i)
        tl.store(pl_ptr + st, l_i)
        tl.store(pacc_ptr + st[:, None] * D + cols[None, :], acc)
        if FUSE:
            # the last of the query's splits (per channel slice) to arrive merges them (the same tiles,
            # split order and arithmetic as _combine_kernel: bit-identical), then zeroes the counter
            cnt = cnt_ptr + s * (D // DV) + cv
            if arrive_last(cnt, n_split):
                for hb in tl.static_range(H // FHB):
                    for cc in range(0, DV // CP):
                        _combine_tile(pm_ptr, pl_ptr, pacc_ptr, sink_ptr, cos_ptr, sin_ptr, o_ptr, s64, n_split, p,
                                      hb * FHB + tl.arange(0, FHB), cv * DV + cc * CP, H, D, ROPE, FHB, CP, NS)
                reset_counter(cnt)
    else:
        sink = tl.load(sink_ptr + hh)
        M = tl.maximum(m_i, sink)
        wgt = tl.exp(m_i - M)
        f = wgt / (l_i * wgt + tl.exp(sink - M))
        _inv_rope_store(acc * f[:, None], o_ptr + (s64 * H + hh)[:, None] * D + cols[None, :], cv * DV, p,
                        cos_ptr, sin_ptr, H, DV, D, ROPE)


@triton.jit
def _combine_tile(pm_ptr, pl_ptr, pacc_ptr, sink_ptr, cos_ptr, sin_ptr, o_ptr, s64, n_split, p, hh, c0,
                  H: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr, HB: tl.constexpr, CP: tl.constexpr,
                  NS: tl.constexpr):
    """Merge the splits' (m, l, acc) of heads hh [HB] x channels c0..c0+CP, add the sink, normalize,
    inverse-rotate, store. The splits come NS at a time: a chunk's loads are unrolled and independent, so they are
    all in flight at once (a loop over single splits waited one round trip a split: 10 µs for 10 splits of one
    query). Within a chunk the running max M is raised to the chunk's, the sums so far are rescaled and the chunk's
    splits are added in split order, element by element: with n_split <= NS this is the two-pass merge's arithmetic
    exactly, and every tile shape gives the same bits. Partials are read with .cg (L2): in the fused epilogue they
    were written by other programs of the same launch."""
    cols = c0 + tl.arange(0, CP)
    sink = tl.load(sink_ptr + hh)
    M = sink
    den = tl.full((HB,), 1.0, tl.float32)  # exp(sink - M) at M = sink
    acc = tl.zeros((HB, CP), tl.float32)
    for i0 in range(0, n_split, NS):
        ms = ()
        ls = ()
        accs = ()
        for i in tl.static_range(NS):
            ok = (hh * 0 + (i0 + i)) < n_split  # [HB]: this split exists
            st = (s64 * n_split + i0 + i) * H + hh
            ms = ms + (tl.load(pm_ptr + st, mask=ok, other=float("-inf"), cache_modifier=".cg"),)
            ls = ls + (tl.load(pl_ptr + st, mask=ok, other=0.0, cache_modifier=".cg"),)
            accs = accs + (tl.load(pacc_ptr + st[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0,
                                   cache_modifier=".cg"),)
        Mn = M
        for i in tl.static_range(NS):
            Mn = tl.maximum(Mn, ms[i])
        r = tl.exp(M - Mn)
        den = den * r
        acc = acc * r[:, None]
        for i in tl.static_range(NS):
            w = tl.exp(ms[i] - Mn)
            den += ls[i] * w
            acc += accs[i] * w[:, None]
        M = Mn
    _inv_rope_store(acc / den[:, None], o_ptr + (s64 * H + hh)[:, None] * D + cols[None, :], c0, p,
                    cos_ptr, sin_ptr, HB, CP, D, ROPE)


@triton.jit
def _combine_kernel(pm_ptr, pl_ptr, pacc_ptr, qpos_ptr, sink_ptr, cos_ptr, sin_ptr, o_ptr, n_split,
                    H: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr, HB: tl.constexpr, CP: tl.constexpr,
                    NS: tl.constexpr = 8, PDL: tl.constexpr = False):
    grid_wait(PDL)  # every input is the attention kernel's output
    grid_release(PDL)
    s = tl.program_id(0)
    hh = tl.program_id(2) * HB + tl.arange(0, HB)
    _combine_tile(pm_ptr, pl_ptr, pacc_ptr, sink_ptr, cos_ptr, sin_ptr, o_ptr, s.to(tl.int64), n_split,
                  tl.load(qpos_ptr + s), hh, tl.program_id(1) * CP, H, D, ROPE, HB, CP, NS)


# ============================================================================ host side


def _kv_parts(kv, what):
    if isinstance(kv, (tuple, list)):
        a, b = kv
        return (a if a.dtype == torch.uint8 else a.view(torch.uint8)), (b if b.dtype == torch.uint8 else b.view(torch.uint8)), True
    if kv.dtype != torch.bfloat16:
        raise ValueError(f"sparse_attention: {what} must be (codes, scales) or a bf16 tensor, got {kv.dtype}")
    return kv, kv, False


def sparse_attention(q, qpos, win_kv, cmp_kv, idx, sink, cos, sin, *, window: int = 128, ring: int | None = None,
                     win_base=None, cmp_base=None, scale: float | None = None, n_split: int | None = None, dv: int | None = None,
                     block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                     qk_once: bool | None = None, fuse_combine: bool | None = None, kv_pairs: bool | None = None,
                     lazy_rescale: float | None = None, pdl: bool | None = None, cvec: int | None = None,
                     ws: bool | None = None, ws_cfg: dict | None = None):
    """q [S, H, D] bf16 post-RoPE; qpos [S] int32; win_kv: (E4M3 codes [R, D] u8, UE8M0 [R, D/32] u8)
    or bf16 [R, D] (ring, slot = pos % R); cmp_kv: (packed FP4 [N, D/2] u8, E4M3 [N, D/16] u8) or
    bf16 [N, D]; idx [S, KC] int32 compressed rows (-1 = padding); sink [H] fp32; cos/sin [P, rope/2].
    ring: rows per ring (default: all rows of win_kv); win_base/cmp_base [S]: per-query base rows
    (both or neither). n_split: key splits per query (default: enough programs for every SM).
    Tuning knobs (None = DEFAULT_BN, BATCH_BN / BATCH_STAGES, QK_ONCE, FUSE_COMBINE, ONE_QUERY_DV / ONE_QUERY_BN): dv, block_n, num_warps,
    num_stages; qk_once: q·K^T split over the warpgroups (not repeated in each); fuse_combine: the
    last-arriving split merges the partials in the same launch (no _combine_kernel launch); kv_pairs: the bf16x2
    tile decoders of kv_pairs.py (quantized KV on CUDA only; elsewhere ignored); lazy_rescale: the running max's
    slack in natural-log units (`_attend_block`; 0 = rescale every block); pdl: programmatic dependent launch of
    both kernels (pdl.py; None: where the device has it, PDL_ATTENTION); cvec: the bytes a thread loads at once
    along a packed FP4 row, 4, 8 or 16 (`_kv_tile`'s CVEC; None: CVEC_DEFAULT); ws: the warp-specialized Gluon
    kernel for the key blocks (sparse_attention_ws.py: FP8/FP4 KV on CUDA sm90+ only, its own key block; None:
    WS_ATTENTION where it applies); ws_cfg: its tuning keywords (`sparse_attention_ws.launch_ws`), and "combine":
    False to time its launch alone (the output is then not written).
    Returns o [S, H, D] bf16 (inverse-rotated)."""
    S, H, D = q.shape
    wkv, wsc, wq = _kv_parts(win_kv, "win_kv")
    ckv, csc, cq = _kv_parts(cmp_kv, "cmp_kv")
    if wq != cq:
        raise ValueError("sparse_attention: window and compressed KV must both be quantized or both bf16")
    if (win_base is None) != (cmp_base is None):
        raise ValueError("sparse_attention: pass both win_base and cmp_base, or neither")
    R = ring or wkv.shape[0]
    dev = q.device
    if wq and H % MMA_HEADS and dev.type == "cuda" and not interpreting() and torch.version.hip is None:
        # FP8/FP4 tiles with fewer than 64 heads came out wrong on the H200 (results/attention_small_widths.json: errors of 4-10 on N(0, 1) values at 16 heads for every knob, D 64 to 512, while
        # bf16 tiles at 16 heads and FP8/FP4 at 64 were right; cause not found: those products are mma.sync, M < 64).
        # The model has 64 heads; smaller presets get q and the sink padded with zero heads to a multiple of 64.
        Hp = -(-H // MMA_HEADS) * MMA_HEADS
        qp = torch.zeros((S, Hp, D), dtype=q.dtype, device=dev)
        qp[:, :H] = q
        sp = torch.zeros(Hp, dtype=torch.float32, device=dev)
        sp[:H] = sink.float()
        o = sparse_attention(qp, qpos, win_kv, cmp_kv, idx, sp, cos, sin, window=window, ring=ring, win_base=win_base,
                             cmp_base=cmp_base, scale=D ** -0.5 if scale is None else scale, n_split=n_split, dv=dv,
                             block_n=block_n, num_warps=num_warps, num_stages=num_stages, qk_once=qk_once,
                             fuse_combine=fuse_combine, kv_pairs=kv_pairs, lazy_rescale=lazy_rescale, pdl=pdl,
                             cvec=cvec, ws=ws, ws_cfg=ws_cfg)
        return o[:, :H].contiguous()
    out = torch.empty((S, H, D), dtype=torch.bfloat16, device=dev)
    if S == 0:
        return out
    # the warp-specialized kernel: decode batches of FP8/FP4 queries (2 <= S <= SMs / 2, the `batch` rule below) unless
    # a knob of this file's kernel is given
    knobs = [k for k, v in (("dv", dv), ("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages),
                            ("qk_once", qk_once), ("fuse_combine", fuse_combine), ("kv_pairs", kv_pairs),
                            ("lazy_rescale", lazy_rescale), ("cvec", cvec)) if v is not None]
    if ws and knobs:
        raise ValueError(f"sparse_attention: ws=True takes none of the Triton kernel's knobs, got {knobs}")
    decode_batch = wq and 1 < S and 2 * S <= sm_count(dev)
    if ws or (ws is None and WS_ATTENTION and not knobs and decode_batch):
        # by default only where its 64-key blocks tile the window (ws=True with another window: its error)
        if wsk.ws_supported(q, win_kv, cmp_kv) and (ws or window % wsk.WS_BN == 0):
            return _sparse_attention_ws(q, qpos, wkv, wsc, ckv, csc, idx, sink, cos, sin, window, R, win_base,
                                        cmp_base, scale, n_split, pdl, out, ws_cfg)
        if ws:
            raise ValueError("sparse_attention: ws=True needs FP8/FP4 KV, 64 heads x 512 channels and a CUDA GPU of "
                             "compute capability 9.0+")
    # a decode batch (2 <= S <= SMs / 2 quantized queries: key splits) may have its own key block and
    # stages (BATCH_BN / BATCH_STAGES; today the CUDA defaults); ROCm keeps its one stage
    batch = decode_batch and not interpreting() and torch.version.hip is None
    # one FP8/FP4 query on CUDA: 32-key blocks (twice the programs of 64, each half the dequantization)
    one = wq and S == 1 and not interpreting() and torch.version.hip is None
    BN = min(block_n or (BATCH_BN if batch else ONE_QUERY_BN if one else DEFAULT_BN[wq]), window)
    if window % BN:
        raise ValueError(f"sparse_attention: window {window} is not a multiple of the key block {BN}")
    if BN < 16 and not interpreting():
        raise ValueError(f"sparse_attention: key block {BN} is below 16, the least K of a compiled tl.dot (P·V); "
                         f"pass block_n >= 16 (smaller blocks run in the interpreter only)")
    KC = idx.shape[1]
    qpos, idx, wb, cb, has_base = _index_args(qpos, idx, win_base, cmp_base)
    # One FP8/FP4 query: 128-channel output slices give 4x the programs (H200 sweep: 20.5 µs vs
    # 25.8 µs at DV 512); batches keep whole rows (more DV slices only repeat the q·k work).
    DV = dv or (ONE_QUERY_DV if S == 1 and wq and not interpreting() and D % ONE_QUERY_DV == 0 else D)
    if D % DV or DV % 32:
        raise ValueError(f"sparse_attention: dv {DV} must divide D {D} and be a multiple of 32")
    ncv = D // DV
    n_blocks = window // BN + triton.cdiv(KC, BN)
    bps, n_split = _key_splits(n_blocks, S * ncv, sm_count(dev), n_split)
    split = n_split > 1
    scale = D ** -0.5 if scale is None else scale
    rope = cos.shape[1] * 2
    # per-slice products (DV < D) in branches spill more than they save (module docstring): off there
    qk_once = (QK_ONCE and DV == D) if qk_once is None else bool(qk_once)
    fuse = split and (FUSE_COMBINE if fuse_combine is None else bool(fuse_combine))
    ptx = ptx_for(dev)
    pairs = wq and ptx and (KV_PAIRS if kv_pairs is None else bool(kv_pairs))
    lazy = float(LAZY_RESCALE if lazy_rescale is None else lazy_rescale)
    pdl = pdl_for(dev) and (PDL_ATTENTION if pdl is None else bool(pdl))
    cvec = CVEC_DEFAULT if cvec is None else int(cvec)
    if cvec not in (4, 8, 16):
        raise ValueError(f"sparse_attention: cvec {cvec} must be 4, 8 or 16 (bytes a thread loads along an FP4 row)")
    if not 0 <= lazy <= LAZY_MAX:  # e^slack bounds each probability: fp32 sums and bf16 P stay finite
        raise ValueError(f"sparse_attention: lazy_rescale {lazy} must be in [0, {LAZY_MAX}]")
    CP = min(64, DV)
    NS = _combine_tile_shape(n_split, H)[0]  # the fused merge's split chunk
    if split:
        pm = torch.empty((S, n_split, H), dtype=torch.float32, device=dev)
        pl = torch.empty_like(pm)
        pacc = torch.empty((S, n_split, H, D), dtype=torch.float32, device=dev)
    else:
        pm = pl = pacc = out
    # fused combine: one arrival counter per (query, channel slice), left at zero by the last arriver
    cnt = counters(dev, S * ncv) if fuse else qpos
    sink = sink if sink.dtype == torch.float32 and sink.is_contiguous() else sink.float().contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    _sparse_attn_kernel[(S, ncv, n_split)](
        q.contiguous(), qpos, wkv, wsc, ckv, csc, idx, wb, cb, sink, cos, sin, out, pm, pl, pacc, cnt,
        R, KC, int(has_base), bps, n_split, scale,
        H=H, D=D, ROPE=rope, W=window, BN=BN, DV=DV, QUANT=wq, SPLIT=split, UPCAST=interpreting(),
        QK_ONCE=qk_once, FUSE=fuse, CP=CP, NS=NS, FHB=min(H, 16), PAIRS=pairs, PTX=ptx, LAZY=lazy, PDL=pdl, CVEC=cvec,
        num_warps=num_warps or 8, num_stages=num_stages or (BATCH_STAGES if batch else _default_stages()),
        **launch_kw(pdl))
    if split and not fuse:
        _launch_combine(pm, pl, pacc, qpos, sink, cos, sin, out, n_split, pdl)
    return out


def _launch_combine(pm, pl, pacc, qpos, sink, cos, sin, out, n_split, pdl):
    """`_combine_kernel` over the splits' partials: grid query x 64-channel x HB-head tiles (`_combine_tile_shape`)."""
    S, H, D = out.shape
    CP = min(64, D)
    NS, HB = _combine_tile_shape(n_split, H)
    _combine_kernel[(S, D // CP, H // HB)](pm, pl, pacc, qpos, sink, cos, sin, out, n_split,
                                          H=H, D=D, ROPE=cos.shape[1] * 2, HB=HB, CP=CP, NS=NS, PDL=pdl, num_warps=4,
                                          **launch_kw(pdl))


def _index_args(qpos, idx, win_base, cmp_base):
    """int32 contiguous qpos / idx / base rows; without bases the base pointers alias qpos (has_base = 0: no zero
    tensors to fill at decode)."""
    idx = idx if idx.dtype == torch.int32 and idx.is_contiguous() else idx.to(torch.int32).contiguous()
    qpos = qpos if qpos.dtype == torch.int32 and qpos.is_contiguous() else qpos.to(torch.int32).contiguous()
    has_base = win_base is not None
    wb = win_base.to(torch.int32).contiguous() if has_base else qpos
    cb = cmp_base.to(torch.int32).contiguous() if has_base else qpos
    return qpos, idx, wb, cb, has_base


def _sparse_attention_ws(q, qpos, wkv, wsc, ckv, csc, idx, sink, cos, sin, window, R, win_base, cmp_base, scale,
                         n_split, pdl, out, ws_cfg=None):
    """The key blocks by the warp-specialized kernel (partials always), merged by `_combine_kernel`."""
    S, H, D = q.shape
    BN = wsk.WS_BN
    if window % BN:
        raise ValueError(f"sparse_attention: window {window} is not a multiple of the ws key block {BN}")
    dev = q.device
    KC = idx.shape[1]
    qpos, idx, wb, cb, has_base = _index_args(qpos, idx, win_base, cmp_base)
    bps, n_split = _key_splits(window // BN + triton.cdiv(KC, BN), S, sm_count(dev), n_split)
    pm = torch.empty((S, n_split, H), dtype=torch.float32, device=dev)
    pl = torch.empty_like(pm)
    cfg = dict(ws_cfg or {})
    combine = cfg.pop("combine", True)
    pbf16 = wsk.WS_PARTIAL_BF16 if cfg.get("partial_bf16") is None else bool(cfg["partial_bf16"])
    pacc = torch.empty((S, n_split, H, D), dtype=torch.bfloat16 if pbf16 else torch.float32, device=dev)
    pdl = pdl_for(dev) and (PDL_ATTENTION if pdl is None else bool(pdl))
    wsk.launch_ws(q.contiguous(), qpos, wkv, wsc, ckv, csc, idx, wb, cb, pm, pl, pacc, R, KC, has_base, bps, n_split,
                  D ** -0.5 if scale is None else scale, window, **{"pdl": pdl and wsk.WS_PDL, **cfg})
    if combine:
        sink = sink if sink.dtype == torch.float32 and sink.is_contiguous() else sink.float().contiguous()
        _launch_combine(pm, pl, pacc, qpos, sink, cos.contiguous(), sin.contiguous(), out, n_split, pdl)
    return out


# Defaults (module docstring): 64-key blocks for FP8/FP4 KV, 32 for bf16 (its 2-stage buffers are
# twice the bytes: 197 KB of shared memory at 64 keys, over sm100's 227 KB limit with its extras);
# two pipeline stages prefetch the next block's rows into shared memory on CUDA (ROCm: one stage).
DEFAULT_BN = {True: 64, False: 32}
QK_ONCE = True  # q·K^T once per key block, its keys split over the warpgroups (_attend_block)
# Key splits merged by the last arriver in the same launch: off, the H200 sweep found the separate
# combine kernel faster (64 queries 58 vs 66 µs, one query 21 vs 26 µs: the last program merges alone).
FUSE_COMBINE = False
# several FP8/FP4 queries: the H200 sweep's best with qk_once (58 µs; 32 / 3 stages 70 µs, 75 µs with the fused
# combine) — the same as the single-query CUDA defaults today
BATCH_BN, BATCH_STAGES = 64, 2
ONE_QUERY_DV = 128  # output channels per program for a single quantized decode query
# H200, L2-cold graph replay, two interleaved runs (tuning/sparse_attention_kv_pairs/*.json):
# quantized KV tiles decoded two values a register (kv_pairs.py; CUDA): 64 queries 60.5-60.7 -> 58.2-58.3 µs, one
# query 15.3-15.5 -> 14.6-14.9; with PDL on both launches as well: 57.3-57.4 and 13.9-14.2. The online softmax's
# lazy rescale (`_attend_block`; the running max's slack in natural-log units) measured level (61.8 µs at slack 8):
# off, selectable.
KV_PAIRS = True
LAZY_RESCALE = 0.0
LAZY_MAX = 30.0  # the largest slack accepted: e^30 ~ 1e13 a probability, ~7e15 summed over 640 keys
PDL_ATTENTION = True
# bytes a thread loads at once along a packed FP4 row (`_kv_tile`'s CVEC). 16 gives the dequantized compressed tile
# a register layout of 32 channels a thread, 8 lanes on 2 chunks of a 128-byte swizzle block (16-way store conflicts);
# 4 gives 8 channels a thread, 32 lanes along a row (conflict-free, Triton 3.6 TTGIR) for 4x the cp.async and stage
# loads (static sm90 SASS, Triton 3.6, 64-query compressed loop: 1,554 -> 1,865 instructions); 8 sits between (1,596;
# 2-way). H200, L2-cold graph replay (tuning/tune_sparse_attention_cvec.json, interleaved): 64
# queries 16: 52.4 / 52.3 / 52.0 µs, 8: 50.6 / 50.7 / 50.5, 4: 52.3; one query 16: 12.9 / 13.8 / 13.7, 8: 13.2 /
# 13.6 (level), 4: 13.7
CVEC_DEFAULT = 8
# and its key block (CUDA): H200 (tuning/tune_sparse_attention_chunked_combine.json, after the chunked combine),
# L2-cold graph replay: BN 32 15.1 µs, BN 64 25.6 (the DV 512 tiles: BN 16 16.8, BN 32 17.8; DV 64 22.3)
ONE_QUERY_BN = 32
# the warp-specialized Gluon kernel (sparse_attention_ws.py) for quantized decode batches (2 <= S <= SMs / 2) on CUDA
# sm90+. H200, L2-cold graph replay, 64 queries (tuning/sparse_attention_ws/*.json and the
# table run, results/kernels_attention.json): 33.9-34.3 µs against this file's kernel's 50.4-51.1; one query stays here (level: 13.7 against 13.5 µs)
WS_ATTENTION = True
MMA_HEADS = 64  # FP8/FP4 KV on CUDA: heads padded to a multiple of this (sparse_attention)
COMBINE_TILE = 4096  # floats of partial accumulators a combine program loads at once (NS x HB x 64)


def _combine_tile_shape(n_split: int, H: int, tile: int = COMBINE_TILE):
    """(NS, HB) of the combine: splits merged a chunk at a time (NS, a power of two up to 16, so that one query's
    splits usually come in one round trip) and heads per program, the chunk's partial tiles [NS, HB, 64] at most
    `tile` floats (32 registers a thread at 4 warps)."""
    NS = min(16, triton.next_power_of_2(max(1, n_split)))
    HB = max(1, min(16, H, tile // (NS * 64)))
    while H % HB:
        HB //= 2
    return NS, HB


def _default_stages() -> int:
    return 1 if torch.version.hip else 2


def _key_splits(n_blocks: int, programs: int, sms: int, n_split: int | None = None):
    """(blocks per split, splits): fewer query programs than SMs (decode) split the keys so that about
    one program per SM runs (flash-decoding); the splits' partial states are merged by the combine."""
    if n_split is None:
        n_split = max(1, min(n_blocks, sms // programs))
    bps = triton.cdiv(n_blocks, max(1, min(n_split, n_blocks)))
    return bps, triton.cdiv(n_blocks, bps)


def _dequant_kv(kv, fmt_win: bool):
    if isinstance(kv, (tuple, list)):
        a, b = kv
        a = a.view(torch.uint8) if a.dtype != torch.uint8 else a
        b = b.view(torch.uint8) if b.dtype != torch.uint8 else b
        if fmt_win:
            return formats.dequant_fp8_ue8m0(a.view(torch.float8_e4m3fn), b, 32)
        return formats.dequant_fp4_e4m3(a, b.view(torch.float8_e4m3fn), 16)
    return kv.float()


def sparse_attention_ref(q, qpos, win_kv, cmp_kv, idx, sink, cos, sin, *, window: int = 128, ring: int | None = None,
                         win_base=None, cmp_base=None, scale: float | None = None, n_split=None, dv=None, block_n=None,
                         num_warps=None, num_stages=None):
    """Eager PyTorch: gather window ∪ selected rows, one softmax with the sink column, inverse RoPE."""
    from dsv41c.codegen.triton.compressor import rope_ref

    S, H, D = q.shape
    dev = q.device
    kw = _dequant_kv(win_kv, True)  # [R, D]
    kc = _dequant_kv(cmp_kv, False)  # [N, D]
    R = ring or kw.shape[0]
    qpos = qpos.long()
    wb = torch.zeros(S, dtype=torch.long, device=dev) if win_base is None else win_base.long()
    cb = torch.zeros(S, dtype=torch.long, device=dev) if cmp_base is None else cmp_base.long()
    j = qpos[:, None] - window + 1 + torch.arange(window, device=dev)[None, :]
    vw = j >= 0
    Kw = kw[wb[:, None] + torch.where(vw, j, 0) % R]  # [S, W, D]
    vc = idx >= 0
    Kc = kc[cb[:, None] + torch.where(vc, idx.long(), 0)]  # [S, KC, D]
    K = torch.cat([Kw, Kc], 1)
    valid = torch.cat([vw, vc], 1)
    scale = D ** -0.5 if scale is None else scale
    logits = torch.einsum("shd,skd->shk", q.float(), K) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    full = torch.cat([logits, sink.float()[None, :, None].expand(S, H, 1)], -1)
    p = torch.softmax(full, -1)[..., :-1]
    o = torch.einsum("shk,skd->shd", p, K)
    return rope_ref(o, qpos[:, None].expand(S, H), cos, sin, inverse=True).to(torch.bfloat16)


# ============================================================================ registration


_ATTN_TYPES = {"q_ptr": "*bf16", "qpos_ptr": "*i32", "idx_ptr": "*i32", "wbase_ptr": "*i32", "cbase_ptr": "*i32",
               "sink_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "o_ptr": "*bf16", "pm_ptr": "*fp32",
               "pl_ptr": "*fp32", "pacc_ptr": "*fp32", "cnt_ptr": "*i32", "R": "i32", "KC": "i32", "has_base": "i32",
               "blocks_per_split": "i32", "n_split": "i32", "scale": "fp32"}


def _attn_spec(c, quant: bool, split: bool, bn: int, dv: int, num_warps: int, num_stages: int, phase: str,
               qk_once: bool | None = None, fuse: bool = False, pairs: bool = False, lazy: float = 0.0,
               cvec: int = CVEC_DEFAULT):
    """pairs: the bf16x2 KV decoders (kv_pairs.py: inline PTX, CUDA targets only); cvec: `_kv_tile`'s CVEC."""
    kvt = "*u8" if quant else "*bf16"
    types = dict(_ATTN_TYPES, wkv_ptr=kvt, wsc_ptr=kvt, ckv_ptr=kvt, csc_ptr=kvt)
    const = {"H": c.num_attention_heads, "D": c.head_dim, "ROPE": c.qk_rope_head_dim, "W": c.sliding_window,
             "BN": bn, "DV": dv, "QUANT": quant, "SPLIT": split, "UPCAST": False,
             "QK_ONCE": (QK_ONCE and dv == c.head_dim) if qk_once is None else qk_once, "FUSE": fuse,
             "CP": min(64, dv), "NS": 8, "FHB": 16, "PAIRS": bool(pairs and quant), "PTX": bool(pairs and quant),
             "LAZY": float(lazy), "PDL": False, "CVEC": cvec}
    return aot_spec(_sparse_attn_kernel, f"{phase}_{'fp8fp4' if quant else 'bf16'}_dv{dv}_bn{bn}", types, const,
                    num_warps=num_warps, num_stages=num_stages)


def _specs(target, widths=PUBLISHED):
    c = widths
    # gfx942/gfx1100 have 64 KB of LDS, which the hoisted q [64, 512] bf16 alone fills: there QK runs
    # per 128-channel slice (DV 128) on 32-key blocks; ROCm pipelines in registers (one stage)
    lds64 = target in ("rocm:gfx942", "rocm:gfx1100")
    stages = 1 if is_rocm(target) else 2
    out = []
    pairs = KV_PAIRS and target.startswith("cuda:")  # inline PTX: CUDA targets only (not ROCm, not Ascend)
    for quant in (True, False):
        dv, bn = (128, 32) if lds64 else (c.head_dim, DEFAULT_BN[quant])
        out.append(_attn_spec(c, quant, True, bn, dv, 8, stages, "decode", pairs=pairs))
        # the batched-decode default (BATCH_BN, BATCH_STAGES), where it differs from the plain decode variant
        if quant and not is_rocm(target) and (BATCH_BN, BATCH_STAGES) != (bn, stages):
            out.append(_attn_spec(c, quant, True, BATCH_BN, dv, 8, BATCH_STAGES, "decode_batch", pairs=pairs))
        # the single-query default (sparse_attention's DV and BN rules; ROCm keeps the decode variant's key block)
        one_bn = bn if is_rocm(target) else ONE_QUERY_BN
        if quant and (dv, bn) != (ONE_QUERY_DV, one_bn):
            out.append(_attn_spec(c, quant, True, one_bn, ONE_QUERY_DV, 8, stages, "decode_one", pairs=pairs))
        out.append(_attn_spec(c, quant, False, bn, dv, 8, stages, "prefill", pairs=pairs))
    # any n_split (8 splits a chunk); the JIT launcher picks NS and HB per call (_combine_tile_shape)
    out.append(aot_spec(_combine_kernel, "combine_hb8_cp64_ns8",
                        {"pm_ptr": "*fp32", "pl_ptr": "*fp32", "pacc_ptr": "*fp32", "qpos_ptr": "*i32",
                         "sink_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "o_ptr": "*bf16",
                         "n_split": "i32"},
                        {"H": c.num_attention_heads, "D": c.head_dim, "ROPE": c.qk_rope_head_dim, "HB": 8, "CP": 64,
                         "NS": 8, "PDL": False},
                        num_warps=4))
    return out


register(KernelTemplate(
    name="sparse_attention", module=__name__,
    summary="one softmax over SWA window ∪ selected compressed entries + sink, FP8/FP4 KV dequantized in-kernel, inverse RoPE",
    keys=("H", "D", "ROPE", "W", "BN", "DV", "QUANT", "SPLIT", "QK_ONCE", "FUSE", "CP", "HB", "NS", "FHB", "UPCAST", "PAIRS",
          "PTX", "LAZY", "PDL", "CVEC"),
    reference=sparse_attention_ref, launch=sparse_attention, specializations=_specs))


# The warp-specialized kernel's template is registered here, beside the pipeline its launch and reference go through
# (sparse_attention(..., ws=True): the same preparation and `_combine_kernel`), so that the kernel module
# (sparse_attention_ws.py) imports nothing of this one.
_WS_OTHERS = "; the sparse_attention template serves this target"


def _ws_launch(q, qpos, win_kv, cmp_kv, idx, sink, cos, sin, **kw):
    return sparse_attention(q, qpos, win_kv, cmp_kv, idx, sink, cos, sin, ws=True, **kw)


register(KernelTemplate(
    name="sparse_attention_ws", module=wsk.__name__,
    summary="decode-batch sparse attention, FP8/FP4 KV: a producer warpgroup dequantizes key blocks while two "
            "consumer warpgroups run wgmma (Gluon, warp-specialized)",
    keys=("H", "D", "W", "BN", "NBUF", "PRODUCER_REGS", "NCH", "PDL", "PBF16", "maxnreg"),
    reference=sparse_attention_ref, launch=_ws_launch, specializations=wsk.ws_specs,
    missing_on={"cuda:sm80": "wgmma, mbarrier partitions and setmaxnreg are sm90+" + _WS_OTHERS,
                "cuda:sm100": "written for Hopper's warpgroup MMA; Blackwell needs tcgen05 and tensor memory (not "
                              "written)" + _WS_OTHERS,
                **{t: "a CUDA Gluon kernel (NVIDIA partitions, wgmma)" + _WS_OTHERS
                   for t in ("rocm:gfx942", "rocm:gfx950", "rocm:gfx1100")}}))
