"""The one-query indexer step and its parts: where its time goes, and what PDL-chaining its launches saves.

Why: the whole step (prep, scoring, then the top-512 and the candidate-2048 selections on two streams) takes
several times the sum of what its kernels read; the kernel table times it only as one row. This script times,
from a CUDA graph, warm and L2-cold (`common.ms_graph`), at one query over 131,072 compressed entries at the
candidate source (ratio 1, the published widths: 32 index heads x 128, FP4 + UE8M0/32):

- `step_serial_ids`: `indexer.indexer_topk(pdl=False, candidate_ids=True)` (plain stream order, the candidate
  blocks ranked into ordered ids: the step's earlier form),
- `step_pdl_ids`: the same with its launches PDL-chained (`pdl=True`: prep -> scoring, its query decoded before
  its wait -> the main stream's one-launch top-k),
- `step_serial`, `step_pdl`: the candidate blocks as flags (`cand_mask`: the selected set, no rank of its sure
  keys; the default), without and with PDL; `step_pdl_seq`: the two selections one after the other on one stream
  (the `*_nowarm` rows of earlier result files: the prep kernel without its L2 prefetch of the selections'
  workspace lines, which measured level with it and was removed),
- parts, PDL off: `prep` (the prep kernel), `prep_score` (prep + scoring), `topk_share2` / `cands_share2[_mask]`
  (one selection alone at the grid it has in the step, half the SMs; `_mask`: as flags), `selections_ids` /
  `selections_mask` (both, forked and joined on two streams as in the step), `topk_full` / `cands_full[_mask]`
  (one selection alone on every SM).

`--queries 4,32` times only the whole step at those query counts (PDL off / on x candidates as ids / as flags),
do_bench and graph replay.

`--kpt 8,4` also times the step and the selections with that many keys a thread in the split programs
(`indexer_topk.SPLIT_KEYS_PER_THREAD`: more warps, less unrolled code; `_kpt8`, `_kpt4` rows).

Every step variant's top-k and candidate flags must equal `step_serial_ids`'s (`same_indices`). Variants are
timed `--repeat` times, interleaved (run r of every variant before run r + 1 of any), so drift between runs
shows as spread.

    python benchmarks/indexer_step.py --out benchmarks/results/indexer_step.json [--repeat 2] [--only REGEX]

Known gaps: the step's predecessor is the L2 flush (torch's sum kernel), not the indexer's query projection; the
parts are timed alone, so their sum is not the step (launch gaps and the overlap of the two streams differ).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import DEV, env_info, ms_graph, write_json  # noqa: E402

from dsv41c import formats  # noqa: E402
from dsv41c.codegen.triton import indexer as ix  # noqa: E402
from dsv41c.codegen.triton import indexer_topk as tk  # noqa: E402
from dsv41c.codegen.triton.streams import side_stream  # noqa: E402

H, T, TOPK, CANDS = 32, 131072, 512, 2048


def inputs(seed: int = 0):
    """The kernel table's one-query indexer data (kernels_attention.py's `_indexer_data`, no adversarial rows)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    qp, qe = formats.quant_fp4_ue8m0(torch.randn(1, H, 128, device=DEV, generator=g), 32)
    kp, ke = formats.quant_fp4_ue8m0(torch.randn(T, 128, device=DEV, generator=g), 32)
    w = torch.randn(1, H, device=DEV, generator=g)
    qpos = torch.tensor([T + 5], dtype=torch.int32, device=DEV)
    return qp, qe, w, kp, ke, qpos


