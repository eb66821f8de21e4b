"""The whole text model, in two forms that must agree (spec §2, §3.0).

Global forward (spec §3.0): x0 = embed(ids); H = x0 copied to hc streams; pre = one-hot
stream 0; per layer L: [Engram] -> attention site -> FFN site (mHC single-pass, mhc.py);
logits = head(norm(collapse(H, pre_last))) in fp32 (float64 in the float64 mode).

Form (a) `forward_full(ids)`: one forward from position 0 with masks over all positions,
as HF's eager model: every layer's window is a dense sliding-window causal mask, each KV
source compresses the whole sequence (`compressor_full`), the compressed part of the mask is
the index source's top-k bias, and attention is `dense_attention`.
Form (b) the serving form with explicit state (state.py): `prefill(state, chunk)` for a
chunk of any length continuing at `state.pos`, `decode(state, token)`. The window comes
from the state's last W-1 rows, compressors carry incomplete groups (`compressor_step`),
compressed entries and indexer keys are appended per KV group, and attention gathers
each query's keys by index (`sparse_attention`). Both forms share the projections, mHC,
MoE, Engram, indexer scoring and top-k, so agreement tests the window / grouping /
visibility / masking logic, which is where chunked serving goes wrong.

CSA2 wiring (layer_plan.py): a `full` layer runs its group's compressor and indexer keys;
`full` and `reindex` layers score their own queries against the group's keys and publish
a top-k selection used by themselves and the following `reuse` layers; the candidate
source (`produces`) publishes a block mask that later index sources of its group
(`consumes`) apply. Groups keep separate caches (spec §7.2, NOT HF's no-cache concat).

Conventions (spec §7): ties toward the lower index (topk.py); `kv_quant=False` turns off
every KV-path fake quantization (FP8 window KV, FP4 compressed KV, FP4 indexer keys and
queries). dtype: float32 | float64 | bfloat16 weights/activations; fp32-critical parts run
in float32, or float64 in the float64 mode (everything is float64 there).
DSpark taps: the mean over the hc streams of the streams entering each layer of
`dspark_target_layer_ids` (its attention input, spec §3.11) — recorded per forward in
`last_taps` and turned into DSpark context rows in the serving state.
Known gaps: batch 1; no image spans (`bias_vl` routing and DEAD Engram tokens unused).
"""
from __future__ import annotations

import torch

from dsv41c.frontend.config import ModelConfig, load_config
from dsv41c.prims.engram_hash import engram_row_ids
from dsv41c.frontend.layer_plan import layer_plan
from dsv41c.frontend.model.errors import InputError
from dsv41c.prims.attention import (attn_kv, attn_out, attn_q, dense_attention, sparse_attention,
                                             window_bias, window_indices)
from dsv41c.prims.compressor import compressor_full, compressor_step
from dsv41c.prims.engram import chunk_row_ids, engram_apply
from dsv41c.prims.indexer import index_keys, index_query, indexer_select, topk_bias
from dsv41c.prims.mhc import hc_collapse, hc_expand, hc_mixes
from dsv41c.prims.moe import moe_forward
from dsv41c.prims.norms import acc_dtype, rms_norm
from dsv41c.prims.quant import fq_compressed_kv
from dsv41c.prims.rope import apply_rope, inv_freq_compress, inv_freq_main, rope_cos_sin
from dsv41c.frontend.model.state import State, new_state
from dsv41c.frontend.model.weights import Weights

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class _Fwd:
    """Per-forward shared values (HF's `shared` dict): positions, RoPE, published top-k."""

    def __init__(self, positions, state, rope):
        self.positions = positions
        self.state = state
        self.rope = rope          # {'main': (cos, sin), 'compress': (cos, sin)} at `positions`
        self.groups = {}          # full form: group -> (compressed kv, indexer keys)
        self.topk = {}            # index source layer -> selected entries [T, k] (or None)
        self.candidates = None    # candidate mask [T, N] of the candidate source
        self.taps = []


@torch.compiler.disable
def _engram_rows(ids, c, layer_pos: int, state):
    """The Engram hash's row ids: host-side integer arithmetic (numpy), kept out of torch.compile's graphs."""
    return (engram_row_ids(ids, c, layer_pos) if state is None
            else chunk_row_ids(c, layer_pos, state.tokens_tail, ids))


