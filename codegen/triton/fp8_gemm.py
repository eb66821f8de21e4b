"""Block-scaled FP8 GEMM for the dense linears, and the FP8/E8M0/E2M1 decode helpers.

What (spec §3.13, §4): y[M, N] = x[M, K] · W[N, K]ᵀ with W stored as FP8 E4M3 codes and one
UE8M0 (power-of-two) scale per 32×32 block (`scale [ceil(N/32), ceil(K/32)]`), fp32
accumulation, output in x's dtype (or `out_dtype`). Variants:
- `fp8_gemm`: plain linear (wq_a, wq_b, wkv, wo_b, shared-expert w2, indexer wq_b, engram wkv...).
- `fp8_gemm_swiglu`: the shared expert's gate/up pair in one kernel: g = x·w1ᵀ, u = x·w3ᵀ,
  h = silu(min(g, limit)) · clamp(u, ±limit) (spec §3.5), so x is read once and h written once.
- `act_quant_fp8`: the `activation_scheme: dynamic` reading: x is quantized per 32 along K to
  E4M3 with a power-of-two scale s = 2^ceil(log2(max(amax, 1e-4)/448)) and dequantized again
  (exactly numerics.fake_quant_fp8_ue8m0). `act_quant=False` (the default) is the exact
  bf16-activation reference path.

Algorithm: "swap AB": the weight tile [BN, BK] is the dot's LEFT operand, so it is decoded in
registers (E4M3 bits -> fp32, times the block scale, -> bf16; exact, because an E4M3 value
times a power of two is a bf16 value) and can feed wgmma straight from registers, while the
activation tile xᵀ [BK, BM] comes through shared memory; decode shapes (M = 1..16 tokens) then
use wgmma's small N instead of padding M to 64. The accumulator is [BN, BM] fp32 and is
transposed once for a coalesced store. Tiles are grouped along M (GROUP_M) for L2 reuse of W.
Dynamic activation quantization is a separate elementwise pass (`act_quant_fp8`) producing the
dequantized activation in x's dtype, which is bit-identical to what an FP8×FP8 tensor-core
product with the two scales multiplied in would compute before accumulation; the GEMM is then
the same bf16 kernel.

Decode helpers shared by moe.py and engram.py: `e4m3_to_f32` (bit arithmetic, or the native
cvt where the target has FP8 units), `e8m0_to_f32`, `e2m1_to_f32`, `fp4_tile_to_f32`, and the
in-register fake-quant `fake_quant_e4m3_pow2`. Interpreter notes: its float casts to bf16/fp8
truncate and its bf16 tl.dot multiplies raw bits, so under TRITON_INTERPRET the launchers set
DOT_F32 (operands upcast to fp32 before tl.dot) and every rounding step is integer arithmetic.

Decode shapes: one token (M = 1) runs `fp8_gemv_kernel` on the CUDA cores (no tensor-core
padding to 16 rows; the block scale multiplies the activation, not each weight element: 3.5 SASS
instructions per weight element vs 6.3 in the MMA loop). 2-8 tokens on sm90 for the linears it was measured on
(shared w1/w3, shared w2, wq_a, wo_b) run fp8_warp_split.py instead: one program per 16 weight rows with K split
over its warps and summed in shared memory, no split-K partials (3-20 % faster at 8 tokens, session 17). M <= 16
otherwise runs the tensor-core kernel with the per-element decoder DECODE_W 0, except the largest linear (engram wkv, from
DECODE_W_MIN_WEIGHTS elements), where the word decoder DECODE_W 1 (below) is faster on the H200;
`_gemm(decode_w=)` forces either. On sm90 the DECODE_W 0 tile has 2 warps and 32 weight rows, so that Triton
emits mma.sync rather than wgmma (`_decode_tile`: faster at 8 tokens on the H200); DECODE_W 1's, and every tile
on other targets, keeps 4 warps. Decode grids on sm90+ (split-K folded into the launch) are
launched with programmatic dependent launch (pdl.py): the weight tile's address math overlaps the previous kernel, x and every
store wait for it; the one-token gemv also loads its split's first weight tile before the wait (EARLY_W, GEMV_EARLY_W:
0.1-0.6 µs less of a decode step behind its predecessor, benchmarks/step_chain.py). The tensor-core k loop loads the next k tile's UE8M0 bytes one iteration ahead (`_mma_k_loop`'s
SPF: Triton's cp.async pipeline leaves these 2-byte loads out), except in the gated decode tile, where it measured
slower (`_spf`, SCALE_PREFETCH). An L2 bulk prefetch of the weight rows (l2_prefetch.py) is selectable, measured
slower, off.

Weight decoders of the tensor-core kernel (`DECODE_W`):
  0: E4M3 bytes -> fp32 per element (`e4m3_to_f32`), × the expanded fp32 block scale, -> bf16; natural
     k order. Prefill, the interpreter/ROCm default, and any K that BK does not tile.
  1: the tile is loaded as 32-bit words (4 codes, bytes b0..b3 little endian = k 4m..4m+3); for each
     byte position P in {0, 1} one shift/mask pair turns byte 2h+P of BOTH 16-bit halves h into bf16
     bits, so the 32-bit result already is a bf16x2 operand register; it is scaled by `fma.rn.bf16x2`
     (inline PTX) and used by the dot without a cast. The columns come out in k_order_w(BK), so the
     ACTIVATION columns are permuted to match (`permute_k_w`, once per call on the host), not the weights.
     (Gathering x's columns inside the kernel instead was measured much slower: engram wkv at 8 tokens
     106 vs 63 µs, tuning/tune_fp8_xgather.json.)
  2: the byte-pair decoder (`e4m3_pairs_to_bf16`, inline PTX, CUDA only): the tile is loaded as bytes in natural k
     order and each thread's 4 consecutive codes go through prmt / shl / and and one fma.rn.bf16x2 a pair, the bit
     algebra of DECODE_W 1 without its column order (so x is not permuted); DECODE_W 0's bits. Explicit only
     (`decode_w=2`, DECODE_PAIRS off): not measured since its launcher was fixed (session 14, see DECODE_PAIRS).

Bit algebra (DECODE_W 1): for a byte c = s·128 + e4·8 + m (E4M3 fn: sign, 4 exponent bits bias 7, 3
mantissa bits), the bf16 with bits (s << 15) | (e4 << 7) | (m << 4) = (s << 15) | ((c & 0x7F) << 4) is
exactly value(c)·2^-120: for e4 >= 1 it is the bf16 normal 2^(e4-127)·(1 + m/8) = 2^(e4-7)·(1 + m/8)·2^-120;
for e4 = 0 the bf16 subnormal (m << 4)·2^-133 = m·2^-129 = (m·2^-9)·2^-120, the E4M3 subnormal; ±0 stay
±0 (the NaN codes 0x7F/0xFF give ±480·2^-120, as the bit-arithmetic `e4m3_to_f32` does). On a word w:
  P = 0 (bytes 0, 2): ((w << 8) & 0x80008000) | ((w << 4) & 0x07F007F0)
  P = 1 (bytes 1, 3): (w & 0x80008000) | ((w >> 4) & 0x07F007F0)
(`e4m3_bf16x2_bits`; the PTX form is prmt (byte 2h+P to the low byte of half h, its sign replicated into
the high byte) then (<< 4) & 0x87F087F0: 3 instructions for either P). The block scale 2^(e-127) then is
2^(e-7) on these values, a bf16 normal for e <= 134 (field e + 120); beyond, it is split into the exact
powers of two f1 = 2^(min(e,134) - 7) and f2 = 2^(max(e,134) - 134) (value·f1 <= 448·2^7 is exact, ·f2
is the true product, inf where the float32 reference overflows; e = 255 makes f2 NaN like `e8m0_to_f32`).
Products are bf16 values (<= 4 significant bits) and exact for e >= 7; below that the smallest ones are
rounded to nearest even bf16 (as the DECODE_W 0 cast to bf16 does). The bf16 fma has no flush-to-zero
form, so subnormal inputs and results survive. Real checkpoints have e around 110..125, so each program
checks its own scale rows once (`_any_scale_above`) and runs a loop with only the f1 multiply unless
some e > 134 (two copies of the k loop, `TWO`). Interpreter / ROCm: the same bit assembly, each half
multiplied in float32 and rounded once to bf16 by integer arithmetic (identical results).

Register layout (DECODE_W 1): the wgmma/mma left operand gives lane q (lane id mod 4) the logical columns
{2q, 2q+1} + 8j of each 16-wide k step. With W = BK/4 words per row, memory word m = q·W/4 + s holds, for
byte P of half h, original k = 4m + 2h + P, placed at logical column P·BK/2 + 2(4s + q) + h: each bf16x2
register is one (2c, 2c+1) pair, a thread's words are contiguous (16-byte loads), and at BK = 128 they
are one 32-column scale block. Triton 3.6 keeps the reshape/permute register-only on sm90 (no shared-memory
round trip for the decoded tile; check with the SASS of `_gemm_variants("cuda:sm90", ...)`).

Split K: both decode paths (gemv and MMA) split K across programs so that the grid fills ONE wave of
the GPU's resident program slots (`_split_k`: DECODE_PROGRAMS_PER_SM × SMs, at least MIN_SPLIT_STEPS k
tiles a split); a split is a run of whole k tiles and need not divide K/BK (`split_bounds`). The last
program of each tile to arrive (`arrival.py`) adds the fp32 partials in split order and runs the
epilogue, inside the same launch (`FOLD`; the separate `splitk_reduce_kernel` remains and gives the
same bits).

Specialization keys: N, K (constexpr: the real linears of the published config, so the
ahead-of-time build knows every stride and vectorizes), mode (prefill / decode / gemv), BM, BN, BK,
GROUP_M, SPLIT_K, FOLD, NATIVE_FP8 (sm90/sm100/gfx950 have an FP8 cvt), GATED, DECODE_W (1: the caller
passes x with each BK block of columns in k_order_w(BK)), PTX (inline PTX allowed: CUDA), PDL, PREFETCH
(bytes per weight row; 0 in every variant), PIPE (gemv: the k loop's pipeline stages).

Measured (H200, triton 3.6, `benchmarks/tune_fp8_decode.py` -> tuning/tune_fp8_decode_gemv.json,
CUDA-graph replay with the weights L2-warm): prefill 53–57% of the bf16 matmul rate (the E4M3 decode
+ scale multiply per weight element runs on the same SM as the MMA). One token, gemv path vs the
earlier MMA + reduce launch: wo_b 13.8 vs 20.2 µs (1.40× its bytes floor), wq_a 4.0 vs 7.3 µs
(2.56×), shared w2 4.9 vs 8.1 µs (1.75×), shared w1/w3 + SwiGLU 9.3 vs 15.6 µs (1.68×). Eight tokens
(MMA, folded): wo_b 21 µs (2.1×), wq_a 7.2 µs (4.6×), shared w2 8.4 µs (3.0×), shared w13 15.6 µs
(2.8×), engram wkv 73.5 µs (1.97×). With the L2 flushed before each replay (kernels_ffn.json):
wo_b one token 18.7 µs (1.89×), wq_a 6.2 µs, shared w13 15.0 µs; wo_b eight tokens 25.3 µs; engram wkv
at eight tokens, now with the word decoder, 63.5 µs (1.71×). The one-token gemv's k loop is not
pipelined (PIPE 1): asking Triton for 2-4 cp.async stages made every linear slower (wo_b 18.5 ->
28.6 µs cold, shared w13 14.9 -> 21.1 µs: tuning/tune_fp8_decode.json): the staging through shared memory
adds ~1.5 instructions per weight element (228 -> 328 SASS per loop step); on a GPU its accumulator
also lands in another register layout, so its K sums differ in the last bit (1-2 of 2304 outputs).
Nsight Compute (tuning/ncu_decode_before.txt, L2 flushed) then showed the decode grids, at ~2 programs
per SM, filling 0.48-0.76 of one wave (wo_b one token: 320 programs, 2.4 of 16 warps per scheduler, DRAM
45 % busy, stalls on L1TEX scoreboards): sizing the split to fill one wave (tuning/tune_fp8_split.json, same
run, L2-cold) took wo_b one token 18.7 -> 15.7 µs (1.58×), shared w13 one token 15.2 -> 11.4 µs (2.05×),
wo_b eight tokens 25.3 -> 21.6 µs (2.15×), shared w13 eight tokens 19.8 -> 18.4 µs; a grid past the
528 resident slots is slower again (wo_b one token, 640 programs: 19.4 µs). A gemv that decodes the E4M3
bytes from 32-bit words by integer arithmetic (no conversion unit; x as int64 words of four bf16,
prescaled by 2^64), keeps a [BN/32, 32, BK/4] accumulator and prefetches two k steps ahead by hand
(sm90 SASS: no shared memory or barrier in the loop, 4.9 instructions per element, 128 registers) was
no faster (tuning/tune_fp8_gemv_words.json: wo_b 16.0, shared w13 11.8, shared w2 8.5, wq_a 6.7 µs cold vs
15.6 / 11.4 / 7.1 / 6.1) and was reverted (git history: "fp8 gemv: E4M3 bytes decoded from 32-bit
words"). Nor did a register prefetch of the next k tile into this kernel (its loads issued before the
current tile's FMAs; static sm90 SASS under triton 3.6, not kept: 121-124 registers at BK 64, 190 gated,
176-229 at BK 128), at BK 64 or 128, 3-4 programs per SM, with or without a ptxas register cap (maxnreg 128 /
168); a cap of 128 at BK 128 (4 programs an SM instead of ~150 registers) was equal for wo_b and 2.5-5 %
slower for the others (tuning/tune_fp8_rpf.json, L2-cold: wo_b 15.9 / 15.9 µs, shared w13 11.1 / 11.5), every
prefetching variant 18-81 % slower; reverted, git history: "fp8 gemv:
register prefetch of the next k tile"). Summing each thread's 16 consecutive products of a row before
the accumulator (SEG 16, the default since) halves the registers, 122 -> 63, so 8 programs fit an SM
instead of 4: L2-cold wo_b 15.9 -> 14.2 µs, shared w13 11.5 -> 10.3 µs (tuning/tune_fp8_gemv_seg.json). An
earlier static check had seen no saving (152 -> 165 registers): its ad-hoc compile gave the pointers no
16-byte alignment hint, so every weight byte was its own LDG.U8 and the sum crossed lanes; the JIT and
the ahead-of-time build (aot_compat.make_ast_source) both pass that hint, check SASS the same way.

Known gaps: no FP8×FP8 tensor-core path (wgmma e4m3 / MFMA fp8) — activations that are
dynamically quantized still multiply in bf16 (same products). One was built and measured for the decode
shapes (commit 2f7c5d5, fp8_w8a8.py, reverted): x quantized to E4M3 codes in its own launch, then one
E4M3 × E4M3 dot per 32-column block (the UE8M0 blocks are 32 wide, so each block's partial is scaled and
added in fp32), 2 warps (Triton: mma.sync on f16-converted operands, 1 F2FP a pair) or 4-8 (wgmma
m64n16k32 e4m3). It matched the act_quant reference (rel err 1.7e-3, bf16 output) but was no faster than
act_quant's fake quant + this bf16 kernel at any of the five decode linears measured at 8 tokens on the
H200 (L2-cold graph replay, its best setting each, tuning/tune_fp8_w8a8.json: shared w13 18.6 vs 16.2 µs,
shared w2 12.5 vs 12.4 (equal within noise), wo_b 26.1 vs 21.3, wq_a 11.3 vs 10.9, engram wkv 84.4 vs 56.6).
Both paths pay a quantization launch; the likely cause (not profiled) is the GEMM's 4 short, dependent
MMA-then-FMA chains a k step, which leave the few warps a decode grid has waiting.
UE8M0 byte 0 (2^-127) decodes to 2^-127 only through the subnormal constant. At 2–16
tokens the DECODE_W 0 loop spends 6.3 SASS instructions per weight element (sm90, triton 3.6, BN 64,
BK 128, 4 warps); DECODE_W 1 brings the one-multiply loop to 4.3 (the decode itself ~2.1: prmt, shl,
and per pair, one HMUL2 per pair), the rest is per-k-step wgmma/descriptor/pipeline overhead that a
larger BN amortizes (BN 128: 3.6). Yet on the H200 (L2-cold graph replay, tuning/tune_fp8_prefetch.json)
DECODE_W 1 is slower on every decode linear but the largest: wo_b M=8 31.3 vs 25.2 µs, wq_a 18.3 vs
9.0 µs, while engram wkv (157 M weights) takes 63.4 vs 73.5 µs — it costs one host-side permutation
launch over x per call plus a scale scan before the loop, which only a long decode amortizes, so it
is the default from DECODE_W_MIN_WEIGHTS on. Gathering x's columns in the kernel's own x load instead
of the permutation launch was slower still (engram 106 µs, wo_b 32.6 µs: tuning/tune_fp8_xgather.json);
fusing the permutation into the producer of x is what would let it pay everywhere.
Its PTX path is exact (the `gpu` tests: all 256 codes × 24 scales, real widths vs float64). The split-K arrival counters are shared module state (see arrival.py).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dsv41c.codegen.templates import KernelTemplate, aot_spec, register  # noqa: F401 (aot_spec re-exported)
from dsv41c.codegen.triton.arrival import arrive_last, counters, reset_counter
from dsv41c.codegen.triton.kv_quant import sm_count
from dsv41c.codegen.triton.l2_prefetch import l2_prefetch_for, prefetch_rows_l2
from dsv41c.codegen.triton.pdl import grid_release, grid_wait, launch_kw, pdl_for
from dsv41c import formats

TARGETS = ("cuda:sm80", "cuda:sm90", "cuda:sm100", "rocm:gfx942", "rocm:gfx950", "rocm:gfx1100")

# Published widths (spec §1.2, §4) used to size the ahead-of-time variants.
HIDDEN = 5120
MOE_INTER = 2304
DENSE_LINEARS = {  # name -> (N, K)
    "wq_a": (1280, 5120), "wq_b": (32768, 1280), "wkv": (512, 5120), "wo_b": (5120, 8192),
    "shared_w2": (5120, 2304), "indexer_wq_b": (4096, 1280), "engram_wkv": (25600, 6144),
    "mtp_main_proj": (5120, 15360),
}
GATED_LINEARS = {"shared_w13": (2304, 5120)}


# ============================================================================ host helpers


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (no faithful bf16 tl.dot there)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_f32_for(*tensors) -> bool:
    """Upcast dot operands to fp32 inside the kernel: interpreter, or fp32 inputs (exact path)."""
    return interpreting() or any(t is not None and t.dtype == torch.float32 for t in tensors)


def native_fp8_for(device) -> bool:
    """Use the hardware E4M3 -> fp32 cvt (sm89+ CUDA); bit arithmetic elsewhere."""
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp32_dot_precision(device) -> str:
    """tl.dot input_precision for fp32 operands that must keep ~fp32 accuracy."""
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return "ieee"
    return "tf32x3"


def parse_target(target: str):
    """'cuda:sm90' -> ('cuda', 90); 'rocm:gfx942' -> ('rocm', 'gfx942'); else (None, None)."""
    kind, _, arch = target.partition(":")
    if kind == "cuda" and arch.startswith("sm") and arch[2:].isdigit():
        return "cuda", int(arch[2:])
    if kind == "rocm" and arch.startswith("gfx"):
        return "rocm", arch
    return None, None


def target_traits(target: str) -> dict | None:
    """What a kernel variant may assume on a target; None for targets without Triton."""
    kind, arch = parse_target(target)
    if kind is None:
        return None
    if kind == "cuda":
        return {"kind": kind, "arch": arch, "native_fp8": arch >= 90, "fp32_prec": "tf32x3",
                "big_tiles": arch >= 90, "warp": 32}
    return {"kind": kind, "arch": arch, "native_fp8": arch == "gfx950", "fp32_prec": "ieee",
            "big_tiles": arch in ("gfx942", "gfx950"), "warp": 32 if arch == "gfx1100" else 64}


def as_u8(t: torch.Tensor) -> torch.Tensor:
    """FP8 / E8M0 / packed-FP4 tensors travel to kernels as raw bytes."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


