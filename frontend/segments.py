"""The pieces of the serving step (prologue, Engram, the parts of a layer, epilogue).

A `Segment` is an nn.Module with named tensor inputs (activations first, then its weights
under LOCAL checkpoint names such as `attn.wq_a.weight`), named outputs, and `body(dict)
-> dict`. A layer is split where the kinds of layer differ, so that each distinct piece
exists once and is exported once, then stamped per layer with the weights renamed
`layers.L.` + local name:
    AttnIn        mHC attention-site mixes, collapse, attn_norm, q / kv projections  (every layer)
    Compress(r)   compressor + indexer keys, appended to the group caches            (KV sources)
                  (`dsv41.cache_append` at row pos // r of the fixed-capacity cache)
    Index(r, c)   indexer queries, scores, candidates, top-k                         (index sources)
    Attend(comp)  window (+ selected compressed rows) sparse attention, output proj. (every layer)
                  (then `dsv41.ring_append` of the chunk's KV rows into the window ring)
    Ffn           expand, FFN-site mixes, collapse, ffn_norm, MoE, expand            (every layer)
`StepModel` holds one of each; `frontend/step.py` routes values between them. Sub-steps
run in child modules named like the checkpoint's sub-modules (`attn`, `attn.compressor`,
`attn.indexer`, `ffn`, `hc_attn`, `hc_ffn`) so that torch.export's `nn_module_stack`
gives every op its source location.

The math is the reference's (frontend/model/*, spec §3), in the order `ReferenceModel`
runs it in its serving form; the KV-path fake quantizers, sparse attention, compressor,
indexer, MoE, Engram and mHC mixes are `torch.ops.dsv41.*` (dsv41c/ops). With
`kv_quant=False` the quantizer ops are left out, as the reference skips them.
State writes are explicit ops (`dsv41c/ops/state.py`), each after every read of the buffer's old
value: the caches are fixed-capacity buffers (rows past pos // ratio unwritten and masked by the
readers), the window a ring of W - 1 rows (slot p % (W - 1)). A write carries its buffer's short
name (`comp_kv`); the tracer stamps the full state name (`state.comp_kv.2`).
Known gaps: DSpark stages are not segments yet; the token tail and the position are replaced whole
(small values, not appended).
"""
from __future__ import annotations

import torch
from torch import nn

import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)
from dsv41c.frontend.layer_plan import layer_plan
from dsv41c.prims.attention import attn_out, attn_q
from dsv41c.prims.mhc import hc_collapse, hc_expand
from dsv41c.prims.norms import acc_dtype, rms_norm
from dsv41c.prims.rope import apply_rope, inv_freq_compress, inv_freq_main, rope_cos_sin
from dsv41c.prims.state import ring_window_indices

ops = torch.ops.dsv41


class Segment(nn.Module):
    act_names: tuple = ()
    out_names: tuple = ()

    def __init__(self, m: "StepModel", weight_names=()):
        super().__init__()
        self.m, self.cfg = m, m.cfg
        self.weight_names = tuple(weight_names)

    @property
    def input_names(self) -> tuple:
        return tuple(self.act_names) + self.weight_names

    def forward(self, *args):
        out = self.body(dict(zip(self.input_names, args)))
        return tuple(out[k] for k in self.out_names)

    def fq(self, name, x):
        return getattr(ops, name)(x) if self.m.kv_quant else x

    def key(self) -> tuple:
        """What makes this segment's graph (beyond the config): equal keys trace equally."""
        return (type(self).__name__,)


class Prologue(Segment):
    act_names = ("ids", "pos", "tail")
    out_names = ("H", "pre", "positions", "cos_m", "sin_m", "cos_c", "sin_c", "inv_c", "pos", "tail")

    def body(self, a):
        c, acc = self.cfg, self.m.acc
        ids, pos = a["ids"], a["pos"]
        T = ids.shape[0]
        positions = pos + torch.arange(T)
        inv_m, inv_c = inv_freq_main(c, acc), inv_freq_compress(c, acc)
        cos_m, sin_m = rope_cos_sin(inv_m, positions)
        cos_c, sin_c = rope_cos_sin(inv_c, positions)
        x0 = a["embed.weight"][ids]
        H = x0.unsqueeze(-2).expand(T, c.hc_mult, c.hidden_size).contiguous()
        # the reference's zeros + pre[:, 0] = 1 (the first collapse takes stream 0), without a write
        pre = (torch.arange(c.hc_mult) == 0).to(acc).expand(T, c.hc_mult).contiguous()
        tail = torch.cat([a["tail"], ids])[T:]
        return {"H": H, "pre": pre, "positions": positions, "cos_m": cos_m, "sin_m": sin_m, "cos_c": cos_c,
                "sin_c": sin_c, "inv_c": inv_c, "pos": pos + T, "tail": tail}


