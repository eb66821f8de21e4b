"""The warp-specialized Gluon attention kernel (codegen/triton/sparse_attention_ws.py) without a GPU.

Gluon has no interpreter, so its numerics are checked on the GPU only (`gpu` tests in test_kernels_attention.py:
`test_gpu_sparse_attention_ws_*`). Here: it compiles ahead of time for sm90 with the installed Triton (its source is
shared by triton 3.6 and 3.9), into the code it is meant to be — register reallocation between its partitions and
wgmma issued back to back (a kernel whose accumulator stayed in flight across its loop got a wait after every wgmma
from ptxas); the launcher refuses it clearly where it cannot run; the matrix lists it for sm90 only, with reasons.
"""
import re

import pytest
import torch

from dsv41c.codegen.triton import sparse_attention as sa
from dsv41c.codegen.triton import sparse_attention_ws as ws
from dsv41c import formats


@pytest.fixture(scope="module")
def sm90_sass():
    from benchmarks.sass import instructions, sass_of
    from dsv41c.codegen.aot_compat import compile_spec
    from dsv41c.codegen.matrix import TARGETS

    (spec,) = ws.ws_specs("cuda:sm90")
    compiled = compile_spec(spec, TARGETS["cuda:sm90"])
    text, usage = sass_of(compiled)
    return compiled, [t for _, t in instructions(text)], usage


def test_compiles_for_sm90_with_partitions_and_pipelined_wgmma(sm90_sass):
    compiled, ops, usage = sm90_sass
    # three partitions' register budgets: the consumers raised, the producer's budget, idle warps lowered to 24
    budgets = sorted({int(m, 16) for t in ops for m in re.findall(r"USETMAXREG\.\w+\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)", t)})
    assert 0x18 in budgets and ws.WS_PRODUCER_REGS in budgets, budgets
    hgmma = [i for i, t in enumerate(ops) if t.startswith("HGMMA")]
    assert len(hgmma) == 36  # q·K^T: 512 / 16 k steps of m64n32; P·V: 64 / 16 of m64n256
    # back to back: no wgmma wait between two consecutive q·K^T steps (the C7515 serialization puts one after each)
    qk = [i for i in hgmma if ".64x32x16" in ops[i]]
    waits = sum(1 for a, b in zip(qk, qk[1:]) if any("WARPGROUP.DEPBAR" in t for t in ops[a + 1:b]))
    assert waits == 0, f"{waits} wgmma waits inside the q·K^T chain"
    # 8 consumer warps + the 4-warp producer
    assert compiled["metadata"]["num_warps"] == 12 and compiled["options"]["maxnreg"] == ws.WS_MAXNREG
    assert compiled["metadata"]["shared"] <= 227 * 1024  # q + two tiles + bias ring + barriers
    # bf16 partials (PBF16) leave through shared memory as 16-byte stores (64 x 512 bf16 = 16 a consumer thread), none
    # of the accumulator layout's narrow ones
    if ws.WS_PARTIAL_BF16:
        assert sum(t.startswith("STG.E.128") for t in ops) == 16, [t for t in ops if t.startswith("STG")]
        assert not any(t.startswith("STG.E.64") for t in ops)


def test_aot_build_records_wgmma_for_the_gluon_kernel(tmp_path):
    from dsv41c.codegen import aot, templates

    t = templates.all_templates()["sparse_attention_ws"]
    m = aot.build(["cuda:sm90", "cuda:sm80"], str(tmp_path / "k"), templates={"sparse_attention_ws": t}, log=None,
                  sources=False)
    (k,) = [k for k in m["kernels"] if k["template"] == "sparse_attention_ws"]
    assert k["target"] == "cuda:sm90" and k["status"] == "built", k.get("error")
    assert k["matrix_instructions"]["check"] == "ok" and k["matrix_instructions"]["dots"] == 2


