"""Sweep sparse attention's decode variants on a GPU under CUDA-graph replay (codegen/triton/sparse_attention.py).

Cases (real widths: 64 heads x 512, window 128, top-512 FP4 compressed entries, FP8 window ring):
- `decode_batch_S64`: 64 decode queries, each over its own ring and its own compressed region (the
  benchmarks/kernels_attention.py case `sparse_attention_decode_batch_S64_fp8fp4`),
- `decode_S1`: one decode query.
For each variant (kwargs of `sparse_attention`; "old" = the defaults before the branch-QK / fused
combine change: qk_once False, fuse_combine False, block_n 64, 2 stages) it records the graph-replay
median, max abs / rel error against `sparse_attention_ref`, the bytes floor (copy bandwidth measured
here) and the time over it. One failing variant is recorded and the rest still run; about 2 minutes.

    python benchmarks/tune_sparse_attention.py --out tune_sparse_attention.json
    python benchmarks/tune_sparse_attention.py --sass [--out sass.json]   # no GPU: sm90 regs/spills/HGMMA
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

OLD = {"qk_once": False, "fuse_combine": False, "block_n": 64, "num_stages": 2}
# (case, S, variants): {} is the launcher's current default
VARIANTS = {
    "decode_batch_S64": (64, [
        ("old", OLD),
        ("default", {}),
        ("qk_once_bn64", {"qk_once": True, "fuse_combine": False, "block_n": 64, "num_stages": 2}),
        ("qk_once_fuse_bn64", {"qk_once": True, "fuse_combine": True, "block_n": 64, "num_stages": 2}),
        ("bn32_ns2", {"block_n": 32, "num_stages": 2}),
        ("bn16_ns3", {"block_n": 16, "num_stages": 3}),
        ("no_fuse", {"fuse_combine": False}),
        ("split4", {"n_split": 4}),
        # whole keys per program, output channels split (no partials, no combine; QK repeated)
        ("dv256_split1", {"dv": 256, "n_split": 1}),
        ("dv256_split1_bn32", {"dv": 256, "n_split": 1, "block_n": 32, "num_stages": 3}),
        ("split1", {"n_split": 1}),
        # kv_pairs.py's bf16x2 tile decoders, the lazy rescale, both
        ("pairs", {"kv_pairs": True}),
        ("lazy8", {"lazy_rescale": 8.0}),
        ("pairs_lazy8", {"kv_pairs": True, "lazy_rescale": 8.0}),
        ("pairs_pdl", {"kv_pairs": True, "pdl": True}),
        ("pdl", {"pdl": True}),
        # 16 warps (4 warpgroups: 64 accumulator registers a thread instead of 128, 4 warps a scheduler)
        ("w16_bn64", {"num_warps": 16}),
        ("w16_bn32_ns3", {"num_warps": 16, "block_n": 32, "num_stages": 3}),
        ("w16_bn32_ns2", {"num_warps": 16, "block_n": 32, "num_stages": 2}),
        # the packed FP4 rows loaded 4 / 8 / 16 bytes a thread (`_kv_tile`'s CVEC; 8 the default): a dequantized-tile
        # layout that stores without bank conflicts, for more cp.async and stage loads
        ("cvec4", {"cvec": 4}),
        ("cvec8", {"cvec": 8}),
        ("cvec16", {"cvec": 16}),
        # cvec 8 was 50.6 vs 52.4 µs cold in a first run; timed again, interleaved
        ("default_again", {}),
        ("cvec8_again", {"cvec": 8}),
        # the warp-specialized Gluon kernel (sparse_attention_ws.py), 1 / 2 (its default) / 4 splits
        ("ws", {"ws": True}),
        ("ws_split1", {"ws": True, "n_split": 1}),
        ("ws_split4", {"ws": True, "n_split": 4}),
        ("default_again2", {}),
        ("ws_again", {"ws": True}),
        # PDL on the ws launch (the combine's launch overlaps it): off / on; the producer's register budget
        ("ws_nopdl", {"ws": True, "ws_cfg": {"pdl": False}}),
        ("ws_pdl", {"ws": True, "ws_cfg": {"pdl": True}}),
        ("ws_p104", {"ws": True, "ws_cfg": {"producer_regs": 104}}),
        ("ws_p120", {"ws": True, "ws_cfg": {"producer_regs": 120}}),
        # after the P·V wait moved into its own iteration (no C7515 serialization): the producer's budget again
        ("ws_p112", {"ws": True, "ws_cfg": {"producer_regs": 112}}),
        ("ws_p128", {"ws": True, "ws_cfg": {"producer_regs": 128}}),
        # tried and reverted (tuning/sparse_attention_ws/idx.json): the query's selected entries staged
        # in shared memory once by the producer, and the position / bases loaded after the fork: 35.0 against 34.3
        # tried and removed (tuning/sparse_attention_ws/fused_merge.json): the last split to arrive
        # merged the others' partials in the same launch (39.6 µs cold against 36.7, and its bits depend on the
        # arrival order)
        # tried and removed (their runs and code in git history), L2-cold µs, the kernel as shipped 34.1-34.5 in the
        # same runs: the next block's
        # entries loaded a block ahead 35.4-35.6; the partials through the freed tile ring (512-byte warp stores) 35.1;
        # every row prefetched into the L2 at the program's start 35.1-35.3; the compressed rows by cp.async into a
        # staging buffer one block ahead 37.6; the two splits merged in the launch by the last to arrive (both
        # partials re-read from the L2, no combine kernel) 38.3-38.5 (warm: 30.3-30.5 against 32.2)
        # tried and removed (its runs in git history; the gpu tests of the form passed): fp16 partials, each head's
        # row scaled by a power of two
        # folded into m and l: 35.9-36.0 µs L2-cold against 34.2-34.3; the launch alone 31.5 against 28.1, 30.8 with no
        # row scaling at all (the fp16 stores, 4 bytes a thread instead of 8, are slower than the fp32 ones); the
        # combine 1.7 µs faster (half the bytes read)
        # bf16 partials (range of fp32, no row scaling) stored through the freed tile ring, 16 bytes a thread
        # (PBF16; tuning/sparse_attention_ws/bf16_partials.json); fp32 and bf16 interleaved, each whole and as the
        # launch alone
        ("partials_fp32", {"ws": True, "ws_cfg": {"partial_bf16": False}}),
        ("partials_bf16", {"ws": True, "ws_cfg": {"partial_bf16": True}}),
        ("partials_fp32_main", {"ws": True, "ws_cfg": {"partial_bf16": False, "combine": False}}),
        ("partials_bf16_main", {"ws": True, "ws_cfg": {"partial_bf16": True, "combine": False}}),
        ("partials_fp32_again", {"ws": True, "ws_cfg": {"partial_bf16": False}}),
        ("partials_bf16_again", {"ws": True, "ws_cfg": {"partial_bf16": True}}),
        # tried and removed (its run in git history): the program's selected entries
        # prefetched into the L2 at its start (prefetch.global.L2, one producer lane a 128-byte line; ptxas stack 56 ->
        # 96 bytes): 30.9-31.3 µs L2-cold against 29.0-29.1 for the kernel as shipped, interleaved
    ]),
    "decode_S1": (1, [
        ("old", {"qk_once": False, "fuse_combine": False}),
        ("default", {}),
        ("no_fuse", {"fuse_combine": False}),
        ("dv128_qk_once", {"dv": 128, "qk_once": True}),
        # the one-query case against torch.compile (which takes 27.6 µs cold, compiled_baseline.json)
        ("dv128_bn32", {"dv": 128, "block_n": 32}),
        ("dv128_w4", {"dv": 128, "num_warps": 4}),
        ("dv128_split5", {"dv": 128, "n_split": 5}),
        ("dv256", {"dv": 256}),
        ("dv512_bn16", {"dv": 512, "block_n": 16, "num_stages": 3}),
        ("dv64", {"dv": 64}),
        ("dv64_bn32", {"dv": 64, "block_n": 32}),
        ("dv128_bn16", {"dv": 128, "block_n": 16, "num_stages": 3}),
        ("dv512_bn32", {"dv": 512, "block_n": 32}),
        ("bn64", {"dv": 128, "block_n": 64}),  # the one-query default before the chunked combine
        ("pairs", {"kv_pairs": True}),
        ("pairs_lazy8", {"kv_pairs": True, "lazy_rescale": 8.0}),
        ("pairs_pdl", {"kv_pairs": True, "pdl": True}),
        ("pdl", {"pdl": True}),
        ("dv128_bn32_ns3", {"dv": 128, "block_n": 32, "num_stages": 3}),
        ("dv256_bn32", {"dv": 256, "block_n": 32}),
        ("dv128_bn32_w4", {"dv": 128, "block_n": 32, "num_warps": 4}),
        ("cvec4", {"cvec": 4}),  # see decode_batch_S64 (13.7 vs 12.9 µs cold)
        ("cvec8", {"cvec": 8}),
        ("cvec16", {"cvec": 16}),
        ("default_again", {}),
        ("cvec8_again", {"cvec": 8}),
        ("ws", {"ws": True}),  # 10 splits of one 64-key block
    ]),
}


def _bytes(S, H=64, D=512, W=128, KC=512):
    return S * (W * (D + D // 32) + KC * (D // 2 + D // 16) + KC * 4 + 2 * H * D * 2)


def run(args):
    import torch

    from benchmarks.common import env_info, max_rel, measure_ceilings, ms_graph
    from benchmarks.kernels_attention import _attn_data, rope_table
    from dsv41c.codegen.triton import sparse_attention as sa

    ceil = measure_ceilings()
    doc = {"kind": "tune_sparse_attention", "env": env_info(), "ceilings": ceil, "cases": []}
    cos, sin = rope_table(1 << 16)
    for case, (S, variants) in VARIANTS.items():
        if args.case and case not in args.case:
            continue
        q, qpos, wkv, ckv, idx, sink, kw = _attn_data(S, True, batched=S > 1)
        ref = sa.sparse_attention_ref(q, qpos, wkv, ckv, idx, sink, cos, sin, **kw)
        floor = _bytes(S) / (ceil["copy_TBps"] * 1e12) * 1e3
        rows = []
        for name, cfg in variants:
            if args.variants and not re.search(args.variants, name):
                continue
            t0 = time.time()
            rec = {"variant": name, "cfg": cfg}
            try:
                f = lambda cfg=cfg: sa.sparse_attention(q, qpos, wkv, ckv, idx, sink, cos, sin, **cfg, **kw)  # noqa: E731
                o = f()
                rec.update(max_rel(o, ref))
                rec["repeat_identical"] = bool(torch.equal(o, f()))  # fused counters left at zero
                t = ms_graph(f, rep=args.rep)
                rec["graph_ms"] = t
                if getattr(t, "cold", None) is not None:
                    rec["graph_cold_ms"] = float(t.cold)
                if isinstance(t, float):
                    rec["over_floor"] = t / floor
            except Exception as ex:  # noqa: BLE001 - one failing variant keeps the rest
                rec["error"] = f"{type(ex).__name__}: {ex}"[:400]
            rec["wall_s"] = round(time.time() - t0, 1)
            rows.append(rec)
            print(f"{case:18s} {name:18s} graph {rec.get('graph_ms', '-')!s:.8} ms  cold {rec.get('graph_cold_ms', '-')!s:.8}"
                  f"  x{rec.get('over_floor', 0):.2f} "
                  f"floor  max_abs {rec.get('max_abs', '-')!s:.8}  {rec.get('error', '')}", flush=True)
        ok = [r for r in rows if isinstance(r.get("graph_ms"), float)]
        best = min(ok, key=lambda r: r["graph_ms"])["variant"] if ok else None
        doc["cases"].append({"case": case, "S": S, "floor_ms": floor, "best": best, "rows": rows})
        print(f"{case}: floor {floor * 1e3:.1f} us, best {best}", flush=True)
        q = wkv = ckv = ref = None  # free the case before the next
        torch.cuda.empty_cache()
    return doc


# ============================================================================ static SASS counts (no GPU)


def _loops(sass: str) -> list:
    """Per loop whose body holds HGMMAs: its length, HGMMA count and local-memory ops."""
    from benchmarks.sass import loop_bodies
    out = []
    for body in loop_bodies(sass):
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in body)
        hg = {k: v for k, v in ops.items() if k.startswith("HGMMA")}
        if hg:
            out.append({"instructions": len(body), "hgmma": hg,
                        "local_memory": sum(v for k, v in ops.items() if k.startswith(("LDL", "STL"))),
                        "prmt": sum(v for k, v in ops.items() if k.startswith("PRMT")),
                        "sts": {k: v for k, v in ops.items() if k.startswith("STS")},
                        "lds": {k: v for k, v in ops.items() if k.startswith("LDS")},
                        "ldgsts": {k: v for k, v in ops.items() if k.startswith("LDGSTS")}})
    return out


def _tile_store_layouts(ttgir: str) -> list:
    """The register layouts of the bf16 KV tiles stored into shared memory for the MMAs (`ttg.local_alloc` of a bf16
    tensor from registers), with the shared layout they go to: the store's bank conflicts follow from the pair (a
    thread's contiguous channels and the lanes along a row against the 128-byte swizzle; docs/KERNELS.md)."""
    defs = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
    out = []
    for m in re.finditer(r"ttg\.local_alloc %\w+ : \(tensor<(\w+)xbf16, (#\w+)>\) -> !ttg\.memdesc<[^,]+, (#\w+)", ttgir):
        out.append({"shape": m.group(1), "registers": defs.get(m.group(2), m.group(2)),
                    "shared": defs.get(m.group(3), m.group(3))})
    return out


