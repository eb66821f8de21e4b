"""Time the decode MoE path (codegen/triton/moe_decode.py) on a GPU: tile sweep, the grouped path, the bytes floor.

For T = 1 and 8 tokens at the published widths (hidden 5120, inter 2304, 384 experts top-6, MXFP4
weights): the whole routed-expert step (prep + gate/up + down/combine) for a few gate/up tiles (down
at its default) and a second down tile (gate/up at its default), PDL off as a control, plus act_quant at the
defaults. Each row: the error against `moe_experts_decode_reference` on the same inputs, the median of
`triton.testing.do_bench` (L2 flushed, host launches included), of `do_bench_cudagraph` (graph replay of
one step; the step's weights partly stay in the 50 MB L2 between replays) and `rot_ms`: one graph of
8 steps over 8 disjoint expert sets, per step (nothing reused from L2: what a decode step sees). The
floor is the unique experts' w1 + w3 + w2 bytes with scales over the copy bandwidth measured here
(1 GiB device copy); the goal is rot_ms <= 2x floor. The current grouped path (`moe.moe_experts`,
moe_align + tensor-core tiles + combine) is timed the same way. A short table comes last.

    python benchmarks/tune_moe_decode.py --out tune_moe_decode.json      # H200, ~3 minutes
    python benchmarks/tune_moe_decode.py --smoke                         # CPU interpreter, tiny, no timing
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

if "--smoke" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import env_info, measure_ceilings, rel_err, write_json  # noqa: E402
from dsv41c.codegen.triton import moe  # noqa: E402
from dsv41c.codegen.triton import moe_decode as md  # noqa: E402
from dsv41c.codegen.triton.moe_router import ROUTERS  # noqa: E402
from dsv41c.codegen.triton import widths  # noqa: E402

LIMIT = 10.0
ROTATE = 8  # disjoint expert sets in the rotating graph
# (BN, BKB, num_warps, ksplit); None = the default. (32, 8, 2) with the default down is the best row of the
# first H200 run (before the layout rework: 0.127 ms at T = 1), kept as the control; (64, 8, 4) was within
# 6% of the default on the second run and is dropped for time. ksplit > 1 splits each gate/up tile's K over
# that many programs (T = 1: 432·ksplit programs instead of 432 on 132 SMs: a finer last wave); hidden
# 5120 = 20 chunks of 8 blocks, so 2, 4 and 5 divide.
# The third run (programmatic dependent launch, pdl.py) kept the default, no split and split 2. This (fourth)
# run: Nsight Compute put the default gate/up grid (T = 1: 2160 programs) at 4 full waves of the 528 resident
# slots plus a partial one of 48, so the finer splits 10 and 20 (2 and 1 chunks a program: the whole program's
# weights are loaded before its grid dependency wait) and 4 (3.27 waves) are timed against it.
GATE_UP = [None, (32, 8, 4, 4), (32, 8, 4, 10), (32, 8, 4, 20)]
# (BN, BKB, num_warps, split); split None = top_k; the first is the default (only its gate/up rows run it).
# (16, 8, 4) of the earlier runs is dropped for time (it never led).
DOWN = [(32, 8, 2, None), (32, 8, 4, None)]
# TUNE_DOWN=1: the down kernel alone is 2.7x its own bytes floor at T = 1 (ncu: 22.6 us for ~35 MB, 36 % DRAM,
# 0.91 waves of 8 programs of 2 warps per SM): fewer rows or warps per program (more, smaller programs; fewer
# registers) and shorter chunks against the default.
DOWN_SWEEP = [(16, 8, 2, None), (16, 8, 1, None), (32, 4, 2, None), (64, 8, 4, None), (32, 8, 1, None),
              (16, 4, 1, None), (32, 8, 2, None)]


def tiles_with(k, D, I, gate_up=None, down=None, pdl=None, fine=None, core=None):
    t = md.decode_tiles(D, I, k)
    if core is not None:  # the GEMV core: 0 FMA (fp4_gemv), 1 tensor cores (fp4_mma_gemv)
        t["core"] = core
    t["pdl"] = pdl  # None: the default (on for sm90+ CUDA devices)
    if fine is not None:  # the per-slot gate/up -> down handoff (default: with PDL)
        t["fine"] = fine
    if gate_up:
        t["gate_up"] = {"BN": gate_up[0], "BKB": gate_up[1], "num_warps": gate_up[2],
                        "ksplit": gate_up[3] if len(gate_up) > 3 else 1, "sub": gate_up[4] if len(gate_up) > 4 else 1}
    if down:
        t["down"] = {"BN": down[0], "BKB": down[1], "num_warps": down[2], "split": down[3] or k,
                     "sub": down[4] if len(down) > 4 else 1}
    return t


def label(t):
    g, d = t["gate_up"], t["down"]
    return (f"core {t.get('core', 0)} | gu BN{g['BN']} BKB{g['BKB']} w{g['num_warps']} k{g.get('ksplit', 1)} "
            f"sub{g.get('sub', 1)} | dn BN{d['BN']} BKB{d['BKB']} w{d['num_warps']} sub{d.get('sub', 1)} "
            f"s{d['split']}" + ("" if t.get("pdl") is None else f" | pdl {'on' if t['pdl'] else 'off'}")
            + ("" if t.get("fine") is None else f" | per-slot handoff {'on' if t['fine'] else 'off'}"))


def make_weights(E, D, I, used, dev, seed=0):
    """Random MXFP4 experts (all 256 byte values, scales 2^-11..2^-4) for the experts in `used`, zeros elsewhere."""
    g = torch.Generator(device=dev).manual_seed(seed)
    w1 = torch.zeros(E, I, D // 2, dtype=torch.int8, device=dev)
    w3, w2 = torch.zeros_like(w1), torch.zeros(E, D, I // 2, dtype=torch.int8, device=dev)
    s1 = torch.full((E, I, D // 32), 120, dtype=torch.uint8, device=dev)
    s3, s2 = s1.clone(), torch.full((E, D, I // 32), 120, dtype=torch.uint8, device=dev)
    u = torch.as_tensor(sorted(used), device=dev)
    for t in (w1, w3, w2):
        t[u] = torch.randint(-128, 128, (len(u), *t.shape[1:]), generator=g, device=dev, dtype=torch.int8)
    for t in (s1, s3, s2):
        t[u] = torch.randint(116, 124, (len(u), *t.shape[1:]), generator=g, device=dev, dtype=torch.uint8)
    return w1, s1, w3, s3, w2, s2


def routings(T, k, E, n, dev, seed=1):
    """n routings over disjoint expert sets (distinct experts within a token, repeats across tokens allowed)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(E, generator=g)
    per = E // n
    out = []
    for r in range(n):
        pool = perm[r * per:(r + 1) * per]
        idx = torch.stack([pool[torch.randperm(per, generator=g)[:k]] for _ in range(T)]).int()
        w = torch.rand(T, k, generator=g) + 0.1
        out.append((idx.to(dev), (w / w.sum(-1, keepdim=True) * 1.5).to(dev)))
    return out


