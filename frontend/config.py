"""The model configuration: official config.json -> validated `ModelConfig`; presets.

`load_config(path)` reads an official `config.json` (top level with `text_config` and
`quantization_config`, spec §1), or a bare text config, and validates every field the
model needs: a missing or mistyped field, or id lists that contradict each other, raise
`ConfigError` naming the file and the field.

Presets (DESIGN.md "Presets"):
- `full`  — the published config (spec §1), verbatim.
- `bench` — official widths and all 40 layers, 32 routed experts and small Engram tables.
- `mini`  — 12 layers with every kind of layer (SWA, ratio-2 Full/Reuse, ratio-1 Full +
  candidates, Reindex, Reuse, Engram) and small widths.
- `tiny`  — the official 40-layer topology and every id list, small widths and small
  windows/top-k so 64-token tests exercise compressed attention, candidates and Reindex.

The layer plan (`layer_plan`) lives in `frontend/layer_plan.py`.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config.json that cannot describe a DeepSeek-V4.1-Flash model."""


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "yarn"
    factor: float = 16.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max_position_embeddings: int = 65536


# name -> (python type(s), required). Order = the order of the published config.
_INT, _FLOAT, _BOOL, _STR, _LIST = int, (int, float), bool, str, list


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    hidden_act: str
    swiglu_limit: float
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: RopeScaling
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    scoring_func: str
    topk_method: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    sliding_window: int
    compress_ratios: tuple
    kv_source_layer_ids: tuple
    index_source_layer_ids: tuple
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    engram_layer_ids: tuple
    engram_num_embeddings: tuple
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    num_nextn_predict_layers: int
    dspark_block_size: int
    dspark_noise_token_id: int
    dspark_target_layer_ids: tuple
    dspark_markov_rank: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    gate_temp: float = 1.0
    attention_bias: bool = False
    # top level
    bos_token_id: int = 0
    eos_token_id: int = 1
    pad_token_id: int = 2
    image_token_id: int = 129264
    tie_word_embeddings: bool = False
    weight_block_size: tuple = (32, 32)
    expert_dtype: str = "fp4"
    name: str = dataclasses.field(default="custom", compare=False)

    # ---------------------------------------------------------------- derived
    @property
    def n_layers_total(self) -> int:
        return self.num_hidden_layers + self.num_nextn_predict_layers

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.o_groups

    def to_json_dict(self) -> dict:
        """The official config.json form (top level + text_config + quantization_config)."""
        text = {}
        for f in dataclasses.fields(self):
            if f.name in _TOP_LEVEL or f.name in ("name", "weight_block_size", "expert_dtype"):
                continue
            v = getattr(self, f.name)
            if isinstance(v, RopeScaling):
                v = dataclasses.asdict(v)
            elif isinstance(v, tuple):
                v = list(v)
            text[f.name] = v
        text["model_type"] = "deepseek_v41_text"
        top = {
            "architectures": ["DeepseekV41ForCausalLM"],
            "model_type": "deepseek_v41",
            "dtype": "bfloat16",
            **{k: getattr(self, k) for k in _TOP_LEVEL},
            "quantization_config": {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": list(self.weight_block_size),
                "scale_fmt": "ue8m0",
                "expert_dtype": self.expert_dtype,
            },
            "text_config": text,
        }
        return top

    def hash(self) -> str:
        """Stable hash of the model-defining fields (not the preset name)."""
        d = self.to_json_dict()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


_TOP_LEVEL = ("bos_token_id", "eos_token_id", "pad_token_id", "image_token_id", "tie_word_embeddings")

# Fields HF defaults when absent from the released config (spec §1.2: gate_temp).
_OPTIONAL = {"gate_temp": 1.0, "attention_bias": False}
# Alternative key names seen in public configs (spec §1.2: engram pad id).
_ALIASES = {"engram_pad_id": "engram_pad_token_id"}


