"""The MoE router in Triton: fp32 gate logits, sqrtsoftplus, biased top-k, normalized weights.

One file: the four logits kernels (tiles, GEMV, fused GEMV + top-k, gate-once) share the split partials, their
summation order and the top-k rows, so that every path gives the same experts; the launcher that chooses among
them and the reference change with them.

What (spec §3.5, §7.1): logits = x_f32 · W_gateᵀ / temp (fp32), s = sqrt(softplus(logits))
(torch's softplus: x above 20, log1p(exp(x)) below, so small values survive until exp
underflows), top-k of s + b (b = `bias`, or `bias_vl` for image-span tokens), ties toward the
LOWER expert index; weights = s[idx] / (Σ + 1e-20) · route_scale.

Algorithm: logits first, then the top-k (`topk_rows`: `router_topk_kernel`, or the fused kernel's last
program), which sums the logit partials in a fixed order and selects top-k by k rounds of one max over int64 keys
(the score's order-preserving bits, then the complement of the index: the max is the largest score at its
lowest index) — exactly a stable descending sort's first k. Logits come from one of three kernels:
- `router_logits_kernel` (prefill, and decode up to GEMV_MAX_T tokens excluded): tiles of
  tokens × experts × optional K split, fp32 tl.dot with input_precision ieee / tf32x3;
- `router_logits_gemv_kernel` (decode, <= GEMV_MAX_T tokens): one program per (token, BE
  experts, K split), fp32 multiply-and-sum, no padded MMA rows. (H200, before the GEMV form: 20 µs under a
  CUDA graph at one token, against a 0.9 µs bytes floor; the GEMV without a K split: 48 programs, 20.6 µs
  L2-cold under Nsight Compute, so K is now split until ~GEMV_PROGRAMS_PER_SM programs per SM.)
- `router_decode_kernel` (decode, the default at 1-2 tokens, and up to GEMV_MAX_T with fused=True): the GEMV's
  programs, then the last of a token's programs to arrive (arrival.py) runs the top-k for it, in the same launch;
  the partials are the GEMV's and are added in the same order, so the bits are the two-launch path's.
  Programmatic dependent launch on sm90+ (pdl.py: it waits before reading x, releases at once).
  H200, CUDA-graph replay, L2-cold (tuning/tune_moe_ffn_chain_fused_router.json): alone 9.1 -> 8.7 µs at one
  token, 28.9 -> 27.6 µs at eight (15.8 µs with the 8-per-SM split, tuning/tune_moe_ffn_chain.json); inside the
  whole MoE FFN at one token (shared expert overlapped) 76.2 -> 72.9 µs, where the launch it saves sits
  on the critical path.

- `router_gate_once_kernel` (decode, the default at GATE_ONCE_MIN_T (3) to GEMV_MAX_T bf16 tokens): the gate read
  once for every token. A program owns a [BE, KS] gate tile (32 experts x 512 channels: 12 x 10 = 120 programs at
  384 x 5120, one 32 KB request each), loaded before its PDL wait (the gate is nobody's output), with the biases;
  after the wait x [16, KS] (rows past T zero) and one MMA (bf16 operands: exact products, fp32 sums) -> partials.
  Then every program takes a ticket on one counter; the last T to arrive each wait until all have (`wait_count`:
  at most T-1 programs spin, on programs already past their MMA), add the splits of one token in order and select
  its experts (`select_rows`); the last of those resets the counters. The interpreter runs programs in turn, so
  there the last arriver selects every token, one after another.
  Why a token a program: the first form ran all T rows of the top-k in the last program, [8, 512] tiles whose
  unrolled code is 4,800 SASS instructions more than one row's (sm90), run once straight through: 36 µs L2-cold at
  8 tokens (13.9 warm) against 9.7 (6.8 warm) with a row a program (`tuning/step_chain_router_tokens_in_program.json`).
  `benchmarks/icache_cold.py` (`results/icache_cold.json`) shows the likely cause: one warp running 8,192
  unrolled FMAs (~128 KB of code) once took 11.3 µs warm and 38.3 µs with the L2 flushed (a loop of the same FMAs:
  13.9 / 14.9), while 4,096 (~64 KB) cost only 0.5 µs more cold than the loop: past ~64 KB, code run once is
  fetched from DRAM line after line. The tensor-core router under Tried, whose last program also ran all eight
  rows, was probably slow for the same reason; the (8 experts, K split) one gave each finisher one row and was slow
  in its logits phase (neither re-measured).
  H200, L2-cold graph replay (`tuning/step_chain_router_gate_once.json`, twice, interleaved): 8 tokens 8.8-9.0 µs
  alone against the per-token GEMV's 15.6-15.9 in the same run (13.5 in the table before); behind the decode norm
  with PDL it adds 6.8 µs to the step (GEMV: 13.6-13.8). Tiles 16 x 1024 / 32 x 256: 9.6 / 9.7 alone. One token:
  9.5-9.7 against the GEMV's 8.6-8.8 (run 2), so one token keeps the GEMV, which since then loads its first gate
  tile and the biases before the PDL wait (`router_decode_kernel`'s EARLY): 8.5 -> 8.0 µs alone, 6.4-6.5 -> 5.5 in
  the step (`tuning/step_chain_router_early.json`; at 8 tokens the GEMV with EARLY, 13.1 / 10.5-10.7, stays
  behind the gate-once kernel). At 2 and 4 tokens (`tuning/step_chain_router_2_4_tokens.json`, alone / in the step with
  PDL, µs): 2 tokens gate once 8.7-9.1 / 6.6-8.1, GEMV with EARLY 8.7-8.8 / 6.1-6.3; 4 tokens gate once 9.1-9.3 /
  6.8-6.9, GEMV with EARLY 10.6 / 8.4-8.5. So GATE_ONCE_MIN_T = 3 (3 tokens not timed).

Specialization keys: router (backbone 384 experts top-6 / DSpark 128 top-3), E, K (5120), TOPK,
mode (decode_fused / decode_gemv / decode / prefill / decode_gate_once), BT, BE, BK, K_PER_SPLIT, PREC; top-k: E_PAD,
K_PAD, HAS_VL, NORM; PDL (the fused kernels; off in the ahead-of-time variants), EARLY (the per-token fused kernel's
first gate tile and biases before the PDL wait; off ahead of time); gate-once: KS, T_PAD (16, the MMA's
least M), ROW_PROGRAMS (a token a program; off in the interpreter), UPCAST (fp32 operands: the interpreter),
MULTI_ROW (fewer programs than tokens: a row program loops over tokens row, row + n, ...).

Tried (measured slower, not kept):
- at 2-8 tokens, programs over (8 experts, K split) that take every token, so the gate is read once per k step
  ([T, 8, 128] products, then a two-level arrival whose last finishers run one top-k row each): 25.9 vs 11.7 µs at
  eight tokens in graph replay (27.7 vs 13.6 L2-cold; its two-launch form 34.0, so the logits phase itself is
  slower), 12.6 vs 6.8 at two; not profiled (tuning/tune_router_tokens.json).
- the split partials added in an unrolled loop (all loads in flight): level, one token 8.5 µs L2-cold.
- the decode router on the tensor cores (16-64 experts a program, tokens padded to 16 MMA columns, the grid's last
  program ranking every token): 1 token 8.78-9.88 µs against the fused GEMV's 8.32-8.34, 8 tokens 29.5-61.5 against
  13.48-13.51 L2-cold; the time grows with the tokens the one last program ranks.

Known gaps: the prefill path is two launches (logits, then top-k); the fused decode kernel's per-token
counter takes one atomic from each of its (E/BE)·splits programs (480 at one token); the gate-once kernel's row
programs spin until the whole grid has arrived, so it needs min(T, programs) of its programs resident at once (any
GPU does: 120 programs of 4 warps) and must not share its counter pool with a concurrent launch; with fewer programs
than tokens (small presets) a row program selects several tokens (MULTI_ROW;
checked on the H200 by the CPU-tier tests compiled there and a `gpu` test);
the GEMV and MMA sum in a different order than the fp32 matmul of the reference, so an exact tie in
s + b between two experts can flip (the benchmark reports the fraction of identical rows), and the gate-once
kernel's weights are not the GEMV's bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, register
from dsv41c.codegen.triton.widths import PUBLISHED
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter, wait_count
from dsv41c.codegen.templates import aot_spec
from dsv41c.codegen.triton.targets import N_SMS_HINT, fp32_dot_precision, interpreting, target_traits
from dsv41c.codegen.triton.targets import sm_count
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for



def routers(widths=PUBLISHED) -> dict:
    """The model's routers: name -> (experts, top-k), from the config's widths (the variants are built per router)."""
    return {"backbone": (widths.n_routed_experts, widths.num_experts_per_tok),
            "dspark": (widths.dspark_n_routed_experts, widths.dspark_num_experts_per_tok)}


ROUTERS = routers()  # the published config's: backbone 384 experts top-6, DSpark 128 top-3
GEMV_MAX_T = 8  # decode: tokens up to which the logits use the GEMV kernel
GEMV_BE, GEMV_BK = 8, 512  # 384 experts -> 48 programs per token and K split, 8 KB of gate per k step
# decode logits: split K until about this many programs per SM (the fused kernel: 38 / 47 registers a thread
# under Triton 3.9 / 3.6 on sm90, no local memory, so 10-13 programs of 4 warps fit an SM). H200, fused
# router, L2-cold (tuning/tune_moe_ffn_chain.json): 8 tokens 27.4 / 15.8 / 15.6 µs at 4 / 8 / 16 (splits 1 / 2
# / 5), 4 tokens 15.7 / 11.2 / 12.1, one token 8.8 / 8.6 / 8.9 (split 10 = one k step a program, all three).
GEMV_PROGRAMS_PER_SM = 8
GEMV_EARLY = True  # router_decode_kernel's EARLY (first gate tile and biases before the PDL wait)
# decode, the gate read once (router_gate_once_kernel): BE experts x up to KS channels a program, one request each
GATE_ONCE = True
GATE_ONCE_MIN_T = 3  # 1-2 tokens: the per-token GEMV with EARLY was as fast alone and faster in the step (H200)
GATE_ONCE_BE, GATE_ONCE_KS = 32, 512


def _gate_once_tiles(E: int, K: int, sms: int = N_SMS_HINT):
    """(BE, KS) of the gate-once router: KS halved from GATE_ONCE_KS (whole power-of-two slices) while the grid has
    fewer than half a program per SM, so that every SM has its gate bytes requested at once."""
    ks = min(GATE_ONCE_KS, triton.next_power_of_2(K))
    while ks > 64 and triton.cdiv(E, GATE_ONCE_BE) * triton.cdiv(K, ks) < sms // 2:
        ks //= 2
    return GATE_ONCE_BE, ks


def _gemv_split(T: int, E: int, K: int, BK: int, interp=None, sms: int = N_SMS_HINT):
    """(splits, K per split) of the decode logits GEMV: enough K splits (whole BK steps) that T·E/BE·splits
    reaches ~GEMV_PROGRAMS_PER_SM·sms (the running device's SMs; N_SMS_HINT, an H200's, for the
    ahead-of-time variant). interp (default: TRITON_INTERPRET) plans two splits for the interpreter. Nsight Compute, H200, one token: with one split (48 programs, 10 dependent 8 KB
    steps each) the logits took 20.6 µs L2-cold for a 0.9 µs bytes floor, DRAM 4 % busy."""
    steps = triton.cdiv(K, BK)
    if interpreting() if interp is None else interp:
        return (2, triton.cdiv(steps, 2) * BK) if steps >= 2 else (1, steps * BK)
    want = max(1, min(steps, GEMV_PROGRAMS_PER_SM * sms // max(1, T * triton.cdiv(E, GEMV_BE))))
    per = triton.cdiv(steps, want)
    return triton.cdiv(steps, per), per * BK


# ============================================================================ kernels


@triton.jit
def router_logits_kernel(x_ptr, w_ptr, part_ptr, T, E: tl.constexpr, K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                         BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """part[split, t, e] = Σ_{k in split} x[t, k]·W[e, k] (fp32 operands; x [T, K] contiguous)."""
    pid_t = tl.program_id(0)
    pid_e = tl.program_id(1)
    split = tl.program_id(2)
    rt = pid_t * BT + tl.arange(0, BT)
    re = pid_e * BE + tl.arange(0, BE)
    t_ok = rt < T
    e_ok = re < E
    k_lo = split * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    acc = tl.zeros((BT, BE), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < k_hi
        xt = tl.load(x_ptr + rt[:, None].to(tl.int64) * K + rk[None, :], mask=t_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        wt = tl.load(w_ptr + re[:, None].to(tl.int64) * K + rk[None, :], mask=e_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.dot(xt, tl.trans(wt), input_precision=PREC)
    tl.store(part_ptr + (split * T + rt[:, None]).to(tl.int64) * E + re[None, :], acc,
             mask=t_ok[:, None] & e_ok[None, :])


@triton.jit
def sqrtsoftplus_f32(x):
    """sqrt(softplus(x)) with torch's threshold (x > 20 -> x) and an accurate log1p(exp(x))."""
    y = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + y
    # log1p(y) = log(u)·y/(u-1) (Goldberg): exact where 1 + y rounds, y itself where it rounds to 1
    one = u == 1.0
    lp = tl.where(one, y, tl.log(u) * (y / tl.where(one, 1.0, u - 1.0)))
    return tl.sqrt(tl.where(x > 20.0, x, lp))


