"""plan-chunks: the prefill chunk size from a memory budget.

    plan-chunks                              no budget: the module's chunk stays; its weights and state reported
    plan-chunks{budget=85899345920}          the largest chunk whose plan fits 80 GiB

What must fit one device: the weights (the function's arguments of a static size other than
`ids` and the state, as stored), the persistent state (its `state.*` arguments at the
module's binding: fixed capacity at the compile's `--max-context`, or the N<g> symbols bound
at `memory.bind.prefill`), and one transient arena, which prefill and decode take in turn: max(arena of @prefill at chunk T,
arena of @decode). The arena at a chunk is plan-memory's own planner (`plan_function`, the
same orders, the same lifetimes over the scheduled order) run at the binding of that chunk:
`T` = chunk, and each data-dependent symbol (the rows a ratio-r compressor emits from a
chunk) at its bound (T + r - 1) // r, read from the `dsv41.compressor_step` that makes it,
else T (at most a row per token).

Algorithm: the candidates are the powers of two from `min_chunk` up to `max_chunk` (default:
the module's `max_context`, else 65536); each is planned, and the largest whose total fits
the budget is kept (the table does not assume the arena grows with the chunk). The module
gets `chunk` and `memory.bind.prefill` at the chosen chunk, so plan-memory then places the
arena there. A budget that cannot hold weights + state + the decode arena, or not even the
smallest chunk, is refused with the figures.

Weight reuse (in the table): the weight bytes a chunk reads once for all its tokens, per
prompt token: (dense weights + routed experts × the expected fraction a chunk touches) /
chunk, where a chunk of T tokens routed top-k of E (uniformly) touches 1 - (1 - k/E)^T of the
experts (E and k from the `dsv41.moe` ops; expert weights are the arguments named
`.experts.`).

Stats: `chunk`, `budget`, `weights-bytes`, `state-bytes`, `decode-arena-bytes`,
`arena-bytes` (at the chunk), `total-bytes`, `headroom-bytes`, and per candidate
`arena-bytes:chunk<T>`, `total-bytes:chunk<T>`, `weight-bytes-per-token:chunk<T>`;
`chunk_table(stats)` reads the table back; `chunk_report_files(records)` is the artifact's
reports/chunks.json (the chosen chunk, the figures, the table).

Known gaps: no TTFT term (the largest fitting chunk is taken; a latency target could stop
earlier); routing is assumed uniform for the reuse estimate; the KV-cache of a batch of
sessions is one session's state (no batch dimension yet); the CUDA context and the kernel
binaries' own memory are not counted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.types import TensorType
from dsv41c.passes.base import ModulePass, PassError, PassResult
from dsv41c.passes.plan_memory import DEFAULT_CHUNK, format_binding, function_symbols, plan_function, resolve_binding

MAX_CHUNK = 65536
_CHUNK_KEY = re.compile(r"(arena-bytes|total-bytes|weight-bytes-per-token):chunk(\d+)$")


def _bytes(t, env, where) -> int:
    if not isinstance(t, TensorType):
        return 0
    n = t.nbytes
    if isinstance(n, int):
        return n
    try:
        return int(n.evaluate(env))
    except KeyError:
        raise PassError(f"plan-chunks: {where}: size {t} has a symbol the binding {format_binding(env)} "
                        "does not give") from None


def _is_state(a) -> bool:
    return a.name.startswith("state.")


def _is_weight(a) -> bool:
    """A weight: an argument that is not the input ids nor state, of a static size (a sized-by-T one is an input)."""
    return (a.name != "ids" and not _is_state(a) and isinstance(a.type, TensorType)
            and isinstance(a.type.nbytes, int))


def weight_bytes(f) -> int:
    return sum(a.type.nbytes for a in f.args if _is_weight(a))


def state_bytes(module, f) -> int:
    env = resolve_binding(module, f)
    return sum(_bytes(a.type, env, f"@{f.name} state {a.name}") for a in f.args if _is_state(a))


def chunk_binder(module, f):
    """-> binding(chunk): f's binding with `T` = chunk and each compressor's emitted rows at their bound
    for that chunk (the symbols and the compressors are found once)."""
    base = resolve_binding(module, f)
    syms = function_symbols(f)
    ratio_of = {}
    for op in f.ops:
        if op.name == "dsv41.compressor_step" and op.results and isinstance(op.results[0].type, TensorType):
            d = op.results[0].type.shape[0]
            if not isinstance(d, int) and len(d.free_symbols()) == 1 and str(d) in d.free_symbols():
                ratio_of[str(d)] = int(op.attrs.get("ratio", 1))
    free = syms - f.bound_symbols() - {"T"}

    def binding(chunk: int) -> dict:
        env = {**base, "T": chunk}
        for s in free:
            r = ratio_of.get(s)
            env[s] = (chunk + r - 1) // r if r else chunk
        return {k: v for k, v in env.items() if k in syms}

    return binding


def chunk_binding(module, f, chunk: int) -> dict:
    """f's binding at one chunk (`chunk_binder` for several)."""
    return chunk_binder(module, f)(chunk)


