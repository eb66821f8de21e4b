"""Tune the grouped MXFP4 expert GEMMs at prefill: FP4 decoders × tile configurations, on one GPU.

Shapes (the published config): 8192 tokens, top-6 over 384 experts, hidden 5120, inter 2304.
Two routings: "router" (random distinct experts per token: the per-expert counts scatter around
128 like a real router's) and "balanced" (exactly 128 rows per expert). For each FP4 decoder
(`codegen/triton/fp4_unpack.py`: 0 join, 1 nibbles, 2 words) and a handful of tiles
(BM tokens = wgmma N, BN weight rows, BK, num_warps, num_stages) it
- checks the routed-expert output against `moe_experts_reference` on the first 64 tokens of
  fresh random data (relative Frobenius error; ok below 2 bf16 ulps), and
- times gate/up and down separately (`triton.testing.do_bench`, median): gate/up with h stored
  in the down kernel's k order and x already permuted (the permutation pass is timed on its own,
  `x_permute_ms`), down with h in its order,
and reports TFLOP/s (4·R·I·D gate/up, 2·R·I·D down, R = 49152 routed rows, padding not counted)
and the fraction of two bf16 rates measured in the same run: a square 8192³ torch.matmul (the
`kernels_ffn.py` ceiling, the goal's "bf16 matmul rate": ≥ 0.6 wanted) and a grouped bf16
torch.bmm at these very shapes ([128 × D]·[D × 2I] and [128 × I]·[I × D] per expert, 96 experts
batched), whose weights stream 4× the bytes of FP4. Every case runs in its own try/except.

    python benchmarks/tune_moe_prefill.py --out tune_moe_prefill.json   # H200, ~3 min (--budget 200 s of timing)
    python benchmarks/tune_moe_prefill.py --smoke                       # CPU interpreter: tiny, correctness only
    python benchmarks/tune_moe_prefill.py --sass [--out sass.json]      # no GPU: sm90 SASS main-loop counts

The JSON is rewritten after every case (a run killed by a step timeout keeps what it measured);
timing cases past `--budget` seconds are recorded as skipped. Decoder 2 (the default) runs first.

`--sass` compiles gate/up and down for cuda:sm90 with the installed Triton (its cuobjdump) and
counts the SASS instructions of the loop that holds the HGMMAs, per decoded weight element and
thread; that and the TTGIR were the only evidence before a GPU run.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import rel_err, write_json  # noqa: E402

T_TOK, E, TOPK, D, I = 8192, 384, 6, 5120, 2304
BF16_ULP = 2.0 ** -7
N_CHK = 64  # tokens checked against the eager reference (it dequantizes every expert it meets)
# (BM, BN, BK, num_warps, num_stages); decoders 0/1 run the first of each list only
GATE_UP_TILES = [(128, 128, 128, 8, 3), (64, 128, 128, 8, 4), (128, 128, 128, 8, 4), (128, 64, 128, 4, 4),
                 (64, 128, 256, 8, 3)]
DOWN_TILES = [(128, 128, 128, 8, 3), (64, 128, 128, 8, 4), (128, 256, 128, 8, 3), (128, 128, 256, 8, 3),
              (64, 256, 128, 8, 3)]
SMOKE_TILES = [(16, 64, 64, 4, 1), (16, 32, 128, 4, 1)]


# ============================================================================ GPU / interpreter runs


def _routings(torch, T, E_, k, dev):
    """{"router": random distinct experts per token, "balanced": token t -> experts (t·k + j) mod E}."""
    g = torch.Generator(device=dev).manual_seed(1)
    idx_r = torch.rand(T, E_, generator=g, device=dev).topk(k, dim=1).indices.int()
    t = torch.arange(T, device=dev)[:, None] * k + torch.arange(k, device=dev)[None, :]
    out = {}
    for name, idx in (("router", idx_r), ("balanced", (t % E_).int())):
        w = torch.rand(T, k, generator=g, device=dev) + 0.1
        out[name] = (idx, w / w.sum(-1, keepdim=True) * 1.5)
    return out


def _experts(torch, E_, N, K, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    w = torch.randint(-128, 128, (E_, N, K // 2), generator=g, device=dev, dtype=torch.int8)
    s = torch.randint(118, 122, (E_, N, K // 32), generator=g, device=dev, dtype=torch.uint8)
    return w, s


def run(args):
    import torch
    import triton

    from dsv41c.codegen.triton import fp4_unpack as fu
    from dsv41c.codegen.triton import moe

    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    T, E_, k, D_, I_ = (16, 8, 2, 256, 128) if smoke else (T_TOK, E, TOPK, D, I)
    n_chk = T if smoke else N_CHK

    def ms(fn):
        if smoke:  # the timed code paths run once, untimed
            fn()
            return float("nan")
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))

    doc = {"kind": "tune_moe_prefill", "smoke": smoke, "host": platform.node(), "torch": torch.__version__,
           "triton": triton.__version__, "shape": {"T": T, "E": E_, "top_k": k, "D": D_, "I": I_},
           "checked_tokens": n_chk,
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (TRITON_INTERPRET)",
           "ceilings": {}, "rows": []}
    rows = doc["rows"]
    t_start = time.time()

    def guarded(rec, fn):
        if rec.get("case") == "time" and time.time() - t_start > args.budget:
            rec["error"] = f"skipped: past the {args.budget:.0f} s budget"
        else:
            try:
                rec.update(fn())
            except Exception as ex:  # noqa: BLE001 - one failing case must not lose the others
                rec["error"] = f"{type(ex).__name__}: {ex}"[:600]
                rec["traceback"] = traceback.format_exc()[-2000:]
        rows.append(rec)
        print(json.dumps({k_: v for k_, v in rec.items() if k_ != "traceback"}), flush=True)
        write_json(args.out, doc)  # after every case: a killed run keeps what it measured
        if dev == "cuda":
            torch.cuda.empty_cache()

    w1, s1 = _experts(torch, E_, I_, D_, dev, 11)
    w3, s3 = _experts(torch, E_, I_, D_, dev, 12)
    w2, s2 = _experts(torch, E_, D_, I_, dev, 13)
    x = (torch.randn(T, D_, device=dev) * (1.0 if smoke else 0.5)).to(torch.bfloat16)
    gu_flops, dn_flops = 4 * T * k * I_ * D_, 2 * T * k * I_ * D_

    if not smoke:
        def ceilings():
            m = 8192
            a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
            b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
            c = {"bf16_matmul_TFLOPs": 2 * m ** 3 / (ms(lambda: a @ b) * 1e-3) / 1e12}
            a = b = None
            nb, rows_e = 96, T * k // E_
            for stage, (kk, nn) in {"gate_up": (D_, 2 * I_), "down": (I_, D_)}.items():
                xa = torch.randn(nb, rows_e, kk, device=dev, dtype=torch.bfloat16)
                wb = torch.randn(nb, kk, nn, device=dev, dtype=torch.bfloat16)
                t = ms(lambda: torch.bmm(xa, wb))
                c[f"bf16_grouped_{stage}_TFLOPs"] = 2 * nb * rows_e * kk * nn / (t * 1e-3) / 1e12
            return c
        rec = {"case": "ceilings"}
        guarded(rec, ceilings)
        doc["ceilings"] = {k_: v for k_, v in rec.items() if k_.endswith("TFLOPs")}
    ceil = doc["ceilings"]

    def rates(rec, stage, t):
        fl = gu_flops if stage == "gate_up" else dn_flops
        rec["TFLOPs"] = fl / (t * 1e-3) / 1e12
        if ceil.get("bf16_matmul_TFLOPs"):
            rec["frac_bf16_matmul"] = rec["TFLOPs"] / ceil["bf16_matmul_TFLOPs"]
        if ceil.get(f"bf16_grouped_{stage}_TFLOPs"):
            rec["frac_bf16_grouped"] = rec["TFLOPs"] / ceil[f"bf16_grouped_{stage}_TFLOPs"]

    for rname, (ti, tw) in _routings(torch, T, E_, k, dev).items():
        ref = moe.moe_experts_reference(x[:n_chk], ti[:n_chk], tw[:n_chk], w1, s1, w3, s3, w2, s2, 10.0)
        counts = torch.bincount(ti.flatten().long(), minlength=E_)
        doc.setdefault("routing", {})[rname] = {"rows_per_expert_min": int(counts.min()),
                                                "rows_per_expert_max": int(counts.max())}
        plans = {}

        def plan_for(BM):
            if BM not in plans:
                plans[BM] = moe.moe_align(ti, E_, BM)
            return plans[BM]

        for dec in (2, 0, 1):  # the default decoder first
            gu_tiles = SMOKE_TILES if smoke else (GATE_UP_TILES if dec == 2 else GATE_UP_TILES[:1])
            dn_tiles = SMOKE_TILES if smoke else (DOWN_TILES if dec == 2 else DOWN_TILES[:1])

            def check(dec=dec, gt=gu_tiles[0], dt=dn_tiles[0]):
                plan = plan_for(gt[0])
                h_order = (dec, dt[2]) if dec and gt[1] % dt[2] == 0 else None
                kw = dict(dot_scaled=False, decode=dec, h_order=h_order)
                h = moe.moe_gate_up(x, plan, tw, w1, s1, w3, s3, 10.0, tiles=gt, **kw)
                y = moe.moe_combine(moe.moe_down(h, plan, w2, s2, torch.bfloat16, tiles=dt, **kw), k)
                err = rel_err(y[:n_chk], ref)
                return {"rel_err": err, "ok": err < 2 * BF16_ULP}

            guarded({"case": "check", "routing": rname, "decoder": dec, "gate_up_tiles": list(gu_tiles[0]),
                     "down_tiles": list(dn_tiles[0])}, check)
            for gt in gu_tiles:
                def gate_up(dec=dec, gt=gt):
                    plan = plan_for(gt[0])
                    xp = fu.permute_k(x, gt[2], dec)  # the kernel alone: x handed over in its k order
                    h_order = (dec, 128) if dec and gt[1] % 128 == 0 else None
                    t = ms(lambda: moe.moe_gate_up(xp, plan, tw, w1, s1, w3, s3, 10.0, tiles=gt, dot_scaled=False,
                                                   decode=dec, h_order=h_order, x_order=(dec, gt[2]) if dec else None))
                    r = {"ms": t, "x_permute_ms": ms(lambda: fu.permute_k(x, gt[2], dec)) if dec else 0.0}
                    rates(r, "gate_up", t)
                    return r
                guarded({"case": "time", "routing": rname, "stage": "gate_up", "decoder": dec, "tiles": list(gt)},
                        gate_up)
            for dt in dn_tiles:
                def down(dec=dec, dt=dt):
                    plan = plan_for(dt[0])
                    h = torch.randn(T * k, I_, device=dev).to(torch.bfloat16) * 0.1
                    h_order = (dec, dt[2]) if dec else None
                    t = ms(lambda: moe.moe_down(h, plan, w2, s2, torch.bfloat16, tiles=dt, dot_scaled=False,
                                                decode=dec, h_order=h_order))
                    r = {"ms": t}
                    rates(r, "down", t)
                    return r
                guarded({"case": "time", "routing": rname, "stage": "down", "decoder": dec, "tiles": list(dt)}, down)
            print(f"-- {rname} decoder {dec} done at {time.time() - t_start:.0f} s", flush=True)
    doc["wall_s"] = time.time() - t_start
    return doc


def print_table(doc):
    rows = doc["rows"]
    c = doc.get("ceilings", {})
    print("\n" + "=" * 100)
    print(f"{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  " +
          "  ".join(f"{k_.replace('_TFLOPs', '')} {v:.0f}" for k_, v in c.items()) + " TFLOP/s")
    for rname in ("router", "balanced"):
        tags = [f"dec {r['decoder']} " + (f"FAILED {r['error'][:60]}" if "error" in r else
                                          f"{r['rel_err']:.1e} {'ok' if r['ok'] else 'BAD'}")
                for r in rows if r.get("case") == "check" and r["routing"] == rname]
        print(f"check {rname:8s} (rel err vs reference, first {doc['checked_tokens']} tokens): " + "; ".join(tags))
    print(f"{'routing':8s} {'stage':7s} dec {'BM,BN,BK,w,s':18s} {'ms':>7s} {'TFLOP/s':>8s} {'%mm':>5s} {'%grp':>5s}")
    best = {}
    for r in rows:
        if r.get("case") != "time":
            continue
        cfg = ",".join(map(str, r["tiles"]))
        if "error" in r:
            print(f"{r['routing']:8s} {r['stage']:7s} {r['decoder']:3d} {cfg:18s} FAILED {r['error'][:40]}")
            continue
        key = (r["routing"], r["stage"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
        print(f"{r['routing']:8s} {r['stage']:7s} {r['decoder']:3d} {cfg:18s} {r['ms']:7.3f} {r['TFLOPs']:8.0f} "
              f"{100 * r.get('frac_bf16_matmul', 0):5.1f} {100 * r.get('frac_bf16_grouped', 0):5.1f}")
    for rname in ("router", "balanced"):
        g, d = best.get((rname, "gate_up")), best.get((rname, "down"))
        if g and d and c.get("bf16_matmul_TFLOPs"):
            tot = 6 * doc["shape"]["T"] * doc["shape"]["top_k"] * doc["shape"]["I"] * doc["shape"]["D"]
            t = g["ms"] + d["ms"]
            print(f"best {rname}: gate/up dec {g['decoder']} {g['tiles']} + down dec {d['decoder']} {d['tiles']} = "
                  f"{t:.2f} ms, {tot / (t * 1e-3) / 1e12 / c['bf16_matmul_TFLOPs']:.0%} of the bf16 matmul rate")


# ============================================================================ static SASS counts


def _loop_counts(sass: str) -> dict:
    """Opcode histogram of the loop holding the HGMMAs: from the target of the backward branch after the
    last HGMMA to that branch."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    wg = [i for i, (_, t) in enumerate(ins) if "HGMMA" in t]
    if not wg:
        return {"error": "no HGMMA"}
    for j in range(wg[-1], len(ins)):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins[j][1])
        if m and int(m.group(1), 16) <= ins[wg[0]][0]:
            start = next(i for i, (a, _) in enumerate(ins) if a == int(m.group(1), 16))
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in ins[start:j + 1])
            return {"instructions": j + 1 - start, "ops": dict(ops.most_common())}
    return {"error": "no backward branch after the HGMMAs"}