@triton.jit
def _load_part(part_ptr, sp, rt, re, T, m2, E: tl.constexpr, CG: tl.constexpr):
    """Split sp's logit partials of rows rt [rows, E_PAD] (0 where masked)."""
    src = part_ptr + (sp * T + rt[:, None]).to(tl.int64) * E + re[None, :]
    if CG:
        return tl.load(src, mask=m2, other=0.0, cache_modifier=".cg")
    return tl.load(src, mask=m2, other=0.0)


@triton.jit
def _sum_parts(part_ptr, rt, T, n_split, E: tl.constexpr, E_PAD: tl.constexpr, CG: tl.constexpr,
               N_SPLIT: tl.constexpr = 0):
    """The logits of rows rt [rows, E_PAD]: the partials part [n_split, T, E] added in split order (0 where masked).
    N_SPLIT > 0: n_split as a constexpr, the loop unrolled so that every split's load is in flight at once."""
    re = tl.arange(0, E_PAD)
    m2 = (rt < T)[:, None] & (re < E)[None, :]
    logits = tl.zeros((rt.shape[0], E_PAD), dtype=tl.float32)
    if N_SPLIT > 0:
        for sp in tl.static_range(N_SPLIT):
            logits += _load_part(part_ptr, sp, rt, re, T, m2, E, CG)
    else:
        for sp in range(0, n_split):
            logits += _load_part(part_ptr, sp, rt, re, T, m2, E, CG)
    return logits