class Epilogue(Segment):
    act_names = ("H", "pre")
    out_names = ("logits",)

    def body(self, a):
        h = rms_norm(hc_collapse(a["H"], a["pre"]), a["norm.weight"], self.cfg.rms_norm_eps)
        return {"logits": (h @ a["head.weight"].T).to(self.m.acc)}


class Engram(Segment):
    act_names = ("H", "ids", "tail")
    out_names = ("H",)

    def __init__(self, m, e: int):
        super().__init__(m, ("embed.weight", "wkv.weight", "q_weight", "k_weight"))
        self.e = e

    def key(self):
        return ("Engram", self.e)

    def body(self, a):
        c = self.cfg
        rows = ops.engram_hash(a["tail"], a["ids"], list(c.engram_layer_ids), self.e, c.engram_max_ngram_size,
                               c.engram_n_heads, c.engram_vocab_size, c.engram_compressed_vocab_size,
                               c.engram_pad_token_id)
        H = ops.engram_apply(a["H"], rows, a["embed.weight"], a["wkv.weight"], a["q_weight"], a["k_weight"],
                             c.rms_norm_eps)
        return {"H": H}


class Mixes(nn.Module):
    """One mHC site's pre/post/comb (a child module so its ops carry `hc_attn` / `hc_ffn`)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    def forward(self, H, fn, base, scale):
        c = self.cfg
        return ops.hc_mixes(H, fn, base, scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps)


class _Call(nn.Module):
    """A child module that runs `fn(*args)`: its ops get the child's name as location."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class AttnIn(Segment):
    """mHC attention-site mixes, collapse + attn_norm, q / kv projections (window KV quantized)."""
    act_names = ("H", "pre", "cos", "sin")
    out_names = ("x", "q", "q_res", "kv", "a_pre", "a_post", "a_comb")

    def __init__(self, m):
        super().__init__(m, ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "attn_norm.weight", "attn.wq_a.weight",
                             "attn.q_norm.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.kv_norm.weight"))
        self.hc_attn, self.attn = Mixes(m.cfg), _Call(self._proj)

    def _proj(self, x, a):
        c, p, eps = self.cfg, "attn.", self.cfg.rms_norm_eps
        q, q_res = attn_q(x, a[p + "wq_a.weight"], a[p + "q_norm.weight"], a[p + "wq_b.weight"],
                          c.num_attention_heads, a["cos"], a["sin"], eps)
        kv = apply_rope(rms_norm(x @ a[p + "wkv.weight"].T, a[p + "kv_norm.weight"], eps), a["cos"], a["sin"])
        return q, q_res, self.fq("fq_window_kv", kv)

    def body(self, a):
        H = a["H"]
        a_pre, a_post, a_comb = self.hc_attn(H, a["hc_attn_fn"], a["hc_attn_base"], a["hc_attn_scale"])
        x = rms_norm(hc_collapse(H, a["pre"]), a["attn_norm.weight"], self.cfg.rms_norm_eps)
        q, q_res, kv = self.attn(x, a)
        return {"x": x, "q": q, "q_res": q_res, "kv": kv, "a_pre": a_pre, "a_post": a_post, "a_comb": a_comb}