def floor_bytes(idx, D, I):
    per_expert = 3 * (I * D // 2 + I * D // 32)  # w1, w3 [I, D/2] + w2 [D, I/2], one scale byte per 32
    return len(torch.unique(idx)) * per_expert


def time_step(fn_for, routes, smoke):
    """(do_bench ms, do_bench_cudagraph ms, rotating-graph ms per step) for fn_for(idx, w)."""
    if smoke:
        return None, None, None
    import triton.testing as tt
    idx, w = routes[0]
    f = lambda: fn_for(idx, w)  # noqa: E731
    bench = float(tt.do_bench(f, warmup=10, rep=60, return_mode="median"))
    try:
        graph = float(tt.do_bench_cudagraph(f, rep=60, return_mode="median"))
    except Exception as e:  # noqa: BLE001 - recorded, the rotating graph may still work
        graph = f"unavailable: {type(e).__name__}: {e}"[:200]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i, wi in routes:
            fn_for(i, wi)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i, wi in routes:
            fn_for(i, wi)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / len(routes))
    return bench, graph, sorted(times)[len(times) // 2]


def _sass_loop_ops(cubin: bytes) -> dict:
    """Instruction counts of the longest backward-branch loop in the SASS (cuobjdump from Triton's bin)."""
    import re
    import subprocess
    import tempfile

    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loop = []
    for a, i in ins:
        m = re.search(r"BRA.*?0x([0-9a-f]+)", i)
        if m and int(m.group(1), 16) < a:
            body = [j for b, j in ins if int(m.group(1), 16) <= b <= a]
            loop = body if len(body) > len(loop) else loop
    ops = [(j.split()[1] if j.startswith("@") else j.split()[0]).split(".")[0] for j in loop]
    return {"loop_instrs": len(ops), **{k: ops.count(k) for k in ("LDG", "STS", "LDS", "BAR", "FFMA")}}


def static_info():
    """Registers, spills, in-loop layout conversions and the SASS main loop of the default sm90 variants.

    loop_converts counts `ttg.convert_layout` inside the TTGIR loop; since the layout rework the remaining
    ones convert the [P] accumulator between the 1D blocked layout and the slice of the [P, 4] tile layout,
    the same thread mapping (no code): the SASS loop's STS / LDS / BAR (shared-memory round trips) tell."""
    import triton

    from dsv41c.codegen import templates
    from dsv41c.codegen.aot_compat import make_ast_source
    target = triton.runtime.driver.active.get_current_target()
    out = {"target": f"{target.backend}:{target.arch}"}
    todo = [(name, templates._REGISTRY[name].specializations("cuda:sm90")[0], {})
            for name in ("moe_decode_gate_up_fp4", "moe_decode_down_fp4")]
    todo += [(f"moe_decode_gate_up_fp4 ksplit={ks}", todo[0][1], {"KSPLIT": ks}) for ks in (2, 4, 5)]
    for name, spec, extra in todo:
        ce = {**spec.constexprs, **extra}
        k = triton.compile(make_ast_source(spec.kernel, spec.signature, ce), target=target,
                           options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
        k._init_handles()
        depth, conv = 0, 0
        for line in k.asm["ttgir"].splitlines():
            depth += "scf.for" in line
            depth -= "scf.yield" in line and depth > 0
            conv += depth > 0 and "convert_layout" in line
        out[name] = {"variant": spec.variant, "n_regs": k.n_regs, "n_spills": k.n_spills, "loop_converts": conv,
                     "ptx_v4_loads": k.asm["ptx"].count(".v4.b32"), "ptx_ftz": k.asm["ptx"].count(".ftz")}
        try:
            sl = _sass_loop_ops(k.asm["cubin"])
            c = spec.constexprs
            # weight elements one thread covers per loop iteration (two chunks): [BN·BKB, 4] words × 8 nibbles
            elems = 2 * c["BN"] * c["BKB"] * 32 * (2 if "gate_up" in name else 1) / (32 * spec.num_warps)
            out[name]["sass"] = {**sl, "instrs_per_weight": round(sl["loop_instrs"] / elems, 2)}
        except Exception as e:  # noqa: BLE001 - informational only
            out[name]["sass"] = f"unavailable: {type(e).__name__}: {e}"[:200]
    return out


def run_case(rows, name, fn):
    t0 = time.time()
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 - one failing case must not lose the others
        r = {"error": f"{type(e).__name__}: {e}"[:400], "traceback": traceback.format_exc()[-2000:]}
    r = {"case": name, **r, "seconds": round(time.time() - t0, 1)}
    rows.append(r)
    print(json.dumps({k: v for k, v in r.items() if k != "traceback"}, default=str), flush=True)
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON results path")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny widths, correctness only")
    args = ap.parse_args(argv)
    smoke = args.smoke
    if not smoke and not args.out:
        ap.error("--out is required (or --smoke)")
    dev = "cpu" if smoke else "cuda"
    if smoke:
        E, k, D, I, Ts = 16, 6, 256, 128, (1, 2)
        gate_ups, downs = [None, (32, 4, 4), (32, 2, 4, 2)], [(32, 4, 4, None), (64, 4, 4, 1)]
        ceil = {"copy_TBps": float("nan")}
        doc = {"smoke": True, "rows": []}
    else:
        E, k = ROUTERS["backbone"]
        D, I, Ts = widths.PUBLISHED.hidden_size, widths.PUBLISHED.moe_intermediate_size, (1, 8)
        gate_ups, downs = GATE_UP, DOWN
        ceil = measure_ceilings()
        doc = {**env_info(), "ceilings": ceil, "rows": []}
        try:  # converts in a loop are no-ops when Triton picks equal layouts; the tuning rows tell
            doc["static"] = static_info()
        except Exception as e:  # noqa: BLE001 - informational only
            doc["static"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(json.dumps({"static": doc["static"]}), flush=True)
    torch.manual_seed(0)
    rows = doc["rows"]
    all_routes = {T: routings(T, k, E, 1 if smoke else ROTATE, dev) for T in Ts}
    used = set()
    for rs in all_routes.values():
        for i, _ in rs:
            used |= set(torch.unique(i).tolist())
    ex = make_weights(E, D, I, used, dev)
    for T in Ts:
        routes = all_routes[T]
        idx, w = routes[0]
        x = torch.randn(T, D, device=dev).bfloat16()
        # per step, averaged over the rotation's expert sets (the rotating graph runs them all)
        fl_ms = sum(floor_bytes(i, D, I) for i, _ in routes) / len(routes) / (ceil["copy_TBps"] * 1e12) * 1e3
        refs = {}

        def ref(aq):  # once per (T, act_quant); a failure fails the cases that need it, not the run
            if aq not in refs:
                refs[aq] = md.moe_experts_decode_reference(x, idx, w, *ex, LIMIT, act_quant=aq)
            return refs[aq]
        # (gate/up, down, act_quant, pdl, fine): None = the default; the explicit off rows are the controls
        if os.environ.get("TUNE_CORE") == "1" or smoke:  # the two GEMV cores, interleaved, twice; core 1's K splits
            # and steps of 2 / 4 groups of 4 blocks (sub; more bytes in flight a lane); (BN, BKB, warps, ksplit, sub)
            ks = [(32, 8, 4, 2, 1)] if smoke else [(32, 8, 4, n, sb) for n, sb in
                                                   ((1, 1), (5, 2), (2, 2), (1, 2), (5, 4), (1, 4))]
            dsub = [] if smoke else [(32, 8, 2, None, 2), (32, 8, 2, None, 3)]
            configs = [(None, None, False, None, None, 0), (None, None, False, None, None, 1)] * 2 \
                + [(g, None, False, None, None, 1) for g in ks] + [(None, d, False, None, None, 1) for d in dsub] \
                + [(None, None, True, None, None, 1)]
            if smoke:
                configs = [c for c in configs if c[0] is not None or c[2]]
        elif os.environ.get("TUNE_FINE") == "1" and not smoke:  # the per-slot gate/up -> down handoff on / off, twice
            configs = [(None, None, False, None, None), (None, None, False, None, False)] * 2 \
                + [(None, None, True, None, None)]
        elif os.environ.get("TUNE_DOWN") == "1" and not smoke:  # the down kernel's tiles only (gate/up default)
            configs = [(None, None, False, None, None)] + [(None, d, False, None, None) for d in DOWN_SWEEP]
        else:
            configs = ([(g, None, False, None, None) for g in gate_ups] + [(None, None, False, False, None)]
                       + [(None, d, False, None, None) for d in downs[1:]] + [(None, None, True, None, None)])
        for g, d, aq, pdl, fine, *core in configs:
            t = tiles_with(k, D, I, g, d, pdl, fine, *core)

            def case(t=t, aq=aq):
                step = lambda i, wi: md.moe_experts_decode(x, i, wi, *ex, LIMIT, act_quant=aq, tiles=t)  # noqa: E731
                err = rel_err(step(idx, w), ref(aq))
                bench, graph, rot = time_step(step, routes, smoke)
                return {"T": T, "tiles": t, "act_quant": aq, "rel_err": err, "ok": err < 2 * 2.0 ** -7,
                        "bench_ms": bench, "cudagraph_ms": graph, "rot_ms": rot, "floor_ms": fl_ms,
                        "rot_over_floor": rot / fl_ms if rot else None}
            run_case(rows, f"decode T={T} {label(t)}" + (" act_quant" if aq else ""), case)

        def grouped():
            step = lambda i, wi: moe.moe_experts(x, i, wi, *ex, LIMIT, small_batch=False)  # noqa: E731
            err = rel_err(step(idx, w), ref(False))
            bench, graph, rot = time_step(step, routes, smoke)
            return {"T": T, "path": "moe.moe_experts (grouped)", "rel_err": err, "bench_ms": bench,
                    "cudagraph_ms": graph, "rot_ms": rot, "floor_ms": fl_ms,
                    "rot_over_floor": rot / fl_ms if rot else None}
        run_case(rows, f"grouped T={T}", grouped)
        if not smoke:
            write_json(args.out, doc)
    if args.out:
        write_json(args.out, doc)
    print("\n" + ("smoke (interpreter, no timing)" if smoke else
                  f"routed experts step, median ms (floor = unique experts' bytes / {ceil['copy_TBps']:.2f} TB/s)"))
    print(f"{'T':>2} {'case':58s} {'rot':>8} {'graph':>8} {'bench':>8} {'x floor':>7} {'rel_err':>9}")
    for r in rows:
        if "error" in r:
            print(f"   {r['case'][:70]}: ERROR {r['error'][:80]}")
            continue
        name = r["case"].split(" ", 2)[-1] if r["case"].startswith("decode") else r["path"]

        def f(v):
            return f"{v:8.4f}" if isinstance(v, float) else f"{'-':>8}"
        xf = f"{r['rot_over_floor']:7.2f}" if r.get("rot_over_floor") else f"{'-':>7}"
        print(f"{r['T']:>2} {name[:58]:58s} {f(r['rot_ms'])} {f(r['cudagraph_ms'])} {f(r['bench_ms'])} {xf} "
              f"{r['rel_err']:9.2e}")
    for T in Ts:
        dec = [r for r in rows if r.get("T") == T and "tiles" in r and isinstance(r.get("rot_ms"), float)]
        grp = next((r for r in rows if r.get("T") == T and "path" in r and isinstance(r.get("rot_ms"), float)), None)
        if dec:
            b = min(dec, key=lambda r: r["rot_ms"])
            print(f"T={T}: floor {b['floor_ms'] * 1e3:.1f} us; best {label(b['tiles'])}"
                  f"{' act_quant' if b['act_quant'] else ''}: {b['rot_ms'] * 1e3:.1f} us ({b['rot_over_floor']:.2f}x)"
                  + (f"; grouped path {grp['rot_ms'] * 1e3:.1f} us ({grp['rot_ms'] / b['rot_ms']:.1f}x slower)"
                     if grp else ""))
    bad = [r for r in rows if "error" in r or r.get("ok") is False]
    return 1 if bad and smoke else 0


if __name__ == "__main__":
    sys.exit(main())
