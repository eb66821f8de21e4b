"""Batched decode sparse attention with warp specialization (Gluon, CUDA sm90+): a producer dequantizes, consumers multiply.

What: the same computation as `sparse_attention.py`'s quantized decode split (one program = one query x one range of
key blocks; window FP8 E4M3 + UE8M0/32 rows, then selected FP4 E2M1 + E4M3/16 rows; K = V; partial (m, l, acc) per
split, merged with the sink and the inverse RoPE by `sparse_attention._combine_kernel`; acc in bf16 by default).

Why a second kernel: in the Triton kernel every warp does everything in turn — gather a key block, dequantize it into
the bf16 tile, q·K^T, the online softmax, P·V — so the tensor cores idle while the tile is decoded and the decode waits
on the MMAs (H200 profile, tuning/ncu_attn_batch_S64_source.txt: 24 % of issue slots used, 0.35 eligible warps a
scheduler; 64 queries took 6.6x their FLOP floor). Triton's automatic warp specialization does not take this loop
(its gathers are not TMA loads; `tl.range(warp_specialize=True)` leaves the sm90 code unchanged), so the partitions
are written by hand in Gluon (Triton's explicit-layout dialect, `triton.experimental.gluon`):

- producer partition (4 warps, PRODUCER_REGS registers): for each key block it gathers the rows (window ring slots or
  the indexer's selected entries), decodes them exactly to the bf16 tile [BN, D] in units of 2^-8 (FP4 rows loaded
  as int32 words and decoded by `kv_pairs`' bf16x2 PTX, written as int32 pairs through an int32 view of the same
  128-byte-swizzled buffer; FP8 codes by the hardware e4m3 conversion times the UE8M0 power of two), NCH channel
  chunks at a time, writes the block's -inf padding bias [BN], and signals `ready[buf]`; NBUF tiles in a ring, each
  freed by the consumers through `empty[buf]`. A block's gathers go out before the producer waits for a free tile.
- consumer (default) partition (8 warps = 2 warpgroups, the registers the producer leaves: 192): q [H, D] staged
  once in shared memory; per block S = q·K^T by wgmma (the two warpgroups take half the keys each), the online
  softmax (fp32 m, l), then P·V by wgmma with P from registers (each warpgroup owns half of the D output channels),
  waited for in the same iteration: an accumulator left in flight across the loop's back edge made ptxas serialize
  every wgmma of the kernel (C7515, a wait after each of the 36 a block; tests/test_kernels_sparse_attention_ws.py
  checks the chain); then the tile goes back to the producer. After the last block the split's (m, l) are stored in
  fp32 and acc (PBF16, the default) rounded to bf16 into the freed tile ring, then read back 16 bytes a thread and
  stored as whole 128-byte lines: half the bytes of fp32 partials, and the accumulator layout's 4-byte bf16 pairs
  (half a sector a quad) never reach global memory.

The arithmetic is the Triton kernel's: the same exact bf16 tiles, fp32 logits, P rounded to bf16, fp32 accumulation,
the same combine (not the same bits: the MMA instruction shapes differ, and acc is rounded to bf16 before the merge,
at most half a bf16 ulp of each split's acc; bf16 has fp32's range, so no row scaling, which fp16 partials need: Tried).
With PDL (pdl.py) the launch waits for its predecessor's grid and lets the combine's launch be scheduled at once.

Measured (H200, L2-cold graph replay, 64 queries, results/kernels_attention.json, tuning/sparse_attention_ws/): with
fp32 partials 33.9-34.3 µs against the Triton kernel's 50.4-51.1; the launch without its combine 28.0, the consumers
alone 22.2, the producer alone 23.1. With bf16 partials: 29.5 µs, the launch alone 25.2 (fp32 partials in the same
run: 34.1-34.3 and 28.3; tuning/sparse_attention_ws/bf16_partials.json). One query: level with the Triton kernel,
which keeps it (sparse_attention.WS_ATTENTION's rule; tuning/sparse_attention_ws/one_query.json).

Specialization keys: H (64), D (512), W (128), BN (key block, 64), NBUF (tiles in flight, 2: q 64 KB + 2 x 64 KB),
PRODUCER_REGS, NCH (decode chunks), PDL, PBF16 (bf16 partials through shared memory; off: fp32 stored from the
accumulator); the launch's maxnreg (168: 12 warps share the 64 K registers, redistributed by setmaxnreg).

Where its time goes (tuning/ws_timeline_fp32_partials.json, 64 queries L2-cold): first tile ready 4.9 µs into a
program, then a 64-key block every 3.3-3.5 µs (the producer's chain: 2.2 µs to hold the next block's rows, 1.3 to
decode; alone it takes 2.3 a block, the consumers alone 2.5), the partial store 4.5 µs, the combine ~6 after the
grid. With bf16 partials (results/ws_timeline.json) the store takes 1.3 µs after the loop; the loop is unchanged.

Tried (measured slower, not kept; L2-cold µs at 64 queries against the kernel of the same run):
- the producer gathering block i+1 before decoding block i (LOOKAHEAD): 38.6 against 36.3
  (tuning/sparse_attention_ws/lookahead.json); with the query's entries staged in shared memory once, 35.0-39.9
  against 35.0-35.3 (tuning/sparse_attention_ws/idx.json).
- the next block's entries loaded a block ahead, so its rows go out at once: 35.4-35.6 against 34.1-34.5.
- the last split of a query merging the others' partials in the launch, its own through the tile ring: 39.6 against
  36.7, and its bits depend on the arrival order (tuning/sparse_attention_ws/fused_merge.json); the two splits merged
  by the last to arrive, no combine kernel: 38.3-38.5 against 34.2 (30.3-30.5 against 32.2 warm).
- fp32 partials staged through the freed tile ring: 35.1 against 34.1-34.5 (the store is bound by the L2's write
  rate, not its pattern); row-scaled fp16 partials stored from the accumulator: 36.0.
- every row of the program's blocks prefetched into the L2 at its start: 35.1-35.3; its selected entries prefetched
  into the L2: 30.9-31.3 against 29.0-29.1.
- the compressed rows gathered by cp.async into an 18 KB staging buffer one block ahead: 37.6.
- 1 or 4 splits: 47.3 / 50.9 against 36.3 (tuning/sparse_attention_ws/first_kernel.json).
- 8 producer warps: the launch's 128 registers a thread leave the consumers' wgmma short (ptxas C7602, needs 158).
- a word-level E2M1 decode (7 PTX instructions a byte against 9): more SASS, not fewer; not timed.

Known gaps: CUDA sm90 only (wgmma, mbarrier partitions, setmaxnreg; sm100 would need tcgen05) — the matrix lists the
Triton kernel everywhere else; quantized KV, H = 64, D = 512 only; always writes partials (8.4 MB of bf16 at 64
queries: their store 1.3 µs and the combine ~4.3 of the 29.5 µs); no interpreter path (Gluon has none): its
numerics are tested on the GPU only, its sm90 build on the CPU. The AOT variant is built with PDL off and ships no launcher for the runtime yet.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)

from triton.experimental.gluon.language._core import builtin

from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.kv_pairs import _E2M1_PAIRS
from dsv41c.codegen.triton.targets import interpreting
from dsv41c.codegen.triton.pdl import launch_kw
from dsv41c.codegen.triton.widths import PUBLISHED

# a CTA-wide (in a partition: the partition's warps) barrier: `gl.barrier` since triton 3.7, `gl.thread_barrier` before
_sync = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier



@builtin
def _reinterpret(smem, dtype, shape, layout, _semantic=None):
    """smem viewed as another dtype / shape / layout (`reinterpret` since triton 3.7, `_reinterpret` before)."""
    view = getattr(smem, "reinterpret", None) or smem._reinterpret
    return view(dtype, shape, layout, _semantic=_semantic)


WS_BN = 64  # keys a block: two warpgroups x 32 keys of q·K^T
WS_NBUF = 2  # bf16 tiles in flight: 64 KB each, beside q's 64 KB (sm90: 227 KB a CTA)
WS_PRODUCER_REGS = 120  # registers a producer thread; the consumers get 192 (sm90, triton 3.6 ptxas: 8 bytes of stack at 120, 176 at 112)
WS_MAXNREG = 168
WS_PDL = True  # launched with PDL where the device has it (pdl.py): the combine's launch overlaps this grid
# bf16 partials stored through the freed tile ring (PBF16): 64 queries 34.1-34.3 -> 29.5 µs L2-cold on the H200, the
# launch alone 28.3 -> 25.2 (tuning/sparse_attention_ws/bf16_partials.json)
WS_PARTIAL_BF16 = True
WS_CHUNKS = 4  # channel chunks a tile is decoded in (the producer's live outputs: 32 registers a chunk)  # the launch's per-thread budget for 12 warps (<= 65536 / 384), redistributed by setmaxnreg


@gluon.jit
def _rows3(n: gl.constexpr, L3: gl.constexpr):
    """arange(n) as [n, 1, 1] in the 3-D layout L3."""
    r = gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    return gl.expand_dims(gl.expand_dims(r, 1), 2)


@gluon.jit
def _mid3(n: gl.constexpr, L3: gl.constexpr):
    """arange(n) as [1, n, 1] in L3."""
    g = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    return gl.expand_dims(gl.expand_dims(g, 0), 2)


@gluon.jit
def _last3(n: gl.constexpr, L3: gl.constexpr):
    """arange(n) as [1, 1, n] in L3."""
    k = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    return gl.expand_dims(gl.expand_dims(k, 0), 1)


@gluon.jit
def _producer(wkv_ptr, wsc_ptr, ckv_ptr, csc_ptr, idx_ptr, s, p, wbase, cbase, R, KC, b0, b1,
              k_smem, bias_smem, ready, empty, D: gl.constexpr, W: gl.constexpr, BN: gl.constexpr,
              NBUF: gl.constexpr, NCH: gl.constexpr):
    """Fill the tile ring: per key block, gather its rows (every chunk's loads issued before waiting for a free
    tile), decode NCH channel chunks in turn into the tile (so a chunk's outputs, not the block's, are live), write
    the padding bias, then signal ready."""
    NWB: gl.constexpr = W // BN
    WG: gl.constexpr = D // 32 // NCH  # UE8M0 groups (32 channels) of a window chunk
    # FP8 window rows as [rows, groups of 32, 32 codes]; FP4 rows as [rows, groups of 16 channels, 2 int32 words]
    LW: gl.constexpr = gl.BlockedLayout([1, 1, 8], [8, 1, 4], [4, 1, 1], [2, 1, 0])
    LC: gl.constexpr = gl.BlockedLayout([1, 1, 2], [4, 8, 1], [4, 1, 1], [2, 1, 0])
    BIAS_L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    I32_TILE: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    s64 = s.to(gl.int64)
    i = 0
    for blk in range(b0, gl.minimum(b1, NWB)):
        # window keys: positions p-W+1 .. p at ring slot pos % R
        j = p - W + 1 + blk * BN + _rows3(BN, LW)
        ok = j >= 0
        rows = (wbase + gl.where(ok, j, 0) % R).to(gl.int64)
        codes = ()
        exps = ()
        for ch in gl.static_range(NCH):
            g = ch * WG + _mid3(WG, LW)
            codes = codes + (gl.load(wkv_ptr + rows * D + g * 32 + _last3(32, LW), mask=ok, other=0),)
            exps = exps + (gl.load(wsc_ptr + rows * (D // 32) + g, mask=ok, other=127),)
        jb = p - W + 1 + blk * BN + gl.arange(0, BN, layout=BIAS_L)
        bias = gl.where(jb >= 0, 0.0, float("-inf"))
        buf = i % NBUF
        mbarrier.wait(empty.index(buf), ((i // NBUF) & 1) ^ 1)
        tile = k_smem.index(buf)
        for ch in gl.static_range(NCH):
            # value·2^(e-127) in units of 2^-8: the e4m3 value (exact in fp32) x 2^-8, then x 2^(e-127) (bits e << 23)
            e = exps[ch].to(gl.int32)
            v = codes[ch].to(gl.float8e4nv, bitcast=True).to(gl.float32) * 0.00390625
            v = v * (e << 23).to(gl.float32, bitcast=True)
            tile.slice(ch * (D // NCH), D // NCH, dim=1).store(gl.reshape(v.to(gl.bfloat16), [BN, D // NCH]))
        bias_smem.index(buf).store(bias)
        fence_async_shared()
        _sync()
        mbarrier.arrive(ready.index(buf), count=1)
        i += 1
    c0 = gl.maximum(b0, NWB)
    cur = _cmp_loads(ckv_ptr, csc_ptr, idx_ptr, s64, cbase, KC, c0, b1, D, BN, NWB, NCH, LC, BIAS_L)
    for blk in range(c0, b1):
        words, factors, bias = cur
        buf = i % NBUF
        mbarrier.wait(empty.index(buf), ((i // NBUF) & 1) ^ 1)
        tile = _reinterpret(k_smem.index(buf), gl.int32, [BN, D // 2], I32_TILE)
        for ch in gl.static_range(NCH):
            # each word's 4 bytes -> 4 bf16x2 pairs (kv_pairs.py's PTX, the factor in both halves of $5 and $6)
            f = gl.broadcast(factors[ch], words[ch])[0]
            o0, o1, o2, o3 = gl.inline_asm_elementwise(_E2M1_PAIRS, "=r,=r,=r,=r,r,r,r", [words[ch], f, f],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
            # [rows, groups, word, i, j] = byte 2i + j of the word: the pairs in channel order
            w = gl.join(gl.join(o0, o2), gl.join(o1, o3))
            # int32 word c of a row = channels 2c, 2c+1: the bf16 tile's bytes under the same 128-byte swizzle
            tile.slice(ch * (D // 2 // NCH), D // 2 // NCH, dim=1).store(gl.reshape(w, [BN, D // 2 // NCH]))
        bias_smem.index(buf).store(bias)
        fence_async_shared()
        _sync()
        mbarrier.arrive(ready.index(buf), count=1)
        i += 1
        cur = _cmp_loads(ckv_ptr, csc_ptr, idx_ptr, s64, cbase, KC, blk + 1, b1, D, BN, NWB, NCH, LC, BIAS_L)


@gluon.jit
def _cmp_loads(ckv_ptr, csc_ptr, idx_ptr, s64, cbase, KC, blk, b1, D: gl.constexpr, BN: gl.constexpr,
               NWB: gl.constexpr, NCH: gl.constexpr, LC: gl.constexpr, BIAS_L: gl.constexpr):
    """The gathers of compressed block blk (nothing is read when blk >= b1): its packed FP4 rows as int32 words
    [BN, groups, 2] a chunk (a word = 4 bytes = 8 channels; 32-bit values, so a block carried across the loop stays
    one register a word, where uint8 elements took one register a byte), each group's factor (its E4M3 scale x
    2^118 as a bf16, copied into both halves of an int32: kv_pairs.py's fma then gives value·scale·2^-8, exact)
    [BN, groups, 1], and the block's padding bias [BN] (-1 entries and columns past KC)."""
    CG: gl.constexpr = D // 16 // NCH  # E4M3 groups (16 channels = 8 bytes = 2 words) of a chunk
    live = blk < b1
    jj = (blk - NWB) * BN + _rows3(BN, LC)
    ent = gl.load(idx_ptr + s64 * KC + jj, mask=(jj < KC) & live, other=-1)
    ok = ent >= 0
    rows = (cbase + gl.where(ok, ent, 0)).to(gl.int64)
    words = ()
    factors = ()
    for ch in gl.static_range(NCH):
        g = ch * CG + _mid3(CG, LC)
        words = words + (gl.load(ckv_ptr + rows * (D // 8) + g * 2 + _last3(2, LC), mask=ok, other=0),)
        sc = gl.load(csc_ptr + rows * (D // 16) + g, mask=ok, other=0)
        f = (sc.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 3.3230699894622896e35).to(gl.bfloat16)
        fb = f.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        factors = factors + (fb | (fb << 16),)
    jb = (blk - NWB) * BN + gl.arange(0, BN, layout=BIAS_L)
    eb = gl.load(idx_ptr + s64 * KC + jb, mask=(jb < KC) & live, other=-1)
    return words, factors, gl.where(eb >= 0, 0.0, float("-inf"))


@gluon.jit
def _consumer(q_ptr, s, sp, nblk, scale, n_split, pm_ptr, pl_ptr, pacc_ptr, q_smem, k_smem, bias_smem, ready, empty,
              H: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr, PBF16: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BN // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D // 2, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    Q_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    s64 = s.to(gl.int64)
    hq = gl.arange(0, H, layout=gl.SliceLayout(1, Q_L))
    cq = gl.arange(0, D, layout=gl.SliceLayout(0, Q_L))
    q_smem.store(gl.load(q_ptr + (s64 * H + hq)[:, None] * D + cq[None, :]))
    fence_async_shared()
    _sync()
    m_i = gl.full([H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    l_i = gl.zeros([H], gl.float32, layout=gl.SliceLayout(1, S_L))
    acc = gl.zeros([H, D], gl.float32, layout=O_L)
    zs = gl.zeros([H, BN], gl.float32, layout=S_L)
    scale = scale * 256.0  # tiles hold K = V in units of 2^-8
    for i in range(nblk):
        buf = i % NBUF
        mbarrier.wait(ready.index(buf), (i // NBUF) & 1)
        kt = k_smem.index(buf)
        qk = warpgroup_mma(q_smem, kt.permute((1, 0)), zs, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
        bias = bias_smem.index(buf).load(gl.SliceLayout(0, S_L))
        logits = qk * scale + bias[None, :]
        m_new = gl.maximum(m_i, gl.max(logits, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp(m_i - m_safe)
        pr = gl.exp(logits - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(pr, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        # P·V waited for in this iteration: an accumulator still in flight across the loop's back edge made ptxas
        # serialize every wgmma of the kernel (C7515: a wait after each of the 36 a block)
        acc = warpgroup_mma(gl.convert_layout(pr.to(gl.bfloat16), P_L), kt, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _sync()  # both warpgroups are done with the tile
        mbarrier.arrive(empty.index(buf), count=1)
    acc = acc * 256.0
    st = (s64 * n_split + sp) * H
    hs = gl.arange(0, H, layout=gl.SliceLayout(1, S_L))
    gl.store(pm_ptr + st + hs, m_i)
    gl.store(pl_ptr + st + hs, l_i)
    if PBF16:
        # bf16 partials, half the bytes, staged through a tile of the ring: the accumulator's layout gives a thread
        # 2 adjacent channels (4 bytes in bf16, half a sector a quad), so they are stored from shared memory instead,
        # 16 bytes a thread and whole 128-byte lines a warp. The ring is free: the producer has signalled its last
        # block and both warpgroups are past their last MMA (the loop's closing barrier).
        stage = k_smem.index(0)
        stage.store(acc.to(gl.bfloat16))
        _sync()
        # fresh aranges rather than q's hq / cq: those would stay live in the consumers' registers across the loop
        hp = gl.arange(0, H, layout=gl.SliceLayout(1, Q_L))
        cp = gl.arange(0, D, layout=gl.SliceLayout(0, Q_L))
        gl.store(pacc_ptr + (st + hp)[:, None] * D + cp[None, :], stage.load(Q_L))
    else:
        ho = gl.arange(0, H, layout=gl.SliceLayout(1, O_L))
        co = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
        gl.store(pacc_ptr + (st + ho)[:, None] * D + co[None, :], acc)


@gluon.jit
def _sparse_attn_ws_kernel(q_ptr, qpos_ptr, wkv_ptr, wsc_ptr, ckv_ptr, csc_ptr, idx_ptr, wbase_ptr, cbase_ptr,
                           pm_ptr, pl_ptr, pacc_ptr, R, KC, has_base, blocks_per_split, n_split, scale,
                           H: gl.constexpr, D: gl.constexpr, W: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
                           PRODUCER_REGS: gl.constexpr, NCH: gl.constexpr, PDL: gl.constexpr = False,
                           PBF16: gl.constexpr = False):
    if PDL:  # pdl.py's protocol: wait for the previous grid's writes, then let the combine launch be scheduled
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
    s = gl.program_id(0)
    sp = gl.program_id(2)
    p = gl.load(qpos_ptr + s)
    wbase = gl.load(wbase_ptr + s) * has_base  # has_base = 0: the base pointers alias qpos
    cbase = gl.load(cbase_ptr + s) * has_base
    b0 = sp * blocks_per_split
    b1 = gl.minimum(b0 + blocks_per_split, W // BN + gl.cdiv(KC, BN))
    TILE: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [H, D], TILE)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], TILE)
    bias_smem = gl.allocate_shared_memory(gl.float32, [NBUF, BN], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for k in gl.static_range(NBUF):
        mbarrier.init(ready.index(k), count=1)
        mbarrier.init(empty.index(k), count=1)
    gl.warp_specialize([
        (_consumer, (q_ptr, s, sp, b1 - b0, scale, n_split, pm_ptr, pl_ptr, pacc_ptr, q_smem, k_smem, bias_smem,
                     ready, empty, H, D, BN, NBUF, PBF16)),
        (_producer, (wkv_ptr, wsc_ptr, ckv_ptr, csc_ptr, idx_ptr, s, p, wbase, cbase, R, KC, b0, b1, k_smem,
                     bias_smem, ready, empty, D, W, BN, NBUF, NCH)),
    ], [4], [PRODUCER_REGS])


def ws_supported(q, win_kv, cmp_kv) -> bool:
    """Whether `sparse_attention_ws` can run these inputs: CUDA sm90+ (not ROCm, not the interpreter), FP8/FP4 KV, the
    model's 64 heads x 512 channels (one wgmma M of heads; two warpgroups of 256 output channels)."""
    if q.device.type != "cuda" or torch.version.hip is not None or interpreting():
        return False
    if not (isinstance(win_kv, (tuple, list)) and isinstance(cmp_kv, (tuple, list))):
        return False
    if tuple(q.shape[1:]) != (64, 512):
        return False
    return torch.cuda.get_device_capability(q.device)[0] >= 9


def launch_ws(q, qpos, wkv, wsc, ckv, csc, idx, wb, cb, pm, pl, pacc, R, KC, has_base, bps, n_split, scale, window,
              block_n=WS_BN, nbuf=WS_NBUF, producer_regs=WS_PRODUCER_REGS, maxnreg=WS_MAXNREG, chunks=WS_CHUNKS,
              pdl=False, partial_bf16=None):
    """The partial-writing launch (grid S x 1 x n_split); `sparse_attention` prepares the arguments and merges.
    partial_bf16: pacc is bf16, stored through shared memory (PBF16; None: pacc's dtype decides)."""
    S, H, D = q.shape
    pbf16 = pacc.dtype == torch.bfloat16
    if partial_bf16 is not None and bool(partial_bf16) != pbf16:
        raise ValueError(f"sparse_attention_ws: partial_bf16={partial_bf16} but pacc is {pacc.dtype}")
    if pacc.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"sparse_attention_ws: partials must be float32 or bfloat16, got {pacc.dtype}")
    if ckv.shape[-1] % 4 or not ckv.is_contiguous():
        raise ValueError(f"sparse_attention_ws: packed FP4 rows must be contiguous whole int32 words, got {tuple(ckv.shape)}")
    _sparse_attn_ws_kernel[(S, 1, n_split)](
        q, qpos, wkv, wsc, ckv.view(torch.int32), csc, idx, wb, cb, pm, pl, pacc,
        R, KC, int(has_base), bps, n_split, scale,
        H=H, D=D, W=window, BN=block_n, NBUF=nbuf, PRODUCER_REGS=producer_regs, NCH=chunks,
        PDL=bool(pdl), PBF16=pbf16, num_warps=8, maxnreg=maxnreg,
        **launch_kw(bool(pdl)))


# ============================================================================ registration


_WS_TYPES = {"q_ptr": "*bf16", "qpos_ptr": "*i32", "wkv_ptr": "*u8", "wsc_ptr": "*u8", "ckv_ptr": "*i32", "csc_ptr": "*u8",
             "idx_ptr": "*i32", "wbase_ptr": "*i32", "cbase_ptr": "*i32", "pm_ptr": "*fp32", "pl_ptr": "*fp32",
             "pacc_ptr": "*fp32", "R": "i32", "KC": "i32", "has_base": "i32", "blocks_per_split": "i32",
             "n_split": "i32", "scale": "fp32"}
def ws_specs(target, widths=PUBLISHED):
    """The launcher's defaults at the model's widths, sm90 only (wgmma, mbarrier partitions, setmaxnreg). Built with
    PDL off, like every AOT variant."""
    if target != "cuda:sm90":
        return []
    c = widths
    const = {"H": c.num_attention_heads, "D": c.head_dim, "W": c.sliding_window, "BN": WS_BN, "NBUF": WS_NBUF,
             "PRODUCER_REGS": WS_PRODUCER_REGS, "NCH": WS_CHUNKS, "PDL": False, "PBF16": WS_PARTIAL_BF16}
    types = {**_WS_TYPES, "pacc_ptr": "*bf16" if WS_PARTIAL_BF16 else "*fp32"}
    return [aot_spec(_sparse_attn_ws_kernel, f"decode_batch_fp8fp4_bn{WS_BN}_nbuf{WS_NBUF}", types, const,
                     num_warps=8, num_stages=1, keys={**const, "maxnreg": WS_MAXNREG})]

