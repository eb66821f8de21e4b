"""Fused KV compressor: wkv GEMM (+ gated pair pooling) -> RMSNorm -> RoPE -> FP4 pack -> cache append.

One file: the prefill kernel and both decode forms run the same tail (`_tail`: RMSNorm, RoPE, FP4 pack, the
indexer key) and must give the reference's codes bit for bit, so the kernels, their launcher and the reference
change together.

What (spec §3.3, §3.4, §3.12): one kernel per KV-source layer turns the attention input x
[T, 5120] into compressed-KV cache rows, and optionally the indexer key rows:
- ratio 1 (layer 20): `latent_t = kv_norm(wkv(x_t))` (bf16 linear, bf16 RMSNorm).
- ratio 2 (layers 2/8/14): aligned pairs (2j, 2j+1): `kv = x·wkv^T`, `g = x·wgate^T` in fp32,
  per-channel softmax over the 2 tokens, weighted sum, then RMSNorm in fp32.
- tail (both): the pre-RoPE latent is written out if asked (the indexer's input), then RoPE
  (interleaved pairs on the last rope_dim channels, compress cos/sin table at the entry's
  position: t for ratio 1, 2j for ratio 2), FP4 E2M1 + one E4M3 scale per 16 channels, packed
  (low nibble = even channel), written to cache row `rows[i]` (-1 = do not write).
- fused indexer key (optional): `k = k_norm(wk(latent))` (latent rounded to bf16, wk 512->128,
  bf16 RMSNorm), RoPE on the last rope_dim of 128 channels, FP4 E2M1 + UE8M0 per 32, packed,
  written to the indexer-key cache at the same row.

Algorithm: one program owns BM output rows and the full 512-channel width, kept in registers
as (even, odd) channel halves: the GEMM computes the even and the odd output channels as two
accumulators (W's rows loaded with stride 2), so RoPE pairs and FP4 nibble pairs are lane-wise
and nothing is shuffled. The RMSNorm needs whole rows, which is why the width is not tiled.
bf16 roundings of the reference (linear output, normalized value, weight product, RoPE output)
are reproduced with an explicit round-to-nearest-even on the fp32 bit pattern (`round_bf16`);
rsqrt is `1 / sqrt_rn` with `div_rn`, so on inputs whose GEMM and sum of squares are exact the
kernel is bit-identical to the reference (tested); elsewhere it differs by accumulation order.

Decode, one launch (`_compress_decode_kernel`; the default for one output row, i.e. 1 token at
ratio 1 or 2 at ratio 2, the H200-timed cases; 2 or 4 tokens with 2 output rows on request,
`fused_tail=True`: 130-183 registers a thread there, one block per SM): the weight read is spread over (C/BN) x NSPLIT programs (512x5120 at BN 8, KPS 1024: 64 x 5
= 320, ~2.4 per H200 SM) as a pure-FMA GEMV: each program loads its whole [BN, KPS] slice of wkv
(+ wgate) in one go (all 16-byte loads in flight; MMA would pad 1-2 tokens to 16 rows), x tiles
broadcast in the same register layout, one reduction along K at the end, an fp32 partial per
(split, token, channel). Every program then takes a ticket (arrival.py: release/acquire atomic);
the last one adds the partials in split order (`.cg` loads) and runs the same tail as the other
paths (`_tail`), with the indexer key's wk GEMV as FMA over [CI, IBK] chunks (`_idx_linear_fma`),
and resets the counter. Results equal the two-launch path up to fp32 summation order.
Decode, two launches (`fused_tail=False`, and every other T <= 32): `_compress_gemv_kernel`
(8 channel blocks x 8 K-splits, tl.dot with the tokens padded to 16 rows), then the tail kernel
(FROM_PART) adds the partials in split order. Measured on an H200 under CUDA-graph replay
(benchmarks/tuning/tune_compressor_decode.json, kernels_attention.json): ratio 1, 1 token 28.5-29.2 us
two-launch -> 8.8 us one launch (13.9 us with the L2 flushed); ratio 2, 2 tokens 36.5-36.8 -> 12.3 us
(17.0 us cold); every FP4 code identical to the reference.
The tail reads data no other program touches (wk's 128 KB, the norm weights, the RoPE rows at the output
positions), so with the L2 flushed each of its dependent reads went to HBM. On sm90+ the first programs
therefore issue L2 bulk prefetches of those bytes at their start (`_prefetch_tail`, DECODE_CFG "tail_pf";
the GEMV takes long enough for them to land): L2-cold, ratio 1 13.7 -> 11.1 us, ratio 2 16.7 -> 15.1-15.5 us,
warm unchanged, the same codes (tuning/tune_compressor_tail_pf.json, on / off / on interleaved).
What the fused indexer key costs in that serial tail (tuning/tune_compressor_noidx.json, the launch
without wk, interleaved twice): ratio 1 8.9 -> 5.2 µs warm (11.2-11.3 -> 7.4 L2-cold), ratio 2 12.1 -> 9.3 (15.3 ->
12.1): 3.2-3.8 µs of each L2-cold (2.8-3.7 warm). Its wk product on the tensor cores (`_idx_linear_mma`, DECODE_CFG "idx_mma": the tail's sm90
code 2,400 -> 1,432 instructions at ratio 1) gains only 0.2 µs warm / 0.5 µs cold at ratio 1 and loses 0.8 at ratio 2
(tuning/tune_compressor_idx_mma.json), so instruction latency is not what the rest of it waits on; on at ratio
1 only.

On sm90+ the decode launch is PDL-launched (DECODE_CFG "pdl"): its first weights, the wkv (and wgate) slice, load
before the grid-dependency wait, x and every store after it, so in a decode step the weight read overlaps the
kernel before it (what the compressor adds to the step, L2-cold: ratio 1 10.0-10.3 -> 8.7-8.9 µs, ratio 2
14.8-15.0 -> 13.2-13.3; results/step_chain.json).

Specialization keys: C (512), ROPE (64), RATIO (1|2), BM (rows per program), BK (K step),
FUSE_IDX (indexer key fused), CI/IROPE (128/64), UPCAST (fp32 dots: interpreter only); the
one-launch decode kernel: NT (tokens), K (hidden size, a constexpr so AOT compiles prove the
16-byte alignment of weight rows), BN, KPS, BK, NSPLIT, IBK, PDL (`DECODE_CFG`; PDL off in the ahead-of-time
variants).
Variants per target: ratio-1 prefill (BM 32) and ratio-2 prefill (BM 16 pairs), each with the
indexer key fused; two-launch decode (GEMV + FROM_PART tail); one-launch decode for 1 token
(ratio 1) and one pair (ratio 2); gfx1100 (RDNA3, 64 KB LDS, wave32) uses BK 32 and one pipeline
stage.

Known gaps: the one-launch decode path's tail is serial work in one program (the 128 KB wk read,
~4 dependent L2 round trips at IBK 128; L2 hits since the tail prefetch; the indexer key's part of it is 3-4 µs,
not explained by its instruction count); its arrival counter is the shared buffer of arrival.py
(launches that use it must not run concurrently on two streams); its register count is set by the
tail as much as by the GEMV, so the grid may not fit one wave at every (BN, num_warps) (see
benchmarks/tune_compressor_decode.py). The ratio-2 partial group (odd token at a chunk's end) is
buffered by the caller (HF `buffer_kv`): this kernel takes complete aligned pairs only. The compressed cache is a flat
row array (a paged layout only changes `rows`). With fp fusion on (Triton's default on GPUs)
RoPE's mul/sub may contract to FMA: GPU results can differ from the reference in the last bit
of a few values (and so in a rare FP4 code); launches here pass enable_fp_fusion=False.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter
from dsv41c.codegen.triton.l2_prefetch import l2_prefetch_for, prefetch_rows_l2
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.codecs import quant_fp4_e4m3_pairs, quant_fp4_ue8m0_pairs, round_bf16
from dsv41c.codegen.triton.targets import interpreting
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c import formats


@triton.jit
def _rope_pairs(E, O, pos, cos_ptr, sin_ptr, R: tl.constexpr, HALF: tl.constexpr, ROPE: tl.constexpr,
                INVERSE: tl.constexpr):
    """Rotate the last ROPE/2 (even, odd) pairs of [R, HALF] by the angle table at pos [R]."""
    i = tl.arange(0, HALF)
    j = i - (HALF - ROPE // 2)
    on = j >= 0
    jj = tl.where(on, j, 0)
    off = pos.to(tl.int64)[:, None] * (ROPE // 2) + jj[None, :]
    c = tl.load(cos_ptr + off, mask=on[None, :], other=1.0)
    s = tl.load(sin_ptr + off, mask=on[None, :], other=0.0)
    if INVERSE:
        s = -s
    eR = E * c - O * s
    oR = E * s + O * c
    return tl.where(on[None, :], eR, E), tl.where(on[None, :], oR, O)


@triton.jit
def _rmsnorm_pairs(E, O, w_ptr, eps, HALF: tl.constexpr, BF16: tl.constexpr):
    """RMSNorm of rows split into (even, odd) halves: w * (x * rsqrt(mean x^2 + eps)) with the
    reference's bf16 roundings when BF16."""
    i = tl.arange(0, HALF)
    ss = tl.sum(E * E, axis=1) + tl.sum(O * O, axis=1)
    ms = tl.math.div_rn(ss, tl.full(ss.shape, 2.0 * HALF, tl.float32)) + eps
    rstd = tl.math.div_rn(tl.full(ms.shape, 1.0, tl.float32), tl.math.sqrt_rn(ms))
    wE = tl.load(w_ptr + 2 * i).to(tl.float32)
    wO = tl.load(w_ptr + 2 * i + 1).to(tl.float32)
    yE = E * rstd[:, None]
    yO = O * rstd[:, None]
    if BF16:
        yE = round_bf16(round_bf16(yE) * wE[None, :])
        yO = round_bf16(round_bf16(yO) * wO[None, :])
    else:
        yE = yE * wE[None, :]
        yO = yO * wO[None, :]
    return yE, yO


