"""dsv41c's domain op library: torch.library custom ops in namespace `dsv41` (leaf package).

Imported by the compiler (tracing keeps each op whole through torch.export; the IR
registry's `dsv41.*` references call them) AND by the runtime (the executor calls
`torch.ops.dsv41.<name>`). It must import nothing from the compiler side (ir, passes,
codegen); for now the eager bodies reach the reference primitives through `_prims.py`.

Ops (schemas in kv_path.py / blocks.py):
    fq_window_kv, fq_compressed_kv, fq_indexer        FP8 / FP4 fake quantization
    sparse_attention                                  gathered-row attention with sinks
    compressor_step                                   compressor state update (+ new latents)
    index_scores, candidate_blocks, select_topk       the CSA2 indexer
    moe, engram_hash, engram_apply, hc_mixes          MoE, Engram, mHC
    dequant_weight                                    a stored checkpoint tensor -> compute dtype
    cache_append, ring_append                         state writes (state.py)
    kv_pack, kv_unpack                                packed KV formats (state.py)
    index_scores_int8                                 the indexer scores by exact integer dots (indexer_int8.py)
    compressor_fused                                  a KV source's compressor chain in one op (compressor_fused.py)

`import dsv41c.ops` registers them all (idempotent: Python imports each module once).
`OP_NAMES` lists them for inventories and tests.
"""
from __future__ import annotations

from dsv41c.ops import blocks, compressor_fused, indexer_int8, kv_path, state, weights  # noqa: F401  (registration side effect)

OP_NAMES = ("fq_window_kv", "fq_compressed_kv", "fq_indexer", "sparse_attention", "compressor_step",
            "index_scores", "candidate_blocks", "select_topk", "moe", "engram_hash", "engram_apply", "hc_mixes", "dequant_weight",
            "cache_append", "ring_append", "kv_pack", "kv_unpack", "index_scores_int8",
            "compressor_fused")
