"""Domain ops `dsv41.*`: the IR's view of the custom ops in `dsv41c/ops` (one row per op).

Schemas keep the custom ops' argument names, so the export converter binds them by name
and codegen lowers each back to `torch.ops.dsv41.<name>.default`. The reference
implementation of every op IS the custom op (which runs the reference model's primitive),
so the interpreter checks a plan against exactly what the eager model computes.

Shape rules: outputs follow the inputs, except `compressor_step`'s latents, whose row
count is data-dependent for ratio > 1 (the declared type names a fresh symbol, as after
`nonzero`; ratio 1 emits one row per token). Costs are first-order: matmul FLOPs of the
top-k experts for `moe`, 4·T·H·K·D for `sparse_attention`, bytes moved otherwise.

`compressor_step` writes its carry buffers (results 1 and 2 are them after the write).
The state appends and the packed KV formats are in `ir/ops_state.py`.
Known gaps: `moe` cost assumes every routed slot is filled.
"""
from __future__ import annotations

from dsv41c.ir.lazy_torch import torch
from dsv41c.ir.registry import Cost, ShapeError, register
from dsv41c.ir.shape_rules import memory_cost, need_tensor
from dsv41c.ir.symbolic import ANY
from dsv41c.ir.types import TensorType, bool_, f32, f64, i64


def _ops():
    import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41 on first use)

    return torch.ops.dsv41


def _call(name, *names):
    """Reference: torch.ops.dsv41.<name>(args in schema order)."""

    def impl(a):
        return getattr(_ops(), name)(*(a[n] for n in names))

    impl.__name__ = f"dsv41_{name}"
    return impl


def _acc(t: TensorType):
    return f64 if t.dtype is f64 else f32


def _same(a):
    return need_tensor(a.get("x", a.get("H")))


def _rows(t: TensorType, what: str):
    if t.rank < 1:
        raise ShapeError(f"{what} must have a leading token dim, got {t}")
    return t.shape[0]


# ---------------------------------------------------------------------------- fake quantization
for _n, _block in (("fq_window_kv", 32), ("fq_compressed_kv", 16), ("fq_indexer", 32)):
    def _fq_shape(a, _block=_block, _n=_n):
        t = need_tensor(a.x)
        if isinstance(t.shape[-1], int) and t.shape[-1] % _block:
            raise ShapeError(f"{_n}: last dim {t.shape[-1]} is not a multiple of the block {_block}")
        return t

    register(f"dsv41.{_n}(Tensor x) -> Tensor", shape=_fq_shape, impl=_call(_n, "x"),
             cost=lambda a, r: Cost(8 * r[0].numel, memory_cost(a, r).bytes))


# ---------------------------------------------------------------------------- attention
def _sparse_attention(a):
    q, pool, idx = need_tensor(a.q), need_tensor(a.pool), need_tensor(a.idx)
    if q.rank != 3 or pool.rank != 2 or idx.rank != 2:
        raise ShapeError(f"sparse_attention: q [T, H, D], pool [M, D], idx [T, K]; got {q}, {pool}, {idx}")
    return q


def _sparse_attention_cost(a, r):
    T, H, D = a.q.shape
    return Cost(4 * T * H * a.idx.shape[1] * D, memory_cost(a, r).bytes)


register("dsv41.sparse_attention(Tensor q, Tensor pool, Tensor idx, Tensor sink, float scale) -> Tensor",
         shape=_sparse_attention, impl=_call("sparse_attention", "q", "pool", "idx", "sink", "scale"),
         cost=_sparse_attention_cost)


# ---------------------------------------------------------------------------- compressor
def _compressor(a):
    x, wkv = need_tensor(a.x), need_tensor(a.wkv)
    n = _rows(x, "compressor_step x") if a.ratio == 1 else ANY  # ratio > 1: data-dependent (pos % ratio)
    return TensorType(x.dtype, (n, wkv.shape[0])), need_tensor(a.buf_kv), need_tensor(a.buf_gate)


register("dsv41.compressor_step(Tensor x, Tensor pos, Tensor wkv, Tensor? wgate, Tensor norm_w, Tensor buf_kv, "
         "Tensor buf_gate, int ratio, float eps) -> (Tensor, Tensor, Tensor)", shape=_compressor,
         impl=_call("compressor_step", "x", "pos", "wkv", "wgate", "norm_w", "buf_kv", "buf_gate", "ratio", "eps"),
         writes=("buf_kv", "buf_gate"), updates=(("buf_kv", 1), ("buf_gate", 2)),  # the ratio-2 carry, in place
         cost=lambda a, r: Cost(2 * a.x.numel * a.wkv.shape[0] * (2 if a.wgate is not None else 1),
                                memory_cost(a, r).bytes))


# ---------------------------------------------------------------------------- indexer
def _index_scores(a):
    q, w, k = need_tensor(a.q), need_tensor(a.w), need_tensor(a.keys)
    return TensorType(w.dtype, (_rows(q, "index_scores q"), _rows(k, "index_scores keys")))


register("dsv41.index_scores(Tensor q, Tensor w, Tensor keys, Tensor positions, int ratio) -> Tensor",
         shape=_index_scores, impl=_call("index_scores", "q", "w", "keys", "positions", "ratio"),
         cost=lambda a, r: Cost(2 * a.q.numel * a.keys.shape[0], memory_cost(a, r).bytes))
register("dsv41.candidate_blocks(Tensor scores, Tensor positions, int ratio, int topk_blocks, int block_size) "
         "-> Tensor", shape=lambda a: need_tensor(a.scores).with_dtype(bool_),
         impl=_call("candidate_blocks", "scores", "positions", "ratio", "topk_blocks", "block_size"))
