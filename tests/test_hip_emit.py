"""Emitted-source kernels: HIP (codegen/hip/) and AscendC (codegen/ascend/).

HIP: the indexer-score source is checked with a HIP-capable clang against hip_minimal.h
(host + device syntax, then device code generation to AMDGCN for gfx942 / gfx1100 / gfx950
where the clang knows the target) and run on the CPU through hip_host_emu.h against the
PyTorch reference. AscendC (no CANN here): emission is deterministic, the sources are
balanced and carry the config's constants, and they parse as C++ against a stub of the
AscendC API declared below (names and syntax, not semantics).
"""
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from dsv41c.codegen import ascend, hip
from dsv41c.codegen.matrix import TARGETS
from dsv41c.formats import dequant_fp4_ue8m0, quant_fp4_ue8m0
from dsv41c.frontend.config import preset

FULL, TINY, MINI = preset("full"), preset("tiny"), preset("mini")
ROCM = [TARGETS[t] for t in ("rocm:gfx942", "rocm:gfx950", "rocm:gfx1100")]
ASCEND = [TARGETS[t] for t in ("ascend:a2", "ascend:a3", "ascend:a5")]
CLANG = hip.find_hip_clang()
NEEDS_CLANG = pytest.mark.skipif(
    CLANG is None, reason="no clang with HIP support for gfx942 (install Debian's clang-19: apt-get install -y clang-19)")
TIDY = hip.find_clang_tidy()
NEEDS_TIDY = pytest.mark.skipif(TIDY is None, reason="no clang-tidy (the test extra installs the clang-tidy wheel)")


def _strip_comments_and_strings(src: str) -> str:
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', src)


def _assert_balanced(src: str, where: str):
    code = _strip_comments_and_strings(src)
    stack = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for i, ch in enumerate(code):
        if ch in "([{":
            stack.append((ch, i))
        elif ch in ")]}":
            assert stack and stack[-1][0] == pairs[ch], f"{where}: unbalanced {ch!r} at offset {i}"
            stack.pop()
    assert not stack, f"{where}: unclosed {stack[-1][0]!r}"
    opens = len(re.findall(r"^\s*#\s*if", code, re.M))
    assert opens == len(re.findall(r"^\s*#\s*endif", code, re.M)), f"{where}: #if/#endif unbalanced"


# ----------------------------------------------------------------------------- HIP: emission


@pytest.mark.parametrize("target", ROCM, ids=lambda t: t.arch)
def test_hip_emission_is_deterministic_and_filled_from_the_config(target):
    a, b = hip.emit_indexer_score(target, FULL), hip.emit_indexer_score(target, FULL)
    assert a == b
    src = a.text
    assert a.filename == "indexer_score_fp4.d128.hip"
    assert "@" not in _strip_comments_and_strings(src)  # every placeholder filled
    assert "constexpr int kConfigHeads = 32;" in src and "constexpr int kConfigHeadDim = 128;" in src
    assert f"constexpr int kLdsLimit = {hip.LDS_LIMIT[target.arch]};" in src
    assert "dsv41c::launch_indexer_score_fp4<128>" in src and "dsv41c_indexer_score_fp4_d128(" in src
    assert f"wave{target.warp_size}" in src and FULL.hash() in src
    # dynamic LDS, sized at launch from the actual head count
    assert "HIP_DYNAMIC_SHARED(float, lds)" in src
    assert "indexer_score_lds_bytes(n_heads, HEAD_DIM)" in src
    _assert_balanced(src, a.filename)
    tiny = hip.emit_indexer_score(target, TINY)
    assert tiny.filename == "indexer_score_fp4.d32.hip" and "kConfigHeads = 4;" in tiny.text
    assert tiny.variant.keys["head_dim"] == 32


def test_hip_has_no_variant_off_rocm():
    assert hip.KERNELS[0].variant_for(TARGETS["cuda:sm90"], FULL) is None
    with pytest.raises(ValueError, match="ROCm targets only"):
        hip.emit_indexer_score(TARGETS["ascend:a5"], FULL)