def sass(args):
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    from dsv41c.codegen.aot_compat import compile_spec
    from dsv41c.codegen.matrix import TARGETS
    from dsv41c.codegen.templates import aot_spec
    from dsv41c.codegen.triton import moe

    tg = TARGETS["cuda:sm90"]
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = {"kind": "tune_moe_prefill_sass", "triton": triton.__version__, "target": tg.name, "rows": []}
    gu_types = {"x_ptr": "*bf16", "slots_ptr": "*i32", "rw_ptr": "*fp32", "tile_expert_ptr": "*i32",
                "tile_row_ptr": "*i32", "offsets_ptr": "*i32", "w1_ptr": "*u8", "s1_ptr": "*u8", "w3_ptr": "*u8",
                "s3_ptr": "*u8", "h_ptr": "*bf16", "limit": "fp32"}
    dn_types = {"h_ptr": "*bf16", "slots_ptr": "*i32", "tile_expert_ptr": "*i32", "tile_row_ptr": "*i32",
                "offsets_ptr": "*i32", "w2_ptr": "*u8", "s2_ptr": "*u8", "out_ptr": "*bf16"}
    BM, BN, BK, nw, ns = GATE_UP_TILES[0]
    for dec in (0, 1, 2):
        for stage in ("gate_up", "down"):
            ce = {"BM": BM, "BN": BN, "BK": BK, "DOT_F32": False, "DOT_SCALED": False, "DECODE": dec, "PTX": True}
            if stage == "gate_up":
                ce.update(K=D, N=I, TOPK=TOPK, H_QUANT=False, H_BK=BK, H_DECODE=dec)
                spec = aot_spec(moe.moe_gate_up_kernel, "sass", gu_types, ce, nw, ns)
                elems = 2 * BN * BK  # w1 and w3 per k step
            else:
                ce.update(K=I, N=D)
                spec = aot_spec(moe.moe_down_kernel, "sass", dn_types, ce, nw, ns)
                elems = BN * BK
            rec = {"stage": stage, "decoder": dec, "tiles": [BM, BN, BK, nw, ns]}
            try:
                res = compile_spec(spec, tg)
                with tempfile.TemporaryDirectory() as tmp:
                    cubin = os.path.join(tmp, "k.cubin")
                    with open(cubin, "wb") as f:
                        f.write(res["asm"]["cubin"])
                    text = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                                          check=True).stdout
                    usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True).stdout
                rec.update(_loop_counts(text))
                m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
                rec.update(registers=int(m.group(1)), stack_bytes=int(m.group(2))) if m else None
                if "instructions" in rec:
                    per_thread = elems / (32 * nw)
                    rec["per_weight_element"] = rec["instructions"] / per_thread
                    rec["local_memory_in_loop"] = sum(v for k_, v in rec["ops"].items()
                                                      if k_.startswith(("LDL", "STL")))
            except Exception as ex:  # noqa: BLE001
                rec["error"] = f"{type(ex).__name__}: {ex}"[:400]
            out["rows"].append(rec)
            top = ", ".join(f"{k_} {v}" for k_, v in list(rec.get("ops", {}).items())[:8])
            print(f"{stage:7s} decoder {dec}: {rec.get('instructions', '-')} instr/loop, "
                  f"{rec.get('per_weight_element', 0):.2f} per weight element·thread, regs {rec.get('registers')}, "
                  f"spills in loop {rec.get('local_memory_in_loop')}; {top} {rec.get('error', '')}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in the interpreter, correctness only")
    ap.add_argument("--sass", action="store_true", help="static sm90 SASS counts (no GPU)")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds after which timing cases are skipped")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    doc = sass(args) if args.sass else run(args)
    write_json(args.out, doc)
    if not args.sass:
        print_table(doc)
        bad = [r for r in doc["rows"] if r.get("case") == "check" and not r.get("ok")]
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