register("dsv41.select_topk(Tensor scores, int k, Tensor? candidates) -> Tensor",
         shape=lambda a: TensorType(i64, (_rows(need_tensor(a.scores), "select_topk scores"), a.k)),
         impl=_call("select_topk", "scores", "k", "candidates"))


# ---------------------------------------------------------------------------- MoE, Engram, mHC
def _moe_cost(a, r):
    T, D = a.x.shape
    inter = a.sw1.shape[0]
    return Cost(6 * T * D * inter * (a.top_k + 1), memory_cost(a, r).bytes)


def _moe_shape(a):
    if len(a.experts) % 3:
        raise ShapeError(f"moe: experts must be [w1, w2, w3] per expert, got {len(a.experts)} tensors")
    return need_tensor(a.x)


register("dsv41.moe(Tensor x, Tensor gate_w, Tensor gate_bias, Tensor[] experts, Tensor sw1, Tensor sw2, Tensor sw3, "
         "int top_k, float route_scale, float swiglu_limit, float gate_temp, bool norm_topk_prob) -> Tensor",
         shape=_moe_shape, cost=_moe_cost,
         impl=_call("moe", "x", "gate_w", "gate_bias", "experts", "sw1", "sw2", "sw3", "top_k", "route_scale",
                    "swiglu_limit", "gate_temp", "norm_topk_prob"))
register("dsv41.engram_hash(Tensor history, Tensor ids, int[] layer_ids, int layer_pos, int max_ngram, int n_heads, "
         "int vocab, int compressed_vocab, int pad_id) -> Tensor",
         shape=lambda a: TensorType(i64, (_rows(need_tensor(a.ids), "engram_hash ids"),
                                          (a.max_ngram - 1) * a.n_heads)),
         impl=_call("engram_hash", "history", "ids", "layer_ids", "layer_pos", "max_ngram", "n_heads", "vocab",
                    "compressed_vocab", "pad_id"))
register("dsv41.engram_apply(Tensor H, Tensor rows, Tensor table, Tensor wkv, Tensor q_weight, Tensor k_weight, "
         "float eps) -> Tensor", shape=lambda a: need_tensor(a.H),
         impl=_call("engram_apply", "H", "rows", "table", "wkv", "q_weight", "k_weight", "eps"),
         cost=lambda a, r: Cost(2 * a.rows.shape[0] * a.wkv.numel, memory_cost(a, r).bytes))


def _hc_mixes(a):
    H = need_tensor(a.H)
    if H.rank != 3:
        raise ShapeError(f"hc_mixes: H must be [T, hc, D], got {H}")
    T, hc, acc = H.shape[0], H.shape[1], _acc(H)
    return TensorType(acc, (T, hc)), TensorType(acc, (T, hc)), TensorType(acc, (T, hc, hc))


register("dsv41.hc_mixes(Tensor H, Tensor fn, Tensor base, Tensor scale, int iters, float hc_eps, float norm_eps) "
         "-> (Tensor, Tensor, Tensor)", shape=_hc_mixes,
         impl=_call("hc_mixes", "H", "fn", "base", "scale", "iters", "hc_eps", "norm_eps"),
         cost=lambda a, r: Cost(2 * a.H.numel * a.fn.shape[0], memory_cost(a, r).bytes))


# ---------------------------------------------------------------------------- stored weights
_STORED = {"fp8_block": ("fp8e4m3",), "fp8_row": ("fp8e4m3",), "fp4_row": ("fp4e2m1x2",), "cast": None}


def _dequant_weight(a):
    w = need_tensor(a.w)
    if a.fmt not in _STORED:
        raise ShapeError(f"dequant_weight: unknown format {a.fmt!r} (known: {', '.join(_STORED)})")
    want = _STORED[a.fmt]
    if want is not None and w.dtype.name not in want:
        raise ShapeError(f"dequant_weight {{fmt = {a.fmt}}}: the stored tensor must be {want[0]}, got {w}")
    if (a.fmt == "cast") != (a.scale is None):
        raise ShapeError(f"dequant_weight {{fmt = {a.fmt}}}: " + ("a cast takes no scale" if a.fmt == "cast"
                                                                  else "a quantized tensor needs its scale"))
    shape = tuple(w.shape[:-1]) + ((w.shape[-1] * 2,) if a.fmt == "fp4_row" else (w.shape[-1],))
    return TensorType(a.dtype, shape)


register("dsv41.dequant_weight(Tensor w, Tensor? scale, str fmt, dtype dtype, bool bf16_round, int block) -> Tensor",
         shape=_dequant_weight, impl=_call("dequant_weight", "w", "scale", "fmt", "dtype", "bf16_round", "block"),
         cost=lambda a, r: Cost(r[0].numel, memory_cost(a, r).bytes))

_ROW_FORMATS = ("fp8_row", "fp4_row", "cast")


def _dequant_rows(a):
    whole = _dequant_weight(a)
    rows = need_tensor(a.rows)
    if a.fmt not in _ROW_FORMATS or whole.rank != 2:
        raise ShapeError(f"dequant_rows: a 2-D row-scaled weight ({', '.join(_ROW_FORMATS)}), got {a.fmt} {a.w}")
    if rows.dtype is not i64:
        raise ShapeError(f"dequant_rows: rows must be i64, got {rows}")
    return TensorType(a.dtype, tuple(rows.shape) + (whole.shape[-1],))


register("dsv41.dequant_rows(Tensor w, Tensor? scale, Tensor rows, str fmt, dtype dtype, bool bf16_round, int block) "
         "-> Tensor", shape=_dequant_rows,
         impl=_call("dequant_rows", "w", "scale", "rows", "fmt", "dtype", "bf16_round", "block"),
         cost=lambda a, r: Cost(r[0].numel, memory_cost(a, r).bytes))
