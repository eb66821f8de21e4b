"""The reference primitives the domain ops run eagerly: the ONE place that imports them.

The ops' eager implementations ARE the reference model's primitive functions, so the
compiled plan and the eager oracle cannot drift apart. They still live in
`dsv41c.frontend.model.*` (and `dsv41c.frontend.engram_hash`); when the lead moves those
modules into this leaf package only the import lines below change, and the runtime's
import graph no longer reaches `frontend/`.
"""
from __future__ import annotations

from dsv41c.frontend.model.attention import sparse_attention  # noqa: F401
from dsv41c.frontend.model.compressor import compressor_step  # noqa: F401
from dsv41c.frontend.model.engram import chunk_row_ids, engram_apply  # noqa: F401
from dsv41c.frontend.model.indexer import candidate_blocks, index_scores, select_topk  # noqa: F401
from dsv41c.frontend.model.mhc import hc_mixes  # noqa: F401
from dsv41c.frontend.model.moe import moe_forward  # noqa: F401
from dsv41c.frontend.model.quant import fq_compressed_kv, fq_indexer, fq_window_kv  # noqa: F401