class Compress(Segment):
    """KV source (mode full): new entries appended to the group caches at row pos // ratio, new carry."""

    def __init__(self, m, ratio: int):
        names = ["attn.compressor.wkv.weight"] + (["attn.compressor.wgate.weight"] if ratio > 1 else [])
        names += ["attn.compressor.norm.weight", "attn.indexer.wk.weight", "attn.indexer.k_norm.weight"]
        super().__init__(m, names)
        self.ratio = ratio
        bufs = ("buf_kv", "buf_gate") if ratio > 1 else ()
        self.act_names = ("x", "pos", "inv_c", "comp_kv", "index_k") + bufs
        self.out_names = ("comp_kv", "index_k") + bufs
        self.attn = nn.Module()
        self.attn.compressor = _Call(self._compress)

    def key(self):
        return ("Compress", self.ratio)

    def _compress(self, a):
        c, r, acc = self.cfg, self.ratio, self.m.acc
        p, x = "attn.compressor.", a["x"]
        bk, bg = (a["buf_kv"], a["buf_gate"]) if r > 1 else (x.new_zeros(0, c.head_dim, dtype=acc),) * 2
        lat, bk, bg = ops.compressor_step(x, a["pos"], a[p + "wkv.weight"], a.get(p + "wgate.weight"),
                                          a[p + "norm.weight"], bk, bg, r, c.rms_norm_eps)
        # entries so far: only complete groups are emitted, so pos // r; the new ones sit at positions r·(first + j)
        first = a["pos"] if r == 1 else a["pos"] // r
        cos, sin = rope_cos_sin(a["inv_c"], (first + torch.arange(lat.shape[0])) * r)
        k = rms_norm(lat @ a["attn.indexer.wk.weight"].T, a["attn.indexer.k_norm.weight"], c.rms_norm_eps)
        keys = self.fq("fq_indexer", apply_rope(k, cos, sin))
        comp = self.fq("fq_compressed_kv", apply_rope(lat, cos, sin))
        out = {"comp_kv": ops.cache_append(a["comp_kv"], comp, first, r, "comp_kv"),
               "index_k": ops.cache_append(a["index_k"], keys, first, r, "index_k")}
        if r > 1:
            out.update(buf_kv=bk, buf_gate=bg)
        return out

    def body(self, a):
        return self.attn.compressor(a)


class Index(Segment):
    """Index source (full / reindex): score the queries against the group's keys, top-k (+ candidates)."""

    def __init__(self, m, ratio: int, candidates):
        super().__init__(m, ("attn.indexer.wq_b.weight", "attn.indexer.weights_proj.weight"))
        self.ratio, self.candidates = ratio, candidates
        self.act_names = ("x", "q_res", "index_k", "positions", "cos", "sin") + (
            ("cand",) if candidates == "consumes" else ())
        self.out_names = ("topk",) + (("cand",) if candidates == "produces" else ())
        self.attn = nn.Module()
        self.attn.indexer = _Call(self._index)

    def key(self):
        return ("Index", self.ratio, self.candidates)

    def _index(self, a):
        c, p, pos = self.cfg, "attn.indexer.", a["positions"]
        q = (a["q_res"] @ a[p + "wq_b.weight"].T).unflatten(-1, (c.index_n_heads, -1))
        q = self.fq("fq_indexer", apply_rope(q, a["cos"], a["sin"]))
        x = a["x"]
        w = (x @ a[p + "weights_proj.weight"].T).to(acc_dtype(x.dtype)) * c.index_n_heads ** -0.5
        scores = ops.index_scores(q, w, a["index_k"], pos, self.ratio)
        out = {}
        if self.candidates == "produces":
            out["cand"] = ops.candidate_blocks(scores, pos, self.ratio, c.candidate_topk_blocks,
                                               c.candidate_block_size)
        out["topk"] = ops.select_topk(scores, c.index_topk, a["cand"] if self.candidates == "consumes" else None)
        return out

    def body(self, a):
        return self.attn.indexer(a)


