"""Random CSA2 indexer modules for the numeric tests of the CSA2 passes (share-csa2-state, lower-indexer-int8).

`random_csa2_module(seed)` builds a verified module with one KV group the way the tracer lays it out
(locations `layers.1.attn.compressor`, `layers.L.attn.indexer`): indexer keys projected by an
`attn.indexer.wk` weight and fake-quantized, appended to the persistent key state, queries of two index
sources fake-quantized, their scores, the source's candidate blocks and top-k, a Reindex layer's top-k
over the candidates. Per seed it varies what the passes must get right:
- the widths (heads, head dim 32 or 64), the ratio, T static (1 or 3) or symbolic;
- the per-channel scales' spread (exp of a scaled random input), so that rows fail the INT8 range proof
  and take the fallbacks, or do not;
- queries that are NOT fake-quantized (the float path must stay), keys off the FP4 grid (a raw state);
- a Reuse layer that recomputes the source's scores and top-k behind a stream event (a duplicate), and one
  that recomputes them with another ratio or other head weights (not a duplicate: must stay).
`random_inputs` (ir/testing.py) makes its inputs; the module returns every score and top-k, so a pass
that changes a number fails `same_outputs`. Deterministic in `seed`.
"""
from __future__ import annotations

import random

from dsv41c.ir.builder import Builder
from dsv41c.ir.core import Module
from dsv41c.ir.symbolic import sym
from dsv41c.ir.types import EVENT, TensorType, f32, i64


def random_csa2_module(seed: int) -> Module:
    rng = random.Random(seed)
    h, d = rng.choice([2, 4]), rng.choice([32, 64])
    T = rng.choice([1, 3, sym("T")])
    ratio = rng.choice([1, 2])
    spread = rng.choice([0.0, 1.0, 3.0])
    N = sym("N1")
    m = Module(attrs={})
    f = m.add_function("decode", [
        ("qf1", TensorType(f32, (T, h, d))), ("w1", TensorType(f32, (T, h))),
        ("qf3", TensorType(f32, (T, h, d))), ("w3", TensorType(f32, (T, h))),
        ("scale", TensorType(f32, (d,))), ("lat", TensorType(f32, (T, d))),
        ("layers.1.attn.indexer.wk.weight", TensorType(f32, (d, d))),
        ("state.index_k.1", TensorType(f32, (N, d))), ("positions", TensorType(i64, (T,)))])
    qf1, w1, qf3, w3, scale, lat, wk, state, positions = f.args
    state.attrs = {"placement": "persistent"}
    b = Builder(f)
    with b.at("layers.1.attn.compressor"):
        spread_v = b.op("aten.exp", b.op("aten.mul", scale, other=spread))
        wkt = b.op("aten.permute", wk, dims=(1, 0))
        k = b.op("aten.mul", b.op("aten.matmul", lat, wkt), spread_v)
        k = b.op("dsv41.fq_indexer", k)
        pick = rng.random()  # the key state as given (the plan's own FP4 keys, or off the grid), quantized, or raw
        base = state if pick < 0.4 else b.op("dsv41.fq_indexer", state) if pick < 0.8 else \
            b.op("aten.mul", state, other=1.0)
        keys = b.op("aten.cat", base, k)
    with b.at("layers.1.attn.indexer"):
        q1 = b.op("aten.mul", qf1, spread_v)
        q1 = b.op("dsv41.fq_indexer", q1) if rng.random() < 0.85 else q1
        s1 = b.op("dsv41.index_scores", q1, w1, keys, positions, ratio=ratio)
        cand = b.op("dsv41.candidate_blocks", s1, positions, ratio=ratio, topk_blocks=rng.choice([1, 2]),
                    block_size=rng.choice([2, 4]))
        kk = rng.choice([1, 2, 4])
        t1 = b.op("dsv41.select_topk", s1, k=kk)
    outs = [s1, t1]
    for layer in (2,):
        kind = rng.choice(["none", "duplicate", "other_ratio", "other_w"])
        if kind == "none":
            continue
        b.op("stream.record", stream=0, result_types=[EVENT], loc=f"layers.{layer}.attn")
        with b.at(f"layers.{layer}.attn.indexer"):
            r = 3 - ratio if kind == "other_ratio" else ratio
            s2 = b.op("dsv41.index_scores", q1, w3 if kind == "other_w" else w1, keys, positions, ratio=r)
            outs += [s2, b.op("dsv41.select_topk", s2, k=kk)]
    with b.at("layers.3.attn.indexer"):
        q3 = b.op("dsv41.fq_indexer", b.op("aten.mul", qf3, spread_v))
        s3 = b.op("dsv41.index_scores", q3, w3, keys, positions, ratio=ratio)
        outs += [s3, b.op("dsv41.select_topk", s3, cand, k=kk)]
    b.ret(*outs)
    return m
