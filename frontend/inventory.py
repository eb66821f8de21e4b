"""The official tensor inventory of a config: every name, shape and stored dtype (spec §4, §4.1).

`expected_tensors(cfg)` lists, in a fixed order, exactly the text-model tensors a
DeepSeek-V4.1-Flash checkpoint holds for `cfg` (no `model.` prefix, no `hc_head*`):

- global: `embed.weight`, per backbone layer `layers.L.*`, per DSpark stage `mtp.N.*`,
  then `norm.weight`, `head.weight`;
- a layer: norms, the two mHC sites, attention (FP8 linears + sink + q/kv norms), the
  CSA2 compressor (mode `full` only; `wgate` only for ratio > 1), the indexer query
  (`full`/`reindex`) and keys (`full`), Engram (engram layers), the MoE router, routed
  experts (packed FP4 + E8M0/32) and the shared expert (FP8);
- a DSpark stage: a ratio-0 layer with `dspark_n_routed_experts` experts; stage 0 adds
  `main_proj` (FP8, taps·hidden → hidden) and `main_norm`; the last stage adds `norm`,
  `markov_head.{embed,head}` and `confidence_head.proj`.

Quantized linears appear as `X.weight` (F8_E4M3 [out, in], or I8 [out, in/2] for routed
experts) immediately followed by `X.scale` (F8_E8M0 on b×b blocks for FP8, [out, in/32]
for FP4); Engram tables have one E8M0 scale per row per 32 columns.

Reconciliation with the published index (96,085 tensors, spec §4): the `full` text
inventory has 95,819 tensors; the vision tower and aligner add 266 (patch_embed 2,
32 blocks × 8, vision.norm 1, aligner 4, image_start/end/newline 3), giving 96,085.

`units_of` groups the inventory into write units (a quantized pair is one unit) and
`init_rule` says how a random checkpoint draws each tensor (checkpoint.py writes them).

Known gaps: vision tensors are not listed (the text compiler ignores them);
`mtp.0.main_proj` may be stored BF16 without a scale in some dumps (spec §6.4) — the
reader accepts that form (see checkpoint.py); this inventory lists the FP8 form.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from dsv41c.frontend.config import ModelConfig
from dsv41c.frontend.layer_plan import layer_plan

DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1}

# Checkpoint entries the text compiler does not use; readers skip them (spec §4 last row).
IGNORED_PREFIXES = ("vision.", "aligner.")
IGNORED_NAMES = ("image_start", "image_end", "image_newline")


class TensorSpec(NamedTuple):
    shape: tuple
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def is_ignored(name: str) -> bool:
    """Non-text checkpoint entries (vision tower, aligner, image markers)."""
    return name.startswith(IGNORED_PREFIXES) or name in IGNORED_NAMES


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Builder:
    """Accumulates name -> TensorSpec in insertion order."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.b = cfg.weight_block_size[0]
        self.out: dict[str, TensorSpec] = {}

    def add(self, name: str, shape, dtype: str):
        if name in self.out:  # a bug in this file, not in the user's input
            raise AssertionError(f"duplicate tensor {name}")
        self.out[name] = TensorSpec(tuple(int(d) for d in shape), dtype)

    def fp8(self, prefix: str, out_f: int, in_f: int):
        self.add(f"{prefix}.weight", (out_f, in_f), "F8_E4M3")
        self.add(f"{prefix}.scale", (_cdiv(out_f, self.b), _cdiv(in_f, self.b)), "F8_E8M0")

    def fp4(self, prefix: str, out_f: int, in_f: int):
        # MXFP4: two E2M1 codes per byte along `in`, one E8M0 scale per 32 along `in`.
        self.add(f"{prefix}.weight", (out_f, in_f // 2), "I8")
        self.add(f"{prefix}.scale", (out_f, _cdiv(in_f, 32)), "F8_E8M0")

    def bf16(self, name: str, *shape):
        self.add(name, shape, "BF16")

    def f32(self, name: str, *shape):
        self.add(name, shape, "F32")


def _block(bl: _Builder, p: str, mode: str, ratio: int, n_experts: int, engram_rows: int | None):
    """One transformer block (backbone layer or DSpark stage) under prefix `p` (e.g. 'layers.3')."""
    c = bl.cfg
    h, hc = c.hidden_size, c.hc_mult
    mix = (2 + hc) * hc  # pre (hc) + post (hc) + comb (hc×hc)
    bl.bf16(f"{p}.attn_norm.weight", h)
    bl.bf16(f"{p}.ffn_norm.weight", h)
    for site in ("attn", "ffn"):
        bl.f32(f"{p}.hc_{site}_fn", mix, hc * h)
        bl.f32(f"{p}.hc_{site}_base", mix)
        bl.f32(f"{p}.hc_{site}_scale", 3)
    # attention
    a = f"{p}.attn"
    heads, hd, ql = c.num_attention_heads, c.head_dim, c.q_lora_rank
    bl.f32(f"{a}.attn_sink", heads)
    bl.fp8(f"{a}.wq_a", ql, h)
    bl.bf16(f"{a}.q_norm.weight", ql)
    bl.fp8(f"{a}.wq_b", heads * hd, ql)
    bl.fp8(f"{a}.wkv", hd, h)
    bl.bf16(f"{a}.kv_norm.weight", hd)
    # grouped output LoRA: block-diagonal [groups·o_lora, heads_per_group·head_dim]
    bl.fp8(f"{a}.wo_a", c.o_groups * c.o_lora_rank, c.heads_per_group * hd)
    bl.fp8(f"{a}.wo_b", h, c.o_groups * c.o_lora_rank)
    if mode == "full":
        bl.bf16(f"{a}.compressor.wkv.weight", hd, h)
        if ratio > 1:
            bl.bf16(f"{a}.compressor.wgate.weight", hd, h)
        bl.bf16(f"{a}.compressor.norm.weight", hd)
    if mode in ("full", "reindex"):
        bl.fp8(f"{a}.indexer.wq_b", c.index_n_heads * c.index_head_dim, ql)
        bl.bf16(f"{a}.indexer.weights_proj.weight", c.index_n_heads, h)
    if mode == "full":
        bl.bf16(f"{a}.indexer.wk.weight", c.index_head_dim, hd)
        bl.bf16(f"{a}.indexer.k_norm.weight", c.index_head_dim)
    if engram_rows is not None:
        e, ehd = f"{p}.engram", c.engram_head_dim
        bl.add(f"{e}.embed.weight", (engram_rows, ehd), "F8_E4M3")
        bl.add(f"{e}.embed.scale", (engram_rows, _cdiv(ehd, 32)), "F8_E8M0")  # per row, per 32 columns
        bl.fp8(f"{e}.wkv", h * (hc + 1), (c.engram_max_ngram_size - 1) * c.engram_n_heads * ehd)
        bl.bf16(f"{e}.q_weight", hc, h)
        bl.bf16(f"{e}.k_weight", hc, h)
    # MoE
    f, inter = f"{p}.ffn", c.moe_intermediate_size
    bl.bf16(f"{f}.gate.weight", n_experts, h)
    bl.f32(f"{f}.gate.bias", n_experts)
    bl.f32(f"{f}.gate.bias_vl", n_experts)
    for j in range(n_experts):
        bl.fp4(f"{f}.experts.{j}.w1", inter, h)
        bl.fp4(f"{f}.experts.{j}.w2", h, inter)
        bl.fp4(f"{f}.experts.{j}.w3", inter, h)
    for w, (o, i) in (("w1", (inter, h)), ("w2", (h, inter)), ("w3", (inter, h))):
        bl.fp8(f"{f}.shared_experts.{w}", o, i)


def expected_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """name -> TensorSpec(shape, dtype) of every text-model tensor, in checkpoint order."""
    bl = _Builder(cfg)
    h, v = cfg.hidden_size, cfg.vocab_size
    bl.bf16("embed.weight", v, h)
    for s in layer_plan(cfg):
        if s.is_dspark:
            continue
        rows = cfg.engram_num_embeddings[s.engram] if s.engram is not None else None
        _block(bl, f"layers.{s.index}", s.mode, s.ratio, cfg.n_routed_experts, rows)
    n_mtp = cfg.num_nextn_predict_layers
    for k in range(n_mtp):
        p = f"mtp.{k}"
        if k == 0:
            # ctx = main_norm(main_proj(concat(taps))): one tap per DSpark target layer (3 in every preset).
            bl.fp8(f"{p}.main_proj", h, len(cfg.dspark_target_layer_ids) * h)
            bl.bf16(f"{p}.main_norm.weight", h)
        _block(bl, p, "swa", 0, cfg.dspark_n_routed_experts, None)
        if k == n_mtp - 1:
            r = cfg.dspark_markov_rank
            bl.bf16(f"{p}.norm.weight", h)
            bl.bf16(f"{p}.markov_head.embed.weight", v, r)
            bl.bf16(f"{p}.markov_head.head.weight", v, r)
            bl.bf16(f"{p}.confidence_head.proj.weight", 1, h + r)
    bl.bf16("norm.weight", h)
    bl.bf16("head.weight", v, h)
    return bl.out


def total_bytes(specs: dict[str, TensorSpec]) -> int:
    return sum(s.nbytes for s in specs.values())


def units_of(specs: dict) -> list[list[str]]:
    """Inventory order grouped into write units: [name] or a quantized pair [X.weight, X.scale]."""
    units, names = [], list(specs)
    i = 0
    while i < len(names):
        n = names[i]
        pair = n.endswith(".weight") and i + 1 < len(names) and names[i + 1] == n[: -len(".weight")] + ".scale"
        units.append(names[i: i + 2] if pair else [n])
        i += 2 if pair else 1
    return units


def init_rule(name: str, spec: TensorSpec) -> tuple[str, float, float]:
    """How a random checkpoint draws `name` before quantization: ('normal', std, mean) or
    ('uniform', low, high). Why these: a 40-layer residual stack must keep its activations
    O(1) — linears N(0, 1/sqrt(in)), norm weights 1 + 0.1·N, unit embeddings, mHC logits
    m = rmsnorm(H)·fn^T ~ N(0, 1) with scales in [0.1, 1], small router biases and heads."""
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight") or name.endswith(("engram.q_weight", "engram.k_weight")):
        return "normal", 0.1, 1.0
    if leaf.startswith("hc_") and leaf.endswith("_fn"):
        return "normal", 1.0 / math.sqrt(spec.shape[1]), 0.0
    if leaf.startswith("hc_") and leaf.endswith("_base"):
        return "normal", 0.1, 0.0
    if leaf.startswith("hc_") and leaf.endswith("_scale"):
        return "uniform", 0.1, 1.0
    if leaf in ("attn_sink",) or name in ("embed.weight",) or name.endswith("engram.embed.weight"):
        return "normal", 1.0, 0.0
    if leaf in ("bias", "bias_vl") or name.endswith("markov_head.embed.weight"):
        return "normal", 0.1, 0.0
    in_f = spec.shape[-1] * (2 if spec.dtype == "I8" else 1)
    small = 0.1 if name.endswith("confidence_head.proj.weight") else 1.0
    return "normal", small / math.sqrt(in_f), 0.0