# ----------------------------------------------------------------------------- HIP: the clang check


@NEEDS_CLANG
@pytest.mark.parametrize("arch", ["gfx942", "gfx1100", "gfx950"])
def test_hip_source_compiles_with_clang_for_amd_targets(arch, tmp_path):
    if arch not in hip._clang_offload_archs(CLANG, (arch,)):
        pytest.skip(f"{CLANG} ({hip.clang_version(CLANG)}) does not know {arch}")
    es = hip.emit_indexer_score(TARGETS[f"rocm:{arch}"], FULL)
    src = tmp_path / es.filename
    src.write_text(es.text)
    ok, log = hip.clang_check(CLANG, str(src), arch, str(tmp_path / "k.s"))
    assert ok, log
    asm = (tmp_path / "k.s").read_text()
    assert re.search(r"_ZN6dsv41c17indexer_score_fp4ILi128EEEvPKhS2_S2_S2_PKfPKiPfii:", asm)  # the kernel symbol
    assert re.search(r"\bds_(read|load)", asm)  # q is read from LDS
    assert ".group_segment_fixed_size: 0" in asm  # no static LDS: all of it is dynamic
    assert ".private_segment_fixed_size: 0" in asm  # no scratch memory ...
    assert ".vgpr_spill_count: 0" in asm  # ... and no register spills (RDNA3 has 256 VGPRs)


def _broken_source(tmp_path, arch):
    """The emitted source with one misspelt built-in (__syncthread), written to tmp_path."""
    src = tmp_path / "broken.hip"
    src.write_text(hip.emit_indexer_score(TARGETS[f"rocm:{arch}"], FULL).text.replace("__syncthreads();",
                                                                                      "__syncthread();"))
    return str(src)


@NEEDS_CLANG
def test_clang_check_catches_a_broken_source(tmp_path):
    ok, log = hip.clang_check(CLANG, _broken_source(tmp_path, "gfx942"), "gfx942")
    assert not ok and "__syncthread" in log


@NEEDS_TIDY
@pytest.mark.parametrize("arch", ["gfx942", "gfx1100", "gfx950"])
def test_hip_source_passes_the_clang_tidy_front_end(arch, tmp_path):
    """The front-end check for targets the HIP clang lacks (gfx950 with Debian's clang-19): host and device
    code parse and type-check for the arch, warnings as errors."""
    if not hip.tidy_knows(TIDY, arch):
        pytest.skip(f"{hip.tidy_version(TIDY)} does not know {arch}")
    es = hip.emit_indexer_score(TARGETS[f"rocm:{arch}"], FULL)
    src = tmp_path / es.filename
    src.write_text(es.text)
    ok, log = hip.tidy_check(TIDY, str(src), arch)
    assert ok, log


@NEEDS_TIDY
def test_clang_tidy_check_catches_a_broken_source_and_an_unknown_arch(tmp_path):
    ok, log = hip.tidy_check(TIDY, _broken_source(tmp_path, "gfx950"), "gfx942")
    assert not ok and "__syncthread" in log
    assert not hip.tidy_knows(TIDY, "gfx999")


@NEEDS_TIDY
def test_aot_build_checks_a_target_the_clang_lacks_with_the_front_end(tmp_path, monkeypatch):
    """`dsv41c kernels --build` for gfx950: the emitted HIP source gets clang's full check where clang knows the
    arch, else clang-tidy's front-end check, recorded in the manifest as such."""
    from dsv41c.codegen import aot
    if not hip.tidy_knows(TIDY, "gfx950"):
        pytest.skip(f"{hip.tidy_version(TIDY)} does not know gfx950")
    monkeypatch.setattr(hip, "find_hip_clang", lambda: None)  # as on a machine with no HIP clang for gfx950
    m = aot.build(["rocm:gfx950"], str(tmp_path / "k"), templates={}, log=None)
    (s,) = [s for s in m["sources"] if s["language"] == "hip"]
    assert s["clang_check"]["ok"] is True and s["clang_check"]["front_end_only"] is True, s
    assert s["clang_check"]["clang"].startswith("clang-tidy ")