def _check_type(name: str, value: Any, ftype, where: str):
    t = ftype if isinstance(ftype, str) else getattr(ftype, "__name__", str(ftype))
    ok = True
    if t in ("int",):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t in ("float",):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif t == "bool":
        ok = isinstance(value, bool)
    elif t == "str":
        ok = isinstance(value, str)
    elif t == "tuple":
        ok = isinstance(value, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    if not ok:
        raise ConfigError(f"{where}: field '{name}' must be {t}, got {type(value).__name__} {value!r}")


def config_from_dict(d: dict, where: str = "<config>", name: str = "custom") -> ModelConfig:
    """Build and validate a ModelConfig from an official config dict (or bare text config)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: top level must be a JSON object")
    text = d.get("text_config", d)
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: field 'text_config' must be an object")
    text = {_ALIASES.get(k, k): v for k, v in text.items()}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(ModelConfig):
        if f.name in ("name", "weight_block_size", "expert_dtype") or f.name in _TOP_LEVEL:
            continue
        if f.name not in text:
            if f.name in _OPTIONAL:
                kwargs[f.name] = _OPTIONAL[f.name]
                continue
            raise ConfigError(f"{where}: missing field 'text_config.{f.name}'")
        v = text[f.name]
        if f.name == "rope_scaling":
            if not isinstance(v, dict):
                raise ConfigError(f"{where}: field 'text_config.rope_scaling' must be an object")
            try:
                v = RopeScaling(**{k: v[k] for k in dataclasses.asdict(RopeScaling()).keys() if k in v})
            except TypeError as e:  # pragma: no cover - defensive
                raise ConfigError(f"{where}: field 'text_config.rope_scaling': {e}") from None
            for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
                if k not in text["rope_scaling"]:
                    raise ConfigError(f"{where}: missing field 'text_config.rope_scaling.{k}'")
        else:
            _check_type(f"text_config.{f.name}", v, f.type, where)
            if f.type == "tuple":
                v = tuple(v)
        kwargs[f.name] = v
    for k in _TOP_LEVEL:
        if k in d and d is not text:
            _check_type(k, d[k], dict((f.name, f.type) for f in dataclasses.fields(ModelConfig))[k], where)
            kwargs[k] = d[k]
    q = d.get("quantization_config") if d is not text else None
    if q is not None:
        if not isinstance(q, dict):
            raise ConfigError(f"{where}: field 'quantization_config' must be an object")
        wbs = q.get("weight_block_size", [32, 32])
        if not (isinstance(wbs, list) and len(wbs) == 2 and wbs[0] == wbs[1] and isinstance(wbs[0], int)):
            raise ConfigError(f"{where}: field 'quantization_config.weight_block_size' must be [b, b], got {wbs!r}")
        if q.get("scale_fmt", "ue8m0") != "ue8m0":
            raise ConfigError(f"{where}: field 'quantization_config.scale_fmt' must be 'ue8m0', got {q.get('scale_fmt')!r}")
        kwargs["weight_block_size"] = tuple(wbs)
        kwargs["expert_dtype"] = q.get("expert_dtype", "fp4")
    cfg = ModelConfig(name=name, **kwargs)
    validate(cfg, where)
    return cfg


def validate(cfg: ModelConfig, where: str = "<config>") -> None:
    """Cross-field checks. Every message names the field(s) at fault."""

    def bad(field_name, msg):
        raise ConfigError(f"{where}: field 'text_config.{field_name}': {msg}")

    for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
              "o_lora_rank", "o_groups", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
              "sliding_window", "index_n_heads", "index_head_dim", "index_topk", "hc_mult", "candidate_block_size",
              "candidate_topk_blocks", "hc_sinkhorn_iters"):
        if getattr(cfg, k) <= 0:
            bad(k, f"must be positive, got {getattr(cfg, k)}")
    if cfg.num_key_value_heads != 1:
        bad("num_key_value_heads", f"V4.1 uses one shared K=V latent, got {cfg.num_key_value_heads}")
    if cfg.head_dim % 32:
        bad("head_dim", f"must be a multiple of 32 (FP8 window-KV scales per 32 channels), got {cfg.head_dim}")
    if cfg.qk_rope_head_dim % 2 or cfg.qk_rope_head_dim > cfg.head_dim:
        bad("qk_rope_head_dim", f"must be even and ≤ head_dim {cfg.head_dim}, got {cfg.qk_rope_head_dim}")
    if cfg.qk_rope_head_dim > cfg.index_head_dim:
        bad("index_head_dim", f"must hold the {cfg.qk_rope_head_dim} RoPE channels, got {cfg.index_head_dim}")
    if cfg.index_head_dim % 32:
        bad("index_head_dim", f"must be a multiple of 32 (FP4 indexer scales per 32), got {cfg.index_head_dim}")
    for k in ("hidden_size", "moe_intermediate_size"):
        if getattr(cfg, k) % 32:
            bad(k, f"must be a multiple of 32 (FP4 experts carry one E8M0 scale per 32), got {getattr(cfg, k)}")
    if cfg.num_attention_heads % cfg.o_groups:
        bad("o_groups", f"{cfg.o_groups} does not divide num_attention_heads {cfg.num_attention_heads}")
    if cfg.num_experts_per_tok > cfg.n_routed_experts:
        bad("num_experts_per_tok", f"{cfg.num_experts_per_tok} > n_routed_experts {cfg.n_routed_experts}")
    if cfg.scoring_func != "sqrtsoftplus":
        bad("scoring_func", f"only 'sqrtsoftplus' is supported, got {cfg.scoring_func!r}")
    if cfg.hidden_act != "silu":
        bad("hidden_act", f"only 'silu' is supported, got {cfg.hidden_act!r}")
    if cfg.n_shared_experts != 1:
        bad("n_shared_experts", f"V4.1 has exactly one shared expert, got {cfg.n_shared_experts}")
    n, nt = cfg.num_hidden_layers, cfg.n_layers_total
    if len(cfg.compress_ratios) != nt:
        bad("compress_ratios", f"has {len(cfg.compress_ratios)} entries, expected num_hidden_layers + "
            f"num_nextn_predict_layers = {nt}")
    for i, r in enumerate(cfg.compress_ratios):
        if r not in (0, 1, 2, 4, 8) or (i >= n and r != 0):
            bad("compress_ratios", f"entry {i} = {r} is not a supported ratio (0/1/2/4/8; DSpark layers 0)")

    def check_ids(name, ids):
        if list(ids) != sorted(set(ids)):
            bad(name, f"must be strictly increasing, got {list(ids)}")
        for i in ids:
            if not 0 <= i < n:
                bad(name, f"layer {i} outside 0..{n - 1}")

    check_ids("kv_source_layer_ids", cfg.kv_source_layer_ids)
    check_ids("index_source_layer_ids", cfg.index_source_layer_ids)
    check_ids("engram_layer_ids", cfg.engram_layer_ids)
    for i in cfg.kv_source_layer_ids:
        if cfg.compress_ratios[i] == 0:
            bad("kv_source_layer_ids", f"layer {i} has compress ratio 0 (no compressed branch)")
        if i not in cfg.index_source_layer_ids:
            bad("index_source_layer_ids", f"KV source layer {i} must also be an index source")
    for i in range(n):
        r = cfg.compress_ratios[i]
        if r == 0:
            if i in cfg.index_source_layer_ids:
                bad("index_source_layer_ids", f"layer {i} has compress ratio 0")
            continue
        srcs = [s for s in cfg.kv_source_layer_ids if s <= i]
        if not srcs:
            bad("kv_source_layer_ids", f"layer {i} (ratio {r}) has no KV source at or before it")
        if cfg.compress_ratios[srcs[-1]] != r:
            bad("compress_ratios", f"layer {i} has ratio {r} but its KV source {srcs[-1]} has "
                f"ratio {cfg.compress_ratios[srcs[-1]]}")
        if any(cfg.compress_ratios[j] == 0 for j in range(srcs[-1], i)):
            bad("compress_ratios", f"layer {i} is separated from its KV source {srcs[-1]} by a ratio-0 layer")
    c = cfg.candidate_source_layer_id
    if c not in cfg.kv_source_layer_ids:
        bad("candidate_source_layer_id", f"{c} is not a KV source layer {list(cfg.kv_source_layer_ids)}")
    if c != cfg.kv_source_layer_ids[-1]:
        # HF applies the candidate mask at EVERY later index source; that is only meaningful
        # (and equal to our per-group reading) when every later index source reads c's entries.
        bad("candidate_source_layer_id", f"{c} must be the last KV source layer "
            f"({cfg.kv_source_layer_ids[-1]}): later index sources consume its candidate mask")
    if len(cfg.engram_num_embeddings) != len(cfg.engram_layer_ids):
        bad("engram_num_embeddings", f"{len(cfg.engram_num_embeddings)} entries for "
            f"{len(cfg.engram_layer_ids)} engram layers {list(cfg.engram_layer_ids)}")
    if cfg.engram_max_ngram_size < 2:
        bad("engram_max_ngram_size", f"must be ≥ 2, got {cfg.engram_max_ngram_size}")
    if cfg.engram_head_dim % 32:
        bad("engram_head_dim", f"must be a multiple of 32 (E8M0 scales per 32), got {cfg.engram_head_dim}")
    if len(cfg.dspark_target_layer_ids) and any(not 0 <= i < n for i in cfg.dspark_target_layer_ids):
        bad("dspark_target_layer_ids", f"{list(cfg.dspark_target_layer_ids)} outside 0..{n - 1}")
    if cfg.num_nextn_predict_layers and cfg.dspark_num_experts_per_tok > cfg.dspark_n_routed_experts:
        bad("dspark_num_experts_per_tok", "exceeds dspark_n_routed_experts")
    if cfg.dspark_noise_token_id >= cfg.vocab_size:
        bad("dspark_noise_token_id", f"{cfg.dspark_noise_token_id} ≥ vocab_size {cfg.vocab_size}")
    if cfg.rope_scaling.rope_type != "yarn":
        bad("rope_scaling", f"rope_type must be 'yarn', got {cfg.rope_scaling.rope_type!r}")


def load_config(path: str) -> ModelConfig:
    """Read config.json (a file, or a checkpoint directory holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return config_from_dict(d, where=path, name=os.path.basename(os.path.dirname(os.path.abspath(path))))


# ============================================================================ presets

FULL_TEXT_CONFIG = {
    "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 64,
    "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1280,
    "o_lora_rank": 1024, "o_groups": 8, "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
    "attention_bias": False, "max_position_embeddings": 1048576, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2304,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "sliding_window": 128, "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
    "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4, "engram_vocab_size": 16000000, "engram_n_heads": 8, "engram_head_dim": 256,
    "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092, "num_nextn_predict_layers": 3,
    "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256, "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3,
}

FULL_CONFIG_JSON = {
    "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 129264,
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                            "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
    "text_config": {**FULL_TEXT_CONFIG, "model_type": "deepseek_v41_text"},
    "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 32, "hidden_size": 1024,
                      "num_attention_heads": 16, "intermediate_size": 2816, "patch_size": 14, "rope_theta": 10000,
                      "downsample_ratio": 3, "max_image_tokens": 1024, "min_pixels": 295936, "max_wh_ratio": None},
}


def _small(text: dict, **over) -> dict:
    d = copy.deepcopy(text)
    d.update(over)
    return d


def _engram_rows(cfg_text: dict) -> list:
    # Rows per engram layer are fixed by the prime walk (spec §3.9/3.10); compute them so
    # the presets satisfy the self-check "each layer's primes sum to its row count".
    from dsv41c.prims.engram_hash import engram_primes

    primes = engram_primes(cfg_text["engram_layer_ids"], cfg_text["engram_max_ngram_size"],
                           cfg_text["engram_n_heads"], cfg_text["engram_vocab_size"])
    return [int(sum(p)) for p in primes]


_TINY_TEXT = _small(
    FULL_TEXT_CONFIG,
    vocab_size=512, hidden_size=64, num_attention_heads=4, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32,
    o_lora_rank=32, o_groups=2, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    sliding_window=16, candidate_topk_blocks=3, candidate_block_size=4, index_n_heads=4, index_head_dim=32,
    index_topk=8, engram_vocab_size=97, engram_n_heads=2, engram_head_dim=32, engram_compressed_vocab_size=512,
    dspark_noise_token_id=500, dspark_markov_rank=16, dspark_n_routed_experts=4, dspark_num_experts_per_tok=2,
    max_position_embeddings=4096,
)

_MINI_TEXT = _small(
    _TINY_TEXT,
    vocab_size=1024, hidden_size=128, num_attention_heads=8, head_dim=64, qk_rope_head_dim=32, q_lora_rank=64,
    o_lora_rank=64, o_groups=4, n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
    num_hidden_layers=12,
    # 0-1 SWA (1 Engram) · 2-5 ratio 2 (2 Full, 3-5 Reuse; 4 Engram) · 6-11 ratio 1
    # (6 Full + candidate source, 7 Reuse, 8 Reindex, 9 Reuse, 10 Reindex, 11 Reuse).
    compress_ratios=[0, 0] + [2] * 4 + [1] * 6 + [0, 0, 0],
    kv_source_layer_ids=[2, 6], index_source_layer_ids=[2, 6, 8, 10], candidate_source_layer_id=6,
    engram_layer_ids=[1, 4], dspark_target_layer_ids=[9, 10, 11], engram_compressed_vocab_size=1024,
    dspark_noise_token_id=1000, index_n_heads=8, index_head_dim=64,
)

_BENCH_TEXT = _small(FULL_TEXT_CONFIG, n_routed_experts=32, dspark_n_routed_experts=16, engram_vocab_size=1 << 16)

_PRESET_TEXT = {"tiny": _TINY_TEXT, "mini": _MINI_TEXT, "bench": _BENCH_TEXT, "full": FULL_TEXT_CONFIG}
PRESETS = tuple(_PRESET_TEXT)


def preset_config_json(name: str) -> dict:
    """The official-format config.json dict of a preset."""
    if name not in _PRESET_TEXT:
        raise ConfigError(f"unknown preset '{name}' (choose from {', '.join(PRESETS)})")
    d = copy.deepcopy(FULL_CONFIG_JSON)
    text = copy.deepcopy(_PRESET_TEXT[name])
    if name != "full":
        text["engram_num_embeddings"] = _engram_rows(text)
    d["text_config"] = {**text, "model_type": "deepseek_v41_text"}
    return d


def preset(name: str) -> ModelConfig:
    return config_from_dict(preset_config_json(name), where=f"preset '{name}'", name=name)
