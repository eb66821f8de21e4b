"""Temporary GPU diagnostics (registers/spills, config sweep). Not part of the suite."""
import os, sys, time, json, itertools
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch, triton
from triton.runtime.jit import JITFunction
from triton.testing import do_bench, do_bench_cudagraph
from dsv41c.codegen.triton import sparse_attention as sa, compressor as cm, indexer as ix
from benchmarks.kernels_attention import _attn_data, rope_table
seen = {}
_run = JITFunction.run
def run(self, *a, **k):
    r = _run(self, *a, **k)
    try:
        key = (self.fn.__name__, tuple(sorted((kk, v) for kk, v in k.items() if isinstance(v, (int, bool)) and kk.isupper() or kk in ("num_warps", "num_stages"))))
        if key not in seen:
            seen[key] = (r.n_regs, r.n_spills, r.metadata.shared)
            print("KERNEL", key, "regs", r.n_regs, "spills", r.n_spills, "smem", r.metadata.shared, flush=True)
    except Exception as e:
        print("introspect fail", e)
    return r
JITFunction.run = run
cos, sin = rope_table(1 << 16)
what = sys.argv[1:] or ["attn", "comp", "topk"]
if "attn" in what:
    for S, batched in ((1, False), (64, True), (256, False)):
        q, qpos, wkv, ckv, idx, sink, kw = _attn_data(S, True, batched=batched)
        for nw, dv, dc, bn in itertools.product((4, 8), (128, 256, 512), (64,), (32, 64)):
            f = lambda: sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, num_warps=nw, dv=dv, dc=dc, block_n=bn, **kw)
            try:
                f(); torch.cuda.synchronize()
                t = do_bench_cudagraph(f, rep=30)
                print(f"ATTN S={S} nw={nw} dv={dv} dc={dc} bn={bn}: {t*1e3:.1f} us", flush=True)
            except Exception as e:
                print(f"ATTN S={S} nw={nw} dv={dv} dc={dc} bn={bn}: ERR {str(e)[:150]}", flush=True)
if "comp" in what:
    D, C, CI = 5120, 512, 128
    for ratio, T in ((1, 1), (1, 4096), (2, 4096)):
        x = torch.randn(T, D, device="cuda").to(torch.bfloat16)
        w = (torch.randn(C, D, device="cuda") / 70).to(torch.bfloat16)
        nw_ = torch.ones(C, device="cuda", dtype=torch.bfloat16)
        wk = (torch.randn(CI, C, device="cuda") / 22).to(torch.bfloat16); knw = torch.ones(CI, device="cuda", dtype=torch.bfloat16)
        J = T // ratio
        pos = torch.arange(J, dtype=torch.int32, device="cuda") * ratio; rows = torch.arange(J, dtype=torch.int32, device="cuda")
        kc = torch.zeros(J, 256, dtype=torch.uint8, device="cuda"); ks = torch.zeros(J, 32, dtype=torch.uint8, device="cuda")
        ic = torch.zeros(J, 64, dtype=torch.uint8, device="cuda"); isc = torch.zeros(J, 4, dtype=torch.uint8, device="cuda")
        lat = torch.zeros(J, C, device="cuda", dtype=torch.bfloat16 if ratio == 1 else torch.float32)
        for bm, nwp, ns, bk in ((16, 4, 2, 64), (32, 8, 2, 64), (16, 8, 2, 32), (16, 16, 2, 32), (64, 8, 2, 32)):
            f = lambda: cm.compress(x, w, nw_, cos, sin, pos, rows, kc, ks, ratio=ratio, wgate=w if ratio == 2 else None, latent_out=lat,
                                    wk=wk, k_norm_w=knw, idx_cache=ic, idx_scale=isc, block_m=bm, num_warps=nwp, num_stages=ns, block_k=bk)
            try:
                f(); torch.cuda.synchronize()
                t = do_bench(f, rep=50, return_mode="median")
                print(f"COMP r{ratio} T={T} bm={bm} nw={nwp} ns={ns} bk={bk}: {t*1e3:.1f} us  {2*T*D*C*ratio/t/1e9:.1f} TFLOP/s", flush=True)
            except Exception as e:
                print(f"COMP r{ratio} T={T} bm={bm} nw={nwp} ns={ns} bk={bk}: ERR {str(e)[:150]}", flush=True)
if "topk" in what:
    for S, N, k in ((32, 16384, 2048), (32, 131072, 512), (1, 131072, 512)):
        s = torch.randn(S, N, device="cuda")
        pin = torch.zeros(S, dtype=torch.int32, device="cuda")
        for ch in (4096, 8192, 16384):
            f = lambda: ix.topk_select(s, k, pin if k == 2048 else None, chunk=ch)
            a = f(); b = ix.topk_select_ref(s, k, pin if k == 2048 else None)
            t = do_bench(f, rep=50, return_mode="median")
            print(f"TOPK S={S} N={N} k={k} chunk={ch}: {t*1e3:.1f} us ok={torch.equal(a, b)} torch.topk={do_bench(lambda: torch.topk(s, k), rep=50, return_mode='median')*1e3:.1f} us", flush=True)