class ReferenceModel:
    def __init__(self, cfg: ModelConfig, state_dict: dict, dtype: torch.dtype = torch.float32,
                 kv_quant: bool = True, device=None):
        if isinstance(dtype, str):
            dtype = DTYPES[dtype]
        self.cfg, self.dtype, self.acc, self.kv_quant = cfg, dtype, acc_dtype(dtype), bool(kv_quant)
        # every tensor the model makes (positions, masks, state) is made on `device`, where the weights are
        self.device = torch.device(device or "cpu")
        self.w = Weights(state_dict, dtype, self.device)
        self.plan = layer_plan(cfg)
        self.n_layers = cfg.num_hidden_layers
        self.groups = {s.index: s.ratio for s in self.plan[: self.n_layers] if s.mode == "full"}
        self._inv = {"main": inv_freq_main(cfg, self.acc).to(self.device),
                     "compress": inv_freq_compress(cfg, self.acc).to(self.device)}
        self._rope_round = torch.bfloat16 if dtype == torch.bfloat16 else None
        self.has_dspark = cfg.num_nextn_predict_layers > 0 and "mtp.0.main_proj.weight" in self.w
        self.trace: dict | None = None  # set to {} to record top-k / candidate statistics
        self.last_taps: torch.Tensor | None = None

    # ------------------------------------------------------------------ public
    def new_state(self) -> State:
        c = self.cfg
        with torch.device(self.device):
            return new_state(self.n_layers, self.groups, c.head_dim, c.index_head_dim, c.hidden_size, self.dtype,
                             self.acc)

    def forward_full(self, ids) -> torch.Tensor:
        """Logits [T, vocab] of one forward from position 0 (HF-style dense masks)."""
        return self._forward(self.check_ids(ids), None)

    def prefill(self, state: State, ids, last_only: bool = False) -> torch.Tensor:
        """Logits [T, vocab] of a chunk continuing at state.pos ([1, vocab], the last position's, with
        `last_only`); updates `state`."""
        return self._forward(self.check_ids(ids), state, last_only)

    def decode(self, state: State, token: int) -> torch.Tensor:
        """Logits [vocab] of one token at state.pos; updates `state`."""
        return self._forward(self.check_ids([int(token)]), state)[0]

    def check_ids(self, ids) -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.int64, device=self.device).reshape(-1)
        if t.numel() == 0:
            raise InputError("no token ids given")
        bad = t[(t < 0) | (t >= self.cfg.vocab_size)]
        if bad.numel():
            raise InputError(f"token id {int(bad[0])} is out of range: the vocabulary has "
                             f"{self.cfg.vocab_size} tokens (ids 0..{self.cfg.vocab_size - 1})")
        return t

    def rope(self, kind: str, positions: torch.Tensor):
        return rope_cos_sin(self._inv[kind], positions, self._rope_round)

    # ------------------------------------------------------------------ forward
    def _forward(self, ids: torch.Tensor, state: State | None, last_only: bool = False) -> torch.Tensor:
        # the factory ops below allocate beside the weights; the forward body names its devices too, since
        # torch.compile (of _forward_here, in the benchmark) does not see this ambient device
        with torch.device(self.device):
            return self._forward_here(ids, state, last_only)

    def _forward_here(self, ids: torch.Tensor, state: State | None, last_only: bool = False) -> torch.Tensor:
        c, w = self.cfg, self.w
        T = ids.shape[0]
        pos0 = state.pos if state is not None else 0
        positions = torch.arange(pos0, pos0 + T, device=ids.device)
        fwd = _Fwd(positions, state, {k: self.rope(k, positions) for k in ("main", "compress")})
        x0 = w["embed.weight"][ids]
        H = x0.unsqueeze(-2).expand(T, c.hc_mult, c.hidden_size).contiguous()
        pre = torch.zeros(T, c.hc_mult, dtype=self.acc, device=ids.device)
        pre[:, 0] = 1.0  # the first collapse takes stream 0 only
        taps = set(c.dspark_target_layer_ids)
        for L in range(self.n_layers):
            s = self.plan[L]
            p = f"layers.{L}"
            if s.engram is not None:
                rows = _engram_rows(ids, c, s.engram, state)
                H = engram_apply(H, rows, w[f"{p}.engram.embed.weight"], w[f"{p}.engram.wkv.weight"],
                                 w[f"{p}.engram.q_weight"], w[f"{p}.engram.k_weight"], c.rms_norm_eps)
            if L in taps:
                fwd.taps.append(H.to(self.acc).mean(dim=-2))
            H, pre = self.block(p, H, pre, lambda x, L=L: self._attention(L, x, fwd), c.n_routed_experts,
                                c.num_experts_per_tok)
        if last_only:  # the head of the last position alone: [T, vocab] logits of a long prompt are gigabytes
            H, pre = H[-1:], pre[-1:]
        h = rms_norm(hc_collapse(H, pre), w["norm.weight"], c.rms_norm_eps)
        logits = (h @ w["head.weight"].T).to(self.acc)
        self.last_taps = torch.stack(fwd.taps, dim=1) if fwd.taps else None
        if state is not None:
            state.pos += T
            keep = c.engram_max_ngram_size - 1
            state.tokens_tail = torch.cat([state.tokens_tail, ids])[-keep:] if keep > 0 else ids[:0]
            if self.has_dspark and self.last_taps is not None:
                from dsv41c.frontend.model.dspark import ctx_rows

                ctx = ctx_rows(self, self.last_taps)
                state.dspark_ctx = torch.cat([state.dspark_ctx, ctx])[-c.sliding_window:]
        return logits

    def block(self, p: str, H, pre, attn, n_experts: int, top_k: int):
        """One layer / DSpark stage after Engram: attention site then FFN site (single-pass mHC)."""
        c, w = self.cfg, self.w
        mix = dict(iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps, norm_eps=c.rms_norm_eps)
        a_pre, a_post, a_comb = hc_mixes(H, w[f"{p}.hc_attn_fn"], w[f"{p}.hc_attn_base"], w[f"{p}.hc_attn_scale"],
                                         **mix)
        x = rms_norm(hc_collapse(H, pre), w[f"{p}.attn_norm.weight"], c.rms_norm_eps)
        H = hc_expand(attn(x), H, a_post, a_comb)
        f_pre, f_post, f_comb = hc_mixes(H, w[f"{p}.hc_ffn_fn"], w[f"{p}.hc_ffn_base"], w[f"{p}.hc_ffn_scale"], **mix)
        x = rms_norm(hc_collapse(H, a_pre), w[f"{p}.ffn_norm.weight"], c.rms_norm_eps)
        H = hc_expand(self.moe(f"{p}.ffn", x, n_experts, top_k), H, f_post, f_comb)
        return H, f_pre

    def moe(self, f: str, x, n_experts: int, top_k: int):
        c, w = self.cfg, self.w
        w1, w2, w3 = w.experts(f, n_experts)
        return moe_forward(x, w[f"{f}.gate.weight"], w[f"{f}.gate.bias"], w1, w2, w3,
                           w[f"{f}.shared_experts.w1.weight"], w[f"{f}.shared_experts.w2.weight"],
                           w[f"{f}.shared_experts.w3.weight"], top_k=top_k, route_scale=c.routed_scaling_factor,
                           swiglu_limit=c.swiglu_limit, gate_temp=c.gate_temp, norm_topk_prob=c.norm_topk_prob)

    # ------------------------------------------------------------------ attention + CSA2
    def _attention(self, L: int, x, fwd: _Fwd):
        c, w, s = self.cfg, self.w, self.plan[L]
        a = f"layers.{L}.attn"
        cos, sin = fwd.rope["compress" if s.ratio else "main"]
        q, q_res = attn_q(x, w[f"{a}.wq_a.weight"], w[f"{a}.q_norm.weight"], w[f"{a}.wq_b.weight"],
                          c.num_attention_heads, cos, sin, c.rms_norm_eps)
        kv = attn_kv(x, w[f"{a}.wkv.weight"], w[f"{a}.kv_norm.weight"], cos, sin, c.rms_norm_eps, self.kv_quant)
        comp, sel = None, None
        if s.ratio:
            if s.mode == "full":
                self._compress(L, x, fwd)
            comp, keys = self._group(s.kv_group, fwd)
            if s.owns_indexer_query:
                self._index(L, x, q_res, keys, fwd)
            sel = fwd.topk.get(s.topk_source)
            if comp.shape[0] == 0:
                comp = None
            elif sel is None:  # cannot happen: the group's index source ran on the same entries
                raise AssertionError(f"layer {L}: compressed entries but no top-k from layer {s.topk_source}")
        scale, sink = c.head_dim**-0.5, w[f"{a}.attn_sink"]
        W = c.sliding_window
        if fwd.state is None:
            keys_all, bias = kv, window_bias(fwd.positions, W, self.acc)
            if comp is not None:
                keys_all = torch.cat([kv, comp])
                bias = torch.cat([bias, topk_bias(sel, comp.shape[0], self.acc)], dim=-1)
            o = dense_attention(q, keys_all, bias, sink, scale)
        else:
            win = fwd.state.window[L]
            pool = torch.cat([win, kv])
            idx = window_indices(fwd.positions, int(fwd.positions[0]) - win.shape[0], W)
            if comp is not None:
                idx = torch.cat([idx, torch.where(sel < 0, sel, sel + pool.shape[0])], dim=-1)
                pool = torch.cat([pool, comp])
            o = sparse_attention(q, pool, idx, sink, scale)
            fwd.state.window[L] = torch.cat([win, kv])[max(0, win.shape[0] + kv.shape[0] - (W - 1)):]
        return attn_out(o, cos, sin, w[f"{a}.wo_a.weight"], w[f"{a}.wo_b.weight"], c.o_groups)

    def _group(self, g: int, fwd: _Fwd):
        """(compressed kv, indexer keys) of KV group g, including this forward's entries."""
        if fwd.state is None:
            return fwd.groups[g]
        return fwd.state.comp_kv[g], fwd.state.index_k[g]

    def _compress(self, L: int, x, fwd: _Fwd):
        """KV source: new entries -> indexer keys (pre-RoPE latents) and compressed KV (rotated, FP4)."""
        c, w, r = self.cfg, self.w, self.plan[L].ratio
        p = f"layers.{L}.attn"
        wkv, wgate, nw = w[f"{p}.compressor.wkv.weight"], w.get(f"{p}.compressor.wgate.weight"), \
            w[f"{p}.compressor.norm.weight"]
        st = fwd.state
        if st is None:
            lat, first = compressor_full(x, wkv, wgate, nw, r, c.rms_norm_eps), 0
        else:
            first = st.n_entries(L)
            empty = x.new_zeros(0, c.head_dim, dtype=self.acc)
            lat, bk, bg = compressor_step(x, wkv, wgate, nw, r, c.rms_norm_eps, st.buf_kv.get(L, empty),
                                          st.buf_gate.get(L, empty))
            if r > 1:
                st.buf_kv[L], st.buf_gate[L] = bk, bg
        cos, sin = self.rope("compress", (first + torch.arange(lat.shape[0], device=lat.device)) * r)
        keys = index_keys(lat, w[f"{p}.indexer.wk.weight"], w[f"{p}.indexer.k_norm.weight"], cos, sin,
                          c.rms_norm_eps, self.kv_quant)
        comp = fq_compressed_kv(apply_rope(lat, cos, sin), self.kv_quant)
        if st is None:
            fwd.groups[L] = (comp, keys)
        else:
            st.comp_kv[L] = torch.cat([st.comp_kv[L], comp])
            st.index_k[L] = torch.cat([st.index_k[L], keys])

    def _index(self, L: int, x, q_res, keys, fwd: _Fwd):
        """Index source: score queries against the group's keys, publish top-k (+ candidates)."""
        c, w, s = self.cfg, self.w, self.plan[L]
        if keys.shape[0] == 0:
            fwd.topk[L] = None
            return
        p = f"layers.{L}.attn.indexer"
        cos, sin = fwd.rope["compress"]
        qi, hw = index_query(q_res, x, w[f"{p}.wq_b.weight"], w[f"{p}.weights_proj.weight"], c.index_n_heads,
                             cos, sin, self.kv_quant)
        produce = (c.candidate_topk_blocks, c.candidate_block_size) if s.candidates == "produces" else None
        cand = fwd.candidates if s.candidates == "consumes" else None
        fwd.topk[L], scores, made = indexer_select(qi, hw, keys, fwd.positions, s.ratio, c.index_topk,
                                                   produce=produce, candidates=cand)
        if made is not None:
            fwd.candidates = made
        if self.trace is not None:
            self._record(L, scores, cand, fwd)

    def _record(self, L: int, scores, cand, fwd: _Fwd):
        """Statistics that show the test inputs exercise selection (not every entry kept)."""
        c = self.cfg
        vis = (scores > float("-inf")).sum(-1)
        eligible = vis if cand is None else ((scores > float("-inf")) & cand).sum(-1)
        t = self.trace.setdefault(L, {"queries": 0, "topk_strict_subset": 0, "candidate_blocks_excluded": 0})
        t["queries"] += int(scores.shape[0])
        t["topk_strict_subset"] += int((eligible > c.index_topk).sum())
        if self.plan[L].candidates == "produces":
            vis_blocks = (vis + c.candidate_block_size - 1) // c.candidate_block_size
            t["candidate_blocks_excluded"] += int((vis_blocks > c.candidate_topk_blocks).sum())


def load_reference(checkpoint_dir: str, dtype="float32", kv_quant: bool = True, device=None) -> ReferenceModel:
    """A reference model on an official-format checkpoint directory (checkpoint.py reader)."""
    from dsv41c.frontend.checkpoint import open_checkpoint

    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    cfg = load_config(checkpoint_dir)
    load_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # lossless: every stored value fits
    sd = open_checkpoint(checkpoint_dir).state_dict(load_dtype)
    return ReferenceModel(cfg, sd, dtype=dtype, kv_quant=kv_quant, device=device)