@triton.jit
def topk_rows(part_ptr, bias_ptr, bias_vl_ptr, img_ptr, w_out_ptr, i_out_ptr, rt, T, n_split, inv_temp, route_scale,
              E: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr, K_PAD: tl.constexpr, HAS_VL: tl.constexpr,
              NORM: tl.constexpr, CG: tl.constexpr):
    """Rows rt of the router's output from the logit partials part [n_split, T, E]: the splits added in order
    (`_sum_parts`), then `select_rows`. CG: read the partials from L2 (`.cg`: other programs of the same launch
    wrote them; arrival.py)."""
    logits = _sum_parts(part_ptr, rt, T, n_split, E, E_PAD, CG)
    b, bvl = load_biases(bias_ptr, bias_vl_ptr, E, E_PAD, HAS_VL)
    select_rows(logits, b, bvl, img_ptr, w_out_ptr, i_out_ptr, rt, T, inv_temp, route_scale, E, E_PAD, TOPK, K_PAD,
                HAS_VL, NORM)


@triton.jit
def load_biases(bias_ptr, bias_vl_ptr, E: tl.constexpr, E_PAD: tl.constexpr, HAS_VL: tl.constexpr):
    """(b, bvl) [E_PAD] fp32, 0 past E: the selection biases (bvl = b without the image-span bias)."""
    re = tl.arange(0, E_PAD)
    b = tl.load(bias_ptr + re, mask=re < E, other=0.0)
    bvl = b
    if HAS_VL:
        bvl = tl.load(bias_vl_ptr + re, mask=re < E, other=0.0)
    return b, bvl