def variants():
    """name -> (fn, output getter or None)."""
    qp, qe, w, kp, ke, qpos = inputs()
    kw = dict(ratio=1, topk=TOPK, candidate_blocks=CANDS, with_stats=False)
    out = {}
    for pdl in (False, True):
        for ids in (True, False):
            name = f"step_{'pdl' if pdl else 'serial'}{'_ids' if ids else ''}"
            out[name] = (lambda pdl=pdl, ids=ids: ix.indexer_topk(qp, qe, w, kp, ke, qpos, pdl=pdl,
                                                                  candidate_ids=ids, **kw))
    out["step_pdl_seq"] = lambda: ix.indexer_topk(qp, qe, w, kp, ke, qpos, pdl=True, overlap_selections=False, **kw)
    nvis, pin, wq = ix.step_prep(qpos, w, 1, T, 8, 128 ** -0.5)
    scores, bmax = ix.index_scores(qp, qe, wq, kp, ke, nvis, block_max=True, block_q=1)
    out["prep"] = lambda: ix.step_prep(qpos, w, 1, T, 8, 128 ** -0.5)

    def prep_score():
        n, _, q = ix.step_prep(qpos, w, 1, T, 8, 128 ** -0.5)
        return ix.index_scores(qp, qe, q, kp, ke, n, block_max=True, block_q=1)
    out["prep_score"] = prep_score
    out["topk_share2"] = lambda: ix.topk_select(scores, TOPK, share=2)
    for mask in (False, True):
        t = "_mask" if mask else ""
        out[f"cands_share2{t}"] = (lambda mask=mask: ix.topk_select(bmax, CANDS, pin, pool=ix.SIDE_POOL, share=2,
                                                                   as_mask=mask))
        out[f"cands_full{t}"] = lambda mask=mask: ix.topk_select(bmax, CANDS, pin, pool=ix.SIDE_POOL, as_mask=mask)
    out["topk_full"] = lambda: ix.topk_select(scores, TOPK)

    def selections(mask=True):
        side = side_stream(scores.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            c = ix.topk_select(bmax, CANDS, pin, pool=ix.SIDE_POOL, share=2, as_mask=mask)
        i = ix.topk_select(scores, TOPK, share=2)
        torch.cuda.current_stream().wait_stream(side)
        return i, c
    out["selections_ids"] = lambda: selections(False)
    out["selections_mask"] = selections
    return out


def multi_query(S: int, out: dict):
    """The whole step at S queries (kernels_attention.py's data: one adversarial query-head row and key row when
    S > 1), PDL off / on x candidates as ids / as flags: do_bench (host launch included) and graph replay."""
    from benchmarks.common import ms
    from benchmarks.kernels_attention import _indexer_data

    qp, qe, w, kp, ke = _indexer_data(S, H, T, spread=S > 1)
    qpos = torch.full((S,), T + 5, dtype=torch.int32, device=DEV) - torch.arange(S, device=DEV, dtype=torch.int32)
    for pdl in (False, True):
        for ids in (True, False):
            f = lambda pdl=pdl, ids=ids: ix.indexer_topk(qp, qe, w, kp, ke, qpos, ratio=1, topk=TOPK,  # noqa: E731
                                                         candidate_blocks=CANDS, with_stats=False, pdl=pdl,
                                                         candidate_ids=ids)
            f()
            torch.cuda.synchronize()
            g = ms_graph(f, rep=50)
            r = {"do_bench_us": ms(f) * 1e3, "graph_us": float(g) * 1e3 if not isinstance(g, str) else g,
                 "graph_cold_us": getattr(g, "cold", 0) * 1e3}
            out[f"S{S}_pdl{int(pdl)}_ids{int(ids)}"] = r
            print(S, pdl, ids, r, flush=True)


def with_kpt(fn, kpt: int):
    """fn run (and so captured) with `indexer_topk.SPLIT_KEYS_PER_THREAD` = kpt."""
    def run():
        old = tk.SPLIT_KEYS_PER_THREAD
        tk.SPLIT_KEYS_PER_THREAD = kpt
        try:
            return fn()
        finally:
            tk.SPLIT_KEYS_PER_THREAD = old
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", default=None, help="regex over the variant names")
    ap.add_argument("--rep", type=int, default=100, help="graph replays a timing")
    ap.add_argument("--kpt", default="", help="comma-separated keys a thread (SPLIT_KEYS_PER_THREAD) to time the "
                    "step_pdl, topk_* and cands_*_mask variants at as well (`_kptN` rows)")
    ap.add_argument("--queries", default="", help="comma-separated query counts: time only the whole step at each "
                    "(PDL off / on x candidates as ids / flags; `multi_query`), e.g. 4,32")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    if a.queries:
        doc = {"what": "indexer step at S queries x 131,072 entries (candidate source), µs", "env": env_info(),
               "rows": {}}
        for S in [int(x) for x in a.queries.split(",") if x]:
            multi_query(S, doc["rows"])
            write_json(a.out, doc)
        return
    vs = variants()
    for kpt in [int(x) for x in a.kpt.split(",") if x]:
        for n in ("step_pdl", "topk_share2", "topk_full", "cands_share2_mask", "selections_mask"):
            vs[f"{n}_kpt{kpt}"] = with_kpt(vs[n], kpt)
    names = [n for n in vs if not a.only or re.search(a.only, n)]
    doc = {"what": "one-query indexer step (131,072 entries, candidate source): graph replay, warm and L2-cold, µs",
           "env": env_info(), "repeat": a.repeat, "rows": {n: {"warm_us": [], "cold_us": []} for n in names}}
    base = vs["step_serial_ids"]()
    torch.cuda.synchronize()
    for n in names:
        if n.startswith("step_"):
            r = vs[n]()
            doc["rows"][n]["same_indices"] = bool(torch.equal(r.topk, base.topk)
                                                  and torch.equal(r.cand_mask, base.cand_mask))
    for rnd in range(a.repeat):
        for n in names:
            t0 = time.time()
            g = ms_graph(vs[n], rep=a.rep)
            row = doc["rows"][n]
            if isinstance(g, str):
                row.setdefault("errors", []).append(g)
            else:
                row["warm_us"].append(round(float(g) * 1e3, 2))
                row["cold_us"].append(round(g.cold * 1e3, 2))
            print(f"[{rnd}] {n:16s} warm {row['warm_us'][-1:]} cold {row['cold_us'][-1:]} "
                  f"({time.time() - t0:.1f} s)", flush=True)
            write_json(a.out, doc)
    write_json(a.out, doc)


if __name__ == "__main__":
    main()