def test_matrix_lists_it_on_sm90_only_with_reasons():
    from dsv41c.codegen.matrix import KernelMatrix

    m = KernelMatrix.build()
    row = next(r for r in m.rows if r.name == "sparse_attention_ws")
    assert row.cells["cuda:sm90"].status == "native"
    for target, cell in row.cells.items():
        if target.startswith("ascend"):  # no Triton backend there at all: the matrix's own reason
            assert cell.status == "missing" and "no Triton backend" in cell.reason, (target, cell)
        elif target != "cuda:sm90":
            assert cell.status == "missing" and "sparse_attention template serves" in cell.reason, (target, cell)


DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(S=3, H=16, D=64, W=16, KC=8, N=24, dev=DEV):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(S, H, D, generator=g).to(torch.bfloat16)
    qpos = torch.tensor([3, 20, 40][:S], dtype=torch.int32)
    wq, we = formats.quant_fp8_ue8m0(torch.randn(W + S, D, generator=g), 32)
    cp, cs = formats.quant_fp4_e4m3(torch.randn(N, D, generator=g), 16)
    idx = torch.randint(-1, N, (S, KC), generator=g).to(torch.int32)
    ang = torch.arange(64, dtype=torch.float64)[:, None] * torch.ones(D // 8, dtype=torch.float64)[None] * 0.01
    args = (q, qpos, (wq.view(torch.uint8), we), (cp, cs.view(torch.uint8)), idx, torch.randn(H, generator=g),
            torch.cos(ang).float(), torch.sin(ang).float())
    return [a.to(dev) if torch.is_tensor(a) else tuple(x.to(dev) for x in a) for a in args]


def test_ws_refused_where_it_cannot_run():
    """Here: the interpreter (CPU tier) or, on a GPU, widths other than the model's 64 heads x 512."""
    args = _inputs()
    assert not ws.ws_supported(args[0], args[2], args[3])
    with pytest.raises(ValueError, match="64 heads x 512 channels and a CUDA GPU of compute capability 9.0"):
        sa.sparse_attention(*args, window=16, ws=True)
    with pytest.raises(ValueError, match=r"takes none of the Triton kernel's knobs, got \['block_n'\]"):
        sa.sparse_attention(*args, window=16, ws=True, block_n=16)
    # the default (ws=None) falls back to the Triton kernel here and matches the reference
    o = sa.sparse_attention(*args, window=16)
    r = sa.sparse_attention_ref(*args, window=16)
    assert (o.float() - r.float()).abs().max() < 0.05 * r.float().abs().max()


@pytest.mark.gpu
def test_gpu_ws_rejects_packed_rows_that_are_not_whole_words():
    args = _inputs(H=64, D=512, W=128, dev="cuda")
    if not ws.ws_supported(args[0], args[2], args[3]):
        pytest.skip("needs sm90+")
    cp, cs = args[3]
    args[3] = (cp[:, :254], cs)  # 254 bytes a row: not whole int32 words
    with pytest.raises(ValueError, match="whole int32 words"):
        sa.sparse_attention(*args, window=128, ws=True)


def test_partials_dtype_is_checked_before_the_launch():
    """The launch writes partials in float32 or bfloat16 (PBF16) only, and an explicit partial_bf16 must agree with
    the buffer it is given; both are refused before anything runs (so on the CPU tier too)."""
    S, H, D = 2, 64, 512
    q = torch.zeros(S, H, D, dtype=torch.bfloat16)
    i32 = torch.zeros(S, dtype=torch.int32)
    u8 = torch.zeros(4, D, dtype=torch.uint8)
    ckv = torch.zeros(4, D // 2, dtype=torch.uint8)
    pm = torch.zeros(S, 2, H)
    common = (q, i32, u8, u8, ckv, u8, torch.zeros(S, 4, dtype=torch.int32), i32, i32, pm, pm)
    tail = (128, 4, False, 5, 2, D ** -0.5, 128)
    with pytest.raises(ValueError, match="partials must be float32 or bfloat16, got torch.float16"):
        ws.launch_ws(*common, torch.zeros(S, 2, H, D, dtype=torch.float16), *tail)
    with pytest.raises(ValueError, match="partial_bf16=True but pacc is torch.float32"):
        ws.launch_ws(*common, torch.zeros(S, 2, H, D), *tail, partial_bf16=True)