class Attend(Segment):
    """Window (+ selected compressed entries) sparse attention with sinks, output projection."""
    out_names = ("y", "window")

    def __init__(self, m, compressed: bool):
        super().__init__(m, ("attn.attn_sink", "attn.wo_a.weight", "attn.wo_b.weight"))
        self.compressed = compressed
        self.act_names = ("q", "kv", "window", "positions", "pos", "cos", "sin") + (
            ("topk", "comp_kv") if compressed else ())
        self.attn = _Call(self._attend)

    def key(self):
        return ("Attend", self.compressed)

    def _attend(self, a):
        c, W, p = self.cfg, self.cfg.sliding_window, "attn."
        kv, win = a["kv"], a["window"]
        pool = torch.cat([win, kv])
        # the ring holds W-1 rows: position p < pos at slot p % (W-1), this chunk's rows after it
        idx = ring_window_indices(a["positions"], a["pos"], win.shape[0], W)
        if self.compressed:
            sel = a["topk"]
            # nothing selected (-1) stays -1: the keys of the reference's "no compressed branch"
            idx = torch.cat([idx, torch.where(sel < 0, sel, sel + pool.shape[0])], dim=-1)
            pool = torch.cat([pool, a["comp_kv"]])
        o = ops.sparse_attention(a["q"], pool, idx, a[p + "attn_sink"], c.head_dim ** -0.5)
        y = attn_out(o, a["cos"], a["sin"], a[p + "wo_a.weight"], a[p + "wo_b.weight"], c.o_groups)
        # the write comes after every read of the old ring (pool above)
        return {"y": y, "window": ops.ring_append(win, kv, a["pos"], "window")}

    def body(self, a):
        return self.attn(a)


class Ffn(Segment):
    """Expand the attention output into the streams, FFN-site mixes, collapse + ffn_norm, MoE, expand."""
    act_names = ("y", "H", "a_pre", "a_post", "a_comb")
    out_names = ("H", "pre")

    def __init__(self, m, n_experts: int | None = None):
        c = m.cfg
        # n_experts < n_routed_experts only for the tracer's stand-in (trace.py stamps all experts)
        self.n_experts = c.n_routed_experts if n_experts is None else n_experts
        names = ["hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", "ffn_norm.weight", "ffn.gate.weight", "ffn.gate.bias"]
        names += [f"ffn.experts.{e}.{w}.weight" for e in range(self.n_experts) for w in ("w1", "w2", "w3")]
        names += [f"ffn.shared_experts.{w}.weight" for w in ("w1", "w2", "w3")]
        super().__init__(m, names)
        self.hc_ffn, self.ffn = Mixes(c), _Call(self._moe)

    def key(self):
        return ("Ffn", self.n_experts)

    def _moe(self, x, a):
        c, p = self.cfg, "ffn."
        experts = [a[f"{p}experts.{e}.{w}.weight"] for e in range(self.n_experts) for w in ("w1", "w2", "w3")]
        return ops.moe(x, a[p + "gate.weight"], a[p + "gate.bias"], experts, a[p + "shared_experts.w1.weight"],
                       a[p + "shared_experts.w2.weight"], a[p + "shared_experts.w3.weight"], c.num_experts_per_tok,
                       c.routed_scaling_factor, c.swiglu_limit, c.gate_temp, c.norm_topk_prob)

    def body(self, a):
        eps = self.cfg.rms_norm_eps
        H = hc_expand(a["y"], a["H"], a["a_post"], a["a_comb"])
        f_pre, f_post, f_comb = self.hc_ffn(H, a["hc_ffn_fn"], a["hc_ffn_base"], a["hc_ffn_scale"])
        x = rms_norm(hc_collapse(H, a["a_pre"]), a["ffn_norm.weight"], eps)
        return {"H": hc_expand(self.ffn(x, a), H, f_post, f_comb), "pre": f_pre}


class StepModel:
    """The segments of one config, built once and shared by every layer of the same kind."""

    def __init__(self, cfg, kv_quant: bool = True, dtype=torch.float32):
        self.cfg, self.kv_quant, self.dtype, self.acc = cfg, bool(kv_quant), dtype, acc_dtype(dtype)
        self.plan = layer_plan(cfg)[: cfg.num_hidden_layers]
        self.prologue = Prologue(self, ("embed.weight",))
        self.epilogue = Epilogue(self, ("norm.weight", "head.weight"))
        self.engram = [Engram(self, e) for e in range(len(cfg.engram_layer_ids))]
        self.attn_in, self.ffn = AttnIn(self), Ffn(self)
        self.attend = {False: Attend(self, False), True: Attend(self, True)}
        self._compress, self._index = {}, {}

    def compress(self, ratio: int) -> Compress:
        if ratio not in self._compress:
            self._compress[ratio] = Compress(self, ratio)
        return self._compress[ratio]

    def index(self, ratio: int, candidates) -> Index:
        k = (ratio, candidates)
        if k not in self._index:
            self._index[k] = Index(self, ratio, candidates)
        return self._index[k]
