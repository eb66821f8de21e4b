"""The decode MoE path (codegen/triton/moe_decode.py) against `moe.moe_experts_reference` + `moe_combine_reference`.

On a machine without CUDA the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET)
on small widths (hidden 256, inter 128, 16 experts, top-6; T = 1 and 8 so experts repeat across
tokens), plus ragged tiles (rows and blocks past the end, both kernels) and the split down path
(per-slot partials and the last-arriving program's combine). The FP4 decode is checked exactly:
every code of every UE8M0 scale 0..255 through the kernels' own GEMV, against formats' dequant.
`gpu`-marked tests repeat the checks at the published widths on CUDA (hidden 5120, inter 2304,
384 experts top-6 and 128 top-3), including CUDA-graph capture.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from dsv41c import formats
from dsv41c.codegen import templates
from dsv41c.codegen.triton import fp4_mma_gemv as mg
from dsv41c.codegen.triton import fp8_gemm as fg
from dsv41c.codegen.triton import moe
from dsv41c.codegen.triton import moe_decode as md
from dsv41c.codegen.triton import targets as tgt
from dsv41c.codegen.triton import widths
from dsv41c.codegen.triton.targets import sm_count
from dsv41c.codegen.triton.moe_router import ROUTERS
from dsv41c.codegen.triton.moe_decode import fp4_gemv

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16_ULP = 2.0 ** -7
E_T, D_T, I_T, K_T = 16, 256, 128, 6


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def fp4_experts(g, E, N, K, scale=0.1):
    ws = [formats.quant_fp4_weight(torch.randn(N, K, generator=g) * scale) for _ in range(E)]
    return torch.stack([w for w, _ in ws]).to(DEV), torch.stack([s for _, s in ws]).to(DEV)


def experts_for(seed, E, D, I):
    g = gen(seed)
    return (*fp4_experts(g, E, I, D), *fp4_experts(g, E, I, D), *fp4_experts(g, E, D, I))


@pytest.fixture(scope="module")
def experts():
    return experts_for(20, E_T, D_T, I_T)


def routing(g, T, k=K_T, E=E_T):
    """Distinct experts per token (a token's k slots never repeat), weights normalized × 1.5."""
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int()
    w = torch.rand(T, k, generator=g) + 0.1
    return idx.to(DEV), (w / w.sum(-1, keepdim=True) * 1.5).to(DEV)


# Few, large programs: the interpreter's cost is per program.
FAST = {"prep": 8, "gate_up": {"BN": 128, "BKB": 8, "num_warps": 4},
        "down": {"BN": 256, "BKB": 4, "num_warps": 4, "split": 1}}
# Four chunks of blocks per GEMV (the two-buffer prefetch loop runs twice), 64-row tiles, split down.
MULTI = {"prep": 4, "gate_up": {"BN": 64, "BKB": 2, "num_warps": 4},
         "down": {"BN": 64, "BKB": 1, "num_warps": 2, "split": 2}}


def check(y, ref, exact_fp32: bool):
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert torch.isfinite(y).all()
    if exact_fp32:  # fp32 h and partials: only the fp32 summation order differs from the reference
        assert rel_err(y, ref) < 2e-6
    else:  # h / partials rounded to bf16: a different fp32 sum order can move a rounding by one ulp
        assert rel_err(y, ref) < BF16_ULP
        torch.testing.assert_close(y.float(), ref.float(), rtol=0, atol=2 * BF16_ULP * ref.abs().max().item())


# ============================================================================ against the reference


# T = 1: every combination; T = 8 (experts repeat across tokens): each option once, to bound interpreter time.
CASES = [(1, aq, dt) for aq in (False, True) for dt in (torch.bfloat16, torch.float32)] + \
    [(8, True, torch.bfloat16), (8, False, torch.float32)]


@pytest.mark.parametrize("T,act_quant,dt", CASES)
def test_decode_matches_reference(experts, T, act_quant, dt):
    g = gen(21 + T)
    x = (torch.randn(T, D_T, generator=g)).to(dt).to(DEV)
    idx, w = routing(g, T)
    if T == 8:
        assert len(torch.unique(idx)) < idx.numel()  # some expert serves several tokens
    kw = dict(limit=10.0, act_quant=act_quant, inter_dtype=dt, partial_dtype=dt)
    y = md.moe_experts_decode(x, idx, w, *experts, tiles=FAST if T == 8 else MULTI, **kw)
    ref = md.moe_experts_decode_reference(x, idx, w, *experts, **kw)
    check(y, ref, dt == torch.float32)
    # the grouped path's reference (expert-order sums) agrees to fp32 rounding
    assert rel_err(y, moe.moe_experts_reference(x, idx, w, *experts, **kw)) < (2e-6 if dt == torch.float32 else 1e-3)
    if act_quant:  # the fake quant really ran: without it the numbers differ
        plain = md.moe_experts_decode_reference(x, idx, w, *experts, limit=10.0, inter_dtype=dt, partial_dtype=dt)
        assert rel_err(plain, ref) > 10 * rel_err(y, ref)


def test_bf16_path_is_bit_identical_to_the_reference_here(experts):
    """Interpreter: numpy sums in fp32 like torch's CPU matmul up to order; with bf16 h and partials the
    roundings absorb the order — this seed gives identical bits (a regression canary, not a GPU property)."""
    g = gen(30)
    x = torch.randn(1, D_T, generator=g).bfloat16().to(DEV)
    idx, w = routing(g, 1)
    y = md.moe_experts_decode(x, idx, w, *experts, limit=10.0)
    ref = md.moe_experts_decode_reference(x, idx, w, *experts, limit=10.0)
    if DEV == "cpu":
        assert torch.equal(y, ref)
    else:
        check(y, ref, False)


def test_swiglu_clamp_and_shared_expert_forward_semantics(experts):
    """moe_forward's use: bf16 output, the shared expert added after the slot sum; limit clamps g and u."""
    g = gen(31)
    T = 3
    x = (torch.randn(T, D_T, generator=g) * 30).bfloat16().to(DEV)  # g, u far beyond ±limit
    idx, w = routing(g, T)
    shared = torch.randn(T, D_T, generator=g).bfloat16().to(DEV)
    kw = dict(limit=1.0, shared=shared, out_dtype=torch.bfloat16)
    y = md.moe_experts_decode(x, idx, w, *experts, **kw)
    ref = md.moe_experts_decode_reference(x, idx, w, *experts, **kw)
    assert y.dtype == torch.bfloat16
    check(y, ref, False)
    unclamped = md.moe_experts_decode_reference(x, idx, w, *experts, limit=1e9, shared=shared, out_dtype=torch.bfloat16)
    assert rel_err(unclamped, ref) > 0.1


@pytest.mark.parametrize("split", [1, 3])
def test_ragged_tiles_and_split_down(split):
    """hidden 160 / inter 96: gate/up BN 64 leaves 32 rows of its second tile past the end, BKB 2 leaves a
    half chunk of blocks; down BN 64 over 160 rows, 3 blocks in chunks of 2; split 3: two slots per program
    and the counter-ordered combine."""
    E, D, I = 8, 160, 96
    ex = experts_for(32, E, D, I)
    g = gen(33)
    T = 2
    x = torch.randn(T, D, generator=g).to(DEV)
    idx, w = routing(g, T, E=E)
    tiles = {"prep": 2, "gate_up": {"BN": 64, "BKB": 2, "num_warps": 4},
             "down": {"BN": 64, "BKB": 2, "num_warps": 2, "split": split}}
    kw = dict(limit=10.0, inter_dtype=torch.float32, partial_dtype=torch.float32)
    y = md.moe_experts_decode(x, idx, w, *ex, tiles=tiles, **kw)
    check(y, md.moe_experts_decode_reference(x, idx, w, *ex, **kw), True)
    y2 = md.moe_experts_decode(x, idx, w, *ex, tiles=tiles, **kw)  # counters re-zeroed per call
    assert torch.equal(y, y2)


@pytest.mark.parametrize("D,BKB,ksplit,dt", [(256, 2, 2, torch.float32),
                                               pytest.param(256, 2, 4, torch.bfloat16, marks=pytest.mark.slow),
                                               pytest.param(160, 2, 3, torch.float32, marks=pytest.mark.slow)])
def test_gate_up_k_split(D, BKB, ksplit, dt):
    """gate/up ksplit: each (slot, row tile) runs as `ksplit` programs over equal ranges of K's chunks, the last
    to arrive adds their g / u in order. hidden 160 = 5 blocks in 3 chunks of 2 (the last one half past the
    end); T = 2 tokens, both down variants; counters re-zeroed per call (same bits twice)."""
    E, I = 8, 96
    ex = experts_for(37, E, D, I)
    g = gen(38)
    T = 2
    x = torch.randn(T, D, generator=g).to(dt).to(DEV)
    idx, w = routing(g, T, E=E)
    kw = dict(limit=10.0, inter_dtype=dt, partial_dtype=dt)
    ref = md.moe_experts_decode_reference(x, idx, w, *ex, **kw)
    for split in (1, 3):
        tiles = {"prep": 2, "gate_up": {"BN": 64, "BKB": BKB, "num_warps": 4, "ksplit": ksplit},
                 "down": {"BN": 64, "BKB": 2, "num_warps": 2, "split": split}}
        y = md.moe_experts_decode(x, idx, w, *ex, tiles=tiles, **kw)
        check(y, ref, dt == torch.float32)
        assert torch.equal(y, md.moe_experts_decode(x, idx, w, *ex, tiles=tiles, **kw))


@pytest.mark.parametrize("split", [3, 1])
def test_per_slot_handoff_keeps_the_bits(split):
    """tiles["fine"]: the gate/up counts each slot's finished tiles (numbered slot-major) and the down kernel
    waits per slot on that count instead of on the whole gate/up grid (moe_decode_down_kernel's FINE). The
    interpreter runs the kernels one after another, so the waits return at once: this checks the counter
    zeroing, the slot-major renumbering with a K split and the count the down kernel waits for, against the
    same call without it, bit for bit (and again, so the counters are re-zeroed per call); split 1: one
    down program waits on all three slots (and releases its dependents after the last wait)."""
    E, D, I = 8, 256, 96
    ex = experts_for(39, E, D, I)
    g = gen(40)
    T = 2
    x = torch.randn(T, D, generator=g).bfloat16().to(DEV)
    idx, w = routing(g, T, k=3, E=E)
    ys = []
    for fine in (False, True, True):
        tiles = {"prep": 2, "gate_up": {"BN": 32, "BKB": 2, "num_warps": 4, "ksplit": 2},
                 "down": {"BN": 64, "BKB": 2, "num_warps": 2, "split": split}, "fine": fine}
        ys.append(md.moe_experts_decode(x, idx, w, *ex, limit=10.0, tiles=tiles))
    assert torch.equal(ys[0], ys[1]) and torch.equal(ys[1], ys[2])
    check(ys[1], md.moe_experts_decode_reference(x, idx, w, *ex, limit=10.0), False)


def test_topk3_and_int64_ids_and_fp16(experts):
    g = gen(34)
    x = torch.randn(2, D_T, generator=g).half().to(DEV)
    idx, w = routing(g, 2, k=3)
    kw = dict(limit=10.0, inter_dtype=torch.float16, partial_dtype=torch.float16, out_dtype=torch.float16)
    y = md.moe_experts_decode(x, idx.long(), w, *experts, **kw)
    ref = md.moe_experts_decode_reference(x, idx, w, *experts, **kw)
    assert y.dtype == torch.float16
    assert rel_err(y, ref) < 2.0 ** -10


# ============================================================================ the FP4 decode, exactly


@triton.jit
def _gemv_probe(w_ptr, s_ptr, xp_ptr, f_ptr, y_ptr, K: tl.constexpr, N: tl.constexpr, BN: tl.constexpr,
                BKB: tl.constexpr):
    """y[t, n] = x_t · dequant(W)[n, :] through the kernels' GEMV (x' / f from the prep kernel)."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    xa = xp_ptr + t * K
    fa = f_ptr + t * (K // 32)
    y, _ = fp4_gemv(w_ptr, s_ptr, w_ptr, s_ptr, xa, fa, xa, fa, pid_n * BN, K, N, BN, BKB, False, True)
    rows = pid_n * BN + tl.arange(0, BN)
    tl.store(y_ptr + t * N + rows, y, mask=rows < N)


def probe_columns(w, s, x):
    """x [T, K] fp32 -> [T, N] via prep + the GEMV (one program per token and 256 rows)."""
    T, K = x.shape
    N = w.shape[0]
    xp = torch.empty(T, K, device=DEV)
    xf = torch.empty(T, K // 32, device=DEV)
    md.moe_decode_prep_kernel[(T, 1)](x, xp, xf, xp, K=K, BKB=K // 32, ACT_QUANT=False, NCNT=0, NCNT_P=1)
    y = torch.empty(T, N, device=DEV)
    BKB, nw = 1, 1
    _gemv_probe[(T, triton.cdiv(N, 256))](md._as_words(w[None], "w")[0], s.contiguous(), xp, xf, y, K=K, N=N, BN=256,
                                          BKB=BKB, num_warps=nw)
    return y


def test_fp4_decode_is_exact_for_every_code_and_scale():
    """One 32-column block per row, row r with UE8M0 scale r (0..255), the 16 codes twice in each row;
    one-hot activations of several magnitudes pick single columns, so y = x·value·2^(e-127) has one
    rounding at most. It must equal that product taken exactly (float64) and rounded once to fp32 —
    subnormal, inf where it overflows, NaN only for e = 255 — and so equal formats' fp32 dequant × x
    wherever that dequantized weight is finite (e = 254, |value| >= 2 is inf there, not in the kernel)."""
    N, K = 256, 32
    codes = torch.stack([(torch.arange(32) + r) % 16 for r in range(N)]).to(torch.uint8)
    for e in (0, 1, 127, 128, 254):  # the named extremes, with all 16 codes present
        assert sorted(set(codes[e].tolist())) == list(range(16))
    w = formats.pack_fp4(codes).view(torch.int8).to(DEV)
    s = torch.arange(N, dtype=torch.int32).to(torch.uint8)[:, None].to(DEV)
    value = formats.e2m1_decode(codes).double()
    scale = torch.where(torch.arange(N) == 255, float("nan"), torch.ldexp(torch.ones(N).double(),
                                                                         torch.arange(N) - 127))
    deq = formats.dequant_fp4_weight(w, s).cpu()  # [N, K] fp32
    for mag in (1.0, 2.0 ** -120, 2.0 ** 100, -3.0):
        x = torch.eye(K, device=DEV) * mag
        y = probe_columns(w, s, x).cpu()  # [K, N]: column k of the dequantized weight × mag
        want = (value * scale[:, None] * mag).float().T
        nan = want.isnan()
        assert nan[:, 255].all() and not nan[:, :255].any()
        assert torch.equal(y[~nan], want[~nan]), f"magnitude {mag}: {int((y[~nan] != want[~nan]).sum())} differ"
        assert torch.isnan(y[nan]).all()  # e = 255 decodes to NaN, like e8m0_to_float
        ref = (deq * mag).T
        fin = torch.isfinite(deq.T)
        assert torch.equal(y[fin], ref[fin])
        assert torch.isinf(want).any() == (abs(mag) >= 1)  # overflow of the product is exercised
        assert (want[~nan] != 0).float().mean() > 0.5  # and most values are neither ±0 codes nor underflow


def test_prescale_is_exact_and_in_range():
    """x' = x·2^c and f = 2^(126-c) per block, so x'·f·2^-126 == x exactly over fp32's whole range (the
    GEMV's x'·(value·2^-126) sums times f are Σ x·value); a normal block's amax lands in [2^100, 2^101)
    unless it is at least 2^101 already (c = 0), a subnormal block's below 2^101."""
    g = gen(35)
    K = 256
    mags = torch.tensor([2.0 ** -149, 2.0 ** -130, 1e-30, 1e-3, 1.0, 3e5, 1e30, 2.0 ** 126]).repeat_interleave(32)
    x = (torch.rand(K, generator=g) + 0.5) * mags * torch.where(torch.rand(K, generator=g) < 0.5, -1.0, 1.0)
    x[0:32] = 2.0 ** -149  # a block of the smallest subnormal
    x[40:48] = 0.0
    x = x[None].to(DEV)
    xp = torch.empty(1, K, device=DEV)
    xf = torch.empty(1, K // 32, device=DEV)
    md.moe_decode_prep_kernel[(1, 2)](x, xp, xf, xp, K=K, BKB=4, ACT_QUANT=False, NCNT=0, NCNT_P=1)
    # back to natural order: stored index s·(K/8) + 4b + q holds k = 32b + 8q + s
    k = torch.arange(K)
    nat = xp[0, ((k % 8) * (K // 8) + (k // 32) * 4 + (k % 32) // 8).to(DEV)].cpu()
    f = xf[0].cpu().repeat_interleave(32)
    assert torch.equal(nat.double() * f.double() * 2.0 ** -126, x[0].cpu().double())
    amax = nat.abs().view(-1, 32).amax(1)
    xmax = x[0].cpu().abs().view(-1, 32).amax(1)
    big = xmax >= 2.0 ** 101
    assert torch.equal(amax[big], xmax[big]) and (amax[~big] < 2.0 ** 101).all()
    normal = ~big & (xmax >= 2.0 ** -126)
    assert (amax[normal] >= 2.0 ** 100).all() and big.any() and (xmax < 2.0 ** -126).any()


# ============================================================================ launcher checks


def test_input_errors_are_clear(experts):
    w1, s1, w3, s3, w2, s2 = experts
    x = torch.randn(1, D_T, device=DEV)
    idx, w = routing(gen(36), 1)
    with pytest.raises(ValueError, match="w2 weight"):
        md.moe_experts_decode(x, idx, w, w1, s1, w3, s3, w2[:, :, :-1], s2, 10.0)
    with pytest.raises(ValueError, match="are not \\[1, k\\]"):
        md.moe_experts_decode(x, idx, w[:, :3], *experts, 10.0)
    with pytest.raises(ValueError, match="float32 only"):
        md.moe_experts_decode(x, idx, w, *experts, 10.0, compute_dtype=torch.float64)
    with pytest.raises(ValueError, match="multiple of 32"):
        md.moe_experts_decode(x, idx, w, *experts, 10.0, tiles={**FAST, "gate_up": {"BN": 16, "BKB": 8,
                                                                                    "num_warps": 1}})
    with pytest.raises(ValueError, match="powers of two"):
        md.moe_experts_decode(x, idx, w, *experts, 10.0, tiles={**FAST, "down": {**FAST["down"], "BN": 48}})
    with pytest.raises(ValueError, match="ksplit=3 does not divide"):  # 8 blocks in 1 chunk of 8
        md.moe_experts_decode(x, idx, w, *experts, 10.0, tiles={**FAST, "gate_up": {**FAST["gate_up"], "ksplit": 3}})
    with pytest.raises(ValueError, match="does not divide top_k"):
        md.moe_experts_decode(x, idx, w, *experts, 10.0, tiles={**FAST, "down": {**FAST["down"], "split": 4}})
    assert md.moe_experts_decode(x[:0], idx[:0], w[:0], *experts, 10.0).shape == (0, D_T)


MY_TEMPLATES = ("moe_decode_prep", "moe_decode_gate_up_fp4", "moe_decode_down_fp4")


def test_templates_registered_with_variants_for_every_target():
    reg = templates._REGISTRY
    for name in MY_TEMPLATES:
        t = reg[name]
        assert t.reference is md.moe_experts_decode_reference and t.launch is md.moe_experts_decode
        for target in tgt.TARGETS:
            specs = t.specializations(target)
            assert specs, f"{name}: no variant for {target}"
            for s in specs:
                assert list(s.signature) == list(s.kernel.arg_names)
                assert set(s.keys) >= set(s.constexprs) and set(s.keys) <= set(t.keys)
                if "BN" in s.constexprs:  # powers of two (the [BN·BKB, 4] tile's aranges)
                    assert s.constexprs["BN"] & (s.constexprs["BN"] - 1) == 0
                    assert s.constexprs["BKB"] & (s.constexprs["BKB"] - 1) == 0
        variants = [s.variant for s in t.specializations("cuda:sm90")]
        assert len(variants) == len(set(variants))
        assert t.specializations("cpu") == [] and t.specializations("ascend:a3") == []
    gu = {s.variant: s for s in reg["moe_decode_gate_up_fp4"].specializations("cuda:sm90")}
    assert gu["backbone_k6"].constexprs["TOPK"] == 6 and gu["dspark_k3"].constexprs["TOPK"] == 3
    assert gu["backbone_k6"].constexprs["K"] == 5120 and gu["backbone_k6"].constexprs["N"] == 2304


def test_templates_are_in_the_kernel_matrix():
    from dsv41c.codegen.matrix import KernelMatrix
    m = KernelMatrix.build()
    rows = {r.name: r for r in m.rows}
    for name in MY_TEMPLATES:
        assert rows[name].cells["cuda:sm90"].status == "native"
        assert rows[name].cells["rocm:gfx942"].status == "native"


def _have_ptxas():
    return os.path.isfile(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")) \
        or shutil.which("ptxas") is not None


# Compiled in a child process: under TRITON_INTERPRET the kernels are interpreter objects.
_AOT_SCRIPT = """
import json, os, re, subprocess, sys, tempfile
from dsv41c.codegen.aot_compat import compile_spec
from dsv41c.codegen.matrix import TARGETS
from dsv41c.codegen import templates
from dsv41c.codegen.triton import moe_decode
out = {}
cuobjdump = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "cuobjdump")
for name in ("moe_decode_gate_up_fp4", "moe_decode_down_fp4"):
    spec = templates._REGISTRY[name].specializations("cuda:sm90")[0]
    asm = compile_spec(spec, TARGETS["cuda:sm90"])["asm"]
    ptx = asm["ptx"]
    r = {"v4": len(re.findall(r"ld\\.global(?:\\.\\w+)*\\.v4\\.b32", ptx)), "ftz": ptx.count(".ftz"),
         "fma": ptx.count("fma.rn.f32")}
    if os.path.isfile(cuobjdump):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(asm["cubin"]); f.flush()
            res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        r["local"] = int(re.search(r"LOCAL:(\\d+)", res).group(1))
    out[name] = r
print(json.dumps(out))
"""


@pytest.mark.skipif(not _have_ptxas(), reason="Triton's ptxas is not installed")
def test_aot_sm90_streams_16_byte_words_without_ftz_or_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for name, v in out.items():
        assert v["v4"] >= 4, f"{name}: weights not loaded as 16-byte vectors"
        assert v["ftz"] == 0, f"{name}: flush-to-zero would lose the E2M1 0.5 (an fp32 subnormal)"
        assert v["fma"] > 0
        assert v.get("local", 0) == 0, f"{name}: register spills"


# ============================================================================ the MMA core (tiles["core"] 1)


# The interpreter runs fp4_mma_gemv's EMU form: the same registers, loads and decode, the mma written as the
# fragment's data movement (fp32 sums in another order than the tensor cores').
MMA = {"prep": 8, "core": 1, "gate_up": {"BN": 32, "BKB": 8, "num_warps": 4, "ksplit": 2},
       "down": {"BN": 32, "BKB": 4, "num_warps": 2, "split": 2}}


@pytest.mark.parametrize("T,act_quant", [pytest.param(1, False, marks=pytest.mark.slow), (1, True),
                                         pytest.param(3, False, marks=pytest.mark.slow)])
def test_mma_core_matches_reference(experts, T, act_quant):
    g = gen(60 + T)
    x = torch.randn(T, D_T, generator=g).bfloat16().to(DEV)
    idx, w = routing(g, T)
    kw = dict(limit=10.0, act_quant=act_quant)
    y = md.moe_experts_decode(x, idx, w, *experts, tiles=MMA, **kw)
    check(y, md.moe_experts_decode_reference(x, idx, w, *experts, **kw), False)
    # no K split, one down program for all slots: the same partials, so the same bits
    one = {**MMA, "gate_up": {**MMA["gate_up"], "ksplit": 1}, "down": {**MMA["down"], "split": 1}}
    y1 = md.moe_experts_decode(x, idx, w, *experts, tiles=one, **kw)
    assert rel_err(y1, y) < BF16_ULP
    if T == 1:  # gate/up steps of 2 groups of 4 blocks (sub 2; inter 128 has one group for the down kernel)
        sub = {**one, "gate_up": {**one["gate_up"], "sub": 2}}
        assert rel_err(md.moe_experts_decode(x, idx, w, *experts, tiles=sub, **kw), y) < BF16_ULP


@pytest.mark.slow
def test_mma_core_loop_and_tail():
    """Hidden 640 = 5 steps of 4 blocks: the two-buffer loop runs twice, then the odd step's tail; inter 384 = 3 down
    steps (one loop turn and the tail) — the reference's numbers either way."""
    ex = experts_for(64, 8, 640, 384)
    g = gen(65)
    x = torch.randn(1, 640, generator=g).bfloat16().to(DEV)
    idx, w = routing(g, 1, k=3, E=8)
    t = {**MMA, "gate_up": {**MMA["gate_up"], "ksplit": 1}, "down": {**MMA["down"], "split": 3}}
    check(md.moe_experts_decode(x, idx, w, *ex, limit=10.0, tiles=t),
          md.moe_experts_decode_reference(x, idx, w, *ex, limit=10.0), False)


def test_mma_core_pairs_decode_every_code():
    """e2m1_pairs_f16x2: all 16 codes in all 8 positions of a word -> f16 halves equal to value·2^-14, in the
    pair order (n0, n4), (n2, n6), (n1, n5), (n3, n7); x_order is the matching k order of x'."""
    @triton.jit
    def k(w_ptr, o_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        p0, p1, p2, p3 = mg.e2m1_pairs_f16x2(tl.load(w_ptr + i))
        tl.store(o_ptr + 4 * i, p0)
        tl.store(o_ptr + 4 * i + 1, p1)
        tl.store(o_ptr + 4 * i + 2, p2)
        tl.store(o_ptr + 4 * i + 3, p3)

    g = gen(62)
    codes = torch.cat([torch.arange(16).repeat_interleave(8).view(16, 8),  # every code in every position
                       torch.randint(0, 16, (48, 8), generator=g)])
    words = sum(codes[:, i].to(torch.int64) << (4 * i) for i in range(8))
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    out = torch.empty(len(words), 4, dtype=torch.int32, device=DEV)
    k[(1,)](words.to(DEV), out, N=len(words))
    out = out.cpu()
    halves = out.view(torch.int16).view(torch.float16).float().view(len(words), 8)  # (lo, hi) per pair
    values = formats.e2m1_decode(codes).float()
    pairs = [0, 4, 2, 6, 1, 5, 3, 7]
    want = values[:, pairs] * 2.0 ** -14
    assert torch.equal(halves, want)
    assert torch.equal(torch.signbit(halves), torch.signbit(want))  # -0 stays -0
    assert [mg.x_order(s) for s in pairs] == list(range(8))


def test_mma_core_plan():
    """decode_tiles' core-1 plan (as on a 132-SM GPU): the gate/up K split for ~16 programs an SM with at least
    MMA_MIN_STEPS steps a program, down steps of 2 groups; the launcher's checks name what core 1 cannot run."""
    for T, k, ks in ((1, 6, 5), (2, 6, 4), (8, 6, 1), (1, 3, 5)):
        t = md.decode_tiles(top_k=k, tokens=T, interp=False, core=1, n_sm=132)
        assert (t["core"], t["gate_up"]["ksplit"], t["gate_up"]["sub"], t["down"]["sub"]) == (1, ks, 1, 2), (T, k)
    assert md.decode_tiles(interp=False, core=0).get("core", 0) == 0
    t = md.decode_tiles(interp=False, core=1)
    why = md._core_problems(torch.device(DEV), torch.float32, torch.float32, widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size, t["gate_up"],
                            t["down"], 3)
    assert any("bf16/f16 activations" in w for w in why) and any("ksplit (3)" in w for w in why)


def test_mma_core_refuses_what_it_cannot_run(experts):
    x = torch.randn(1, D_T).to(DEV)
    idx, w = routing(gen(63), 1)
    with pytest.raises(ValueError, match="bf16/f16 activations"):
        md.moe_experts_decode(x, idx, w, *experts, 10.0, tiles=MMA)  # fp32 x would round in f16
    with pytest.raises(ValueError, match="ksplit"):
        md.moe_experts_decode(x.bfloat16(), idx, w, *experts, 10.0,
                              tiles={**MMA, "gate_up": {**MMA["gate_up"], "ksplit": 3}})
    with pytest.raises(ValueError, match="core=2"):
        md.moe_experts_decode(x.bfloat16(), idx, w, *experts, 10.0, tiles={**MMA, "core": 2})


# ============================================================================ GPU tier: published widths


def real_width_case(router, T, seed, sparse_fp4_experts):
    """T tokens of bf16 x at the published widths, their routing for `router` and MXFP4 experts (only the routed ones
    random): -> (generator, x, idx, w, experts)."""
    E, k = ROUTERS[router]
    g = gen(seed)
    gk = torch.Generator(device=DEV).manual_seed(seed + 1)
    x = torch.randn(T, widths.PUBLISHED.hidden_size, generator=g).bfloat16().to(DEV)
    idx, w = routing(g, T, k=k, E=E)
    return g, x, idx, w, sparse_fp4_experts(E, widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size, torch.unique(idx).long(), gk, DEV)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
@pytest.mark.parametrize("router", ["backbone", "dspark"])
def test_gpu_decode_real_widths(T, router, sparse_fp4_experts):
    k = ROUTERS[router][1]
    g, x, idx, w, ex = real_width_case(router, T, 40, sparse_fp4_experts)
    for aq in (False, True):
        y = md.moe_experts_decode(x, idx, w, *ex, 10.0, act_quant=aq)
        ref = md.moe_experts_decode_reference(x, idx, w, *ex, 10.0, act_quant=aq)
        assert rel_err(y, ref) < 2 * BF16_ULP
        grouped = moe.moe_experts(x, idx, w, *ex, 10.0, act_quant=aq)
        assert rel_err(y, grouped) < 4 * BF16_ULP
    shared = torch.randn(T, widths.PUBLISHED.hidden_size, generator=g).bfloat16().to(DEV)
    y = md.moe_experts_decode(x, idx, w, *ex, 10.0, shared=shared, out_dtype=torch.bfloat16)
    ref = md.moe_experts_decode_reference(x, idx, w, *ex, 10.0, shared=shared, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and rel_err(y, ref) < 2 * BF16_ULP
    # both down variants: the same per-slot partials summed in the same order, so the same bits
    y0 = md.moe_experts_decode(x, idx, w, *ex, 10.0)
    for split in (1, k):
        # the default's plan (core 1's K split depends on the slots and the SMs)
        tiles = md.decode_tiles(top_k=k, tokens=T, n_sm=sm_count(x.device), device=x.device)
        tiles["down"]["split"] = split
        assert torch.equal(md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=tiles), y0)


@pytest.mark.gpu
def test_gpu_decode_cuda_graph_replay(sparse_fp4_experts):
    E, k = ROUTERS["backbone"]
    g = gen(42)
    gk = torch.Generator(device=DEV).manual_seed(43)
    x = torch.randn(1, widths.PUBLISHED.hidden_size, generator=g).bfloat16().to(DEV)
    idx, w = routing(g, 1, k=k, E=E)
    ex = sparse_fp4_experts(E, widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size, torch.arange(E, device=DEV), gk, DEV)
    eager = md.moe_experts_decode(x, idx, w, *ex, 10.0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        md.moe_experts_decode(x, idx, w, *ex, 10.0)  # warm-up (compiles) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = md.moe_experts_decode(x, idx, w, *ex, 10.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    idx.copy_(routing(g, 1, k=k, E=E)[0])  # new routing, same graph
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, md.moe_experts_decode(x, idx, w, *ex, 10.0))


@pytest.mark.gpu
def test_gpu_pdl_chain_matches_serialized_launches(sparse_fp4_experts):
    """Programmatic dependent launch (sm90+): the three kernels overlap their predecessors' tails, read
    the expert ids and weights before their grid waits; the ids and x are written by the kernels just
    before the chain (inside the captured graph), so an early read of either would show as a difference.
    With PDL the down kernel waits per slot on the gate/up's tile counts (the default, "fine") — a wait
    that returned early would read a stale h' — and, as a control, on the whole grid."""
    from dsv41c.codegen.triton.pdl import pdl_for
    if not pdl_for(torch.device(DEV)):
        pytest.skip("PDL needs an sm90+ CUDA device")
    E, k = ROUTERS["backbone"]
    g = gen(44)
    gk = torch.Generator(device=DEV).manual_seed(45)
    ex = sparse_fp4_experts(E, widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size, torch.arange(E, device=DEV), gk, DEV)
    for T in (1, 8):
        x_src = torch.randn(T, widths.PUBLISHED.hidden_size, generator=g).bfloat16().to(DEV)
        idx_src, w = routing(g, T, k=k, E=E)
        idx_src = idx_src.to(torch.int32)
        on, off, grid = md.decode_tiles(top_k=k), md.decode_tiles(top_k=k), md.decode_tiles(top_k=k)
        on["pdl"], off["pdl"] = True, False
        grid["pdl"], grid["fine"] = True, False  # PDL, the down kernel waiting on the whole gate/up grid
        x, idx = x_src.clone(), idx_src.clone()
        ref = md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=off)
        assert torch.equal(md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=on), ref)
        assert torch.equal(md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=grid), ref)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=on)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            idx.copy_(idx_src)
            x.copy_(x_src)
            out = md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=on)
        for _ in range(3):
            idx_src.copy_(routing(g, T, k=k, E=E)[0])
            x_src.copy_(torch.randn(T, widths.PUBLISHED.hidden_size, generator=g).bfloat16())
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, md.moe_experts_decode(x_src, idx_src, w, *ex, 10.0, tiles=off))