@triton.jit
def _pairs(A, BM: tl.constexpr, HALF: tl.constexpr):
    """[BM, 2·HALF] in channel order -> (even channels, odd channels), each [BM, HALF]: rows are
    loaded contiguously (wide loads) and split in registers, not loaded with stride 2."""
    return tl.split(tl.reshape(A, (BM, HALF, 2)))


@triton.jit
def _add_partial(a, b, ga, gb, pa, pg, off, m, C: tl.constexpr, RATIO: tl.constexpr, CACHE: tl.constexpr):
    """Add one K-split's fp32 partial rows (part/gpart at element offset off) to the running sums:
    a (token 2r or r), b (token 2r+1) and the gate's ga / gb (ratio 2)."""
    a += tl.load(pa + off, mask=m, other=0.0, cache_modifier=CACHE)
    if RATIO == 2:
        b += tl.load(pa + off + C, mask=m, other=0.0, cache_modifier=CACHE)
        ga += tl.load(pg + off, mask=m, other=0.0, cache_modifier=CACHE)
        gb += tl.load(pg + off + C, mask=m, other=0.0, cache_modifier=CACHE)
    return a, b, ga, gb


@triton.jit
def _stage_latent(LE, LO, r, rmask, lsc_ptr, C: tl.constexpr):
    """The latent rows r (even / odd halves) to the scratch rows lsc in channel order, visible to the whole
    program: the indexer key's product reads them back in the layout of its wk chunks."""
    h = tl.arange(0, C // 2)
    lp = lsc_ptr + r[:, None] * C + 2 * h[None, :]
    tl.store(lp, LE, mask=rmask[:, None])
    tl.store(lp + 1, LO, mask=rmask[:, None])
    tl.debug_barrier()  # the scratch row is written by other threads of this program


@triton.jit
def _idx_linear_fma(LE, LO, r, rmask, wk_ptr, lsc_ptr, C: tl.constexpr, CI: tl.constexpr, BM: tl.constexpr,
                    IBK: tl.constexpr):
    """Indexer key linear k = L·wk^T for BM <= 2 latent rows (bf16 values in fp32 halves LE/LO) in
    fp32, no MMA padding to 16 rows. The latent goes through a scratch row lsc (so every K chunk is
    loaded straight in the layout of the wk tile it multiplies); wk is read as [CI, IBK] chunks
    (contiguous, wide loads), each one load of 8+ 16-byte vectors per thread so they are in flight
    together (this runs in one program: latency, not issue, bounds it), reduced per chunk.
    Returns (even, odd) output channels [BM, CI/2]."""
    tl.static_assert(BM <= 2, "_idx_linear_fma: rows 0 and 1 only (the one-launch decode's <= 2 output rows)")
    _stage_latent(LE, LO, r, rmask, lsc_ptr, C)
    j = tl.arange(0, CI)
    kk = tl.arange(0, IBK)
    wp = wk_ptr + j[:, None] * C + kk[None, :]
    k0 = tl.zeros((CI,), tl.float32)
    if BM == 2:
        k1 = tl.zeros((CI,), tl.float32)
    for cb in tl.static_range(C // IBK):
        w = tl.load(wp + cb * IBK).to(tl.float32)
        k0 += tl.sum(w * tl.load(lsc_ptr + cb * IBK + kk)[None, :], axis=1)
        if BM == 2:
            k1 += tl.sum(w * tl.load(lsc_ptr + C + cb * IBK + kk)[None, :], axis=1)
    k = tl.where(r[:, None] == 0, k0[None, :], 0.0)
    if BM == 2:
        k = tl.where(r[:, None] == 1, k1[None, :], k)
    return _pairs(k, BM, CI // 2)


@triton.jit
def _idx_linear_mma(LE, LO, r, rmask, wk_ptr, lsc_ptr, C: tl.constexpr, CI: tl.constexpr, BM: tl.constexpr,
                    IBK: tl.constexpr, DOT_F32: tl.constexpr):
    """`_idx_linear_fma`'s product on the tensor cores: kᵀ [CI, 16] = Σ over K chunks of wk[:, chunk] [CI, IBK] ·
    Lᵀ[chunk, 16], the BM <= 2 latent rows padded to 16 MMA columns (read back from the scratch row lsc, as the FMA
    path). The latent values are bf16 already, so the bf16 products are exact and the sums are fp32 (in another
    order than the FMA path's). It takes the ratio-1 tail's sm90 code from 2,400 to 1,432 instructions, for 0.5 µs
    L2-cold on the H200 (module docstring). DOT_F32: operands upcast (the interpreter).
    Returns (even, odd) output channels [BM, CI/2]."""
    tl.static_assert(BM <= 2, "_idx_linear_mma: rows 0 and 1 only (the one-launch decode's <= 2 output rows)")
    _stage_latent(LE, LO, r, rmask, lsc_ptr, C)
    j = tl.arange(0, CI)
    kk = tl.arange(0, IBK)
    n = tl.arange(0, 16)
    acc = tl.zeros((CI, 16), tl.float32)
    for cb in tl.static_range(C // IBK):
        w = tl.load(wk_ptr + j[:, None] * C + cb * IBK + kk[None, :])  # [CI, IBK] bf16
        lt = tl.load(lsc_ptr + n[None, :] * C + cb * IBK + kk[:, None], mask=(n < BM)[None, :], other=0.0)
        if DOT_F32:
            acc = tl.dot(w.to(tl.float32), lt, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, lt.to(tl.bfloat16), acc)
    k0 = tl.sum(tl.where((n == 0)[None, :], acc, 0.0), axis=1)  # [CI]: latent row 0's outputs
    k = tl.where(r[:, None] == 0, k0[None, :], 0.0)
    if BM == 2:
        k1 = tl.sum(tl.where((n == 1)[None, :], acc, 0.0), axis=1)
        k = tl.where(r[:, None] == 1, k1[None, :], k)
    return _pairs(k, BM, CI // 2)


@triton.jit
def _tail(accE, accO, bE, bO, gaE, gaO, gbE, gbO, r, rmask, nw_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr,
          kvc_ptr, kvs_ptr, lat_ptr, wk_ptr, knw_ptr, ic_ptr, is_ptr, lsc_ptr, eps,
          C: tl.constexpr, ROPE: tl.constexpr, RATIO: tl.constexpr, BM: tl.constexpr, WRITE_LAT: tl.constexpr,
          LAT_BF16: tl.constexpr, FUSE_IDX: tl.constexpr, CI: tl.constexpr, IROPE: tl.constexpr,
          UPCAST: tl.constexpr, IBK: tl.constexpr, IDX_MMA: tl.constexpr = 0):
    """Everything after the linear, for BM rows r (mask rmask): ratio-2 gated pooling, RMSNorm,
    latent out, fused indexer key, RoPE, FP4 pack, cache append. acc*/b*/ga*/gb* are the (even, odd)
    halves of the linear outputs [BM, C/2] (b, ga, gb: ratio 2 only). IBK > 0: the indexer key's
    linear runs as FMA (BM <= 2, `_idx_linear_fma`, scratch lsc; IDX_MMA 1 / 2: on the tensor cores,
    `_idx_linear_mma`, 2 with fp32 operands), else as tl.dot (BM >= 16)."""
    HALF: tl.constexpr = C // 2
    h = tl.arange(0, HALF)
    r64 = r.to(tl.int64)
    if RATIO == 2:
        # per-channel softmax over the pair, fp32 (reference order: exp(g - max) / sum)
        mE = tl.maximum(gaE, gbE)
        eaE = tl.exp(gaE - mE)
        ebE = tl.exp(gbE - mE)
        sE = eaE + ebE
        E = tl.math.div_rn(eaE, sE) * accE + tl.math.div_rn(ebE, sE) * bE
        mO = tl.maximum(gaO, gbO)
        eaO = tl.exp(gaO - mO)
        ebO = tl.exp(gbO - mO)
        sO = eaO + ebO
        O = tl.math.div_rn(eaO, sO) * accO + tl.math.div_rn(ebO, sO) * bO
        E, O = _rmsnorm_pairs(E, O, nw_ptr, eps, HALF, False)
    else:
        E, O = _rmsnorm_pairs(round_bf16(accE), round_bf16(accO), nw_ptr, eps, HALF, True)

    if WRITE_LAT:
        lp = lat_ptr + r64[:, None] * C + 2 * h[None, :]
        if LAT_BF16:
            tl.store(lp, round_bf16(E).to(lat_ptr.dtype.element_ty), mask=rmask[:, None])
            tl.store(lp + 1, round_bf16(O).to(lat_ptr.dtype.element_ty), mask=rmask[:, None])
        else:
            tl.store(lp, E.to(lat_ptr.dtype.element_ty), mask=rmask[:, None])
            tl.store(lp + 1, O.to(lat_ptr.dtype.element_ty), mask=rmask[:, None])

    pos = tl.load(pos_ptr + r, mask=rmask, other=0)
    rows = tl.load(rows_ptr + r, mask=rmask, other=-1)
    wmask = rmask & (rows >= 0)
    rows64 = rows.to(tl.int64)

    if FUSE_IDX:
        # k = k_norm(wk(bf16(latent))): even/odd output channels x even/odd input channels
        IH: tl.constexpr = CI // 2
        ci = tl.arange(0, IH)
        LE = round_bf16(E)
        LO = round_bf16(O)
        if IBK > 0 and IDX_MMA > 0:
            kE, kO = _idx_linear_mma(LE, LO, r, rmask, wk_ptr, lsc_ptr, C, CI, BM, IBK, IDX_MMA == 2)
        elif IBK > 0:
            kE, kO = _idx_linear_fma(LE, LO, r, rmask, wk_ptr, lsc_ptr, C, CI, BM, IBK)
        else:
            wkb = wk_ptr + (2 * ci)[None, :] * C + (2 * h)[:, None]  # [HALF, IH]: wk[2ci, 2h]
            wEE = tl.load(wkb)
            wEO = tl.load(wkb + 1)
            wOE = tl.load(wkb + C)
            wOO = tl.load(wkb + C + 1)
            if UPCAST:
                wEE = wEE.to(tl.float32)
                wEO = wEO.to(tl.float32)
                wOE = wOE.to(tl.float32)
                wOO = wOO.to(tl.float32)
            else:
                LE = LE.to(tl.bfloat16)
                LO = LO.to(tl.bfloat16)
            kE = tl.dot(LE, wEE) + tl.dot(LO, wEO)
            kO = tl.dot(LE, wOE) + tl.dot(LO, wOO)
        kE, kO = _rmsnorm_pairs(round_bf16(kE), round_bf16(kO), knw_ptr, eps, IH, True)
        kE, kO = _rope_pairs(kE, kO, pos, cos_ptr, sin_ptr, BM, IH, IROPE, False)
        kp, ke = quant_fp4_ue8m0_pairs(round_bf16(kE), round_bf16(kO), BM, IH)
        tl.store(ic_ptr + rows64[:, None] * IH + ci[None, :], kp.to(tl.uint8), mask=wmask[:, None])
        ie = tl.arange(0, CI // 32)
        tl.store(is_ptr + rows64[:, None] * (CI // 32) + ie[None, :], ke.to(tl.uint8), mask=wmask[:, None])

    E, O = _rope_pairs(E, O, pos, cos_ptr, sin_ptr, BM, HALF, ROPE, False)
    if RATIO == 1:
        E = round_bf16(E)
        O = round_bf16(O)
    packed, sc = quant_fp4_e4m3_pairs(E, O, BM, HALF)
    tl.store(kvc_ptr + rows64[:, None] * HALF + h[None, :], packed.to(tl.uint8), mask=wmask[:, None])
    sj = tl.arange(0, C // 16)
    tl.store(kvs_ptr + rows64[:, None] * (C // 16) + sj[None, :], sc.to(tl.uint8), mask=wmask[:, None])


@triton.jit
def _compressor_kernel(x_ptr, wkv_ptr, wg_ptr, nw_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr,
                       kvc_ptr, kvs_ptr, lat_ptr, wk_ptr, knw_ptr, ic_ptr, is_ptr, part_ptr, gpart_ptr,
                       n_out, K, stride_x, eps, n_tok, ksplit,
                       C: tl.constexpr, ROPE: tl.constexpr, RATIO: tl.constexpr, BM: tl.constexpr,
                       BK: tl.constexpr, WRITE_LAT: tl.constexpr, LAT_BF16: tl.constexpr,
                       FUSE_IDX: tl.constexpr, CI: tl.constexpr, IROPE: tl.constexpr, UPCAST: tl.constexpr,
                       FROM_PART: tl.constexpr):
    HALF: tl.constexpr = C // 2
    pid = tl.program_id(0)
    r = pid * BM + tl.arange(0, BM)
    rmask = r < n_out
    r64 = r.to(tl.int64)
    h = tl.arange(0, HALF)
    kk = tl.arange(0, BK)
    if FROM_PART:
        # decode (two-launch path): the linear outputs were computed by _compress_gemv_kernel as
        # ksplit partial sums [ksplit, n_tok, C] (fp32), added here in split order (deterministic)
        cc = tl.arange(0, C)
        pa = part_ptr + (RATIO * r64)[:, None] * C + cc[None, :]
        pg = gpart_ptr + (RATIO * r64)[:, None] * C + cc[None, :]
        a = tl.zeros((BM, C), tl.float32)
        b = a
        ga = a
        gb = a
        off = tl.zeros((), tl.int64)
        for ks in range(ksplit):
            a, b, ga, gb = _add_partial(a, b, ga, gb, pa, pg, off, rmask[:, None], C, RATIO, "")
            off += n_tok * C
        accE, accO = _pairs(a, BM, HALF)
        bE, bO = _pairs(b, BM, HALF)
        gaE, gaO = _pairs(ga, BM, HALF)
        gbE, gbO = _pairs(gb, BM, HALF)
    else:
        # x rows: token RATIO*r (+1 for the second token of a pair)
        xa_ptrs = x_ptr + (RATIO * r64)[:, None] * stride_x + kk[None, :]
        # W tiles [BK, HALF]: even output channels are W rows 2h, odd ones 2h+1
        wE_ptrs = wkv_ptr + (2 * h).to(tl.int64)[None, :] * K + kk[:, None]
        accE = tl.zeros((BM, HALF), tl.float32)
        accO = tl.zeros((BM, HALF), tl.float32)
        bE = accE
        bO = accO
        gaE = accE
        gaO = accO
        gbE = accE
        gbO = accO
        if RATIO == 2:
            gE_ptrs = wg_ptr + (2 * h).to(tl.int64)[None, :] * K + kk[:, None]
        for k0 in range(0, K, BK):
            kmask = (k0 + kk) < K
            xa = tl.load(xa_ptrs + k0, mask=rmask[:, None] & kmask[None, :], other=0.0)
            wE = tl.load(wE_ptrs + k0, mask=kmask[:, None], other=0.0)
            wO = tl.load(wE_ptrs + K + k0, mask=kmask[:, None], other=0.0)
            if UPCAST:
                xa = xa.to(tl.float32)
                wE = wE.to(tl.float32)
                wO = wO.to(tl.float32)
            accE = tl.dot(xa, wE, accE)
            accO = tl.dot(xa, wO, accO)
            if RATIO == 2:
                xb = tl.load(xa_ptrs + stride_x + k0, mask=rmask[:, None] & kmask[None, :], other=0.0)
                vE = tl.load(gE_ptrs + k0, mask=kmask[:, None], other=0.0)
                vO = tl.load(gE_ptrs + K + k0, mask=kmask[:, None], other=0.0)
                if UPCAST:
                    xb = xb.to(tl.float32)
                    vE = vE.to(tl.float32)
                    vO = vO.to(tl.float32)
                bE = tl.dot(xb, wE, bE)
                bO = tl.dot(xb, wO, bO)
                gaE = tl.dot(xa, vE, gaE)
                gaO = tl.dot(xa, vO, gaO)
                gbE = tl.dot(xb, vE, gbE)
                gbO = tl.dot(xb, vO, gbO)
    _tail(accE, accO, bE, bO, gaE, gaO, gbE, gbO, r, rmask, nw_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr,
          kvc_ptr, kvs_ptr, lat_ptr, wk_ptr, knw_ptr, ic_ptr, is_ptr, part_ptr, eps,
          C, ROPE, RATIO, BM, WRITE_LAT, LAT_BF16, FUSE_IDX, CI, IROPE, UPCAST, 0)


@triton.jit
def _compress_gemv_kernel(x_ptr, w_ptr, wg_ptr, part_ptr, gpart_ptr, T, K, stride_x, k_per_split,
                          C: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          GATE: tl.constexpr, UPCAST: tl.constexpr):
    """Decode-size linear (two-launch path): a [BN output channels] x [K range] slice for all T (<= BT)
    tokens, fp32 partial sums to part[k-split, T, C] (and the gate's to gpart). Many programs share the
    5 MB of weights, which one program per 16 tokens cannot stream fast enough."""
    pn = tl.program_id(0)
    ks = tl.program_id(1)
    t = tl.arange(0, BT)
    tm = t < T
    n = pn * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    k_lo = ks * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BT, BN), tl.float32)
    gacc = tl.zeros((BT, BN), tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        km = (k0 + kk) < k_hi
        x = tl.load(x_ptr + t[:, None].to(tl.int64) * stride_x + k0 + kk[None, :], mask=tm[:, None] & km[None, :],
                    other=0.0)
        w = tl.load(w_ptr + n[None, :].to(tl.int64) * K + k0 + kk[:, None], mask=km[:, None], other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, w, acc)
        if GATE:
            g = tl.load(wg_ptr + n[None, :].to(tl.int64) * K + k0 + kk[:, None], mask=km[:, None], other=0.0)
            if UPCAST:
                g = g.to(tl.float32)
            gacc = tl.dot(x, g, gacc)
    off = (ks.to(tl.int64) * T + t[:, None]) * C + n[None, :]
    tl.store(part_ptr + off, acc, mask=tm[:, None])
    if GATE:
        tl.store(gpart_ptr + off, gacc, mask=tm[:, None])


@triton.jit
def _fma_token(acc, w, xp, k, km):
    """acc [BN, BK] += w [BN, BK] * x[k] (one token's K chunk, k and km [BN, BK] broadcast along the
    channels so the x tile gets w's register layout: no layout conversion through shared memory; the
    repeated addresses hit L1). An explicit fma: the launch turns fp fusion off (for the tail's
    RoPE), which would split it into a multiply and an add."""
    return tl.fma(w, tl.load(xp + k, mask=km, other=0.0).to(tl.float32), acc)


@triton.jit
def _prefetch_tail(p, wk_ptr, nw_ptr, knw_ptr, cos_ptr, sin_ptr, pos_ptr, C: tl.constexpr, CI: tl.constexpr,
                   BM: tl.constexpr, FUSE_IDX: tl.constexpr, WK_ROW: tl.constexpr, NW_BYTES: tl.constexpr,
                   KNW_BYTES: tl.constexpr, CS_ROW: tl.constexpr, CS_STRIDE: tl.constexpr):
    """L2 bulk prefetch (l2_prefetch.py) of what only the last arriver's tail reads, issued by the first
    programs at their start, so the tail's dependent reads hit the L2 instead of HBM: wk's CI rows (program
    p < CI, one row each), the norm weights (program CI) and the RoPE table rows at the output positions
    (program CI + 1, which reads pos first); p is the linear id pn·NSPLIT + ks (all 320 programs of the real
    shapes are resident in one wave, so the order only decides who asks; a grid of fewer than CI + 2 programs
    prefetches less). A hint: nothing waits on it and no result depends on it."""
    one = tl.zeros((1,), tl.int64)
    if FUSE_IDX:
        if p < CI:
            prefetch_rows_l2(wk_ptr + p.to(tl.int64) * C + one, WK_ROW, True)
    if p == CI:
        prefetch_rows_l2(nw_ptr + one, NW_BYTES, True)
        if FUSE_IDX:
            prefetch_rows_l2(knw_ptr + one, KNW_BYTES, True)
    if p == CI + 1:
        pos = tl.load(pos_ptr + tl.arange(0, BM)).to(tl.int64) * CS_STRIDE
        prefetch_rows_l2(cos_ptr + pos, CS_ROW, True)
        prefetch_rows_l2(sin_ptr + pos, CS_ROW, True)


@triton.jit
def _compress_decode_kernel(x_ptr, wkv_ptr, wg_ptr, nw_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr,
                            kvc_ptr, kvs_ptr, lat_ptr, wk_ptr, knw_ptr, ic_ptr, is_ptr, ws_ptr, cnt_ptr,
                            stride_x8, eps, K: tl.constexpr,
                            C: tl.constexpr, ROPE: tl.constexpr, RATIO: tl.constexpr, NT: tl.constexpr,
                            BN: tl.constexpr, KPS: tl.constexpr, BK: tl.constexpr, NSPLIT: tl.constexpr,
                            WRITE_LAT: tl.constexpr, LAT_BF16: tl.constexpr, FUSE_IDX: tl.constexpr,
                            CI: tl.constexpr, IROPE: tl.constexpr, IBK: tl.constexpr, TAIL_PF: tl.constexpr = False,
                            WK_ROW: tl.constexpr = 0, NW_BYTES: tl.constexpr = 0, KNW_BYTES: tl.constexpr = 0,
                            CS_ROW: tl.constexpr = 0, IDX_MMA: tl.constexpr = 0, PDL: tl.constexpr = False):
    """Decode (NT = 1, 2 or 4 tokens, NT/RATIO <= 2 output rows) in one launch. Program (pn, ks):
    output channels [pn·BN, +BN) over K range [ks·KPS, +KPS) for every token as a pure-FMA GEMV
    (w [BN, BK] chunks, unrolled so all loads are in flight, x broadcast, one K reduction at the end),
    fp32 partial to ws; the last program to arrive (arrival.py) adds the NSPLIT partials in split
    order and runs the tail (`_tail`), then resets the counter.
    ws layout (fp32): part [NSPLIT, NT, C], gate part [NSPLIT, NT, C], latent scratch [NT/RATIO, C].
    K (the hidden size) is a constexpr and x's row stride is passed in units of 8 elements (stride_x8):
    otherwise an AOT compile cannot prove 16-byte alignment of the weight rows / x rows and falls back
    to narrow loads. TAIL_PF (sm90+): `_prefetch_tail` first (WK_ROW / NW_BYTES / KNW_BYTES / CS_ROW: the
    bytes of a wk row, the norm weights, the key-norm weights and a RoPE table row).
    PDL (pdl.py): the first chunk's weights (static data) are loaded before the grid-dependency wait, x and every
    store after it, so under programmatic dependent launch the weight reads overlap the predecessor."""
    HALF: tl.constexpr = C // 2
    BM: tl.constexpr = NT // RATIO
    WS_PART: tl.constexpr = NSPLIT * NT * C
    pn = tl.program_id(0)
    ks = tl.program_id(1)
    if TAIL_PF:
        _prefetch_tail(pn * NSPLIT + ks, wk_ptr, nw_ptr, knw_ptr, cos_ptr, sin_ptr, pos_ptr, C, CI, BM, FUSE_IDX,
                       WK_ROW, NW_BYTES, KNW_BYTES, CS_ROW, ROPE // 2)
    n = pn * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    wrow = n.to(tl.int64)[:, None] * K
    stride_x = stride_x8 * 8
    a0 = tl.zeros((BN, BK), tl.float32)
    if NT >= 2:
        a1 = tl.zeros((BN, BK), tl.float32)
    if NT >= 4:
        a2 = tl.zeros((BN, BK), tl.float32)
        a3 = tl.zeros((BN, BK), tl.float32)
    if RATIO == 2:
        g0 = tl.zeros((BN, BK), tl.float32)
        g1 = tl.zeros((BN, BK), tl.float32)
        if NT >= 4:
            g2 = tl.zeros((BN, BK), tl.float32)
            g3 = tl.zeros((BN, BK), tl.float32)
    for c in tl.static_range(KPS // BK):
        k = tl.broadcast_to((ks * KPS + c * BK + kk)[None, :], (BN, BK))
        km = k < K
        w = tl.load(wkv_ptr + wrow + k, mask=km, other=0.0).to(tl.float32)
        if RATIO == 2 and PDL:  # (without PDL the gate loads where it always did: the same code as before)
            g = tl.load(wg_ptr + wrow + k, mask=km, other=0.0).to(tl.float32)
        if c == 0:  # x is the predecessor's output: wait for it here, after the first weights are in flight
            grid_wait(PDL)
            grid_release(PDL)
        a0 = _fma_token(a0, w, x_ptr, k, km)
        if NT >= 2:
            a1 = _fma_token(a1, w, x_ptr + stride_x, k, km)
        if NT >= 4:
            a2 = _fma_token(a2, w, x_ptr + 2 * stride_x, k, km)
            a3 = _fma_token(a3, w, x_ptr + 3 * stride_x, k, km)
        if RATIO == 2:
            if not PDL:
                g = tl.load(wg_ptr + wrow + k, mask=km, other=0.0).to(tl.float32)
            g0 = _fma_token(g0, g, x_ptr, k, km)
            g1 = _fma_token(g1, g, x_ptr + stride_x, k, km)
            if NT >= 4:
                g2 = _fma_token(g2, g, x_ptr + 2 * stride_x, k, km)
                g3 = _fma_token(g3, g, x_ptr + 3 * stride_x, k, km)
    pp = ws_ptr + ks * (NT * C) + n  # part[ks, t, n]
    tl.store(pp, tl.sum(a0, axis=1))
    if NT >= 2:
        tl.store(pp + C, tl.sum(a1, axis=1))
    if NT >= 4:
        tl.store(pp + 2 * C, tl.sum(a2, axis=1))
        tl.store(pp + 3 * C, tl.sum(a3, axis=1))
    if RATIO == 2:
        tl.store(pp + WS_PART, tl.sum(g0, axis=1))
        tl.store(pp + WS_PART + C, tl.sum(g1, axis=1))
        if NT >= 4:
            tl.store(pp + WS_PART + 2 * C, tl.sum(g2, axis=1))
            tl.store(pp + WS_PART + 3 * C, tl.sum(g3, axis=1))

    if arrive_last(cnt_ptr, tl.num_programs(0) * tl.num_programs(1)):
        r = tl.arange(0, BM)
        rmask = r < BM
        cc = tl.arange(0, C)
        pa = ws_ptr + (RATIO * r)[:, None] * C + cc[None, :]
        a = tl.zeros((BM, C), tl.float32)
        b = a
        ga = a
        gb = a
        # split order, as the two-launch path; .cg: the partials of other SMs, not a stale L1 line
        for s in tl.static_range(NSPLIT):
            a, b, ga, gb = _add_partial(a, b, ga, gb, pa, pa + WS_PART, s * (NT * C), rmask[:, None], C, RATIO,
                                        ".cg")
        accE, accO = _pairs(a, BM, HALF)
        bE, bO = _pairs(b, BM, HALF)
        gaE, gaO = _pairs(ga, BM, HALF)
        gbE, gbO = _pairs(gb, BM, HALF)
        _tail(accE, accO, bE, bO, gaE, gaO, gbE, gbO, r, rmask, nw_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr,
              kvc_ptr, kvs_ptr, lat_ptr, wk_ptr, knw_ptr, ic_ptr, is_ptr, ws_ptr + 2 * WS_PART, eps,
              C, ROPE, RATIO, BM, WRITE_LAT, LAT_BF16, FUSE_IDX, CI, IROPE, False, IBK, IDX_MMA)
        reset_counter(cnt_ptr)


# ============================================================================ host side


def _u8(t):
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


# Fused decode launch tiling (`_compress_decode_kernel`), by ratio. BN output channels x KPS
# reduction elements per program, as BK-wide unrolled chunks; IBK: K chunk of the tail's wk GEMV.
# At C=512, D=5120: 64 channel blocks x 5 K-splits = 320 programs (~2.4 per H200 SM), 16 KB of wkv
# (+16 KB of wgate) each; the tail then adds 5 partials.
# idx_mma: the indexer key's product on the tensor cores (`_idx_linear_mma`), at ratio 1 only: H200, L2-cold graph
# replay, twice, interleaved (tuning/tune_compressor_idx_mma.json): ratio 1 11.41 / 11.51 -> 10.93 / 10.98 µs
# (IBK 64: 11.94 / 11.98, 256: 12.04 / 12.22), ratio 2 15.13 / 15.34 -> 15.90 / 16.08 (slower); the same codes
# pdl: programmatic dependent launch (pdl.py): the first weights load before the grid wait. Alone it changes nothing
# (L2-cold 10.8-10.9 µs at ratio 1 with or without); behind the decode norm that produces x (PDL too) it takes what
# the compressor adds to the step from 10.0-10.3 to 8.7-8.9 µs at ratio 1 and 14.8-15.0 to 13.2-13.3 at ratio 2
# (H200, benchmarks/step_chain.py, results/step_chain.json, twice, interleaved; the same bytes).
DECODE_CFG = {  # tail_pf: `_prefetch_tail` where the device has the L2 bulk prefetch
    1: {"BN": 8, "KPS": 1024, "BK": 1024, "IBK": 128, "num_warps": 8, "maxnreg": None, "tail_pf": True,
        "idx_mma": True, "pdl": True},
    2: {"BN": 8, "KPS": 1024, "BK": 1024, "IBK": 128, "num_warps": 8, "maxnreg": None, "tail_pf": True,
        "idx_mma": False, "pdl": True},
}


def _decode_cfg(ratio, C, D, over):
    cfg = dict(DECODE_CFG[ratio])
    bad = set(over or {}) - set(cfg)
    if bad:
        raise ValueError(f"compress: unknown decode_cfg keys {sorted(bad)} (known: {sorted(cfg)})")
    cfg.update(over or {})
    cfg["BN"] = min(cfg["BN"], C)
    cfg["KPS"] = min(cfg["KPS"], triton.next_power_of_2(D))
    cfg["BK"] = min(cfg["BK"], cfg["KPS"])
    cfg["IBK"] = min(cfg["IBK"], C)
    for k in ("BN", "KPS", "BK", "IBK"):
        v = cfg[k]
        if v <= 0 or v & (v - 1):
            raise ValueError(f"compress: decode_cfg {k}={v} must be a power of two")
    if C % cfg["BN"] or C % cfg["IBK"]:
        raise ValueError(f"compress: decode_cfg BN={cfg['BN']} / IBK={cfg['IBK']} must divide C={C}")
    return cfg


def _launch_decode_fused(x, wkv, wgate, norm_w, cos, sin, pos, rows, kv_cache, kv_scale, latent_out, wk,
                         k_norm_w, idx_cache, idx_scale, eps, ratio, rope, CI, decode_cfg):
    """One launch: split-K FMA GEMV over (C/BN) x NSPLIT programs, the last arriver runs the tail."""
    T, D = x.shape
    C = wkv.shape[0]
    cfg = _decode_cfg(ratio, C, D, decode_cfg)
    nsplit = triton.cdiv(D, cfg["KPS"])
    n_out = T // ratio
    fuse = wk is not None
    # fp32 workspace: partials [nsplit, T, C], gate partials (same), the tail's latent scratch [n_out, C]
    ws = torch.empty(2 * nsplit * T * C + n_out * C, dtype=torch.float32, device=x.device)
    dummy = kv_cache
    cos, sin = cos.contiguous(), sin.contiguous()
    wk = wk.contiguous() if fuse else None
    pf = {}
    row_sizes = (C * (wk.element_size() if fuse else 2), C * norm_w.element_size(),
                 CI * (k_norm_w.element_size() if fuse else 2), rope // 2 * cos.element_size())
    if (cfg["tail_pf"] and all(b % 16 == 0 for b in row_sizes)
            and l2_prefetch_for(x.device, wk, norm_w, k_norm_w, cos, sin)):
        pf = dict(TAIL_PF=True, WK_ROW=row_sizes[0], NW_BYTES=row_sizes[1], KNW_BYTES=row_sizes[2],
                  CS_ROW=row_sizes[3])
    pdl = bool(cfg["pdl"]) and pdl_for(x.device)
    _compress_decode_kernel[(C // cfg["BN"], nsplit)](
        x, wkv.contiguous(), (wgate if wgate is not None else wkv).contiguous(), norm_w, cos,
        sin, pos.to(torch.int32).contiguous(), rows.to(torch.int32).contiguous(),
        _u8(kv_cache), _u8(kv_scale), latent_out if latent_out is not None else dummy,
        wk if fuse else wkv, k_norm_w if fuse else norm_w,
        _u8(idx_cache) if fuse else dummy, _u8(idx_scale) if fuse else dummy, ws, counters(x.device, 1),
        x.stride(0) // 8, eps, K=D,
        C=C, ROPE=rope, RATIO=ratio, NT=T, BN=cfg["BN"], KPS=cfg["KPS"], BK=cfg["BK"], NSPLIT=nsplit,
        WRITE_LAT=latent_out is not None, LAT_BF16=latent_out is not None and latent_out.dtype == torch.bfloat16,
        FUSE_IDX=fuse, CI=CI, IROPE=rope, IBK=cfg["IBK"], num_warps=cfg["num_warps"], num_stages=1,
        IDX_MMA=(2 if interpreting() else 1) if cfg["idx_mma"] else 0, enable_fp_fusion=False, **pf,
        PDL=pdl, **launch_kw(pdl),
        **({"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] and not interpreting() else {}))


def compress(x, wkv, norm_w, cos, sin, pos, rows, kv_cache, kv_scale, *, ratio: int = 1, wgate=None,
             latent_out=None, wk=None, k_norm_w=None, idx_cache=None, idx_scale=None, eps: float = 1e-20,
             block_m: int | None = None, block_k: int | None = None, num_warps: int | None = None,
             num_stages: int = 2, split_k: int | None = None, fused_tail: bool | None = None,
             decode_cfg: dict | None = None):
    """Run the fused compressor.

    x [T, D] bf16 (ratio 2: T = 2·J complete aligned pairs); wkv (and wgate) [C, D] bf16;
    norm_w [C]; cos/sin [P, rope/2] fp32 (compress RoPE table); pos [T/ratio] int32 (entry
    position: t, or 2j); rows [T/ratio] int32 cache rows (-1 = skip); kv_cache [N, C/2] uint8,
    kv_scale [N, C/16] uint8 (E4M3 codes). Optional latent_out [T/ratio, C] (pre-RoPE latent), and
    the fused indexer key: wk [CI, C], k_norm_w [CI], idx_cache [N, CI/2] uint8, idx_scale
    [N, CI/32] uint8 (UE8M0). split_k: decode path (T <= 32 tokens by default): the linear runs
    as split-K partial sums over many programs, then the tail adds them. fused_tail (decode, T in
    {1, 2, 4} with T/ratio <= 2 rows): True = one launch (`_compress_decode_kernel`, the last
    program runs the tail), False = the two-launch path (GEMV kernel, then the tail kernel); None
    = fused for one output row (T == ratio, the H200-timed cases), two-launch otherwise. decode_cfg overrides the fused launch's tiling (`DECODE_CFG` keys).
    Returns latent_out."""
    T, D = x.shape
    C = wkv.shape[0]
    if ratio not in (1, 2):
        raise ValueError(f"compress: ratio {ratio} (only 1 and 2 exist in DeepSeek-V4.1)")
    if ratio == 2 and (wgate is None or T % 2):
        raise ValueError("compress: ratio 2 needs wgate and an even number of tokens (complete aligned pairs; "
                         "buffer the odd token of a chunk and prepend it to the next call)")
    if wkv.shape[1] != D or x.stride(1) != 1:
        raise ValueError(f"compress: x {tuple(x.shape)} / wkv {tuple(wkv.shape)} mismatch or x not row-major")
    n_out = T // ratio
    rope = cos.shape[1] * 2
    fuse = wk is not None
    CI = wk.shape[0] if fuse else 32
    interp = interpreting()
    if split_k is None:
        split_k = 8 if T <= 32 else 0
    BM = block_m or (16 if (ratio == 2 or n_out <= 16) else 32)
    if num_warps is None:
        num_warps = 8
    BK = block_k or (32 if ratio == 2 else 64)  # ratio 2 streams 4 weight tiles per K step
    dummy = kv_cache
    if n_out == 0:
        return latent_out
    # the fused kernel's 16-byte loads need 8-element aligned x rows (K itself is a constexpr there)
    fusable = bool(split_k) and T in (1, 2, 4) and n_out <= 2 and x.stride(0) % 8 == 0 and D % 8 == 0
    if fused_tail and not fusable:
        raise ValueError(f"compress: fused_tail=True needs the decode path with T in (1, 2, 4) tokens, at most "
                         f"2 output rows and 8-element (16-byte) aligned x rows (got T={T}, ratio={ratio}, "
                         f"split_k={split_k}, x.stride(0)={x.stride(0)}, D={D}); pass fused_tail=None")
    # by default only one output row (T == ratio): the H200-timed cases; two rows (130-183 registers a
    # thread, one block per SM) are untimed, so they take the one launch only when asked (fused_tail=True)
    if fusable and (fused_tail or (fused_tail is None and n_out == 1)):
        _launch_decode_fused(x, wkv, wgate, norm_w, cos, sin, pos, rows, kv_cache, kv_scale, latent_out, wk,
                             k_norm_w, idx_cache, idx_scale, eps, ratio, rope, CI, decode_cfg)
        return latent_out
    part = gpart = dummy
    if split_k:
        if T > 32:
            raise ValueError(f"compress: split_k (decode path) takes at most 32 tokens, got {T}")
        BT = max(16, triton.next_power_of_2(T))
        BN = 64 if C % 64 == 0 else C
        kps = triton.cdiv(triton.cdiv(D, split_k), 64) * 64
        split_k = triton.cdiv(D, kps)
        part = torch.empty((split_k, T, C), dtype=torch.float32, device=x.device)
        gpart = torch.empty_like(part) if ratio == 2 else part
        _compress_gemv_kernel[(C // BN, split_k)](
            x, wkv.contiguous(), (wgate if wgate is not None else wkv).contiguous(), part, gpart, T, D, x.stride(0), kps,
            C=C, BT=BT, BN=BN, BK=64, GATE=ratio == 2, UPCAST=interp, num_warps=4)
    grid = (triton.cdiv(n_out, BM),)
    _compressor_kernel[grid](
        x, wkv.contiguous(), (wgate if wgate is not None else wkv).contiguous(), norm_w, cos.contiguous(),
        sin.contiguous(), pos.to(torch.int32).contiguous(), rows.to(torch.int32).contiguous(),
        _u8(kv_cache), _u8(kv_scale), latent_out if latent_out is not None else dummy,
        wk.contiguous() if fuse else wkv, k_norm_w if fuse else norm_w,
        _u8(idx_cache) if fuse else dummy, _u8(idx_scale) if fuse else dummy, part, gpart,
        n_out, D, x.stride(0), eps, T, split_k,
        C=C, ROPE=rope, RATIO=ratio, BM=BM, BK=BK, WRITE_LAT=latent_out is not None,
        LAT_BF16=latent_out is not None and latent_out.dtype == torch.bfloat16,
        FUSE_IDX=fuse, CI=CI, IROPE=rope, UPCAST=interp, FROM_PART=bool(split_k), num_warps=num_warps,
        num_stages=num_stages,
        enable_fp_fusion=False)
    return latent_out


# ----------------------------------------------------------------------------- reference


def _rms(x, w, eps, bf16: bool):
    xf = x.float()
    ms = (xf * xf).sum(-1, keepdim=True) / xf.shape[-1] + eps
    y = xf * (1.0 / torch.sqrt(ms))
    if bf16:
        return (y.to(torch.bfloat16) * w.to(torch.bfloat16)).float()
    return y * w.float()


def rope_ref(x, pos, cos, sin, inverse: bool = False):
    """Interleaved-pair RoPE on the last 2·cos.shape[1] channels of x [..., C] (fp32 math)."""
    x = x.float().clone()
    n = cos.shape[1]
    c = cos[pos.long()].float()
    s = sin[pos.long()].float()
    while c.dim() < x.dim():
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    if inverse:
        s = -s
    e = x[..., -2 * n::2].clone()
    o = x[..., -2 * n + 1::2].clone()
    x[..., -2 * n::2] = e * c - o * s
    x[..., -2 * n + 1::2] = e * s + o * c
    return x


def compress_ref(x, wkv, norm_w, cos, sin, pos, rows, kv_cache, kv_scale, *, ratio: int = 1, wgate=None,
                 latent_out=None, wk=None, k_norm_w=None, idx_cache=None, idx_scale=None, eps: float = 1e-20,
                 block_m=None, block_k=None, num_warps=None, num_stages=2, split_k=None,
                 fused_tail=None, decode_cfg=None):
    """Pure-PyTorch compressor with the spec's roundings (same call signature as `compress`)."""
    xf = x.float()
    if ratio == 1:
        kv = (xf @ wkv.float().T).to(torch.bfloat16)
        lat = _rms(kv, norm_w, eps, True)
    else:
        kv = (xf @ wkv.float().T).unflatten(0, (-1, 2))
        g = (xf @ wgate.float().T).unflatten(0, (-1, 2))
        m = g.amax(1, keepdim=True)
        e = torch.exp(g - m)
        p = e / e.sum(1, keepdim=True)
        lat = _rms(p[:, 0] * kv[:, 0] + p[:, 1] * kv[:, 1], norm_w, eps, False)
    if latent_out is not None:
        latent_out.copy_(lat.to(latent_out.dtype))
    ok = rows.long() >= 0
    rr = rows.long()[ok]
    if wk is not None:
        k = (lat.to(torch.bfloat16).float() @ wk.float().T).to(torch.bfloat16)
        k = _rms(k, k_norm_w, eps, True)
        k = rope_ref(k, pos, cos, sin).to(torch.bfloat16)
        kp, ke = formats.quant_fp4_ue8m0(k.float(), 32)
        _u8(idx_cache)[rr] = kp[ok]
        _u8(idx_scale)[rr] = ke[ok]
    c = rope_ref(lat, pos, cos, sin)
    if ratio == 1:
        c = c.to(torch.bfloat16)
    p4, s4 = formats.quant_fp4_e4m3(c.float(), 16)
    _u8(kv_cache)[rr] = p4[ok]
    _u8(kv_scale)[rr] = s4.view(torch.uint8)[ok]
    return latent_out


# ----------------------------------------------------------------------------- registration


def _specs(target, widths=PUBLISHED):
    c = widths
    out = []
    gemv_types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "wg_ptr": "*bf16", "part_ptr": "*fp32", "gpart_ptr": "*fp32",
                  "T": "i32", "K": "i32", "stride_x": "i32", "k_per_split": "i32"}
    for ratio in (1, 2):
        bk = 32 if (target == "rocm:gfx1100" or ratio == 2) else 64
        lat_t = "*bf16" if ratio == 1 else "*fp32"
        types = {"x_ptr": "*bf16", "wkv_ptr": "*bf16", "wg_ptr": "*bf16", "nw_ptr": "*bf16",
                 "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i32", "rows_ptr": "*i32",
                 "kvc_ptr": "*u8", "kvs_ptr": "*u8", "lat_ptr": lat_t, "wk_ptr": "*bf16", "knw_ptr": "*bf16",
                 "ic_ptr": "*u8", "is_ptr": "*u8", "part_ptr": "*fp32", "gpart_ptr": "*fp32", "n_out": "i32",
                 "K": "i32", "stride_x": "i32", "eps": "fp32", "n_tok": "i32", "ksplit": "i32"}
        # prefill: fused GEMM + tail; decode: split-K GEMV (many programs) + tail reading the partials
        for phase, bm, from_part in (("prefill", 32 if ratio == 1 else 16, False), ("decode", 16, True)):
            const = {"C": c.head_dim, "ROPE": c.qk_rope_head_dim, "RATIO": ratio, "BM": bm, "BK": bk,
                     "WRITE_LAT": True, "LAT_BF16": ratio == 1, "FUSE_IDX": True, "CI": c.index_head_dim,
                     "IROPE": c.qk_rope_head_dim, "UPCAST": False, "FROM_PART": from_part}
            out.append(aot_spec(_compressor_kernel, f"r{ratio}_{phase}_bm{bm}", types, const, num_warps=8,
                                num_stages=1 if target == "rocm:gfx1100" else 2,
                                keys={"RATIO": ratio, "BM": bm, "BK": bk, "C": c.head_dim, "FUSE_IDX": True,
                                      "FROM_PART": from_part, "enable_fp_fusion": False}))
        bt = 16 * ratio
        out.append(aot_spec(_compress_gemv_kernel, f"r{ratio}_decode_gemv_bt{bt}", gemv_types,
                            {"C": c.head_dim, "BT": bt, "BN": 64, "BK": 64, "GATE": ratio == 2, "UPCAST": False},
                            num_warps=4))
        # fused decode (one launch, last arriver runs the tail): one token (ratio 1) / one pair (ratio 2)
        cfg = _decode_cfg(ratio, c.head_dim, c.hidden_size, None)
        nt = ratio
        ftypes = {k: v for k, v in types.items() if k not in ("part_ptr", "gpart_ptr", "n_out", "n_tok", "ksplit", "K")}
        ftypes.update({"ws_ptr": "*fp32", "cnt_ptr": "*i32", "stride_x8": "i32"})
        del ftypes["stride_x"]
        fconst = {"K": c.hidden_size, "C": c.head_dim, "ROPE": c.qk_rope_head_dim, "RATIO": ratio, "NT": nt, "BN": cfg["BN"],
                  "KPS": cfg["KPS"], "BK": cfg["BK"], "NSPLIT": -(-c.hidden_size // cfg["KPS"]), "WRITE_LAT": True,
                  "LAT_BF16": ratio == 1, "FUSE_IDX": True, "CI": c.index_head_dim, "IROPE": c.qk_rope_head_dim,
                  "IBK": cfg["IBK"], "TAIL_PF": False, "WK_ROW": 0, "NW_BYTES": 0, "KNW_BYTES": 0, "CS_ROW": 0,
                  "IDX_MMA": int(cfg["idx_mma"]), "PDL": False}
        out.append(aot_spec(_compress_decode_kernel, f"r{ratio}_decode_fused_t{nt}", ftypes, fconst,
                            num_warps=cfg["num_warps"], num_stages=1,
                            keys={"RATIO": ratio, "NT": nt, "C": c.head_dim, "FUSE_IDX": True, "BN": cfg["BN"],
                                  "KPS": cfg["KPS"], "enable_fp_fusion": False,
                                  **({"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] else {})}))
    return out


register(KernelTemplate(
    name="compressor", module=__name__,
    summary="wkv GEMM (+ ratio-2 gated pair pool) -> RMSNorm -> RoPE -> FP4/E4M3 cache append (+ fused indexer key)",
    keys=("RATIO", "C", "ROPE", "BM", "BK", "FUSE_IDX", "CI", "BN", "BT", "FROM_PART", "GATE", "IBK", "IROPE", "K",
          "KPS", "LAT_BF16", "NSPLIT", "NT", "UPCAST", "WRITE_LAT", "TAIL_PF", "WK_ROW", "NW_BYTES", "KNW_BYTES",
          "CS_ROW", "IDX_MMA", "PDL"),
    reference=compress_ref, launch=compress, specializations=_specs))
