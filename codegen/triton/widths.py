"""The model widths the kernel library's ahead-of-time variants are specialized for, and the dense linears they give.

Why here: the kernel library is shared by the compiler and the runtime, so it cannot import the compiler's config
(frontend/config.py). `ModelWidths` names the config fields a kernel's specializations read, with the same names
as `ModelConfig`, so `ModelWidths.of(config)` takes them from any config (or anything with those attributes), and a
template's `specializations(target, widths)` is given them; `PUBLISHED` is the published DeepSeek-V4.1-Flash
config's (spec §1.2, §4), the default of every ahead-of-time build. tests/test_kernel_widths.py checks that
PUBLISHED equals `ModelWidths.of(preset("full"))`, so the two cannot drift apart.

Kernels take these widths as constexpr specialization keys (`C`, `D`, `K`, `N`, `H`, ...) from their launchers
(which read them off the tensors) or from these fields (ahead of time); no kernel module spells a width itself.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelWidths:
    hidden_size: int = 5120
    moe_intermediate_size: int = 2304
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_lora_rank: int = 1024
    o_groups: int = 8
    sliding_window: int = 128
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    engram_max_ngram_size: int = 4
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    num_nextn_predict_layers: int = 3
    n_routed_experts: int = 384
    num_experts_per_tok: int = 6
    dspark_n_routed_experts: int = 128
    dspark_num_experts_per_tok: int = 3

    @classmethod
    def of(cls, config) -> "ModelWidths":
        """The widths of a config (any object with these attribute names: a ModelConfig, a ModelWidths)."""
        missing = [f.name for f in dataclasses.fields(cls) if not hasattr(config, f.name)]
        if missing:
            raise ValueError(f"ModelWidths.of: {type(config).__name__} has no {', '.join(missing)}")
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @property
    def engram_cols(self) -> int:
        """Engram's hashed columns a token: (max_ngram - 1) · n_heads."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads


PUBLISHED = ModelWidths()


def dense_linears(w: ModelWidths = PUBLISHED) -> dict:
    """The FP8 dense linears of the model: name -> (N, K)."""
    return {
        "wq_a": (w.q_lora_rank, w.hidden_size),
        "wq_b": (w.num_attention_heads * w.head_dim, w.q_lora_rank),
        "wkv": (w.head_dim, w.hidden_size),
        "wo_b": (w.hidden_size, w.o_groups * w.o_lora_rank),
        "shared_w2": (w.hidden_size, w.moe_intermediate_size),
        "indexer_wq_b": (w.index_n_heads * w.index_head_dim, w.q_lora_rank),
        "engram_wkv": ((w.hc_mult + 1) * w.hidden_size, w.engram_cols * w.engram_head_dim),
        "mtp_main_proj": (w.hidden_size, w.num_nextn_predict_layers * w.hidden_size),
    }


def gated_linears(w: ModelWidths = PUBLISHED) -> dict:
    """The gated (SwiGLU) FP8 linears: name -> (N, K) of each of the pair."""
    return {"shared_w13": (w.moe_intermediate_size, w.hidden_size)}