@pytest.mark.gpu
def test_gpu_moe_forward_shared_expert_overlap_keeps_the_bits(sparse_fp4_experts):
    """moe_forward(overlap_shared=True) runs the shared expert on a side stream joined before the down
    kernel: the same bits as the one-stream order, eagerly and replayed from a CUDA graph whose x is
    rewritten inside the graph just before the FFN (a down kernel that did not wait for the side stream
    would add a stale shared output)."""
    def fp8_weight(g, N, K):
        w, s = formats.quant_fp8_weight(torch.randn(N, K, generator=g) * 0.05)
        return w, s
    E, k = ROUTERS["backbone"]
    g = gen(46)
    gk = torch.Generator(device=DEV).manual_seed(47)
    ex = sparse_fp4_experts(E, widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size, torch.arange(E, device=DEV), gk, DEV)
    gw = (torch.randn(E, widths.PUBLISHED.hidden_size, generator=g) * 0.02).bfloat16().to(DEV)
    bias = (torch.randn(E, generator=g) * 0.01).to(DEV)
    shared = tuple(t.to(DEV) for t in (*fp8_weight(g, widths.PUBLISHED.moe_intermediate_size, widths.PUBLISHED.hidden_size), *fp8_weight(g, widths.PUBLISHED.moe_intermediate_size, widths.PUBLISHED.hidden_size),
                                       *fp8_weight(g, widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size)))
    kw = dict(top_k=k, route_scale=1.5, limit=10.0)
    for T in (1, 8):
        x_src = torch.randn(T, widths.PUBLISHED.hidden_size, generator=g).bfloat16().to(DEV)
        x = x_src.clone()
        ref = moe.moe_forward(x, gw, bias, *ex, shared, overlap_shared=False, **kw)
        assert torch.equal(moe.moe_forward(x, gw, bias, *ex, shared, overlap_shared=True, **kw), ref)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            moe.moe_forward(x, gw, bias, *ex, shared, overlap_shared=True, **kw)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.copy_(x_src)
            out = moe.moe_forward(x, gw, bias, *ex, shared, overlap_shared=True, **kw)
        for _ in range(3):
            x_src.copy_(torch.randn(T, widths.PUBLISHED.hidden_size, generator=g).bfloat16())
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, moe.moe_forward(x_src, gw, bias, *ex, shared, overlap_shared=False, **kw))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
@pytest.mark.parametrize("router", ["backbone", "dspark"])
def test_gpu_mma_core_real_widths(T, router, sparse_fp4_experts):
    """core 1 (mma.sync, decoded registers) at the published widths: against the reference (bf16 roundings of
    h and the partials bound it, as for core 0), its K splits and down splits, and CUDA-graph replay."""
    k = ROUTERS[router][1]
    g, x, idx, w, ex = real_width_case(router, T, 44, sparse_fp4_experts)
    tiles = md.decode_tiles(top_k=k)
    tiles["core"] = 1
    for aq in (False, True):
        y = md.moe_experts_decode(x, idx, w, *ex, 10.0, act_quant=aq, tiles=tiles)
        ref = md.moe_experts_decode_reference(x, idx, w, *ex, 10.0, act_quant=aq)
        assert rel_err(y, ref) < 2 * BF16_ULP
        y0 = md.moe_experts_decode(x, idx, w, *ex, 10.0, act_quant=aq, tiles={**tiles, "core": 0})
        assert rel_err(y, y0) < 2 * BF16_ULP
    y1 = md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=tiles)
    for ks, split in ((1, k), (8, 1), (2, k)):
        t = {**tiles, "gate_up": {**tiles["gate_up"], "ksplit": ks}, "down": {**tiles["down"], "split": split}}
        assert rel_err(md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=t), y1) < BF16_ULP
    for pdl in (False, True):  # the PDL chain and the per-slot handoff keep the bits
        assert torch.equal(md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles={**tiles, "pdl": pdl}), y1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = md.moe_experts_decode(x, idx, w, *ex, 10.0, tiles=tiles)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y1)