# ============================================================================ jit decode helpers


@triton.jit
def e4m3_to_f32(b, NATIVE: tl.constexpr):
    """E4M3 (fn) codes (uint8 tensor) -> float32. NaN (0x7F/0xFF) decodes as 480 (not produced)."""
    if NATIVE:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        bi = b.to(tl.int32)
        mag = bi & 0x7F
        # normal: exponent e4 + 120 (rebias 7 -> 127), mantissa bits to the top of fp32's
        v = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
        v = tl.where(mag < 8, mag.to(tl.float32) * 0.001953125, v)  # subnormal: m · 2^-9
        return tl.where((bi & 0x80) != 0, -v, v)


@triton.jit
def e8m0_to_f32(e):
    """UE8M0 bytes -> 2^(e-127) float32 (byte 0 -> 2^-127 subnormal, 255 -> NaN)."""
    ei = e.to(tl.int32)
    v = (ei << 23).to(tl.float32, bitcast=True)
    v = tl.where(ei == 0, 5.877471754111438e-39, v)
    return tl.where(ei == 255, float("nan"), v)


@triton.jit
def e2m1_to_f32(c):
    """E2M1 codes (int32 0..15, bit 3 = sign) -> float32 {0, .5, 1, 1.5, 2, 3, 4, 6}."""
    mag = c & 7
    v = ((mag << 22) + (126 << 23)).to(tl.float32, bitcast=True)  # 2^((mag>>1)-1)·(1 + (mag&1)/2)
    v = tl.where(mag < 2, mag.to(tl.float32) * 0.5, v)
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def expand_cols(s, R: tl.constexpr, C: tl.constexpr, REP: tl.constexpr):
    """[R, C] -> [R, C·REP], each column repeated REP times (per-block scales -> per element)."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], (R, C, REP)), (R, C * REP))


@triton.jit
def fp4_tile_to_f32(wp, sc, R: tl.constexpr, BK: tl.constexpr):
    """Packed E2M1 bytes [R, BK/2] (low nibble = even k) + UE8M0 bytes [R, BK/32] -> fp32 [R, BK]."""
    wi = wp.to(tl.int32)
    s = expand_cols(e8m0_to_f32(sc), R, BK // 32, 16)  # per packed byte
    lo = e2m1_to_f32(wi & 15) * s
    hi = e2m1_to_f32(wi >> 4) * s
    return tl.reshape(tl.join(lo, hi), (R, BK))


@triton.jit
def pow2_ceil_f32(r):
    """2^ceil(log2 r) for normal positive float32 r, exactly (exponent field + 'mantissa != 0')."""
    u = r.to(tl.int32, bitcast=True)
    e = ((u >> 23) & 0xFF) + ((u & 0x7FFFFF) != 0).to(tl.int32)
    return (e << 23).to(tl.float32, bitcast=True)


@triton.jit
def pow2_inv_f32(p):
    """1/p for a normal power of two p, exactly (no division: the GPU `/` is approximate)."""
    u = p.to(tl.int32, bitcast=True)
    return ((254 - ((u >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def round_e4m3_f32(v):
    """Round float32 v (|v| <= 448) to the nearest E4M3 value, ties to even, returned as float32."""
    a = tl.abs(v)
    u = a.to(tl.int32, bitcast=True)
    e = tl.maximum(((u >> 23) & 0xFF), 121)  # E4M3 subnormals share the 2^-6 binade's step
    ulp = ((e - 3) << 23).to(tl.float32, bitcast=True)  # 2^(exp-3): 3 mantissa bits
    inv = ((254 - (e - 3)) << 23).to(tl.float32, bitcast=True)
    q = (a * inv + 8388608.0) - 8388608.0  # RNE to an integer (a·inv < 16 is exact)
    r = q * ulp
    return tl.where(v < 0, -r, r)


@triton.jit
def fake_quant_e4m3_pow2(x, R: tl.constexpr, C: tl.constexpr):
    """Per-32-column dynamic FP8 fake quant of a float32 tile [R, C] (numerics.fake_quant_fp8_ue8m0)."""
    xb = tl.reshape(x, (R, C // 32, 32))
    amax = tl.maximum(tl.max(tl.abs(xb), axis=2), 1e-4)
    s = pow2_ceil_f32(tl.div_rn(amax, 448.0))
    q = round_e4m3_f32(tl.minimum(tl.maximum(xb * pow2_inv_f32(s)[:, :, None], -448.0), 448.0))
    return tl.reshape(q * s[:, :, None], (R, C))


# ============================================================================ jit: E4M3 words -> bf16x2 (DECODE_W 1)


@triton.jit
def e4m3_bf16x2_bits(w, P: tl.constexpr):
    """uint32 words -> uint32 whose 16-bit halves are the bf16 bits of byte P (0/1) of each half, value·2^-120."""
    if P == 0:
        return ((w << 8) & 0x80008000) | ((w << 4) & 0x07F007F0)
    else:
        return (w & 0x80008000) | ((w >> 4) & 0x07F007F0)


@triton.jit
def ue8m0_pow2_factors(e, B: tl.constexpr):
    """UE8M0 exponents (int32 0..255) -> uint32 (f1 | f1 << 16, f2 | f2 << 16): bf16x2 pairs of the exact
    powers of two with f1·f2 = 2^(e-127)·2^B, for decoded bit patterns worth value·2^-B. With the cap
    c = 254 - B (the largest e for which 2^(e-127+B) is still a bf16): f1 = 2^(min(e,c)-127+B) (biased
    field min(e,c) + B) and f2 = 2^(max(e,c)-c) (field max(e,c) + B - 127); e = 255 (NaN in UE8M0) makes
    f2 a NaN. B = 120 for E4M3 (ue8m0_e4m3_factors), 126 for E2M1 (fp4_unpack.ue8m0_bf16x2_factors)."""
    b1 = (tl.minimum(e, 254 - B) + B) << 7
    b2 = tl.where(e == 255, 0x7FC0, (tl.maximum(e, 254 - B) + B - 127) << 7)
    return (b1 | (b1 << 16)).to(tl.uint32), (b2 | (b2 << 16)).to(tl.uint32)


@triton.jit
def ue8m0_e4m3_factors(e):
    """The scale factors of E4M3 bit patterns worth value·2^-120: f1 = 2^(min(e,134)-7), f2 = 2^(max(e,134)-134)."""
    return ue8m0_pow2_factors(e, 120)


@triton.jit
def bits_f32(bits):
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16_bits_rn(v):
    """float32 -> its bf16 bits (in the low 16 of a uint32), round to nearest even, subnormals kept."""
    u = v.to(tl.uint32, bitcast=True)
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@triton.jit
def scale_bf16x2_rn(v, f1, f2, TWO: tl.constexpr):
    """uint32 pairs of bf16 bits × the bf16x2 pair f1 (and × f2 if TWO), as float32 per half through bit moves
    (interpreter, ROCm: the interpreter keeps bf16 as raw uint16, its bf16 `*` multiplies the bits): v·f1·f2 is
    exact in float32 (a 4-significant-bit value times powers of two, >= 2^-136), then rounded once to nearest
    even bf16, which is what the PTX path's two roundings give (the first is exact whenever f2 != 1)."""
    if TWO:
        lo = bits_f32(v << 16) * bits_f32(f1 << 16) * bits_f32(f2 << 16)
        hi = bits_f32(v & 0xFFFF0000) * bits_f32(f1 & 0xFFFF0000) * bits_f32(f2 & 0xFFFF0000)
    else:
        lo = bits_f32(v << 16) * bits_f32(f1 << 16)
        hi = bits_f32(v & 0xFFFF0000) * bits_f32(f1 & 0xFFFF0000)
    return (_f32_to_bf16_bits_rn(hi) << 16) | _f32_to_bf16_bits_rn(lo)