def _routing(f):
    """(E, k) of the first MoE op, or None."""
    for op in f.ops:
        name = op.attrs.get("op") if op.name == "kernel.call" else op.name
        if name == "dsv41.moe" and "top_k" in op.attrs:
            return _expert_count(op), int(op.attrs["top_k"])
    return None


def _expert_count(op) -> int:
    from dsv41c.ir.registry import get

    args, _ = get("dsv41.moe").bind(op.operands, {k: v for k, v in op.attrs.items()
                                                 if k not in ("template", "variant", "target", "op")})
    return len(args["experts"]) // 3


def reuse_per_token(f, chunk: int) -> float:
    """Weight bytes read per prompt token at `chunk` (see the module docstring)."""
    experts = sum(a.type.nbytes for a in f.args if ".experts." in a.name and _is_weight(a))
    dense = weight_bytes(f) - experts
    routing = _routing(f)
    frac = 1.0 if not routing or not routing[0] else 1.0 - (1.0 - routing[1] / routing[0]) ** chunk
    return round((dense + experts * frac) / chunk, 1)


def chunk_table(stats: dict) -> list:
    """[{chunk, arena_bytes, total_bytes, weight_bytes_per_token}] from plan-chunks' stats."""
    rows: dict = {}
    for k, v in stats.items():
        m = _CHUNK_KEY.match(k)
        if m:
            rows.setdefault(int(m.group(2)), {"chunk": int(m.group(2))})[m.group(1).replace("-", "_")] = v
    return [rows[c] for c in sorted(rows)]


def chunk_report_files(records) -> dict:
    """reports/chunks.json from a pipeline run's records, when plan-chunks ran with a budget, else {}."""
    import json

    rec = next((r for r in records if r.name == "plan-chunks" and not r.disabled and r.stats.get("budget")), None)
    if rec is None:
        return {}
    head = {k.replace("-", "_"): v for k, v in rec.stats.items() if ":" not in k}
    return {"reports/chunks.json": json.dumps({**head, "table": chunk_table(rec.stats)}, indent=1, sort_keys=True)
            + "\n"}


def _gib(n) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)"


@dataclass(frozen=True)
class PlanChunks(ModulePass):
    name: ClassVar[str] = "plan-chunks"
    budget: int = 0
    min_chunk: int = 16
    max_chunk: int = 0

    def run(self, module) -> PassResult:
        pre, dec = module.functions.get("prefill"), module.functions.get("decode")
        if pre is None:
            return PassResult(module, False, {})
        if self.budget < 0 or self.min_chunk < 1 or self.max_chunk < 0:
            raise PassError(f"plan-chunks: budget, min_chunk and max_chunk must be >= 0 (min_chunk >= 1), got "
                            f"{self.budget}, {self.min_chunk}, {self.max_chunk}")
        weights, state = weight_bytes(pre), state_bytes(module, pre)
        current = int(module.attrs.get("chunk") or resolve_binding(module, pre).get("T") or DEFAULT_CHUNK)
        stats = {"weights-bytes": weights, "state-bytes": state, "budget": self.budget}
        if not self.budget:
            return PassResult(module, False, {"chunk": current, **stats})
        decode_arena = plan_function(dec, resolve_binding(module, dec)).arena if dec is not None else 0
        fixed = weights + state + decode_arena
        stats["decode-arena-bytes"] = decode_arena
        if fixed > self.budget:
            raise PassError(f"plan-chunks: the budget {_gib(self.budget)} cannot hold the weights {_gib(weights)} + "
                            f"the persistent state {_gib(state)} + the decode arena {_gib(decode_arena)} = "
                            f"{_gib(fixed)}; give a larger --memory-budget or a smaller --max-context")
        top = self.max_chunk or int(module.attrs.get("max_context") or MAX_CHUNK)
        cands, c = [], self.min_chunk
        while c <= max(top, self.min_chunk):
            cands.append(c)
            c *= 2
        best, table = None, {}
        binding = chunk_binder(module, pre)
        for c in cands:
            arena = plan_function(pre, binding(c)).arena
            total = weights + state + max(arena, decode_arena)
            table[c] = arena
            stats[f"arena-bytes:chunk{c}"] = arena
            stats[f"total-bytes:chunk{c}"] = total
            stats[f"weight-bytes-per-token:chunk{c}"] = reuse_per_token(pre, c)
            if total <= self.budget:
                best = c
        if best is None:
            c0 = cands[0]
            raise PassError(f"plan-chunks: the budget {_gib(self.budget)} cannot hold even a chunk of {c0}: weights "
                            f"{_gib(weights)} + state {_gib(state)} + arena {_gib(max(table[c0], decode_arena))} = "
                            f"{_gib(stats[f'total-bytes:chunk{c0}'])}")
        env = binding(best)
        total = stats[f"total-bytes:chunk{best}"]
        module.attrs = {**module.attrs, "chunk": best, "memory.bind.prefill": format_binding(env)}
        stats.update({"chunk": best, "arena-bytes": table[best], "total-bytes": total,
                      "headroom-bytes": self.budget - total})
        return PassResult(module, best != current, dict(sorted(stats.items())))