@triton.jit
def select_rows(logits, b, bvl, img_ptr, w_out_ptr, i_out_ptr, rt, T, inv_temp, route_scale, E: tl.constexpr,
                E_PAD: tl.constexpr, TOPK: tl.constexpr, K_PAD: tl.constexpr, HAS_VL: tl.constexpr,
                NORM: tl.constexpr):
    """Rows rt of the router's output from their logits [rows, E_PAD] and the biases b / bvl [E_PAD]: sqrtsoftplus,
    biased top-k by TOPK rounds of one int64-key max (score, then lowest index), normalized × route_scale."""
    re = tl.arange(0, E_PAD)
    t_ok = rt < T
    e_ok = re < E
    s = sqrtsoftplus_f32(logits * inv_temp)
    sel = s + b[None, :]
    if HAS_VL:
        img = tl.load(img_ptr + rt, mask=t_ok, other=0) != 0
        sel = tl.where(img[:, None], s + bvl[None, :], sel)
    sel = tl.where(e_ok[None, :], sel + 0.0, float("-inf"))  # +0.0: -0.0 and +0.0 tie
    # one int64 key per expert whose descending order is (descending sel, ascending index): the float's
    # order-preserving int32 in the high half, E_PAD-1-index in the low half. A round is then one max
    # reduction for the winner (was two: max, then the lowest index attaining it) and one for its s.
    sb = sel.to(tl.int32, bitcast=True)
    key = (tl.where(sb >= 0, sb, sb ^ 0x7FFFFFFF).to(tl.int64) << 32) | (E_PAD - 1 - re[None, :]).to(tl.int64)
    rk = tl.arange(0, K_PAD)
    top_i = tl.zeros((rt.shape[0], K_PAD), dtype=tl.int32)
    top_w = tl.zeros((rt.shape[0], K_PAD), dtype=tl.float32)
    # the normalizer summed in selection order, one add a round: a tl.sum over top_w's K_PAD columns adds in a tree
    # that follows the tile's register layout, which differs between the fused kernel's one row and the top-k
    # kernel's BT rows, so their weights differed in the last bit on the H200 at 44 experts and 3 or 8 tokens
    # (the interpreter sums in one order)
    total = tl.zeros((rt.shape[0],), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        best = tl.max(key, axis=1)
        idx = E_PAD - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        hit = re[None, :] == idx[:, None]
        wj = tl.sum(tl.where(hit, s, 0.0), axis=1)  # one nonzero term: exact in any order
        total += wj
        top_i = tl.where(rk[None, :] == j, idx[:, None], top_i)
        top_w = tl.where(rk[None, :] == j, wj[:, None], top_w)
        key = tl.where(hit, -9223372036854775808, key)
    if NORM:
        top_w = top_w / (total[:, None] + 1e-20)
    top_w = top_w * route_scale
    om = t_ok[:, None] & (rk[None, :] < TOPK)
    tl.store(i_out_ptr + rt[:, None] * TOPK + rk[None, :], top_i, mask=om)
    tl.store(w_out_ptr + rt[:, None] * TOPK + rk[None, :], top_w, mask=om)


@triton.jit
def router_topk_kernel(part_ptr, bias_ptr, bias_vl_ptr, img_ptr, w_out_ptr, i_out_ptr, T, n_split,
                       inv_temp, route_scale, E: tl.constexpr,
                       BT: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr, K_PAD: tl.constexpr,
                       HAS_VL: tl.constexpr, NORM: tl.constexpr):
    rt = tl.program_id(0) * BT + tl.arange(0, BT)
    topk_rows(part_ptr, bias_ptr, bias_vl_ptr, img_ptr, w_out_ptr, i_out_ptr, rt, T, n_split, inv_temp, route_scale,
              E, E_PAD, TOPK, K_PAD, HAS_VL, NORM, False)


@triton.jit
def logits_partial_program(x_ptr, w_ptr, part_ptr, T, E: tl.constexpr, K: tl.constexpr, BE: tl.constexpr,
                           BK: tl.constexpr, K_PER_SPLIT: tl.constexpr):
    """Program (token t, BE experts, K split): part[split, t, e] = Σ_{k in split} x[t, k]·W[e, k], fp32
    multiply-and-sum."""
    t = tl.program_id(0)
    re = tl.program_id(1) * BE + tl.arange(0, BE)
    split = tl.program_id(2)
    e_ok = re < E
    acc = _gemv_steps(tl.zeros((BE,), dtype=tl.float32), x_ptr + t.to(tl.int64) * K, w_ptr, re, e_ok,
                      split * K_PER_SPLIT, tl.minimum(split * K_PER_SPLIT + K_PER_SPLIT, K), K, BK)
    tl.store(part_ptr + (split * T + t).to(tl.int64) * E + re, acc, mask=e_ok)


@triton.jit
def _gemv_steps(acc, x_row, w_ptr, re, e_ok, k_from, k_to, K: tl.constexpr, BK: tl.constexpr):
    """acc [BE] += Σ_{k in [k_from, k_to)} W[re, k]·x_row[k], a BK step at a time (fp32 multiply-and-sum)."""
    for k0 in range(k_from, k_to, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < K
        xk = tl.load(x_row + rk, mask=k_ok, other=0.0).to(tl.float32)
        wt = tl.load(w_ptr + re[:, None].to(tl.int64) * K + rk[None, :], mask=e_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(wt * xk[None, :], axis=1)
    return acc


@triton.jit
def router_logits_gemv_kernel(x_ptr, w_ptr, part_ptr, T, E: tl.constexpr, K: tl.constexpr, BE: tl.constexpr,
                              BK: tl.constexpr, K_PER_SPLIT: tl.constexpr):
    """Decode: part[split, t, e] = Σ_{k in split} x[t, k]·W[e, k] for one token and BE experts, fp32
    multiply-and-sum (router_topk_kernel adds the splits in order).

    At a few tokens the [16-token, BK]·[BK, BE] fp32 MMAs of router_logits_kernel are 15/16 padding and
    tf32x3 triples them; a GEMV over [BE, BK] weight tiles streams the 3.9 MB gate at memory speed, once
    there are enough programs to keep it in flight (program_id(2) splits K: `_gemv_split`)."""
    logits_partial_program(x_ptr, w_ptr, part_ptr, T, E, K, BE, BK, K_PER_SPLIT)


@triton.jit
def router_decode_kernel(x_ptr, w_ptr, part_ptr, cnt_ptr, bias_ptr, bias_vl_ptr, img_ptr, w_out_ptr, i_out_ptr, T,
                         inv_temp, route_scale, E: tl.constexpr, K: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr,
                         K_PER_SPLIT: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr, K_PAD: tl.constexpr,
                         HAS_VL: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr = False,
                         EARLY: tl.constexpr = False):
    """Decode, one launch: the logits GEMV of router_logits_gemv_kernel, then the last of the token's
    (E/BE)·splits programs to arrive (arrival.py; counter cnt[t], left at 0) runs `topk_rows` for it.
    Same partials, same order, so the same bits as the two-launch path.

    PDL: x is the predecessor's output, so the program waits first; it releases the next kernel at once
    (pdl.py's contract; the MoE prep that follows waits for this kernel to complete). EARLY: the split's first gate
    tile and the biases are loaded before that wait (static data), the same arithmetic."""
    t = tl.program_id(0)
    if EARLY:
        # static data before the wait: the split's first gate tile and the biases (the top-k's, should this
        # program arrive last); the same sums in the same order as logits_partial_program
        re = tl.program_id(1) * BE + tl.arange(0, BE)
        split = tl.program_id(2)
        e_ok = re < E
        rk = split * K_PER_SPLIT + tl.arange(0, BK)
        w0 = tl.load(w_ptr + re[:, None].to(tl.int64) * K + rk[None, :], mask=e_ok[:, None] & (rk < K)[None, :],
                     other=0.0).to(tl.float32)
        b, bvl = load_biases(bias_ptr, bias_vl_ptr, E, E_PAD, HAS_VL)
        grid_wait(PDL)
        grid_release(PDL)
        x_row = x_ptr + t.to(tl.int64) * K
        acc = tl.zeros((BE,), dtype=tl.float32)
        acc += tl.sum(w0 * tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)[None, :], axis=1)
        acc = _gemv_steps(acc, x_row, w_ptr, re, e_ok, split * K_PER_SPLIT + BK,
                          tl.minimum(split * K_PER_SPLIT + K_PER_SPLIT, K), K, BK)
        tl.store(part_ptr + (split * T + t).to(tl.int64) * E + re, acc, mask=e_ok)
        if arrive_last(cnt_ptr + t, tl.num_programs(1) * tl.num_programs(2)):
            rr = t + tl.arange(0, 1)
            select_rows(_sum_parts(part_ptr, rr, T, tl.num_programs(2), E, E_PAD, True), b, bvl, img_ptr, w_out_ptr,
                        i_out_ptr, rr, T, inv_temp, route_scale, E, E_PAD, TOPK, K_PAD, HAS_VL, NORM)
            reset_counter(cnt_ptr + t)
    else:
        grid_wait(PDL)
        grid_release(PDL)
        logits_partial_program(x_ptr, w_ptr, part_ptr, T, E, K, BE, BK, K_PER_SPLIT)
        if arrive_last(cnt_ptr + t, tl.num_programs(1) * tl.num_programs(2)):
            topk_rows(part_ptr, bias_ptr, bias_vl_ptr, img_ptr, w_out_ptr, i_out_ptr, t + tl.arange(0, 1), T,
                      tl.num_programs(2), inv_temp, route_scale, E, E_PAD, TOPK, K_PAD, HAS_VL, NORM, True)
            reset_counter(cnt_ptr + t)


@triton.jit
def router_gate_once_kernel(x_ptr, w_ptr, part_ptr, cnt_ptr, bias_ptr, bias_vl_ptr, img_ptr, w_out_ptr, i_out_ptr,
                            T, inv_temp, route_scale, E: tl.constexpr, K: tl.constexpr, BE: tl.constexpr,
                            KS: tl.constexpr, T_PAD: tl.constexpr, ROW_PROGRAMS: tl.constexpr, E_PAD: tl.constexpr,
                            TOPK: tl.constexpr, K_PAD: tl.constexpr, HAS_VL: tl.constexpr, NORM: tl.constexpr,
                            UPCAST: tl.constexpr, PDL: tl.constexpr = False, MULTI_ROW: tl.constexpr = False):
    """Decode, one launch, the gate read once for every token: program (BE experts, K slice of KS channels) loads
    its [BE, KS] gate tile in one request (before the PDL grid wait: the gate is no kernel's output), then x [T_PAD,
    KS] (rows past T are 0), and stores part[split, t, e] = x·Wᵀ over the slice as one MMA (bf16 operands: every
    product exact, fp32 accumulation; UPCAST: fp32 operands, ieee, for the interpreter, whose bf16 dot is wrong).
    Then the top-k, a token a program (ROW_PROGRAMS: the last T programs to arrive; else, in the interpreter, the last
    one, token after token): the splits added in order, `topk_rows`. Two counters, left at zero."""
    eb = tl.program_id(0)
    sp = tl.program_id(1)
    re = eb * BE + tl.arange(0, BE)
    rk = sp * KS + tl.arange(0, KS)
    rt = tl.arange(0, T_PAD)
    e_ok = re < E
    k_ok = rk < K
    t_ok = rt < T
    w = tl.load(w_ptr + re[:, None].to(tl.int64) * K + rk[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
    grid_wait(PDL)  # x is the predecessor's output
    grid_release(PDL)
    x = tl.load(x_ptr + rt[:, None].to(tl.int64) * K + rk[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
    # the biases (static, 2 KB) too before the MMA, so that a row program's top-k waits on no DRAM round trip
    b, bvl = load_biases(bias_ptr, bias_vl_ptr, E, E_PAD, HAS_VL)
    if UPCAST:
        acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w))
    tl.store(part_ptr + (sp * T + rt[:, None]).to(tl.int64) * E + re[None, :], acc, mask=t_ok[:, None] & e_ok[None, :])
    NS: tl.constexpr = (K + KS - 1) // KS  # = num_programs(1), as a constexpr: the top-k's loads unrolled
    n = tl.num_programs(0) * NS
    if ROW_PROGRAMS:
        # the last T programs to arrive take a token each: once every program has arrived (wait_count: at most T-1
        # of them spin, for programs already past their MMA), a row's top-k. Its code is one row's, executed once;
        # the whole [T, E_PAD] top-k in one program was 4,800 more SASS instructions (sm90), run once straight
        # through: 8 µs more than one row in graph replay, 28 µs more with the L2 flushed (its code fetched cold)
        tl.debug_barrier()  # every thread's partial stores before the release
        row = n - 1 - tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
        if row < T:
            wait_count(cnt_ptr, n)
            if MULTI_ROW:
                # tokens row, row + n, ...: with fewer programs than tokens (few experts: a small preset's 24 x 128
                # gate is 2 programs) a program takes several; without it tokens past the grid were never
                # selected (their outputs left unwritten: the CPU-tier router tests run on the H200). A constexpr, as
                # the loop cost the model's 8 tokens 0.45 µs against one straight row
                for r in range(row, T, n):
                    rr = r + tl.arange(0, 1)
                    select_rows(_sum_parts(part_ptr, rr, T, NS, E, E_PAD, True, NS), b, bvl, img_ptr, w_out_ptr,
                                i_out_ptr, rr, T, inv_temp, route_scale, E, E_PAD, TOPK, K_PAD, HAS_VL, NORM)
            else:
                rr = row + tl.arange(0, 1)
                select_rows(_sum_parts(part_ptr, rr, T, NS, E, E_PAD, True, NS), b, bvl, img_ptr, w_out_ptr, i_out_ptr,
                            rr, T, inv_temp, route_scale, E, E_PAD, TOPK, K_PAD, HAS_VL, NORM)
            if arrive_last(cnt_ptr + 1, tl.minimum(n, T)):  # every row program is past its wait: both counters at 0
                reset_counter(cnt_ptr)
                reset_counter(cnt_ptr + 1)
    elif arrive_last(cnt_ptr, n):  # the interpreter runs programs one after another: no program may wait
        for t in range(0, T):
            rr = t + tl.arange(0, 1)
            select_rows(_sum_parts(part_ptr, rr, T, NS, E, E_PAD, True, NS), b, bvl, img_ptr, w_out_ptr, i_out_ptr, rr,
                        T, inv_temp, route_scale, E, E_PAD, TOPK, K_PAD, HAS_VL, NORM)
        reset_counter(cnt_ptr)


# ============================================================================ reference


def router_reference(x, gate_w, bias, top_k: int, route_scale: float = 1.5, gate_temp: float = 1.0,
                     bias_vl=None, image_mask=None, norm_topk_prob: bool = True):
    """x [T, D] -> (weights [T, k] fp32, expert ids [T, k] int32)."""
    s = torch.nn.functional.softplus((x.float() @ gate_w.float().T) / gate_temp).sqrt()
    b = bias.float()[None, :].expand_as(s)
    if bias_vl is not None and image_mask is not None:
        b = torch.where(image_mask.bool()[:, None], bias_vl.float()[None, :], b)
    order = torch.sort(s + b + 0.0, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = s.gather(-1, order)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * route_scale, order.to(torch.int32)


# ============================================================================ launcher


def router(x, gate_w, bias, top_k: int, route_scale: float = 1.5, gate_temp: float = 1.0, bias_vl=None,
           image_mask=None, norm_topk_prob: bool = True, fused=None, pdl=None, gate_once=None, tiles=None,
           early=None):
    """Triton router: -> (weights [T, k] fp32, expert ids [T, k] int32).

    fused (None: on up to GEMV_MAX_T tokens): the decode logits and top-k in one launch
    (`router_decode_kernel`; same bits as the two launches, which fused=False keeps). gate_once (None: GATE_ONCE
    where it applies: GATE_ONCE_MIN_T to GEMV_MAX_T bf16 tokens, fused left None): the one-launch kernel that reads the gate
    once for all the tokens (`router_gate_once_kernel`: MMA sums, so not the GEMV's bits); tiles: its (BE, KS).
    pdl: the fused kernels' programmatic dependent launch (None: where the device has it; False: off). early (None:
    GEMV_EARLY): the per-token fused kernel loads its first gate tile and the biases before its PDL wait."""
    T, D = x.shape
    E = gate_w.shape[0]
    if gate_w.shape[1] != D or bias.shape != (E,):
        raise ValueError(f"router: gate {tuple(gate_w.shape)} / bias {tuple(bias.shape)} do not fit x {tuple(x.shape)}")
    if top_k > E:
        raise ValueError(f"router: top_k={top_k} > {E} experts")
    gemv = T <= GEMV_MAX_T
    if fused and not gemv:
        raise ValueError(f"router: fused=True is the decode path (T <= {GEMV_MAX_T}), got T={T}")
    once_ok = gemv and x.dtype == gate_w.dtype == torch.bfloat16
    if gate_once and not once_ok:
        raise ValueError(f"router: gate_once=True needs bf16 x and gate and T <= {GEMV_MAX_T}, got T={T}, "
                         f"{x.dtype} / {gate_w.dtype}")
    gate_once = (GATE_ONCE and once_ok and fused is None and T >= GATE_ONCE_MIN_T) if gate_once is None \
        else bool(gate_once)
    fused = gemv if fused is None else bool(fused)
    wts = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    if T == 0:
        return wts, ids
    x = x.contiguous()
    gw = gate_w.contiguous()
    has_vl = bias_vl is not None and image_mask is not None
    img = image_mask.to(torch.uint8).contiguous() if has_vl else ids
    b = bias.float().contiguous()
    b_vl = bias_vl.float().contiguous() if has_vl else b
    topk_ce = dict(E=E, E_PAD=triton.next_power_of_2(E), TOPK=top_k, K_PAD=triton.next_power_of_2(top_k),
                   HAS_VL=has_vl, NORM=norm_topk_prob)
    if gate_once:
        BE, KS = tiles or _gate_once_tiles(E, D, sm_count(x.device))
        n_split = triton.cdiv(D, KS)
        part = torch.empty(n_split, T, E, dtype=torch.float32, device=x.device)
        pdl = pdl_for(x.device) and (pdl is None or bool(pdl))
        grid = (triton.cdiv(E, BE), n_split)
        router_gate_once_kernel[grid](
            x, gw, part, counters(x.device, 2, pool="router_gate_once"), b, b_vl, img, wts, ids, T, 1.0 / gate_temp,
            float(route_scale), K=D, BE=BE, KS=KS, T_PAD=16, ROW_PROGRAMS=not interpreting(), UPCAST=interpreting(),
            PDL=pdl, MULTI_ROW=grid[0] * grid[1] < T, num_warps=4, **topk_ce, **launch_kw(pdl))
        return wts, ids
    if gemv:
        BK = min(GEMV_BK, triton.next_power_of_2(D))
        split, k_per = _gemv_split(T, E, D, BK, sms=sm_count(x.device))
        part = torch.empty(split, T, E, dtype=torch.float32, device=x.device)
        grid = (T, triton.cdiv(E, GEMV_BE), split)
        if fused:
            pdl = pdl_for(x.device) and (pdl is None or bool(pdl))
            router_decode_kernel[grid](x, gw, part, counters(x.device, T, pool="router"), b, b_vl, img, wts, ids, T,
                                       1.0 / gate_temp, float(route_scale), K=D, BE=GEMV_BE, BK=BK, K_PER_SPLIT=k_per,
                                       PDL=pdl, EARLY=GEMV_EARLY if early is None else bool(early), num_warps=4,
                                       **topk_ce, **launch_kw(pdl))
            return wts, ids
        router_logits_gemv_kernel[grid](x, gw, part, T, E=E, K=D, BE=GEMV_BE, BK=BK, K_PER_SPLIT=k_per, num_warps=4)
    else:
        if interpreting():
            BT, BE, BK = 16, 64, 64
            split, k_per = _router_split(False, D, BK)
        elif T <= 64:
            BT, BE, BK = 16, 64, 128
            split, k_per = _router_split(True, D, BK)
        else:
            BT, BE, BK = 64, 128, 64
            split, k_per = _router_split(False, D, BK)
        part = torch.empty(split, T, E, dtype=torch.float32, device=x.device)
        router_logits_kernel[(triton.cdiv(T, BT), triton.cdiv(E, BE), split)](
            x, gw, part, T, E=E, K=D, K_PER_SPLIT=k_per, BT=BT, BE=BE, BK=BK, PREC=fp32_dot_precision(x.device),
            num_warps=4, num_stages=1 if interpreting() else 3)
    BT2 = min(4 if interpreting() else 8, triton.next_power_of_2(T))
    router_topk_kernel[(triton.cdiv(T, BT2),)](part, b, b_vl, img, wts, ids, T, split, 1.0 / gate_temp,
                                                float(route_scale), BT=BT2, num_warps=4, **topk_ce)
    return wts, ids


# ============================================================================ ahead-of-time variants


def _router_split(T_small: bool, D: int, BK: int):
    split = max(1, min(8, D // 1024)) if T_small else 1
    k_per = triton.cdiv(triton.cdiv(D, split), BK) * BK
    return triton.cdiv(D, k_per), k_per


def _router_variants(target: str, widths=PUBLISHED) -> list:
    tr = target_traits(target)
    if tr is None:
        return []
    out = []
    lt = {"x_ptr": "*bf16", "w_ptr": "*bf16", "part_ptr": "*fp32", "T": "i32"}
    tt = {"part_ptr": "*fp32", "bias_ptr": "*fp32", "bias_vl_ptr": "*fp32", "img_ptr": "*u8", "w_out_ptr": "*fp32",
          "i_out_ptr": "*i32", "T": "i32", "n_split": "i32", "inv_temp": "fp32", "route_scale": "fp32"}
    for name, (E, k) in routers(widths).items():
        for mode, (BT, BE, BK) in {"decode": (16, 64, 128), "prefill": (64, 128, 64)}.items():
            _, k_per = _router_split(mode == "decode", widths.hidden_size, BK)
            ce = {"E": E, "K": widths.hidden_size, "K_PER_SPLIT": k_per, "BT": BT, "BE": BE, "BK": BK, "PREC": tr["fp32_prec"]}
            out.append(aot_spec(router_logits_kernel, f"logits_{name}_{mode}", lt, ce, 4, 3,
                                {"router": name, "mode": mode, "TOPK": k, **ce}))
        _, k_per = _gemv_split(1, E, widths.hidden_size, GEMV_BK, interp=False)  # the one-token split on an H200
        ce = {"E": E, "K": widths.hidden_size, "BE": GEMV_BE, "BK": GEMV_BK, "K_PER_SPLIT": k_per}
        out.append(aot_spec(router_logits_gemv_kernel, f"logits_{name}_decode_gemv",
                            {"x_ptr": "*bf16", "w_ptr": "*bf16", "part_ptr": "*fp32", "T": "i32"}, ce, 4, 1,
                            {"router": name, "mode": "decode_gemv", "TOPK": k, **ce}))
        ce = {"E": E, "BT": 8, "E_PAD": triton.next_power_of_2(E), "TOPK": k, "K_PAD": triton.next_power_of_2(k),
              "HAS_VL": True, "NORM": True}
        out.append(aot_spec(router_topk_kernel, f"topk_{name}_e{E}_k{k}", tt, ce, 4, 1,
                            {"router": name, "TOPK": k, **ce}))
        fce = {"E": E, "K": widths.hidden_size, "BE": GEMV_BE, "BK": GEMV_BK, "K_PER_SPLIT": k_per,
               **{c: ce[c] for c in ("E_PAD", "TOPK", "K_PAD", "HAS_VL", "NORM")}, "PDL": False, "EARLY": False}
        ft = {"x_ptr": "*bf16", "w_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32",
              **{a: tt[a] for a in ("bias_ptr", "bias_vl_ptr", "img_ptr", "w_out_ptr", "i_out_ptr", "T", "inv_temp",
                                    "route_scale")}}
        out.append(aot_spec(router_decode_kernel, f"decode_fused_{name}", ft, fce, 4, 1,
                            {"router": name, "mode": "decode_fused", **fce}))
        be, ks = _gate_once_tiles(E, widths.hidden_size)
        gce = {"E": E, "K": widths.hidden_size, "BE": be, "KS": ks, "T_PAD": 16, "ROW_PROGRAMS": True, "UPCAST": False,
               **{c: ce[c] for c in ("E_PAD", "TOPK", "K_PAD", "HAS_VL", "NORM")}, "PDL": False,
               "MULTI_ROW": False}  # the model's gates: 120 / 80 programs, at least T_PAD
        out.append(aot_spec(router_gate_once_kernel, f"decode_gate_once_{name}", ft, gce, 4, 1,
                            {"router": name, "mode": "decode_gate_once", **gce}))
    return out


register(KernelTemplate(
    name="moe_router", module=__name__,
    summary="fp32 gate logits, sqrtsoftplus, biased top-k (ties -> lower index), normalized ×scale weights",
    keys=("router", "E", "K", "TOPK", "mode", "BT", "BE", "BK", "K_PER_SPLIT", "PREC", "E_PAD", "K_PAD", "HAS_VL",
          "NORM", "PDL", "KS", "T_PAD", "ROW_PROGRAMS", "UPCAST", "EARLY", "MULTI_ROW"), reference=router_reference,
    launch=router,
    specializations=_router_variants))
