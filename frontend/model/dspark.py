"""DSpark: the 3-stage parallel block drafter (spec §3.11).

Context. For every target position t the backbone records taps = the mean over the hc
streams of the streams entering each layer of `dspark_target_layer_ids` (37/38/39: their
attention inputs). ctx_t = main_norm(main_proj(concat(taps_t))) (mtp.0 owns main_proj /
main_norm). The serving state keeps ctx rows of the last W positions (`ctx_rows`).

Draft block. Inputs [anchor, noise × (B-1)] (B = dspark_block_size, noise =
dspark_noise_token_id), embedded with the shared `embed.weight`, copied to hc streams,
pre = one-hot stream 0; positions anchor_pos+1 .. anchor_pos+B (nemo "official": the
anchor occupies the first slot but predicts the following position). Stages mtp.0..N-1
run serially, each a ratio-0 block (main RoPE): attention keys/values are the stage's own
kv_norm(wkv(·)) of (a) the ctx rows at positions anchor_pos-W+1..anchor_pos (RoPE at their
positions) and (b) the block's own attention inputs (RoPE at the draft positions); every
draft query sees all of (a) and all B keys of (b) (non-causal inside the block); sink,
inverse RoPE, grouped wo_a/wo_b; then MoE with dspark_n_routed_experts experts top
dspark_num_experts_per_tok; single-pass mHC with `pre` carried across stages.
Heads (last stage): h = collapse(H, pre) (pre-norm); base = head(norm(h)) with the
shared lm head; Markov: e = markov_head.embed[prev_i], logits_i = base_i + markov_head.head·e;
confidence c_i = sigmoid(confidence_head.proj · [h_i ; e]) (fp32). Rows are drafted in
order: prev_0 = anchor, prev_i = token drafted at row i-1 (greedy argmax, first maximum).

Engine-level choices (no checkpoint fixes them; they cannot change greedy output, which
the target verifies):
- The anchor is the last token the TARGET has processed (its ctx row exists, spec §6.6:
  ctx visible up to and including the anchor). Row 0 then predicts a token greedy decoding
  already knows (the target's argmax at the anchor); `draft(..., first=tok)` forces row 0
  to that token so rows 1..B-1 condition their Markov bias on the true token.
- The window KV (ctx and draft rows) gets the FP8 window fake quantization when
  kv_quant is on, as every window cache of the backbone.
Known gaps: no sampling (greedy only); DSpark RoPE = `main` is implied by ratio 0, not
independently confirmed (spec §6.5).
"""
from __future__ import annotations

import torch

from dsv41c.prims.attention import attn_kv, attn_out, attn_q, dense_attention
from dsv41c.prims.mhc import hc_collapse
from dsv41c.prims.norms import rms_norm


def ctx_rows(model, taps: torch.Tensor) -> torch.Tensor:
    """taps [T, n_taps, hidden] (accumulation dtype) -> ctx rows [T, hidden] (model dtype)."""
    w, eps = model.w, model.cfg.rms_norm_eps
    x = taps.flatten(-2).to(model.dtype)
    return rms_norm(x @ w["mtp.0.main_proj.weight"].T, w["mtp.0.main_norm.weight"], eps)


class DSparkDrafter:
    def __init__(self, model):
        if not model.has_dspark:
            raise ValueError("the checkpoint has no DSpark (mtp.*) weights")
        self.m = model
        self.cfg = model.cfg
        self.last = f"mtp.{self.cfg.num_nextn_predict_layers - 1}"

    def draft(self, state, anchor: int, first: int | None = None):
        """Draft B tokens for positions state.pos .. state.pos+B-1 (anchor = token at state.pos-1).

        Returns (tokens [B] list of int, confidence [B] tensor). `first` forces row 0.
        """
        m, c, w = self.m, self.cfg, self.m.w
        B = c.dspark_block_size
        anchor_pos = state.pos - 1
        ctx = state.dspark_ctx
        ctx_pos = torch.arange(anchor_pos - ctx.shape[0] + 1, anchor_pos + 1)
        positions = torch.arange(anchor_pos + 1, anchor_pos + 1 + B)
        ids = torch.tensor([anchor] + [c.dspark_noise_token_id] * (B - 1))
        H = w["embed.weight"][ids].unsqueeze(-2).expand(B, c.hc_mult, c.hidden_size).contiguous()
        pre = torch.zeros(B, c.hc_mult, dtype=m.acc)
        pre[:, 0] = 1.0
        for k in range(c.num_nextn_predict_layers):
            p = f"mtp.{k}"
            H, pre = m.block(p, H, pre, lambda x, p=p: self._attention(p, x, ctx, ctx_pos, positions),
                             c.dspark_n_routed_experts, c.dspark_num_experts_per_tok)
        h = hc_collapse(H, pre)
        base = (rms_norm(h, w[f"{self.last}.norm.weight"], c.rms_norm_eps) @ w["head.weight"].T).to(m.acc)
        emb, head = w[f"{self.last}.markov_head.embed.weight"], w[f"{self.last}.markov_head.head.weight"]
        w_conf = w[f"{self.last}.confidence_head.proj.weight"].to(m.acc)[0]
        tokens, conf, prev = [], [], int(anchor)
        for i in range(B):
            e = emb[prev]
            logits = base[i] + (head @ e).to(m.acc)
            conf.append(torch.sigmoid(w_conf @ torch.cat([h[i].to(m.acc), e.to(m.acc)])))
            prev = int(first) if (i == 0 and first is not None) else int(torch.argmax(logits))
            tokens.append(prev)
        return tokens, torch.stack(conf)

    def _attention(self, p: str, x, ctx, ctx_pos, positions):
        m, c, w = self.m, self.cfg, self.m.w
        a = f"{p}.attn"
        cos, sin = m.rope("main", positions)
        q, _ = attn_q(x, w[f"{a}.wq_a.weight"], w[f"{a}.q_norm.weight"], w[f"{a}.wq_b.weight"],
                      c.num_attention_heads, cos, sin, c.rms_norm_eps)
        kv_draft = attn_kv(x, w[f"{a}.wkv.weight"], w[f"{a}.kv_norm.weight"], cos, sin, c.rms_norm_eps, m.kv_quant)
        ccos, csin = m.rope("main", ctx_pos)
        kv_ctx = attn_kv(ctx, w[f"{a}.wkv.weight"], w[f"{a}.kv_norm.weight"], ccos, csin, c.rms_norm_eps,
                         m.kv_quant)
        keys = torch.cat([kv_ctx, kv_draft])
        bias = torch.zeros(x.shape[0], keys.shape[0], dtype=m.acc)  # ctx window + whole block visible
        o = dense_attention(q, keys, bias, w[f"{a}.attn_sink"], c.head_dim**-0.5)
        return attn_out(o, cos, sin, w[f"{a}.wo_a.weight"], w[f"{a}.wo_b.weight"], c.o_groups)