# ----------------------------------------------------------------------------- HIP: run on the CPU

_DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
typedef int hipError_t;
typedef struct ihipStream_t* hipStream_t;
extern "C" hipError_t ENTRY(const uint8_t*, const uint8_t*, const uint8_t*, const uint8_t*, const float*,
                            const int*, float*, int, int, int, hipStream_t);
template <class T> std::vector<T> rd(const char* p, size_t n) {
  std::vector<T> v(n ? n : 1);
  FILE* f = fopen(p, "rb");
  if (!f || (n && fread(v.data(), sizeof(T), n, f) != n)) exit(3);
  fclose(f);
  return v;
}
int main(int argc, char** argv) {
  int S = atoi(argv[1]), T = atoi(argv[2]), H = atoi(argv[3]), D = atoi(argv[4]), vis = atoi(argv[5]);
  auto qc = rd<uint8_t>("qc.bin", (size_t)S * H * D / 2);
  auto qs = rd<uint8_t>("qs.bin", (size_t)S * H * D / 32);
  auto kc = rd<uint8_t>("kc.bin", (size_t)T * D / 2);
  auto ks = rd<uint8_t>("ks.bin", (size_t)T * D / 32);
  auto w = rd<float>("w.bin", (size_t)S * H);
  auto nv = rd<int>("vis.bin", (size_t)S);
  std::vector<float> out((size_t)S * T, 12345.0f);
  int rc = (int)ENTRY(qc.data(), qs.data(), kc.data(), ks.data(), w.data(), vis ? nv.data() : nullptr, out.data(),
                      S, T, H, nullptr);
  FILE* f = fopen("out.bin", "wb");
  fwrite(out.data(), 4, out.size(), f);
  fclose(f);
  return rc;
}
"""


def _host_cxx():
    for cxx in ("g++", "clang++", "clang++-19"):
        path = shutil.which(cxx)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory):
    cxx = _host_cxx()
    if cxx is None:
        pytest.skip("no host C++ compiler for the HIP host emulation")
    d = tmp_path_factory.mktemp("hipemu")
    es = hip.emit_indexer_score(TARGETS["rocm:gfx942"], MINI)  # head_dim 64, 8 heads configured
    (d / es.filename).write_text(es.text)
    (d / "driver.cpp").write_text(_DRIVER)
    base = [cxx, "-std=c++20", "-O1", "-pthread", "-DDSV41C_HIP_HOST_EMU", "-I", hip.HERE,
            "-DENTRY=dsv41c_indexer_score_fp4_d64", "-x", "c++", str(d / es.filename), str(d / "driver.cpp"),
            "-o", str(d / "emu")]
    p = subprocess.run(base[:1] + ["-fsanitize=address"] + base[1:], capture_output=True, text=True)
    if p.returncode != 0:  # no ASan runtime: still run, without the LDS bounds check
        p = subprocess.run(base, capture_output=True, text=True)
    if p.returncode != 0 and "<barrier>" in p.stderr:
        pytest.skip(f"{cxx} lacks C++20 <barrier>")
    assert p.returncode == 0, p.stderr
    return d


def _run_emu(d, S, T, H, D, vis, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, w = torch.randn(S, H, D, generator=g), torch.randn(T, D, generator=g), torch.randn(S, H, generator=g)
    k[T // 3] = 0  # an all-zero key: the smallest scales and codes
    qc, qs = quant_fp4_ue8m0(q, 32)
    kc, ks = quant_fp4_ue8m0(k, 32)
    for name, t in dict(qc=qc, qs=qs, kc=kc, ks=ks, w=w.float(), vis=torch.tensor(vis, dtype=torch.int32)).items():
        t.contiguous().numpy().tofile(d / f"{name}.bin")
    p = subprocess.run([str(d / "emu"), str(S), str(T), str(H), str(D), "1"], cwd=d, capture_output=True, text=True,
                       timeout=120)
    out = torch.from_numpy(np.fromfile(d / "out.bin", dtype=np.float32).reshape(S, T))
    qd, kd = dequant_fp4_ue8m0(qc, qs, 32).double(), dequant_fp4_ue8m0(kc, ks, 32).double()
    ref = (w.double()[:, :, None] * torch.relu(torch.einsum("shd,td->sht", qd, kd))).sum(1) * D ** -0.5
    mask = torch.arange(T)[None, :] >= torch.tensor(vis)[:, None]
    return p, out, ref.float().masked_fill(mask, float("-inf")), mask


@pytest.mark.parametrize("heads", [8, 3, 20])
def test_hip_kernel_matches_the_reference_on_the_host(emu_binary, heads):
    # 8 = configured; 3 and 20: the launch's head count, not the config's, sizes the LDS
    p, out, ref, mask = _run_emu(emu_binary, S=3, T=300, H=heads, D=64, vis=[0, 137, 300])
    assert p.returncode == 0, p.stderr[-3000:]
    assert torch.equal(torch.isinf(out), mask) and (out[mask] < 0).all()
    torch.testing.assert_close(out[~mask], ref[~mask], rtol=1e-5, atol=1e-5)


def test_hip_launcher_rejects_heads_beyond_the_lds(emu_binary):
    too_many = hip.LDS_LIMIT["gfx942"] // ((64 + 1) * 4) + 1
    p, out, _, _ = _run_emu(emu_binary, S=1, T=8, H=too_many, D=64, vis=[8])
    assert p.returncode == 1  # hipErrorInvalidValue, nothing launched
    assert (out == 12345.0).all()


# ----------------------------------------------------------------------------- AscendC

_ASCENDC_STUB = r"""
// A stub of the AscendC API surface the emitted kernels use: declarations only, permissive
// signatures. It checks C++ syntax and names, not the real API's overloads or semantics.
#pragma once
#include <cstdint>
#include <cstddef>
#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*
struct bfloat16_t { float v; };
struct fp8_e4m3fn_t { uint8_t v; };
struct fp4x2_e2m1_t { uint8_t v; };
namespace AscendC {
enum class QuePosition { VECIN, VECOUT, VECCALC, A1, B1 };
enum class TPosition { VECIN, VECOUT, VECCALC };
enum class RoundMode { CAST_NONE, CAST_RINT };
enum PipeType { PIPE_V, PIPE_S, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
template <class T> struct LocalTensor {
  T GetValue(int64_t) const;
  void SetValue(int64_t, T) const;
  LocalTensor operator[](int64_t) const;
  template <class U> LocalTensor<U> ReinterpretCast() const;
};
template <class T> struct GlobalTensor {
  void SetGlobalBuffer(T*, uint64_t n = 0);
  T GetValue(uint64_t) const;
  GlobalTensor operator[](uint64_t) const;
};
template <QuePosition P, int D> struct TQue {
  template <class T> LocalTensor<T> AllocTensor();
  template <class T> void EnQue(const LocalTensor<T>&);
  template <class T> LocalTensor<T> DeQue();
  template <class T> void FreeTensor(const LocalTensor<T>&);
};
template <TPosition P> struct TBuf { template <class T> LocalTensor<T> Get(); };
struct TPipe {
  template <class Q> void InitBuffer(Q&, int, uint64_t);
  template <class B> void InitBuffer(B&, uint64_t);
};
struct DataCopyParams { uint16_t blockCount, blockLen, srcStride, dstStride; };
struct DataCopyExtParams { uint16_t blockCount; uint32_t blockLen, srcStride, dstStride, rsv; };
template <class T> struct DataCopyPadExtParams { bool isPad; uint8_t l, r; T v; };
uint32_t GetBlockIdx();
uint32_t GetBlockNum();
template <PipeType P> void PipeBarrier();
#define DSV41C_STUB_OP(name) template <class... A> void name(A&&...);
DSV41C_STUB_OP(DataCopy) DSV41C_STUB_OP(DataCopyPad) DSV41C_STUB_OP(Cast) DSV41C_STUB_OP(Muls)
DSV41C_STUB_OP(Mul) DSV41C_STUB_OP(Add) DSV41C_STUB_OP(Div) DSV41C_STUB_OP(Exp) DSV41C_STUB_OP(Rsqrt)
DSV41C_STUB_OP(ReduceSum) DSV41C_STUB_OP(Duplicate) DSV41C_STUB_OP(Axpy) DSV41C_STUB_OP(Mins) DSV41C_STUB_OP(Maxs)
}  // namespace AscendC
"""


@pytest.mark.parametrize("emit", [ascend.emit_sparse_attention, ascend.emit_compressor], ids=["attn", "compressor"])
@pytest.mark.parametrize("target", ASCEND, ids=lambda t: t.arch)
def test_ascendc_emission_is_deterministic_balanced_and_filled(emit, target):
    a, b = emit(target, FULL), emit(target, FULL)
    assert a == b
    src = a.text
    assert "@" not in _strip_comments_and_strings(src)
    _assert_balanced(src, a.filename)
    for token in ("__aicore__", "GlobalTensor<", "LocalTensor<", "TPipe", "TQue<", "CopyIn", "Compute",
                  "CopyOut", "GetBlockIdx()"):
        assert token in src, token
    hw = target.arch == "a5"
    assert f"#define DSV41C_HW_FP8_FP4 {int(hw)}" in src
    assert a.variant.variant == ("hw_fp8_fp4" if hw else "scalar_codec")
    assert a.variant.status == ("native" if hw else "generic")
    if emit is ascend.emit_sparse_attention:
        assert a.filename == "sparse_attention_fp4.h64_d512.cpp"
        for c in ("kHeads = 64;", "kHeadDim = 512;", "kWindow = 128;", "kTopk = 512;", "kFp8Block = 32;",
                  "kFp4Block = 16;", "kScale = 0.0441941738f;", "= 640"):
            assert c in src, c
        assert "void dsv41c_sparse_attention_fp4_h64_d512(" in src
    else:
        assert a.filename == "compressor_fused.d512.cpp"
        for c in ("kHidden = 5120;", "kLatent = 512;", "kRopeDim = 64;", "kFp4Block = 16;", "kRmsEps = 1e-20f;",
                  "kAmaxFloor = 0.01171875f;", "Ratios in this config: 1, 2"):
            assert c in src, c
        assert "void dsv41c_compressor_fused_r1_d512(" in src and "void dsv41c_compressor_fused_r2_d512(" in src
        assert a.variant.keys["ub_bytes"] <= ascend.UB_BYTES


def test_ascendc_follows_the_config():
    t = TARGETS["ascend:a2"]
    attn = ascend.emit_sparse_attention(t, TINY)
    assert attn.filename == "sparse_attention_fp4.h4_d64.cpp"
    assert "kHeads = 4;" in attn.text and "kWindow = 16;" in attn.text and "kTopk = 8;" in attn.text
    comp = ascend.emit_compressor(t, MINI)
    assert "kHidden = 128;" in comp.text and "kLatent = 64;" in comp.text
    assert ascend.KERNELS[0].variant_for(TARGETS["rocm:gfx942"], FULL) is None


@pytest.mark.parametrize("emit", [ascend.emit_sparse_attention, ascend.emit_compressor], ids=["attn", "compressor"])
@pytest.mark.parametrize("arch", ["a2", "a5"])
def test_ascendc_sources_parse_against_an_api_stub(emit, arch, tmp_path):
    cxx = _host_cxx()
    if cxx is None:
        pytest.skip("no host C++ compiler")
    (tmp_path / "kernel_operator.h").write_text(_ASCENDC_STUB)
    es = emit(TARGETS[f"ascend:{arch}"], FULL)
    (tmp_path / es.filename).write_text(es.text)
    p = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wno-unused-variable", "-I", str(tmp_path),
                        str(tmp_path / es.filename)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-4000:]