def _e4m3_asm(sel: str, two: bool) -> tl.constexpr:
    """The PTX of `e4m3_bf16x2_scaled`: prmt with selector `sel` (byte P of each half + its sign copy),
    shl 4, mask, then one or two fma.rn.bf16x2 by the scale factors ($2, $3)."""
    head = ("{ .reg .b32 p, z; mov.b32 z, 0x80008000; prmt.b32 p, $1, $1, %s; shl.b32 p, p, 4; "
            "and.b32 p, p, 0x87F087F0; " % sel)
    tail = ("fma.rn.bf16x2 p, p, $2, z; fma.rn.bf16x2 $0, p, $3, z; }" if two else "fma.rn.bf16x2 $0, p, $2, z; }")
    return tl.constexpr(head + tail)


_E4M3_ASM_P0_ONE, _E4M3_ASM_P0_TWO = _e4m3_asm("0xA280", False), _e4m3_asm("0xA280", True)
_E4M3_ASM_P1_ONE, _E4M3_ASM_P1_TWO = _e4m3_asm("0xB391", False), _e4m3_asm("0xB391", True)


@triton.jit
def e4m3_bf16x2_scaled(w, f1, f2, P: tl.constexpr, PTX: tl.constexpr, TWO: tl.constexpr):
    """uint32 words -> uint32 bf16x2: byte P of each 16-bit half, decoded and × f1 (× f2 if TWO), exact.

    PTX: prmt/shl/and, then fma.rn.bf16x2 (x·f + -0.0; the bf16 fma has no flush-to-zero form, so bf16
    subnormal inputs and results survive) on explicit 32-bit registers (Triton's own bf16 `*` is a scalar
    mul per element and its layout decides the pairing)."""
    # prmt puts byte 2h + P in the low byte of half h and its sign replicated (0x00 / 0xFF) in the high byte
    # (selector nibbles: output byte i <- source byte, +8 = replicate its sign); << 4 moves the code's bits
    # 0..6 to bf16 bits 4..10 and a sign copy to bit 15; the mask keeps exactly those (the bit algebra of
    # `e4m3_bf16x2_bits`, one instruction fewer for P = 0)
    if PTX:
        if TWO:
            asm2: tl.constexpr = _E4M3_ASM_P0_TWO if P == 0 else _E4M3_ASM_P1_TWO
            return tl.inline_asm_elementwise(asm2, "=r,r,r,r", [w, f1, f2], dtype=tl.uint32, is_pure=True, pack=1)
        else:
            asm1: tl.constexpr = _E4M3_ASM_P0_ONE if P == 0 else _E4M3_ASM_P1_ONE
            return tl.inline_asm_elementwise(asm1, "=r,r,r", [w, f1], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return scale_bf16x2_rn(e4m3_bf16x2_bits(w, P), f1, f2, TWO)


@triton.jit
def bf16x2_halves(v, F32: tl.constexpr):
    """uint32 [...] -> [..., 2] (bits 0..15, bits 16..31) as bf16, or as float32 by moving the bits (F32)."""
    if F32:
        return tl.join(bits_f32(v << 16), bits_f32(v & 0xFFFF0000))
    else:
        return tl.join(v.to(tl.uint16).to(tl.bfloat16, bitcast=True),
                       (v >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True))


@triton.jit
def e4m3_words_to_bf16(ww, sc, R: tl.constexpr, BK: tl.constexpr, PTX: tl.constexpr, F32: tl.constexpr,
                       TWO: tl.constexpr):
    """uint32 words [R, BK/4] (memory order, 4 E4M3 codes each) + UE8M0 bytes [R, BK/32] -> [R, BK] in
    k_order_w(BK): bf16 (float32 if F32, the interpreter's exact tl.dot path; values are bf16 values).
    TWO: apply the second scale factor (exact for every byte; without it only bytes <= 134 are)."""
    f1, f2 = ue8m0_e4m3_factors(sc.to(tl.int32))
    f1 = expand_cols(f1, R, BK // 32, 8)  # one scale per 8 words (32 k)
    f2 = expand_cols(f2, R, BK // 32, 8)
    t = tl.join(bf16x2_halves(e4m3_bf16x2_scaled(ww, f1, f2, 0, PTX, TWO), F32),
                bf16x2_halves(e4m3_bf16x2_scaled(ww, f1, f2, 1, PTX, TWO), F32))  # [R, m, h, P]
    t = tl.reshape(t, (R, 4, BK // 16, 2, 2))  # m = q·W/4 + s
    return tl.reshape(tl.permute(t, (0, 4, 2, 1, 3)), (R, BK))  # (P, s, q, h)


def _e4m3_pairs_asm(two: bool) -> tl.constexpr:
    """The PTX of `e4m3_pairs_to_bf16` for 4 codes in one register ($2): code pairs (0, 1) and (2, 3), each moved to
    the two 16-bit halves with its sign copied into the high byte (prmt), shifted and masked into bf16 bits worth
    value·2^-120 (the bit algebra of `e4m3_bf16x2_bits`), then scaled by one (or two) fma.rn.bf16x2 by the same
    elements' factors ($3, $4; $5, $6)."""
    f1, f2 = ("$3", "$4"), ("$5", "$6")
    body = ""
    for half, sel in enumerate(("0x9180", "0xB3A2")):  # output bytes: code, its sign copy, next code, its sign copy
        body += (f"prmt.b32 p, $2, $2, {sel}; shl.b32 p, p, 4; and.b32 p, p, 0x87F087F0; "
                 + (f"fma.rn.bf16x2 p, p, {f1[half]}, z; fma.rn.bf16x2 ${half}, p, {f2[half]}, z; " if two
                    else f"fma.rn.bf16x2 ${half}, p, {f1[half]}, z; "))
    return tl.constexpr("{ .reg .b32 p, z; mov.b32 z, 0x80008000; " + body + "}")


_E4M3_PAIRS_ONE, _E4M3_PAIRS_TWO = _e4m3_pairs_asm(False), _e4m3_pairs_asm(True)


@triton.jit
def e4m3_one_factor(e):
    """UE8M0 bytes e <= 134 -> 2^(e-7), the bf16 with exponent field e + 120: `_E4M3_PAIRS_ONE`'s whole scale (wrong
    for larger bytes, which need `e4m3_pair_factors`)."""
    return ((e.to(tl.int32) + 120) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e4m3_pair_factors(e):
    """UE8M0 bytes -> the bf16 scale factors of `_E4M3_PAIRS_*`'s bit patterns (worth value·2^-120):
    2^(min(e,134)-7) and 2^(max(e,134)-134) (NaN for e = 255), one per byte, not yet expanded per element."""
    ei = e.to(tl.int32)
    b1 = e4m3_one_factor(tl.minimum(ei, 134))
    b2 = tl.where(ei == 255, 0x7FC0, (tl.maximum(ei, 134) - 7) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return b1, b2


@triton.jit
def e4m3_pairs_to_bf16(codes, e, R: tl.constexpr, BK: tl.constexpr, TWO: tl.constexpr):
    """E4M3 codes [R, BK] (uint8, natural k order) + UE8M0 bytes [R, BK/32] -> the bf16 tile [R, BK]: DECODE_W 0's
    bits (value·2^(e-127) rounded to bf16), by inline PTX (CUDA only) on code pairs: prmt, shl, and, then one
    fma.rn.bf16x2 by 2^(min(e,134)-7) (TWO: and one by 2^(max(e,134)-134), for bytes above 134) — 4 instructions
    a pair against the per-element decoder's 6 (e4m3 cvt, two f16 -> f32, two multiplies, a bf16x2 pack). The asm
    is elementwise (pack 4: the 4 consecutive elements of a thread share a register), so the tile keeps its
    natural k order and x is not permuted (unlike DECODE_W 1's words)."""
    b1, b2 = e4m3_pair_factors(e)
    b1 = expand_cols(b1, R, BK // 32, 32)
    if TWO:
        b2 = expand_cols(b2, R, BK // 32, 32)
        out = tl.inline_asm_elementwise(_E4M3_PAIRS_TWO, "=r,=r,r,r,r,r,r", [codes, b1, b2], dtype=tl.bfloat16,
                                        is_pure=True, pack=4)
    else:
        out = tl.inline_asm_elementwise(_E4M3_PAIRS_ONE, "=r,=r,r,r,r", [codes, b1], dtype=tl.bfloat16,
                                        is_pure=True, pack=4)
    return out


# ============================================================================ kernels


@triton.jit
def split_bounds(split, K: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_lo, k_hi) of split `split` of K: split s takes the BK tiles [s·T // S, (s+1)·T // S), T = K / BK,
    S = SPLIT_K, so the runs differ by at most one tile and S need not divide T (the launcher picks S to fill
    the GPU's resident program slots, not to divide T). SPLIT_K == 1: the whole K (any K; the tail masked)."""
    if SPLIT_K == 1:
        return 0, K
    T: tl.constexpr = K // BK
    return (split * T // SPLIT_K) * BK, ((split + 1) * T // SPLIT_K) * BK


@triton.jit
def fp8_gemm_kernel(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, y_ptr, part_ptr, cnt_ptr, M, limit, w3_off, s3_off,
                    N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, GATED: tl.constexpr, NATIVE_FP8: tl.constexpr,
                    DOT_F32: tl.constexpr, FOLD: tl.constexpr, DECODE_W: tl.constexpr, PTX: tl.constexpr,
                    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0, SPF: tl.constexpr = False):
    """y = x·Wᵀ (GATED: y = silu(min(x·W1ᵀ, limit))·clamp(x·W3ᵀ, ±limit)); W E4M3 with UE8M0/32×32.

    Decode grids on sm90+: PREFETCH (bytes per row, 0 = off) requests the first PREFETCH bytes of each of
    the program's weight rows over its K split into the L2 first (l2_prefetch.py), PDL then waits for the
    previous kernel (pdl.py) before x or any store.

    GATED 2 (the stacked gated tile): a program's BN weight rows are BN/2 rows of W1 then the same BN/2 rows of W3,
    one tile and one dot; W3's rows are addressed as w_ptr + w3_off (ws_ptr + s3_off for its scales: the byte
    distances between the tensors, so the tile is one pointer tensor whose rows stay 16-byte aligned and contiguous
    along k, which a per-row select between two base pointers is not: there Triton dropped the vectorized cp.async
    weight loads for 71 small LDGs a k step, sm90 SASS). w3_off is a multiple of 16 (the launcher checks).

    x [M, K] and y [M, N] are contiguous. SPLIT_K > 1: program_id(1) takes a run of whole BK tiles of the
    reduction (`split_bounds`) and writes fp32 partials part[split, M, N] (GATED: [split, M, 2N], g then u); with
    FOLD the last of the SPLIT_K programs of a tile (arrival counter cnt[pid]) sums them in split
    order and runs the epilogue, otherwise `splitk_reduce_kernel` does in a second launch.
    DECODE_W 1: the weight tile is decoded from 32-bit words by bf16x2 bit assembly (`e4m3_words_to_bf16`,
    inline PTX if PTX) and x's columns must come in k_order_w(BK) per BK block (K % BK == 0)."""
    tl.static_assert(DECODE_W != 1 or (K % BK == 0 and BK % 32 == 0), "DECODE_W 1 needs K % BK == 0, BK % 32 == 0")
    tl.static_assert(DECODE_W != 2 or (PTX and BK % 32 == 0 and K % 32 == 0),
                     "DECODE_W 2 is inline PTX (CUDA) and needs BK % 32 == 0, K % 32 == 0")
    tl.static_assert(SPLIT_K == 1 or K % BK == 0, "SPLIT_K > 1 needs K % BK == 0 (splits are runs of whole k tiles)")
    tl.static_assert(GATED != 2 or DECODE_W != 1, "the stacked gated tile (GATED 2) has no word decoder (DECODE_W 1)")
    BNO: tl.constexpr = BN // (1 + (GATED == 2))  # output columns of a program (GATED 2: half its weight rows)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    num_n = (N + BNO - 1) // BNO
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % gsize
    pid_n = (pid % (GROUP_M * num_n)) // gsize

    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BNO + tl.arange(0, BNO)
    m_ok = rm < M
    n_ok = rn < N
    if GATED == 2:  # weight rows of the tile: w1's rows rn, then w3's (up) rows rn
        rr = tl.arange(0, BN)
        rw = pid_n * BNO + rr % BNO
        up = rr >= BNO
        rw_ok = rw < N
    else:  # the weight rows are the output columns (up: all False, unused)
        rw, up, rw_ok = rn, rn < 0, n_ok
    k_lo, k_hi = split_bounds(split, K, BK, SPLIT_K)
    rows_pf = tl.minimum(rn, N - 1).to(tl.int64) * K + k_lo
    prefetch_rows_l2(w_ptr + rows_pf, PREFETCH, PREFETCH > 0)
    if GATED:
        prefetch_rows_l2(w3_ptr + rows_pf, PREFETCH, PREFETCH > 0)
    grid_wait(PDL)
    grid_release(PDL)
    if DECODE_W:
        # e > 134 needs the second bf16x2 scale factor; real checkpoints never have one, so the
        # program checks its own scale rows once and runs the one-multiply loop when it can
        if _any_scale_above(ws_ptr, ws3_ptr, pid_n, k_lo, k_hi, N, K, BNO, GATED != 0, 134):
            acc, acc3 = _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rw, up, m_ok, rw_ok,
                                    k_lo, k_hi, N, K, BM, BN, BK, SPLIT_K, GATED, NATIVE_FP8, DOT_F32, DECODE_W, PTX,
                                    True, SPF)
        else:
            acc, acc3 = _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rw, up, m_ok, rw_ok,
                                    k_lo, k_hi, N, K, BM, BN, BK, SPLIT_K, GATED, NATIVE_FP8, DOT_F32, DECODE_W, PTX,
                                    False, SPF)
    else:
        acc, acc3 = _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rw, up, m_ok, rw_ok, k_lo,
                                k_hi, N, K, BM, BN, BK, SPLIT_K, GATED, NATIVE_FP8, DOT_F32, DECODE_W, PTX, True, SPF)
    if GATED == 2:  # [BN, BM] = w1 rows then w3 rows -> g, u [BNO, BM]
        acc, acc3 = tl.split(tl.permute(tl.reshape(acc, (2, BNO, BM)), (1, 2, 0)))
    omask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:
        W2 = N * (1 + (GATED != 0))
        base = part_ptr + (split * M + rm.to(tl.int64))[:, None] * W2 + rn[None, :]
        tl.store(base, tl.trans(acc), mask=omask)
        if GATED:
            tl.store(base + N, tl.trans(acc3), mask=omask)
        if FOLD:
            if arrive_last(cnt_ptr + pid, SPLIT_K):
                _fold_splits(part_ptr, y_ptr, rm, rn, M, limit, N, SPLIT_K, GATED != 0)
                reset_counter(cnt_ptr + pid)
    else:
        if GATED:
            acc = _swiglu(acc, acc3, limit)
        tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], tl.trans(acc).to(y_ptr.dtype.element_ty),
                 mask=omask)


@triton.jit
def _any_scale_above(ws_ptr, ws3_ptr, pid_n, k_lo, k_hi, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                     GATED: tl.constexpr, LIMIT: tl.constexpr):
    """Whether any UE8M0 byte of this program's scale rows (W, and W3 if GATED) over its K split [k_lo, k_hi)
    (multiples of 32) exceeds LIMIT."""
    KS = (K + 31) // 32
    RB: tl.constexpr = (BN + 31) // 32 + 1  # scale rows a BN tile can touch (it need not start on a 32 row)
    RBP: tl.constexpr = triton.next_power_of_2(RB)
    rr = (pid_n * BN) // 32 + tl.arange(0, RBP)
    r_ok = (rr < (pid_n * BN + BN + 31) // 32) & (rr < (N + 31) // 32)
    mx = tl.zeros((RBP, 32), dtype=tl.int32)
    for c0 in range(k_lo // 32, k_hi // 32, 32):
        cc = c0 + tl.arange(0, 32)
        ok = r_ok[:, None] & (cc < k_hi // 32)[None, :]
        offs = rr[:, None] * KS + cc[None, :]
        mx = tl.maximum(mx, tl.load(ws_ptr + offs, mask=ok, other=0).to(tl.int32))
        if GATED:
            mx = tl.maximum(mx, tl.load(ws3_ptr + offs, mask=ok, other=0).to(tl.int32))
    return tl.max(tl.max(mx, axis=1), axis=0) > LIMIT


@triton.jit
def _mma_k_loop(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, w3_off, s3_off, rm, rn, up, m_ok, n_ok, k_lo, k_hi,
                N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                SPLIT_K: tl.constexpr, GATED: tl.constexpr, NATIVE_FP8: tl.constexpr, DOT_F32: tl.constexpr,
                DECODE_W: tl.constexpr, PTX: tl.constexpr, TWO: tl.constexpr, SPF: tl.constexpr = False):
    """fp8_gemm_kernel's k loop over this program's split [k_lo, k_hi): (acc, acc3) [BN, BM] fp32 = W-tile · x-tileᵀ.
    rn [BN]: the tile's weight rows; GATED 2 (stacked): row i is row rn[i] of W3 (at w_ptr + w3_off, scales at
    ws_ptr + s3_off) where up[i], else of W, one tile and one dot (acc3 unused). TWO (DECODE_W 1 and 2): apply the
    second scale factor (needed only where a UE8M0 byte exceeds 134).

    SPF: the UE8M0 scale bytes of the next k tile are loaded one iteration ahead (registers carried by the loop).
    Triton's pipeline takes the weight and x tiles through cp.async stages, but not the scale loads (2 bytes a
    thread: below cp.async's 4), so without SPF each k step issues its scale load and waits a whole global round
    trip for it before the decode (sm90 SASS: LDG.E.U16 at the top of the loop, consumed in the same
    iteration; Nsight Compute: long-scoreboard waits are 30-35 % of the 8-token kernels' cycles between a warp's
    instructions, the largest share)."""
    KS = (K + 31) // 32
    w_rows = rn.to(tl.int64)[:, None] * K
    s_rows = (rn // 32)[:, None] * KS
    if GATED == 2:  # one pointer tile over both matrices: W3's rows by their byte distance from W. The offset
        # is the 0/1 row flag times w3_off: a select between two pointers, or between w3_off and 0, lost the rows'
        # 16-byte contiguity in Triton's analysis (71 small LDGs a k step, sm90 SASS); the product kept it. The other
        # tiles' offsets and address expressions are unchanged (their sm90 k loops are the same as before the stacked
        # tile under Triton 3.6 and 3.9)
        w_rows = w_rows + (up.to(tl.int64) * w3_off)[:, None]
        s_rows = s_rows + (up.to(tl.int64) * s3_off)[:, None]
    x_rows = rm.to(tl.int64)[:, None] * K
    KW: tl.constexpr = K // 4
    w_words = w_ptr.to(tl.pointer_type(tl.uint32)) + rn.to(tl.int64)[:, None] * KW
    w3_words = w3_ptr.to(tl.pointer_type(tl.uint32)) + rn.to(tl.int64)[:, None] * KW
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    acc3 = tl.zeros((BN, BM), dtype=tl.float32)
    if SPF:  # the first k tile's scales, before the loop
        rs0 = k_lo // 32 + tl.arange(0, BK // 32)
        sm0 = n_ok[:, None] & (rs0[None, :] * 32 < k_hi)
        s_nxt = tl.load(ws_ptr + s_rows + rs0[None, :], mask=sm0, other=127)
        if GATED == 1:
            s3_nxt = tl.load(ws3_ptr + s_rows + rs0[None, :], mask=sm0, other=127)
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        if K % BK == 0:
            xm = m_ok[:, None]
            wm = n_ok[:, None]
        else:
            xm = m_ok[:, None] & (rk[None, :] < K)
            wm = n_ok[:, None] & (rk[None, :] < K)
        xt = tl.load(x_ptr + x_rows + rk[None, :], mask=xm, other=0.0)
        if DOT_F32:
            xt = xt.to(tl.float32)
        else:
            xt = xt.to(tl.bfloat16)
        # one scale byte per (row, 32 columns), expanded in registers (not one load per element)
        rs = k0 // 32 + tl.arange(0, BK // 32)
        if SPF:
            rsn = rs + BK // 32
            smn = n_ok[:, None] & (rsn[None, :] * 32 < k_hi)  # blocks that start inside the split: none after the last tile
            s_cur = s_nxt
            s_nxt = tl.load(ws_ptr + s_rows + rsn[None, :], mask=smn, other=127)
            if GATED == 1:
                s3_cur = s3_nxt
                s3_nxt = tl.load(ws3_ptr + s_rows + rsn[None, :], mask=smn, other=127)
        else:
            sm = n_ok[:, None] & (rs[None, :] < KS)
            s_cur = tl.load(ws_ptr + s_rows + rs[None, :], mask=sm, other=127)
            if GATED == 1:
                s3_cur = tl.load(ws3_ptr + s_rows + rs[None, :], mask=sm, other=127)
        if DECODE_W == 2:  # byte pairs by inline PTX, natural k order; rows as DECODE_W 0's (stacked ones too)
            wt = e4m3_pairs_to_bf16(tl.load(w_ptr + w_rows + rk[None, :], mask=wm, other=0), s_cur, BN, BK, TWO)
            if DOT_F32:
                acc += tl.dot(wt.to(tl.float32), tl.trans(xt), input_precision="ieee")
            else:
                acc += tl.dot(wt, tl.trans(xt))
            if GATED == 1:
                wt3 = e4m3_pairs_to_bf16(tl.load(w3_ptr + w_rows + rk[None, :], mask=wm, other=0), s3_cur, BN, BK,
                                         TWO)
                if DOT_F32:
                    acc3 += tl.dot(wt3.to(tl.float32), tl.trans(xt), input_precision="ieee")
                else:
                    acc3 += tl.dot(wt3, tl.trans(xt))
        elif DECODE_W:
            # the decoded tile already is bf16 (fp32 under DOT_F32) with bf16 values: no cast before the dot
            rw = (k0 // 4 + tl.arange(0, BK // 4))[None, :]
            wt = e4m3_words_to_bf16(tl.load(w_words + rw, mask=n_ok[:, None], other=0), s_cur, BN, BK, PTX, DOT_F32,
                                    TWO)
            if DOT_F32:
                acc += tl.dot(wt, tl.trans(xt), input_precision="ieee")
            else:
                acc += tl.dot(wt, tl.trans(xt))
            if GATED == 1:
                wt3 = e4m3_words_to_bf16(tl.load(w3_words + rw, mask=n_ok[:, None], other=0), s3_cur, BN, BK, PTX,
                                         DOT_F32, TWO)
                if DOT_F32:
                    acc3 += tl.dot(wt3, tl.trans(xt), input_precision="ieee")
                else:
                    acc3 += tl.dot(wt3, tl.trans(xt))
        else:
            sc = expand_cols(e8m0_to_f32(s_cur), BN, BK // 32, 32)
            wt = e4m3_to_f32(tl.load(w_ptr + w_rows + rk[None, :], mask=wm, other=0), NATIVE_FP8) * sc
            if DOT_F32:
                acc += tl.dot(wt, tl.trans(xt), input_precision="ieee")
            else:
                acc += tl.dot(wt.to(tl.bfloat16), tl.trans(xt))
            if GATED == 1:
                sc3 = expand_cols(e8m0_to_f32(s3_cur), BN, BK // 32, 32)
                wt3 = e4m3_to_f32(tl.load(w3_ptr + w_rows + rk[None, :], mask=wm, other=0), NATIVE_FP8) * sc3
                if DOT_F32:
                    acc3 += tl.dot(wt3, tl.trans(xt), input_precision="ieee")
                else:
                    acc3 += tl.dot(wt3.to(tl.bfloat16), tl.trans(xt))
    return acc, acc3


@triton.jit
def fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, w3_ptr, ws3_ptr, y_ptr, part_ptr, cnt_ptr, limit,
                    N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                    GATED: tl.constexpr, NATIVE_FP8: tl.constexpr, PDL: tl.constexpr = False,
                    PREFETCH: tl.constexpr = 0, PIPE: tl.constexpr = 1, SEG: tl.constexpr = 0,
                    EARLY_W: tl.constexpr = False):
    """One token (M = 1): y = x·Wᵀ on the CUDA cores, no tensor-core padding to 16 rows.

    EARLY_W: the split's first k tile of weight bytes and scale bytes (static data) is loaded before the grid
    dependency wait, and the loop runs from the second tile; under PDL those loads overlap the predecessor.

    PREFETCH (sm90+, bytes per row, 0 = off): the first PREFETCH bytes of each of the program's weight rows
    over its K split are requested into the L2 first (l2_prefetch.py); PDL: then the grid dependency wait
    (pdl.py), before x or any store.

    The weight tile is read as [BN/32 row groups, 32, BK] so that one UE8M0 scale per (row group,
    32 columns) multiplies the ACTIVATION (BN/32 · BK products per step) instead of every weight
    element: w·(x·s) equals (w·s)·x exactly in fp32 (s is a power of two). Per weight element that
    leaves the E4M3 -> fp32 cvt and one FMA; the fp32 partial products stay elementwise in
    registers ([BN, BK] accumulator) and are reduced along K once, after the loop. PIPE >= 2 asks
    Triton to pipeline the k loop's loads (cp.async, PIPE stages). K is split over
    program_id(1); the last arriving split (cnt[pid_n]) sums the partials in split order and runs
    the epilogue (`_fold_splits`), so one launch does the whole linear. Needs K % BK == 0 and
    BN % 32 == 0 (checked by the launcher).

    SEG (0, or a power of two up to 16 that divides BK; the launcher checks): 0 keeps one fp32 accumulator
    per tile element; SEG n sums each run of n consecutive products of a row first (inside one thread: Triton gives a thread 16 contiguous
    weight bytes, one 16-byte load, when the pointers carry their 16-byte alignment hint) into a
    [RG, 32, BK/n] accumulator, which halves the registers at n = 16 (GEMV_SEG). The fp32 sum order
    differs between the two (last-bit differences)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    RG: tl.constexpr = BN // 32
    KS: tl.constexpr = K // 32
    k_lo, k_hi = split_bounds(split, K, BK, SPLIT_K)
    g = pid_n * RG + tl.arange(0, RG)  # 32-row groups (= scale rows)
    r = tl.arange(0, 32)
    rn3 = g[:, None, None] * 32 + r[None, :, None]  # [RG, 32, 1]
    n_ok3 = rn3 < N
    rows_pf = tl.minimum(pid_n * BN + tl.arange(0, BN), N - 1).to(tl.int64) * K + k_lo
    prefetch_rows_l2(w_ptr + rows_pf, PREFETCH, PREFETCH > 0)
    if GATED:
        prefetch_rows_l2(w3_ptr + rows_pf, PREFETCH, PREFETCH > 0)
    kk = tl.arange(0, BK)
    sk = tl.arange(0, BK // 32)
    w_rows = rn3.to(tl.int64) * K
    AK: tl.constexpr = BK // SEG if SEG else BK
    acc = tl.zeros((RG, 32, AK), dtype=tl.float32)
    acc3 = tl.zeros((RG, 32, AK), dtype=tl.float32)
    if EARLY_W:
        g_ok0 = g[:, None] < (N + 31) // 32
        s_off0 = g[:, None] * KS + k_lo // 32 + sk[None, :]
        sb0 = tl.load(ws_ptr + s_off0, mask=g_ok0, other=127)
        wb0 = tl.load(w_ptr + w_rows + k_lo + kk[None, None, :], mask=n_ok3, other=0)
        if GATED:
            sb30 = tl.load(ws3_ptr + s_off0, mask=g_ok0, other=127)
            wb30 = tl.load(w3_ptr + w_rows + k_lo + kk[None, None, :], mask=n_ok3, other=0)
    grid_wait(PDL)
    grid_release(PDL)
    if EARLY_W:  # the first tile, from the bytes loaded before the wait (the loop's arithmetic, in its order)
        x = tl.load(x_ptr + k_lo + kk).to(tl.float32)
        xs = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                        e8m0_to_f32(sb0)[:, :, None], (RG, 1, BK))
        acc = _add_products(acc, e4m3_to_f32(wb0, NATIVE_FP8) * xs, RG, AK, SEG)
        if GATED:
            xs3 = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                             e8m0_to_f32(sb30)[:, :, None], (RG, 1, BK))
            acc3 = _add_products(acc3, e4m3_to_f32(wb30, NATIVE_FP8) * xs3, RG, AK, SEG)
        k_lo += BK
    # PIPE >= 2 asks Triton to pipeline the k loop's loads (PIPE stages of cp.async into shared memory; it
    # pipelines loads that feed no tl.dot only when the loop asks). The default, 1, does not: measured faster
    # (GEMV_PIPE).
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=PIPE):
        x = tl.load(x_ptr + k0 + kk).to(tl.float32)
        s_off = g[:, None] * KS + k0 // 32 + sk[None, :]  # [RG, BK/32]
        g_ok = g[:, None] < (N + 31) // 32
        xs = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                        e8m0_to_f32(tl.load(ws_ptr + s_off, mask=g_ok, other=127))[:, :, None], (RG, 1, BK))
        w = e4m3_to_f32(tl.load(w_ptr + w_rows + k0 + kk[None, None, :], mask=n_ok3, other=0), NATIVE_FP8)
        acc = _add_products(acc, w * xs, RG, AK, SEG)
        if GATED:
            xs3 = tl.reshape(tl.broadcast_to(tl.reshape(x, (1, BK // 32, 32)), (RG, BK // 32, 32)) *
                             e8m0_to_f32(tl.load(ws3_ptr + s_off, mask=g_ok, other=127))[:, :, None], (RG, 1, BK))
            w3 = e4m3_to_f32(tl.load(w3_ptr + w_rows + k0 + kk[None, None, :], mask=n_ok3, other=0), NATIVE_FP8)
            acc3 = _add_products(acc3, w3 * xs3, RG, AK, SEG)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    y1 = tl.reshape(tl.sum(acc, axis=2), (BN,))
    if SPLIT_K == 1:
        if GATED:
            y1 = _swiglu(y1, tl.reshape(tl.sum(acc3, axis=2), (BN,)), limit)
        tl.store(y_ptr + rn, y1.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        W2 = N * (1 + GATED)
        tl.store(part_ptr + split * W2 + rn, y1, mask=n_ok)
        if GATED:
            tl.store(part_ptr + split * W2 + N + rn, tl.reshape(tl.sum(acc3, axis=2), (BN,)), mask=n_ok)
        if arrive_last(cnt_ptr + pid_n, SPLIT_K):
            _fold_splits(part_ptr, y_ptr, tl.arange(0, 1), rn, 1, limit, N, SPLIT_K, GATED)
            reset_counter(cnt_ptr + pid_n)


@triton.jit
def _add_products(acc, prod, RG: tl.constexpr, AK: tl.constexpr, SEG: tl.constexpr):
    """fp8_gemv_kernel's accumulate: prod [RG, 32, BK] into acc [RG, 32, AK], each run of SEG products summed
    first (inside a thread) when SEG, else elementwise (AK = BK)."""
    if SEG:
        out = acc + tl.sum(tl.reshape(prod, (RG, 32, AK, SEG)), axis=3)
    else:
        out = acc + prod
    return out


@triton.jit
def _swiglu(g, u, limit):
    """silu(min(g, L))·clamp(u, ±L). Known gap: a NaN g or u (only from a NaN scale byte, UE8M0 255, which real
    checkpoints do not hold) may come out finite on the GPU, where min / max lower to fmin / fmax that drop NaN;
    the torch reference (torch.clamp) keeps it."""
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _fold_splits(part_ptr, y_ptr, rm, rn, M, limit, N: tl.constexpr, SPLIT_K: tl.constexpr, GATED: tl.constexpr):
    """Last arriver of a split-K tile: y[rm, rn] = epilogue(Σ_split part[split, rm, rn]) in split order
    (the order `splitk_reduce_kernel` uses, so both paths give the same bits). `.cg` loads read L2,
    where the other programs' partials are, not this SM's L1."""
    W2 = N * (1 + GATED)
    omask = (rm < M)[:, None] & (rn < N)[None, :]
    acc = tl.zeros((rm.shape[0], rn.shape[0]), dtype=tl.float32)
    acc3 = tl.zeros((rm.shape[0], rn.shape[0]), dtype=tl.float32)
    for sp in tl.static_range(SPLIT_K):
        row = part_ptr + (sp * M + rm.to(tl.int64))[:, None] * W2 + rn[None, :]
        acc += tl.load(row, mask=omask, other=0.0, cache_modifier=".cg")
        if GATED:
            acc3 += tl.load(row + N, mask=omask, other=0.0, cache_modifier=".cg")
    if GATED:
        acc = _swiglu(acc, acc3, limit)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=omask)


@triton.jit
def splitk_reduce_kernel(part_ptr, y_ptr, M, limit, N: tl.constexpr, SPLIT_K: tl.constexpr, GATED: tl.constexpr,
                         BLOCK: tl.constexpr):
    """y[m, n] = epilogue(Σ_split part[split, m, n]) in split order (deterministic)."""
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = rn < N
    W2 = N * (1 + GATED)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK,), dtype=tl.float32)
    for sp in tl.static_range(SPLIT_K):
        row = part_ptr + (sp * M + m) * W2
        acc += tl.load(row + rn, mask=ok, other=0.0)
        if GATED:
            acc3 += tl.load(row + N + rn, mask=ok, other=0.0)
    if GATED:
        acc = _swiglu(acc, acc3, limit)
    tl.store(y_ptr + m * N + rn, acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def act_quant_fp8_kernel(x_ptr, y_ptr, M, K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """y = dequant(quant_e4m3_pow2_per32(x)) for a [BR, BK] tile of contiguous x [M, K] (K % 32 == 0)."""
    rm = tl.program_id(0) * BR + tl.arange(0, BR)
    rk = tl.program_id(1) * BK + tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    offs = rm[:, None].to(tl.int64) * K + rk[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = fake_quant_e4m3_pow2(x, BR, BK)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# ============================================================================ references


def act_quant_fp8_reference(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-32 FP8 fake quantization (E4M3, pow2 scale, amax floor 1e-4), x's dtype."""
    return formats.fake_quant_fp8_ue8m0(x, 32)


def fp8_gemm_reference(x, w, w_scale, act_quant: bool = False, out_dtype=None):
    """x [M, K] · dequant(W [N, K], scale [N/32, K/32])ᵀ in fp32 -> out_dtype (default x's)."""
    xa = act_quant_fp8_reference(x) if act_quant else x
    y = xa.float() @ formats.dequant_fp8_weight(w, w_scale).T
    return y.to(out_dtype or x.dtype)


def fp8_gemm_swiglu_reference(x, w1, s1, w3, s3, limit: float, act_quant: bool = False, out_dtype=None):
    """h = silu(min(x·W1ᵀ, limit)) · clamp(x·W3ᵀ, ±limit), fp32 math -> out_dtype (default x's)."""
    xa = (act_quant_fp8_reference(x) if act_quant else x).float()
    g = (xa @ formats.dequant_fp8_weight(w1, s1).T).clamp(max=limit)
    u = (xa @ formats.dequant_fp8_weight(w3, s3).T).clamp(-limit, limit)
    return (torch.nn.functional.silu(g) * u).to(out_dtype or x.dtype)


# ============================================================================ launchers


N_SMS_HINT = 132  # SMs of an H100/H200-class GPU: what the ahead-of-time variants' split-K assumes (the JIT
# launcher reads the running device's count, kv_quant.sm_count)
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
GEMV_MAX_M = 1  # tokens that take the CUDA-core path (fp8_gemv_kernel)
GEMV_BK = 128  # its k tile
# its first weight tile loaded before the PDL wait (the kernel's EARLY_W; PDL launches only). H200, L2-cold, behind
# a norm (benchmarks/step_chain.py, tuning/step_chain_early_w.json, twice, interleaved, the same bits): what the
# linear adds to the step, PDL -> PDL + EARLY_W: wq_a 3.89 / 4.01 -> 3.65 / 3.78 µs, wo_b 11.98 / 12.19 -> 11.75 /
# 11.81, shared w1/w3 8.39 / 8.21 -> 7.80 / 8.14; alone (no predecessor) wq_a 5.84 / 6.02 -> 6.32 / 6.40, the
# others level. A decode step always has the predecessor, so it is on.
GEMV_EARLY_W = True
GEMV_PIPE = 1  # its k loop's pipeline stages (the kernel's PIPE); 2-4 were slower on the H200 (tuning/tune_fp8_decode.json)
# Its accumulator: 0 = one fp32 per weight element of the [BN, BK] tile (122 registers a thread, sm90 SASS, Triton
# 3.6); n = each thread's n consecutive products of a row summed first, one fp32 per n elements (63 registers: 8
# programs an SM instead of 4, so twice the weight bytes in flight). H200, L2-cold graph replay, interleaved with
# the old default (tuning/tune_fp8_gemv_seg.json): wo_b 15.9 -> 14.2 µs, shared w13 11.5 -> 10.3, shared w2
# 7.3 -> 7.1, wq_a 6.1 -> 6.0 (no gain: 20 tiles × 20 splits, capped by MIN_SPLIT_STEPS).
GEMV_SEG = 16
FOLD_SPLIT_K = True  # split-K epilogue by the last-arriving program (one launch) rather than a reduce kernel
# weight decoder of the M <= 16 tensor-core path on CUDA (0: per element via fp32; 1: bf16x2 words). H200,
# L2-cold graph replay (tuning/tune_fp8_prefetch.json): the words decoder wins only where the
# decode's issue time dominates, the largest linear: engram wkv (25600×6144) at 8 tokens 63.4 vs 73.5 µs; it
# loses on the others (wo_b 31.3 vs 25.2, wq_a 18.3 vs 9.0, shared w2 18.6 vs 10.9, shared w13 29.8 vs 20.0 µs:
# the host-side permutation of x is one more launch, and the scale scan adds a round trip). So it is the
# default from DECODE_W_MIN_WEIGHTS weight elements on (engram wkv; mtp_main_proj, 79 M, stays per element).
DECODE_W_CUDA = 1
DECODE_W_MIN_WEIGHTS = 100_000_000
# The byte-pair decoder (DECODE_W 2, `e4m3_pairs_to_bf16`) as the decode default below DECODE_W_MIN_WEIGHTS: off until
# measured. Session 11 built it and measured wrong products (rel err 1.4) and slower tiles on the H200; the cause
# (session 14, reading that commit, e207ddd) was the launcher, not the PTX: it permuted x to the word decoder's
# k order (`if dw:` for dw == 2 too) and chose the word decoder's 4-warp tile (`bool(dw)`). Both are fixed here;
# the `gpu` test compares its bits with DECODE_W 0.
DECODE_PAIRS = False
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


def ptx_for(device) -> bool:
    """Inline PTX (the bf16x2 fma of DECODE_W 1) compiles on CUDA only, not in the interpreter."""
    return not interpreting() and device.type == "cuda" and torch.version.hip is None


def _decode_w(decode_w, M: int, N: int, K: int, BK: int, device) -> int:
    """The mma path's weight decoder: explicit 0/1/2, or None = DECODE_W_CUDA for M <= 16 on CUDA where K tiles
    and the weight has at least DECODE_W_MIN_WEIGHTS elements, else DECODE_PAIRS for M <= 16 on CUDA (off: not
    yet measured), else 0."""
    if decode_w is None:
        if ptx_for(device) and M <= 16 and K % BK == 0 and BK % 32 == 0 and N * K >= DECODE_W_MIN_WEIGHTS:
            return DECODE_W_CUDA
        return 2 if DECODE_PAIRS and ptx_for(device) and M <= 16 and BK % 32 == 0 and K % 32 == 0 else 0
    if decode_w not in (0, 1, 2):
        raise ValueError(f"decode_w: 0, 1 or 2, got {decode_w!r}")
    if decode_w == 1 and (K % BK or BK % 32):
        raise ValueError(f"decode_w=1 needs K % BK == 0 and BK % 32 == 0 (K={K}, BK={BK})")
    if decode_w == 2 and (not ptx_for(device) or BK % 32 or K % 32):
        # K % 32: the two-factor check (`_any_scale_above`) reads whole 32-column scale blocks only
        raise ValueError(f"decode_w=2 is inline PTX: a CUDA device outside the interpreter, BK % 32 == 0 and "
                         f"K % 32 == 0 (device {device}, BK={BK}, K={K})")
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


def mma_sync_decode_for(device) -> bool:
    """Whether the 2-warp decode tile (mma.sync) is the one to run: CUDA sm90, the only chip it was measured on."""
    if interpreting() or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


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


def act_quant_fp8(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 32:
        raise ValueError(f"act_quant_fp8: K={x.shape[-1]} is not a multiple of 32")
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    M, K = x2.shape
    BR, BK = (16, 128) if not interpreting() else (8, 64)
    if M:
        act_quant_fp8_kernel[(triton.cdiv(M, BR), triton.cdiv(K, BK))](x2, y, M, K=K, BR=BR, BK=BK)
    return y.reshape(x.shape)


def _gemv_tiles(N: int, K: int, gated: bool = False, sms: int = N_SMS_HINT):
    """(BN, BK, SPLIT_K, num_warps, num_stages) of the one-token CUDA-core path, or None if K does not tile.
    num_stages is the k loop's pipeline (the kernel's PIPE: 1 none, n >= 2 Triton's n-stage cp.async).
    The accumulators live in registers: with GEMV_SEG 16, one [BN, BK/16] fp32 accumulator per weight matrix
    (64×128 tiles, or 32×128 gated with two matrices) keeps a thread at 63 registers (sm90 SASS, Triton 3.6),
    8 programs an SM."""
    BN, BK = (32, 64) if interpreting() else ((32 if gated else 64), GEMV_BK)
    if K % BK:
        return None
    SK = 2 if interpreting() and K % (2 * BK) == 0 else _split_k(1, N, K, BN, BK, DECODE_PROGRAMS_PER_SM["gemv"], sms)
    return BN, BK, SK, 4, GEMV_PIPE


# L2 prefetch of the weight rows (l2_prefetch.py): OFF by default. On the H200 (tuning/tune_fp8_prefetch.json) it made
# every decode linear slower under the L2-cold replay (wo_b 1 token 18.6 -> 20.2 µs at 64 KB a program,
# 22.2 µs for the whole split; shared w13 15.0 -> 18.4 µs; engram wkv 73.5 -> 75.9 / 99.3 µs): the
# loads the programs already keep in flight saturate HBM, and the bulk requests only compete with them.
# `_gemm(prefetch=...)` keeps it selectable for other chips.
PREFETCH_PROGRAM_BYTES = 64 * 1024  # the budget of one program when prefetch="budget"


def _prefetch_row_bytes(prefetch, device, w, w3, k_split: int, rows: int) -> int:
    """Bytes per weight row that a decode program prefetches into the L2 (0 = none). prefetch: None / False / 0
    off (the default), "budget" PREFETCH_PROGRAM_BYTES over the program's rows, True the whole K split, an int
    that many bytes; only on sm90+ CUDA with 16-byte aligned weights; rounded down to 128-byte lines."""
    if not prefetch or not l2_prefetch_for(device, w, w3):
        return 0
    b = PREFETCH_PROGRAM_BYTES // rows if prefetch == "budget" else (k_split if prefetch is True else int(prefetch))
    return min(k_split, b) // 128 * 128 if k_split % 16 == 0 else 0


def _gemm(x, w, s, w3, s3, limit, act_quant, out_dtype, name, tiles=None, path=None, fold=None, decode_w=None,
          pdl=None, prefetch=None, spf=None, stack=None, early_w=None):
    """Shared launcher. path: "gemv" (one token on the CUDA cores), "mma" (tensor cores), "warp_split" (decode, the
    K split over one program's warps: fp8_warp_split.py), or None (gemv for M <= GEMV_MAX_M when K tiles; warp_split
    where `fp8_warp_split.default_for` says so and none of the mma options below is given; else mma). fold: split-K epilogue inside the GEMM launch
    (last-arriver) instead of a second launch; default on. tiles overrides the path's tile tuple
    (sweeps): mma (BM, BN, BK, GROUP_M, SPLIT_K, num_warps, num_stages), gemv (BN, BK, SPLIT_K,
    num_warps, num_stages[, SEG]; SEG defaults to GEMV_SEG). decode_w: the mma path's weight decoder, 0, 1 or 2
    (DECODE_W; 1 permutes x's columns to k_order_w(BK) here, once per call; 2 is CUDA only); None: `_decode_w`'s
    default. pdl / prefetch: programmatic
    dependent launch (pdl.py) and the L2 prefetch of the weight rows (l2_prefetch.py); None: on for decode
    shapes on sm90+ CUDA devices; prefetch off unless asked for (`_prefetch_row_bytes`). spf: the mma path's
    scale prefetch (`_mma_k_loop`); None: `_spf`'s default. stack (gated, mma path, per-element decoder): the
    stacked tile (GATED 2: a program's weight rows are BN/2 rows of w1 then the same BN/2 rows of w3, one dot, and
    the tiles and splits of a plain linear of 2N rows) instead of the paired one (BN rows of each, two dots);
    None: `_stack`'s default. early_w: the gemv path's EARLY_W (its first weight tile loaded before the PDL wait);
    None: GEMV_EARLY_W where the launch is PDL. (The same for the warp split, each warp's first step peeled off its
    pipelined loop, was slower in every chain: tuning/step_chain_m8_early_w.json, code in commit 2d70a75.)"""
    K = x.shape[-1]
    _check_w(w, s, K, name)
    if w3 is not None:
        _check_w(w3, s3, K, name)
        if w3.shape != w.shape:
            raise ValueError(f"{name}: w1 {tuple(w.shape)} and w3 {tuple(w3.shape)} differ")
    if act_quant:
        x = act_quant_fp8(x)
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], w.shape[0]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    gated = w3 is not None
    wu, su = as_u8(w), as_u8(s)
    w3u, s3u = (as_u8(w3), as_u8(s3)) if gated else (wu, su)
    mma_args = {k: v for k, v in (("tiles", tiles), ("fold", fold), ("decode_w", decode_w), ("prefetch", prefetch),
                                  ("spf", spf), ("stack", stack)) if v is not None}
    from dsv41c.codegen.triton import fp8_warp_split as ws  # here, not at the top: it imports this module
    # the L2 prefetch is the one mma option the warp split takes too
    if path is None and M > GEMV_MAX_M and set(mma_args) <= {"prefetch"} and ws.default_for(x.device, M, N, K, gated):
        path = "warp_split"
    if path == "warp_split":
        mma_args.pop("prefetch", None)
        if mma_args:
            raise ValueError(f"{name}: the warp-split path takes none of the mma path's options ({sorted(mma_args)})")
        return ws.fp8_gemm_warp_split(x2, w, s, w3, s3, limit, out_dtype or x.dtype, pdl=pdl, name=name,
                                      prefetch=prefetch).reshape(*x.shape[:-1], N)
    if path is None:
        path = "gemv" if M <= GEMV_MAX_M and _gemv_tiles(N, K, gated) is not None else "mma"
    if path == "gemv":
        if M != 1:
            raise ValueError(f"{name}: the gemv path takes one token, got M={M}")
        if fold is False or decode_w:
            raise ValueError(f"{name}: the gemv path always folds its split-K and has no weight decoder choice "
                             f"(fold={fold}, decode_w={decode_w})")
        BN, BK, SK, nw, ns, *seg = tiles or _gemv_tiles(N, K, gated, sm_count(x.device)) or (0, 0, 0, 0, 0)
        if len(seg) > 1:
            raise ValueError(f"{name}: gemv tiles are (BN, BK, SPLIT_K, num_warps, num_stages[, SEG]), got {tiles}")
        seg = seg[0] if seg else GEMV_SEG
        if not BK or K % BK or not 1 <= SK <= K // BK or BN % 32:
            raise ValueError(f"{name}: gemv path needs K={K} divisible by BK={BK}, 1 <= SPLIT_K={SK} <= K/BK and "
                             f"BN={BN} % 32 == 0")
        if seg and (seg & (seg - 1) or BK % seg or seg > 16):
            raise ValueError(f"{name}: gemv SEG={seg} must be a power of two <= 16 that divides BK={BK}")
        part = torch.empty((SK, 1, (2 if gated else 1) * N), dtype=torch.float32, device=x.device) if SK > 1 else y
        grid = (triton.cdiv(N, BN), SK)
        cnt = counters(x.device, grid[0]) if SK > 1 else y  # no counters touched without a split
        pdl = pdl_for(x.device) and (pdl is None or bool(pdl))  # never where the device has no PDL
        pf = _prefetch_row_bytes(prefetch, x.device, wu, w3u, K // BK // SK * BK, BN * (1 + gated))
        fp8_gemv_kernel[grid](x2, wu, su, w3u, s3u, y, part, cnt, float(limit),
                              N=N, K=K, BN=BN, BK=BK, SPLIT_K=SK, GATED=gated,
                              NATIVE_FP8=native_fp8_for(x.device), PDL=pdl, PREFETCH=pf, PIPE=ns, SEG=seg,
                              EARLY_W=(GEMV_EARLY_W and pdl) if early_w is None else bool(early_w),
                              num_warps=nw, num_stages=ns, **launch_kw(pdl))
        return y.reshape(*x.shape[:-1], N)
    fold = FOLD_SPLIT_K if fold is None else fold
    words = _decode_w(decode_w, M, N, K, DECODE_BK, x.device) == 1
    mma_sync = mma_sync_decode_for(x.device)
    stacked = _stack(stack, gated, M, words, mma_sync, name)
    # the stacked tile plans over its 2N weight rows (one weight stream, one accumulator)
    BM, BN, BK, GM, SK, nw, ns = tiles or _tiles(M, 2 * N if stacked else N, K, gated, sm_count(x.device), words,
                                                  mma_sync, stacked)
    if SK > 1 and (K % BK or SK > K // BK):
        raise ValueError(f"{name}: SPLIT_K={SK} needs K={K} divisible by BK={BK} and at most K/BK splits: each "
                         "split is a run of whole k tiles")
    if stacked and BN % 2:
        raise ValueError(f"{name}: the stacked gated tile needs an even BN, got {BN}")
    dw = _decode_w(decode_w, M, N, K, BK, x.device)
    x2 = _decoder_x(x2, dw, BK)
    part = y if SK == 1 else torch.empty((SK, M, (2 if gated else 1) * N), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN // 2 if stacked else BN), SK)
    cnt = counters(x.device, grid[0]) if fold and SK > 1 else y  # prefill grids never touch (or grow) them
    # decode grids (M <= 16) only: PDL and the L2 prefetch of the weight rows (prefill tiles reuse W from the
    # L2 across M tiles anyway, and a separate reduce launch would have to honour PDL's contract too)
    dec = M <= 16 and (fold or SK == 1)
    pdl = pdl_for(x.device) and dec and (pdl is None or bool(pdl))  # never where the device has no PDL
    pf = _prefetch_row_bytes(prefetch if dec else 0, x.device, wu, w3u, K // BK // SK * BK if SK > 1 else K,
                             BN * (1 + gated))
    w3_off, s3_off = (_byte_distance(w3u, wu, 16, name), _byte_distance(s3u, su, 1, name)) if stacked else (0, 0)
    fp8_gemm_kernel[grid](x2, wu, su, w3u, s3u, y, part, cnt, M,
                          float(limit), w3_off, s3_off, N=N, K=K, BM=BM, BN=BN, BK=BK, GROUP_M=GM,
                          SPLIT_K=SK, GATED=2 if stacked else int(gated), NATIVE_FP8=native_fp8_for(x.device),
                          DOT_F32=dot_f32_for(x2), FOLD=fold and SK > 1, DECODE_W=dw, PTX=ptx_for(x.device), PDL=pdl,
                          PREFETCH=pf, SPF=_spf(spf, M <= 16, gated and not stacked), num_warps=nw, num_stages=ns,
                          **launch_kw(pdl))
    if SK > 1 and not fold:
        RB = 256 if interpreting() else 1024
        splitk_reduce_kernel[(M, triton.cdiv(N, RB))](part, y, M, float(limit), N=N, SPLIT_K=SK, GATED=gated,
                                                      BLOCK=RB, num_warps=4)
    return y.reshape(*x.shape[:-1], N)


def fp8_gemm(x, w, w_scale, act_quant: bool = False, out_dtype=None):
    """x [..., K] (bf16/fp32) · dequant(W)ᵀ -> [..., N]; W E4M3 [N, K], scale E8M0 [N/32, K/32]."""
    return _gemm(x, w, w_scale, None, None, 0.0, act_quant, out_dtype, "fp8_gemm")


def fp8_gemm_swiglu(x, w1, s1, w3, s3, limit: float, act_quant: bool = False, out_dtype=None):
    """Shared-expert gate/up: silu(min(x·W1ᵀ, limit)) · clamp(x·W3ᵀ, ±limit) -> [..., N]."""
    return _gemm(x, w1, s1, w3, s3, limit, act_quant, out_dtype, "fp8_gemm_swiglu")


# ============================================================================ ahead-of-time variants


def _gemm_types(act: str):
    return {"x_ptr": act, "w_ptr": "*u8", "ws_ptr": "*u8", "w3_ptr": "*u8", "ws3_ptr": "*u8", "y_ptr": act,
            "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "limit": "fp32",
            "w3_off": "i64", "s3_off": "i64"}


def _gemm_variants(target: str, gated: bool) -> list:
    """Per linear: `decode` (M <= 16, tensor cores, split-K folded into the launch), `gemv` (one
    token, CUDA cores, split-K folded) and `prefill` variants."""
    tr = target_traits(target)
    if tr is None:
        return []
    shapes = GATED_LINEARS if gated else DENSE_LINEARS
    out = []
    for name, (N, K) in shapes.items():
        for mode in ("decode", "prefill"):
            # DECODE_W 1 (the decode mode on CUDA for the largest linears): the caller permutes x to k_order_w(BK)
            dw = DECODE_W_CUDA if (mode == "decode" and tr["kind"] == "cuda" and K % DECODE_BK == 0
                                   and N * K >= DECODE_W_MIN_WEIGHTS) else 0
            stacked = False
            if mode == "decode":
                mma_sync = tr["kind"] == "cuda" and tr["arch"] == 90
                stacked = _stack(None, gated, 1, dw == 1, mma_sync)
                BN, nw, kind = _decode_tile(gated, dw == 1, mma_sync, stacked)
                BM, BK, GM, ns = 16, DECODE_BK, 1, (4 if tr["big_tiles"] else 2)
                SK = _split_k(1, 2 * N if stacked else N, K, BN, BK, DECODE_PROGRAMS_PER_SM[kind])
            elif tr["big_tiles"]:
                BM, BN, BK, GM, SK, nw, ns = 128, 128, 64, 8, 1, 8, 3
            else:  # sm80 / gfx1100: smaller shared memory / register budget
                BM, BN, BK, GM, SK, nw, ns = 64, 128, 64, 8, 1, 4, 2
            if gated and mode == "prefill":
                BN = 64  # two accumulators
            ce = {"N": N, "K": K, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": GM, "SPLIT_K": SK,
                  "GATED": 2 if stacked else int(gated), "NATIVE_FP8": tr["native_fp8"], "DOT_F32": False,
                  "FOLD": SK > 1, "DECODE_W": dw, "PTX": tr["kind"] == "cuda", "PDL": False, "PREFETCH": 0,
                  "SPF": _spf(None, mode == "decode", gated and not stacked)}
            keys = {"linear": name, "mode": mode, "act": "bf16", **ce}
            # fewer than 4 warps: mma.sync on purpose on Hopper (`_decode_tile`)
            mx = "mma.sync" if tr["kind"] == "cuda" and nw < 4 else None
            # the stacked tile's W3 offset: the runtime passes a multiple of 16 (as `_byte_distance` checks)
            out.append(aot_spec(fp8_gemm_kernel, f"{name}_{mode}", _gemm_types("*bf16"), ce, nw, ns, keys, matrix=mx,
                                divisible={"w3_off": 16} if stacked else None))
        if K % GEMV_BK == 0:
            BN = 32 if gated else 64
            SK = _split_k(1, N, K, BN, GEMV_BK, DECODE_PROGRAMS_PER_SM["gemv"])
            ce = {"N": N, "K": K, "BN": BN, "BK": GEMV_BK, "SPLIT_K": SK, "GATED": gated,
                  "NATIVE_FP8": tr["native_fp8"], "PDL": False, "PREFETCH": 0, "PIPE": GEMV_PIPE, "SEG": GEMV_SEG,
                  "EARLY_W": False}
            types = {k: v for k, v in _gemm_types("*bf16").items() if k not in ("M", "w3_off", "s3_off")}
            out.append(aot_spec(fp8_gemv_kernel, f"{name}_gemv", types, ce, 4, GEMV_PIPE,
                                {"linear": name, "mode": "gemv", "act": "bf16", **ce}))
    return out


def _act_quant_variants(target: str) -> list:
    if target_traits(target) is None:
        return []
    out = []
    for K in sorted({k for _, k in DENSE_LINEARS.values()} | {MOE_INTER}):
        ce = {"K": K, "BR": 16, "BK": 128}
        out.append(aot_spec(act_quant_fp8_kernel, f"k{K}", {"x_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32"}, ce, 4, 1,
                            {"act": "bf16", **ce}))
    return out


register(KernelTemplate(
    name="fp8_gemm", module=__name__,
    summary="x · dequant(E4M3 W, UE8M0 32×32)ᵀ, fp32 accumulate (dense linears)",
    keys=("linear", "N", "K", "mode", "act", "BM", "BN", "BK", "GROUP_M", "SPLIT_K", "NATIVE_FP8", "GATED",
          "DOT_F32", "FOLD", "DECODE_W", "PTX", "PDL", "PREFETCH", "PIPE", "SEG", "SPF", "EARLY_W"),
    reference=fp8_gemm_reference, launch=fp8_gemm,
    specializations=lambda t: _gemm_variants(t, False)))
register(KernelTemplate(
    name="fp8_gemm_swiglu", module=__name__,
    summary="shared expert gate/up: silu(min(x·W1ᵀ, L))·clamp(x·W3ᵀ, ±L), FP8 weights",
    keys=("linear", "N", "K", "mode", "act", "BM", "BN", "BK", "GROUP_M", "SPLIT_K", "NATIVE_FP8", "GATED",
          "DOT_F32", "FOLD", "DECODE_W", "PTX", "PDL", "PREFETCH", "PIPE", "SEG", "SPF", "EARLY_W"),
    reference=fp8_gemm_swiglu_reference, launch=fp8_gemm_swiglu,
    specializations=lambda t: _gemm_variants(t, True)))
register(KernelTemplate(
    name="act_quant_fp8", module=__name__,
    summary="dynamic per-32 E4M3 fake quant of activations (pow2 scales)",
    keys=("act", "K", "BR", "BK"), reference=act_quant_fp8_reference, launch=act_quant_fp8,
    specializations=_act_quant_variants))
