"""The serving step as a function of tensors: state in -> (logits, state out).

`serve_step(model, values, call)` is the ONE orchestration of a prefill chunk / decode
step, faithful to `ReferenceModel`'s serving form (model.py `_forward` with a State): the
same primitives in the same order, with the KV-path quantizers and the CSA2 pieces as
`dsv41.*` custom ops. It only routes named values between *segments*
(`frontend/segments.py`: prologue, Engram, one segment per kind of layer, epilogue);
`call(segment, inputs, prefix)` runs one. Eagerly (`eager_step`) `call` runs the segment's
body on tensors; when tracing (`frontend/trace.py`) it stamps the segment's exported IR
into the function being built, with the weights renamed by `prefix`. So the eager check
and the compiled plan go through the same routing.

State (flat dict, names are the IR's argument names; `new_state`), every buffer fixed-size:
    state.pos                [] i64        tokens processed so far
    state.tokens_tail        [max_n-1] i64 last ids (the pad id before the sequence start)
    state.window.L           [W-1, D]      window ring: position p < pos at slot p % (W-1)
                                           (zeros before position 0; masked by index -1)
    state.comp_kv.g          [C_g, D]      compressed entries of KV group g: rows 0 .. pos//r - 1
                                           valid, the rest zero (masked by every reader)
    state.index_k.g          [C_g, Dk]     indexer keys of the same entries
    state.buf_kv.g, state.buf_gate.g  [r-1, D] acc   rows of the incomplete group
                                           (ratio > 1; first pos % r rows valid)
C_g = ceil(max_context / r) (`cache_capacity`): the capacity `--max-context` fixes; an append past
it is an error naming the buffer. So the only symbolic dim of the step is T (chunk), plus the
data-dependent count of entries a ratio-2 compressor emits.
Known gaps: DSpark taps/context are not part of the compiled step; one sequence.
"""
from __future__ import annotations

import torch

from dsv41c.frontend.layer_plan import layer_plan


def cache_capacity(cfg, ratio: int, max_context: int | None = None) -> int:
    """Rows of a ratio-`ratio` KV group's caches at `max_context` positions (default: the model's)."""
    n = int(max_context or cfg.max_position_embeddings)
    return -(-n // ratio)


def new_state(cfg, dtype=torch.float32, max_context: int | None = None) -> dict:
    """The empty serving state of one sequence (see the module docstring)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    plan = layer_plan(cfg)[: cfg.num_hidden_layers]
    st = {"state.pos": torch.zeros((), dtype=torch.int64),
          "state.tokens_tail": torch.full((cfg.engram_max_ngram_size - 1,), cfg.engram_pad_token_id,
                                          dtype=torch.int64)}
    for s in plan:
        st[f"state.window.{s.index}"] = torch.zeros(cfg.sliding_window - 1, cfg.head_dim, dtype=dtype)
    for s in plan:
        if s.mode != "full":
            continue
        g = s.index
        cap = cache_capacity(cfg, s.ratio, max_context)
        st[f"state.comp_kv.{g}"] = torch.zeros(cap, cfg.head_dim, dtype=dtype)
        st[f"state.index_k.{g}"] = torch.zeros(cap, cfg.index_head_dim, dtype=dtype)
        if s.ratio > 1:
            st[f"state.buf_kv.{g}"] = torch.zeros(s.ratio - 1, cfg.head_dim, dtype=acc)
            st[f"state.buf_gate.{g}"] = torch.zeros(s.ratio - 1, cfg.head_dim, dtype=acc)
    return st


def serve_step(model, values: dict, call):
    """values: 'ids' and every 'state.*' entry -> (logits, new state dict). See module doc."""
    ids, tail, pos = values["ids"], values["state.tokens_tail"], values["state.pos"]
    o = call(model.prologue, {"ids": ids, "pos": pos, "tail": tail}, "")
    H, pre, positions = o["H"], o["pre"], o["positions"]
    rope = {"main": (o["cos_m"], o["sin_m"]), "compress": (o["cos_c"], o["sin_c"])}
    new = {"state.pos": o["pos"], "state.tokens_tail": o["tail"]}
    groups, topk, cand = {}, {}, None  # per forward, as the reference's `_Fwd`
    for s in model.plan:
        L, g, p = s.index, s.kv_group, f"layers.{s.index}."
        if s.engram is not None:
            H = call(model.engram[s.engram], {"H": H, "ids": ids, "tail": tail}, p + "engram.")["H"]
        cos, sin = rope[s.rope]
        a = call(model.attn_in, {"H": H, "pre": pre, "cos": cos, "sin": sin}, p)
        if s.ratio and s.mode == "full":
            ins = {"x": a["x"], "pos": pos, "inv_c": o["inv_c"]}
            ins.update({k: values[f"state.{k}.{g}"] for k in model.compress(s.ratio).act_names if k not in ins})
            groups[g] = call(model.compress(s.ratio), ins, p)
            new.update({f"state.{k}.{g}": v for k, v in groups[g].items()})
        if s.ratio and s.owns_indexer_query:
            seg = model.index(s.ratio, s.candidates)
            ins = {"x": a["x"], "q_res": a["q_res"], "index_k": groups[g]["index_k"], "positions": positions,
                   "cos": cos, "sin": sin}
            if s.candidates == "consumes":
                ins["cand"] = cand
            r = call(seg, ins, p)
            topk[L] = r["topk"]
            cand = r.get("cand", cand)
        ins = {"q": a["q"], "kv": a["kv"], "window": values[f"state.window.{L}"], "positions": positions,
               "pos": pos, "cos": cos, "sin": sin}
        if s.ratio:
            ins.update(topk=topk[s.topk_source], comp_kv=groups[g]["comp_kv"])
        r = call(model.attend[bool(s.ratio)], ins, p)
        new[f"state.window.{L}"] = r["window"]
        r = call(model.ffn, {"y": r["y"], "H": H, "a_pre": a["a_pre"], "a_post": a["a_post"],
                             "a_comb": a["a_comb"]}, p)
        H, pre = r["H"], r["pre"]
    logits = call(model.epilogue, {"H": H, "pre": pre}, "")["logits"]
    return logits, new


def eager_step(model, weights, values: dict):
    """Run serve_step on tensors; `weights` maps checkpoint names to tensors (or has .get)."""
    get = weights.get if hasattr(weights, "get") else weights.__getitem__

    def call(seg, ins, prefix):
        args = dict(ins)
        for local in seg.weight_names:
            args[local] = get(prefix + local)
        return seg.body(args)

    return serve_step(model, values, call)
