"""The reference primitives the domain ops run eagerly: the ONE place that imports them.

The ops' eager implementations ARE the primitive functions the reference model composes
(`dsv41c.prims`, a leaf package), so the compiled plan and the eager oracle cannot drift
apart, and the runtime's import graph never reaches the compiler.
"""
from __future__ import annotations

from dsv41c.prims.attention import sparse_attention  # noqa: F401
from dsv41c.prims.compressor import compressor_step  # noqa: F401
from dsv41c.prims.engram import chunk_row_ids, engram_apply  # noqa: F401
from dsv41c.prims.indexer import candidate_blocks, index_scores, select_topk  # noqa: F401
from dsv41c.prims.mhc import hc_mixes  # noqa: F401
from dsv41c.prims.moe import moe_forward  # noqa: F401
from dsv41c.prims.quant import fq_compressed_kv, fq_indexer, fq_window_kv  # noqa: F401
