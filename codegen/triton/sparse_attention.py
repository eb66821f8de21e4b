"""Sparse latent attention: sliding window ∪ selected compressed entries, with sinks and inverse RoPE.

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

Algorithm (flash-decoding style): a program owns one query, all H heads (the MMA rows: the
heads share every key, MQA), a range of DV output channels and a range of key blocks (BN keys).
Window blocks and compressed blocks run in two separate loops (no format branch inside a loop).
Per key block it gathers the key rows with contiguous loads in natural channel order (FP4 bytes
are split into nibbles and re-interleaved in registers), computes q·k over the 512 channels in
chunks of DC (q is re-read from L1/L2 per chunk; 64×512 does not fit registers), keeps the
online-softmax state (m, l) in fp32, and accumulates P·V for its own DV channels only. With one
split the program applies the sink, normalizes and inverse-rotates (pairs taken apart with
tl.split, put back with tl.join); with several splits (decode: the keys are spread over ~32
programs) partial (m, l, acc) go to a scratch buffer and `_combine_kernel` (splits unrolled)
merges them, adds the sink and inverse-rotates.

Specialization keys: H (64), D (512), ROPE (64), W (128), BN (key block), DC (q·k channel
chunk), DV (output channels per program), QUANT (fp8/fp4 vs bf16), SPLIT; combine: NSPLIT.
Variants (from an H200 sweep): decode = split over 10 programs, DV 256, BN 64, + combine
(NSPLIT 10; a batch of >= 32 decode queries runs the same tile unsplit); prefill (>= 256 queries)
= one program per query, DV 512, BN 32; each for both KV formats (bf16 with DC 64 and one
pipeline stage: shared memory). ROCm: one stage (LDS: 64 KB gfx942/gfx1100, 160 KB gfx950);
gfx1100 also BN 32, DC 64 and DV 256 for prefill.

Known gaps: entries selected by the indexer that also lie in the window are attended twice
(as the reference does, spec §3.4 note). Window rows are trusted to hold the right positions
(the ring must be at least W + S - 1 rows for a prefill chunk of S queries). Probabilities are
rounded to bf16 for the P·V MMA on GPUs (fp32 in the interpreter). No paging (base rows only).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton.kv_quant import (
    aot_spec, e2m1_decode, e4m3_decode, interpreting, is_rocm, round_bf16, ue8m0_to_float)
from dsv41c import formats as nx


@triton.jit
def _load_rows(kv_ptr, sc_ptr, rows, valid, c0, N: tl.constexpr, D: tl.constexpr, WIN: tl.constexpr,
               QUANT: tl.constexpr):
    """Key/value rows [BN] x channels c0..c0+N (natural order, contiguous loads) -> fp32 [BN, N]."""
    r64 = rows.to(tl.int64)[:, None]
    pm = valid[:, None]
    cols = c0 + tl.arange(0, N)
    if QUANT:
        if WIN:  # FP8 E4M3 codes [R, D] + UE8M0 [R, D/32]
            c = tl.load(kv_ptr + r64 * D + cols[None, :], mask=pm, other=0)
            sc = ue8m0_to_float(tl.load(sc_ptr + r64 * (D // 32) + (cols // 32)[None, :], mask=pm, other=127))
            v = e4m3_decode(c) * sc
        else:  # packed FP4 [N, D/2] (low nibble = even channel) + E4M3 per 16 channels [N, D/16]
            b = tl.load(kv_ptr + r64 * (D // 2) + (c0 // 2 + tl.arange(0, N // 2))[None, :], mask=pm,
                        other=0).to(tl.int32)
            v = tl.reshape(tl.join(e2m1_decode(b & 15), e2m1_decode(b >> 4)), (rows.shape[0], N))
            sc = e4m3_decode(tl.load(sc_ptr + r64 * (D // 16) + (cols // 16)[None, :], mask=pm, other=0))
            v = v * sc
    else:
        v = tl.load(kv_ptr + r64 * D + cols[None, :], mask=pm, other=0.0).to(tl.float32)
    return v


@triton.jit
def _qk_block(q_rows, kv_ptr, sc_ptr, rows, valid, H: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
              DC: tl.constexpr, WIN: tl.constexpr, QUANT: tl.constexpr, UPCAST: tl.constexpr):
    """q [H, D] (rows of pointers) · K[rows]^T over D in chunks of DC -> fp32 [H, BN]."""
    qk = tl.zeros((H, BN), tl.float32)
    for dc in tl.static_range(D // DC):
        qc = tl.load(q_rows + dc * DC + tl.arange(0, DC)[None, :])
        kc = _load_rows(kv_ptr, sc_ptr, rows, valid, dc * DC, DC, D, WIN, QUANT)
        if UPCAST:
            qk = tl.dot(qc.to(tl.float32), tl.trans(kc), qk)
        else:
            qk = tl.dot(qc, tl.trans(kc.to(tl.bfloat16)), qk)
    return qk


@triton.jit
def _online_update(qk, valid, scale, m_i, l_i, acc, v, UPCAST: tl.constexpr):
    logits = tl.where(valid[None, :], qk * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    pr = tl.exp(logits - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(pr, axis=1)
    if UPCAST:
        acc = tl.dot(pr, v, acc * alpha[:, None])
    else:
        acc = tl.dot(pr.to(tl.bfloat16), v.to(tl.bfloat16), acc * alpha[:, None])
    return m_new, l_i, acc


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
                        sink_ptr, cos_ptr, sin_ptr, o_ptr, pm_ptr, pl_ptr, pacc_ptr,
                        R, KC, blocks_per_split, n_split, scale,
                        H: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr, W: tl.constexpr, BN: tl.constexpr,
                        DC: tl.constexpr, DV: tl.constexpr, QUANT: tl.constexpr, SPLIT: tl.constexpr,
                        UPCAST: tl.constexpr):
    NWB: tl.constexpr = W // BN
    s = tl.program_id(0)
    cv = tl.program_id(1)
    sp = tl.program_id(2)
    s64 = s.to(tl.int64)
    hh = tl.arange(0, H)
    p = tl.load(qpos_ptr + s)
    wbase = tl.load(wbase_ptr + s)
    cbase = tl.load(cbase_ptr + s)
    n_blocks = NWB + KC // BN
    b0 = sp * blocks_per_split
    b1 = tl.minimum(b0 + blocks_per_split, n_blocks)
    q_rows = q_ptr + (s64 * H + hh)[:, None] * D
    c0 = cv * DV
    m_i = tl.full((H,), float("-inf"), tl.float32)
    l_i = tl.zeros((H,), tl.float32)
    acc = tl.zeros((H, DV), tl.float32)
    # window keys: positions p-W+1 .. p, ring slot pos % R
    for blk in range(b0, tl.minimum(b1, NWB)):
        j = p - W + 1 + blk * BN + tl.arange(0, BN)
        valid = j >= 0
        rows = wbase + tl.where(valid, j, 0) % R
        qk = _qk_block(q_rows, wkv_ptr, wsc_ptr, rows, valid, H, BN, D, DC, True, QUANT, UPCAST)
        v = _load_rows(wkv_ptr, wsc_ptr, rows, valid, c0, DV, D, True, QUANT)
        m_i, l_i, acc = _online_update(qk, valid, scale, m_i, l_i, acc, v, UPCAST)
    # selected compressed entries (-1 = padding)
    for blk in range(tl.maximum(b0, NWB), b1):
        e = tl.load(idx_ptr + s64 * KC + (blk - NWB) * BN + tl.arange(0, BN))
        valid = e >= 0
        rows = cbase + tl.where(valid, e, 0)
        qk = _qk_block(q_rows, ckv_ptr, csc_ptr, rows, valid, H, BN, D, DC, False, QUANT, UPCAST)
        v = _load_rows(ckv_ptr, csc_ptr, rows, valid, c0, DV, D, False, QUANT)
        m_i, l_i, acc = _online_update(qk, valid, scale, m_i, l_i, acc, v, UPCAST)
    cols = c0 + tl.arange(0, DV)
    if SPLIT:
        st = (s64 * n_split + sp) * H + hh
        tl.store(pm_ptr + st, m_i)
        tl.store(pl_ptr + st, l_i)
        tl.store(pacc_ptr + st[:, None] * D + cols[None, :], acc)
    else:
        sink = tl.load(sink_ptr + hh)
        M = tl.maximum(m_i, sink)
        wgt = tl.exp(m_i - M)
        f = wgt / (l_i * wgt + tl.exp(sink - M))
        _inv_rope_store(acc * f[:, None], o_ptr + (s64 * H + hh)[:, None] * D + cols[None, :], c0, p,
                        cos_ptr, sin_ptr, H, DV, D, ROPE)


@triton.jit
def _combine_kernel(pm_ptr, pl_ptr, pacc_ptr, qpos_ptr, sink_ptr, cos_ptr, sin_ptr, o_ptr,
                    H: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr, CP: tl.constexpr, NSPLIT: tl.constexpr):
    s = tl.program_id(0)
    cb = tl.program_id(1)
    s64 = s.to(tl.int64)
    hh = tl.arange(0, H)
    cols = cb * CP + tl.arange(0, CP)
    sink = tl.load(sink_ptr + hh)
    M = sink
    for i in tl.static_range(NSPLIT):
        M = tl.maximum(M, tl.load(pm_ptr + (s64 * NSPLIT + i) * H + hh))
    den = tl.exp(sink - M)
    acc = tl.zeros((H, CP), tl.float32)
    for i in tl.static_range(NSPLIT):  # unrolled: the split loads are independent
        st = (s64 * NSPLIT + i) * H + hh
        w = tl.exp(tl.load(pm_ptr + st) - M)
        den += tl.load(pl_ptr + st) * w
        acc += tl.load(pacc_ptr + st[:, None] * D + cols[None, :]) * w[:, None]
    p = tl.load(qpos_ptr + s)
    _inv_rope_store(acc / den[:, None], o_ptr + (s64 * H + hh)[:, None] * D + cols[None, :], cb * CP, p,
                    cos_ptr, sin_ptr, H, CP, D, ROPE)


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
                     block_n: int | None = None, dc: int | None = None, num_warps: int | None = None,
                     num_stages: int | None = None):
    """q [S, H, D] bf16 post-RoPE; qpos [S] int32; win_kv: (E4M3 codes [R, D] u8, UE8M0 [R, D/32] u8)
    or bf16 [R, D] (ring, slot = pos % R); cmp_kv: (packed FP4 [N, D/2] u8, E4M3 [N, D/16] u8) or
    bf16 [N, D]; idx [S, KC] int32 compressed rows (-1 = padding); sink [H] fp32; cos/sin [P, rope/2].
    ring: rows per ring (default: all rows of win_kv); win_base/cmp_base [S]: per-query base rows.
    Returns o [S, H, D] bf16 (inverse-rotated)."""
    S, H, D = q.shape
    wkv, wsc, wq = _kv_parts(win_kv, "win_kv")
    ckv, csc, cq = _kv_parts(cmp_kv, "cmp_kv")
    if wq != cq:
        raise ValueError("sparse_attention: window and compressed KV must both be quantized or both bf16")
    R = ring or wkv.shape[0]
    dev = q.device
    out = torch.empty((S, H, D), dtype=torch.bfloat16, device=dev)
    if S == 0:
        return out
    # H200 sweep (benchmarks/kernels_attention.py): long prefill chunks run best with one program per
    # query owning all 512 channels (DV 512, BN 32); decode and small batches with DV 256, BN 64
    many = S >= 256
    BN = min(block_n or (32 if many else 64), window)
    if window % BN:
        raise ValueError(f"sparse_attention: window {window} is not a multiple of the key block {BN}")
    KC = idx.shape[1]
    if KC % BN:
        idx = torch.cat([idx, torch.full((S, BN - KC % BN), -1, dtype=idx.dtype, device=dev)], 1)
        KC = idx.shape[1]
    idx = idx.to(torch.int32).contiguous()
    zeros = torch.zeros(S, dtype=torch.int32, device=dev)
    wb = zeros if win_base is None else win_base.to(torch.int32).contiguous()
    cb = zeros if cmp_base is None else cmp_base.to(torch.int32).contiguous()
    DV = dv or (D if many or D < 256 else D // 2)
    if D % DV or DV % 32:
        raise ValueError(f"sparse_attention: dv {DV} must divide D {D} and be a multiple of 32")
    ncv = D // DV
    n_blocks = (window + KC) // BN
    bps, n_split = _key_splits(n_blocks, S * ncv, n_split)
    split = n_split > 1
    scale = D ** -0.5 if scale is None else scale
    rope = cos.shape[1] * 2
    if split:
        pm = torch.empty((S, n_split, H), dtype=torch.float32, device=dev)
        pl = torch.empty_like(pm)
        pacc = torch.empty((S, n_split, H, D), dtype=torch.float32, device=dev)
    else:
        pm = pl = pacc = out
    qpos = qpos.to(torch.int32).contiguous()
    nw = num_warps or (8 if DV >= 256 else 4)
    _sparse_attn_kernel[(S, ncv, n_split)](
        q.contiguous(), qpos, wkv, wsc, ckv, csc, idx, wb, cb, sink.float().contiguous(), cos.contiguous(),
        sin.contiguous(), out, pm, pl, pacc, R, KC, bps, n_split, scale,
        H=H, D=D, ROPE=rope, W=window, BN=BN, DC=min(dc or (128 if wq else 64), D), DV=DV, QUANT=wq, SPLIT=split,
        UPCAST=interpreting(), num_warps=nw, num_stages=num_stages or (3 if wq else 1))
    if split:
        CP = min(64, D)
        _combine_kernel[(S, D // CP)](pm, pl, pacc, qpos, sink.float().contiguous(), cos.contiguous(),
                                      sin.contiguous(), out, H=H, D=D, ROPE=rope, CP=CP, NSPLIT=n_split, num_warps=4)
    return out


def _key_splits(n_blocks: int, programs: int, n_split: int | None = None):
    """(blocks per split, splits): few query programs (decode) split the keys so ~32 programs run."""
    if n_split is None:
        n_split = max(1, min(n_blocks, 16, triton.cdiv(32, programs))) if programs < 64 else 1
    bps = triton.cdiv(n_blocks, n_split)
    return bps, triton.cdiv(n_blocks, bps)


def _dequant_kv(kv, fmt_win: bool):
    if isinstance(kv, (tuple, list)):
        a, b = kv
        a = a.view(torch.uint8) if a.dtype != torch.uint8 else a
        b = b.view(torch.uint8) if b.dtype != torch.uint8 else b
        if fmt_win:
            return nx.dequant_fp8_ue8m0(a.view(torch.float8_e4m3fn), b, 32)
        return nx.dequant_fp4_e4m3(a, b.view(torch.float8_e4m3fn), 16)
    return kv.float()


def sparse_attention_ref(q, qpos, win_kv, cmp_kv, idx, sink, cos, sin, *, window: int = 128, ring: int | None = None,
                         win_base=None, cmp_base=None, scale: float | None = None, n_split=None, dv=None, block_n=None,
                         dc=None, num_warps=None, num_stages=None):
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


def _specs(target):
    from dsv41c.frontend.config import preset

    c = preset("full")
    small = target == "rocm:gfx1100"  # 64 KB LDS
    out = []
    for quant in (True, False):
        kvt = "*u8" if quant else "*bf16"
        types = {"q_ptr": "*bf16", "qpos_ptr": "*i32", "wkv_ptr": kvt, "wsc_ptr": kvt, "ckv_ptr": kvt, "csc_ptr": kvt,
                 "idx_ptr": "*i32", "wbase_ptr": "*i32", "cbase_ptr": "*i32", "sink_ptr": "*fp32", "cos_ptr": "*fp32",
                 "sin_ptr": "*fp32", "o_ptr": "*bf16", "pm_ptr": "*fp32", "pl_ptr": "*fp32", "pacc_ptr": "*fp32",
                 "R": "i32", "KC": "i32", "blocks_per_split": "i32", "n_split": "i32", "scale": "fp32"}
        # measured on H200 (benchmarks/kernels_attention.py sweep): decode DV 256 / BN 64 (keys split
        # over 10 programs + combine), prefill DV 512 / BN 32 (one program per query)
        for phase, split, dv, bn in (("decode", True, c.head_dim // 2, 64), ("prefill", False, c.head_dim, 32)):
            if small:
                bn, dv = 32, c.head_dim // 2
            dc = 64 if (small or not quant) else 128
            const = {"H": c.num_attention_heads, "D": c.head_dim, "ROPE": c.qk_rope_head_dim, "W": c.sliding_window,
                     "BN": bn, "DC": dc, "DV": dv, "QUANT": quant, "SPLIT": split, "UPCAST": False}
            out.append(aot_spec(_sparse_attn_kernel, f"{phase}_{'fp8fp4' if quant else 'bf16'}_dv{dv}_bn{bn}", types,
                                const, num_warps=8, num_stages=3 if (quant and not is_rocm(target)) else 1))
    # decode: 128 window + 512 selected keys, one query, two channel halves (as the launcher splits)
    bn = 32 if small else 64
    nsplit = _key_splits((c.sliding_window + c.index_topk) // bn, 2)[1]
    out.append(aot_spec(_combine_kernel, f"combine_nsplit{nsplit}",
                        {"pm_ptr": "*fp32", "pl_ptr": "*fp32", "pacc_ptr": "*fp32", "qpos_ptr": "*i32",
                         "sink_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "o_ptr": "*bf16"},
                        {"H": c.num_attention_heads, "D": c.head_dim, "ROPE": c.qk_rope_head_dim, "CP": 64,
                         "NSPLIT": nsplit}, num_warps=4))
    return out


register(KernelTemplate(
    name="sparse_attention", module=__name__,
    summary="one softmax over SWA window ∪ selected compressed entries + sink, FP8/FP4 KV dequantized in-kernel, inverse RoPE",
    keys=("H", "D", "ROPE", "W", "BN", "DC", "DV", "QUANT", "SPLIT"),
    reference=sparse_attention_ref, launch=sparse_attention, specializations=_specs))