SASS_CFGS = [  # (label, split, BN, DV, warps, stages, qk_once, fuse)
    ("old_decode_bn64", True, 64, 512, 8, 2, False, False),
    ("qk_once_bn64", True, 64, 512, 8, 2, True, False),
    ("qk_once_fuse_bn64", True, 64, 512, 8, 2, True, True),
    ("default_batch_bn32_ns3", True, 32, 512, 8, 3, True, True),
    ("bn32_ns2", True, 32, 512, 8, 2, True, True),
    ("bn16_ns3", True, 16, 512, 8, 3, True, True),
    ("old_one_query_dv128", True, 64, 128, 8, 2, False, False),
    ("one_query_dv128_qk_once", True, 64, 128, 8, 2, True, True),
    ("old_prefill_bn64", False, 64, 512, 8, 2, False, False),
    ("prefill_bn64_qk_once", False, 64, 512, 8, 2, True, False),
    ("batch_dv256_nosplit_bn64", False, 64, 256, 8, 2, False, False),
    ("batch_dv256_nosplit_bn64_qk_once", False, 64, 256, 8, 2, True, False),
    ("batch_dv256_nosplit_bn32_ns3", False, 32, 256, 8, 3, False, False),
    ("batch_dv256_nosplit_bn64_w4", False, 64, 256, 4, 2, False, False),
    # kv_pairs.py's bf16x2 decoders (the 9th field), the batch and one-query defaults and 16 warps
    ("pairs_qk_once_bn64", True, 64, 512, 8, 2, True, False, True),
    ("pairs_one_query_dv128_bn32", True, 32, 128, 8, 2, False, False, True),
    ("pairs_bn32_ns2", True, 32, 512, 8, 2, True, False, True),
    ("pairs_w16_bn64", True, 64, 512, 16, 2, True, False, True),
    ("pairs_w16_bn32_ns3", True, 32, 512, 16, 3, True, False, True),
    # the packed FP4 rows loaded 4 / 8 bytes a thread (the 10th field: `_kv_tile`'s CVEC)
    ("pairs_qk_once_bn64_cvec4", True, 64, 512, 8, 2, True, False, True, 4),
    ("pairs_qk_once_bn64_cvec8", True, 64, 512, 8, 2, True, False, True, 8),
    ("pairs_one_query_dv128_bn32_cvec4", True, 32, 128, 8, 2, False, False, True, 4),
]


