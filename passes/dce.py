"""dce: erase ops whose results nothing uses.

Algorithm: one backward sweep per function over the op list (ops are in SSA order, so a
use always comes after its definition): the returned values are live; an op is kept if it
has side effects (`writes`/`sync` in the registry, e.g. cache appends and stream
record/wait), is not registered (kept, so an unknown op is reported by the verifier rather
than silently dropped), or defines a live value; a kept op makes its operands live.
Linear in the number of ops and operands.

Stats: `erased` (total) and `erased:<op name>` per op kind.
Known gaps: unused function arguments stay (the signature is the runtime's ABI).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import erase_dead_ops


@dataclass(frozen=True)
class DeadCodeElimination(ModulePass):
    name: ClassVar[str] = "dce"

    def run(self, module) -> PassResult:
        stats = {}
        total = 0
        for f in module.functions.values():
            for op_name, n in erase_dead_ops(f).items():
                stats[f"erased:{op_name}"] = stats.get(f"erased:{op_name}", 0) + n
                total += n
        return PassResult(module, total > 0, {"erased": total, **dict(sorted(stats.items()))})