def sass(args):
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    from benchmarks.sass import instructions, registers_stack, sass_of
    from dsv41c.codegen.aot_compat import compile_spec
    from dsv41c.codegen.matrix import TARGETS
    from dsv41c.codegen.triton import sparse_attention as sa
    from dsv41c.frontend.config import preset

    tg = TARGETS["cuda:sm90"]
    c = preset("full")
    doc = {"kind": "tune_sparse_attention_sass", "triton": triton.__version__, "target": tg.name, "rows": []}
    for label, split, bn, dv, nw, ns, qk, fuse, *more in SASS_CFGS:
        pairs = bool(more and more[0])
        cvec = more[1] if len(more) > 1 else 16  # rows without one: 16, the default when they were recorded
        rec = {"label": label, "split": split, "BN": bn, "DV": dv, "warps": nw, "stages": ns, "qk_once": qk,
               "fuse": fuse, "pairs": pairs, "cvec": cvec}
        try:
            spec = sa._attn_spec(c, True, split, bn, dv, nw, ns, "sass", qk, fuse, pairs=pairs, cvec=cvec)
            compiled = compile_spec(spec, tg)
            text, usage = sass_of(compiled)
            rec["tile_store_layouts"] = _tile_store_layouts(compiled["asm"]["ttgir"])
            rs = registers_stack(usage)
            if rs:
                rec.update(registers=rs[0], stack_bytes=rs[1])
            rec["loops"] = _loops(text)
        except Exception as ex:  # noqa: BLE001
            rec["error"] = f"{type(ex).__name__}: {ex}"[:400]
        doc["rows"].append(rec)
        lp = "; ".join(f"{lo['instructions']} instr, HGMMA {lo['hgmma']}, LDL/STL {lo['local_memory']}"
                       for lo in rec.get("loops", [])[:2])
        print(f"{label:26s} regs {rec.get('registers')} stack {rec.get('stack_bytes')}: {lp} {rec.get('error', '')}",
              flush=True)
    # the combine (splits merged NS at a time): are a chunk's loads issued before its first exp?
    for ns, hb in ((16, 4), (8, 8), (2, 16)):
        rec = {"label": f"combine_ns{ns}_hb{hb}", "NS": ns, "HB": hb, "CP": 64, "warps": 4}
        try:
            spec = sa.aot_spec(sa._combine_kernel, rec["label"], COMBINE_TYPES,
                               {"H": c.num_attention_heads, "D": c.head_dim, "ROPE": c.qk_rope_head_dim, "HB": hb,
                                "CP": 64, "NS": ns, "PDL": False}, num_warps=4)
            text, usage = sass_of(compile_spec(spec, tg))
            rs = registers_stack(usage)
            if rs:
                rec.update(registers=rs[0], stack_bytes=rs[1])
            ops = [t for _, t in instructions(text)]
            ldg = [i for i, t in enumerate(ops) if "LDG" in t]
            ex2 = [i for i, t in enumerate(ops) if "MUFU.EX2" in t]
            # the schedule in one letter an instruction: L a global load, E an exp, A a float add / multiply
            order = "".join("L" if "LDG" in t else "E" if "MUFU.EX2" in t else "A" if re.match(r"F(ADD|FMA|MUL)", t)
                            else "" for t in ops)
            rec.update(instructions=len(ops), ldg=len(ldg),
                       ldg_before_first_ex2=sum(1 for i in ldg if not ex2 or i < ex2[0]), order=order)
        except Exception as ex:  # noqa: BLE001
            rec["error"] = f"{type(ex).__name__}: {ex}"[:400]
        doc["rows"].append(rec)
        print(f"{rec['label']:26s} regs {rec.get('registers')} stack {rec.get('stack_bytes')}: "
              f"{rec.get('instructions')} instr, {rec.get('ldg')} LDG, {rec.get('ldg_before_first_ex2')} before the "
              f"first exp {rec.get('error', '')}", flush=True)
    return doc


COMBINE_TYPES = {"pm_ptr": "*fp32", "pl_ptr": "*fp32", "pacc_ptr": "*fp32", "qpos_ptr": "*i32", "sink_ptr": "*fp32",
                 "cos_ptr": "*fp32", "sin_ptr": "*fp32", "o_ptr": "*bf16", "n_split": "i32"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--case", action="append", help="only these cases (decode_batch_S64, decode_S1)")
    ap.add_argument("--rep", type=int, default=30, help="graph-replay budget per variant (ms)")
    ap.add_argument("--variants", default=os.environ.get("TUNE_VARIANTS", ""),
                    help="only the variants whose name this regex finds (default: $TUNE_VARIANTS, else all)")
    ap.add_argument("--sass", action="store_true", help="static sm90 SASS counts (no GPU)")
    args = ap.parse_args(argv)
    doc = sass(args) if args.sass else run(args)
    from benchmarks.common import write_json

    write_json(args.out, doc)


if __name__ == "__main__":
    main()
