"""plan-memory: every transient value gets an offset in one arena per function.

    plan-memory                              sizes at the module's binding (see below)
    plan-memory{bind="T=512,N20=65536"}      sizes at an explicit binding

What is in the arena: every tensor result of an op that the function does not return, plus
each op's scratch (`workspace_bytes = DIM` on the op: live during that op only; workspace
*operands* are ordinary values and planned as such). Outside it: the arguments (persistent
state `state.*` and weights), the returned values (logits, the new state) and the bases of
returned views, values a pass already marked `placement = "persistent"`, index and event
values, and the results of view ops (`ir/aliases.py`: they share their base's bytes).

Lifetimes: a value lives from its defining op to its last use in the scheduled order, a use
of any view of it included, extended to the last op that may still run concurrently with
any use (`ir/happens_before`: a use on a side stream keeps the buffer until the stream that
read it has joined the one that reuses it). Sizes are the type's bytes at a concrete binding, rounded up to 256 bytes.
Offsets: `passes/arena_fit.py` (best fit over the coalesced free gaps of each buffer's
lifetime, split at the low end; orders by size, start, lifetime length and size x length
tried, the smallest arena kept).

Binding of the symbolic dims, per function, first match wins: the `bind` option; the module
attribute `memory.bind.<function>` (text `T=2048,N20=4096`, which `config_binding` computes
from a config for the compile driver); then defaults: `T` = module attribute `chunk` or
2048; a symbol the arguments bind (cache lengths N<g>) = module attribute `max_context` or
4096 (an upper bound: a group holds at most one entry per position); a data-dependent
symbol (the compressor's emitted rows) = the value of `T`, else 1 (at most one row per token).

Records: results get `placement = "transient"` and `arena_offset = BYTES`; an op with
`workspace_bytes` gets `workspace_offset`; the module gets `memory.<fn>.arena_bytes`,
`.lower_bound` (max over time of live bytes), `.no_reuse` (the sum of all buffers),
`.caching_allocator` (`passes/caching_allocator.py`'s reserved peak for the same
allocation sequence), `.order` and `.binding`. Stats carry the same figures.
`memory_report(module)` gives them as a dict and `memory_report_files(module)` as the
artifact's reports/memory.json plus a timeline picture per function (PNG and SVG).

Known gaps: views are known by op name (`ir/aliases.py`), so a reshape that copies at run time
still shares its base's lifetime instead of owning bytes; no in-place reuse of an operand dying at the op that
defines the result (the intervals are closed); persistent state is sized by its owner,
not here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dsv41c.ir.aliases import is_alias_op, last_reads, returned_bases
from dsv41c.ir.happens_before import HappensBefore
from dsv41c.ir.symbolic import SymExpr, free_symbols
from dsv41c.ir.types import TensorType
from dsv41c.passes.arena_fit import ALIGN, ORDERS, align, best_placement, lower_bound
from dsv41c.passes.base import ModulePass, PassError, PassResult
from dsv41c.passes.caching_allocator import Estimate, simulate

DEFAULT_CHUNK = 2048
DEFAULT_CONTEXT = 4096


@dataclass
class Buffer:
    name: str          # the value's text name, or "<op name>#<position>.workspace"
    start: int         # first op position (inclusive)
    end: int           # last op position (inclusive), after the stream-join extension
    nbytes: int        # the type's bytes at the binding
    size: int          # nbytes rounded up to ALIGN
    value: object = field(default=None, repr=False, compare=False)
    op: object = field(default=None, repr=False, compare=False)   # the op, for a workspace


@dataclass
class MemoryPlan:
    function: str
    binding: dict
    buffers: list
    offsets: list
    arena: int
    lower_bound: int
    no_reuse: int
    order: str
    caching: Estimate

    def summary(self) -> dict:
        return {"bytes": self.arena, "lower_bound": self.lower_bound, "no_reuse": self.no_reuse,
                "caching_allocator_estimate": self.caching.reserved_peak,
                "caching_allocator_allocated_peak": self.caching.allocated_peak,
                "caching_allocator_segments": self.caching.segments,
                "ratio_to_lower_bound": round(self.arena / self.lower_bound, 4) if self.lower_bound else 1.0,
                "buffers": len(self.buffers), "order": self.order, "alignment": ALIGN,
                "binding": dict(sorted(self.binding.items()))}


def parse_binding(text: str, where: str) -> dict:
    env = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError("missing '='")
            SymExpr.symbol(name.strip())
            env[name.strip()] = int(value)
        except ValueError as e:
            raise PassError(f"plan-memory: {where}: bad binding {item!r} ({e}); want NAME=INT[,NAME=INT...], "
                            "e.g. T=2048") from None
    return env


def format_binding(env: dict) -> str:
    return ",".join(f"{k}={env[k]}" for k in sorted(env))


def function_symbols(f) -> set:
    out = set()
    for v in list(f.args) + [r for op in f.ops for r in op.results]:
        out |= v.type.free_symbols()
    for op in f.ops:
        out |= set(free_symbols(op.attrs.get("workspace_bytes", 0)))
    return out


def resolve_binding(module, f, bind: str = "") -> dict:
    """The concrete value of every symbol of f (see the module docstring for the order)."""
    env = parse_binding(bind, "option bind")
    attr = module.attrs.get(f"memory.bind.{f.name}")
    if isinstance(attr, str):
        for k, v in parse_binding(attr, f"module attribute memory.bind.{f.name}").items():
            env.setdefault(k, v)
    syms = function_symbols(f)
    if "T" in syms and "T" not in env:
        env["T"] = int(module.attrs.get("chunk") or DEFAULT_CHUNK)
    bound = f.bound_symbols()
    for s in sorted(syms - set(env)):
        if s in bound:
            env[s] = int(module.attrs.get("max_context") or DEFAULT_CONTEXT)
        else:
            env[s] = env.get("T", 1)
    return {k: v for k, v in env.items() if k in syms}


def config_binding(cfg, chunk: int, max_context: int) -> dict:
    """Exact bounds per function from a config: {"prefill": "T=..,N2=..,n2=..", "decode": "..."}.
    N<g> = ceil(max_context / ratio) entries of KV group g; n<g> = the rows a ratio-r
    compressor emits from a chunk, at most (chunk + r - 1) // r."""
    from dsv41c.frontend.layer_plan import layer_plan

    out = {}
    for fn, t in (("prefill", chunk), ("decode", 1)):
        env = {"T": t} if fn == "prefill" else {}
        for s in layer_plan(cfg)[: cfg.num_hidden_layers]:
            if s.mode != "full":
                continue
            env[f"N{s.index}"] = -(-max_context // s.ratio)
            env[f"n{s.index}"] = (t + s.ratio - 1) // s.ratio
        out[fn] = format_binding(env)
    return out


def binding_attrs(cfg, chunk: int = DEFAULT_CHUNK, max_context: int | None = None) -> dict:
    """Module attributes `memory.bind.<fn>` for `config_binding` (max_context: the config's
    max_position_embeddings unless given); the compile driver sets them before the pipeline."""
    ctx = int(max_context or cfg.max_position_embeddings)
    return {f"memory.bind.{fn}": text for fn, text in config_binding(cfg, chunk, ctx).items()}


def _nbytes(t, env, where) -> int:
    n = t.dtype.itemsize
    for d in t.shape:  # dim by dim: multiplying symbolic polynomials first costs more than the plan
        if not isinstance(d, int):
            try:
                d = int(d.evaluate(env))
            except KeyError:
                missing = sorted(d.free_symbols() - set(env))
                raise PassError(f"plan-memory: {where}: size {t} needs a value for {', '.join(missing)} "
                                f"(give plan-memory{{bind=\"{missing[0]}=...\"}})") from None
        n *= d
    return n


def collect_buffers(f, env) -> list:
    from dsv41c.ir.printer import function_namer

    names = function_namer(f)
    hb = HappensBefore(f)
    returned = returned_bases(f)  # a returned value and the base of a returned view outlive the call
    last = last_reads(f, hb)  # id(value) -> latest position that may still read it, or a view of it
    out = []
    for i, op in enumerate(f.ops):
        for r in op.results:
            if not isinstance(r.type, TensorType) or id(r) in returned or r.attrs.get("placement") == "persistent":
                continue
            if is_alias_op(op.name):  # a view: its base's bytes, kept until the view's last read
                continue
            n = _nbytes(r.type, env, f"@{f.name}: op #{i} {op.name} result {names(r)}")
            end = max(i, hb.last_unaware(i), last.get(id(r), i))
            out.append(Buffer(names(r)[1:], i, end, n, align(n), value=r))
        ws = op.attrs.get("workspace_bytes")
        if ws:
            n = ws if isinstance(ws, int) else _ws_eval(ws, env, f"@{f.name}: op #{i} {op.name} workspace_bytes")
            out.append(Buffer(f"{op.name}#{i}.workspace", i, max(i, hb.last_unaware(i)), n, align(n), op=op))
    return out


def _ws_eval(d, env, where):
    try:
        return int(d.evaluate(env))
    except (KeyError, AttributeError):
        raise PassError(f"plan-memory: {where}: {d} cannot be evaluated at {format_binding(env)}") from None


def allocation_events(buffers) -> list:
    """The alloc/free sequence an eager runtime makes: results allocated at their op, freed after their last use."""
    at_start: dict = {}
    at_end: dict = {}
    for k, b in enumerate(buffers):
        at_start.setdefault(b.start, []).append(k)
        at_end.setdefault(b.end, []).append(k)
    events = []
    for p in sorted(set(at_start) | set(at_end)):
        events += [("alloc", k, buffers[k].nbytes) for k in at_start.get(p, [])]
        events += [("free", k) for k in at_end.get(p, [])]
    return events


def plan_function(f, env, orders=ORDERS) -> MemoryPlan:
    bufs = collect_buffers(f, env)
    spans = [(b.start, b.end, b.size) for b in bufs]
    offsets, arena, order = best_placement(spans, orders)
    return _plan(f, env, bufs, offsets, arena, order)


def _plan(f, env, bufs, offsets, arena, order) -> MemoryPlan:
    spans = [(b.start, b.end, b.size) for b in bufs]
    return MemoryPlan(f.name, dict(env), bufs, offsets, arena, lower_bound(spans), sum(b.size for b in bufs),
                      order, simulate(allocation_events(bufs)))


def recorded_plan(module, f) -> MemoryPlan | None:
    """The plan plan-memory wrote into f (offsets from the value attributes), or None if it did not run."""
    binding, order = module.attrs.get(f"memory.{f.name}.binding"), module.attrs.get(f"memory.{f.name}.order")
    if not isinstance(binding, str) or not isinstance(order, str):
        return None
    env = parse_binding(binding, f"memory.{f.name}.binding")
    bufs = collect_buffers(f, env)
    offsets = []
    for b in bufs:
        off = (b.value.attrs if b.value is not None else b.op.attrs).get(
            "arena_offset" if b.value is not None else "workspace_offset")
        if not isinstance(off, int):
            return None
        offsets.append(off)
    arena = max([o + b.size for o, b in zip(offsets, bufs)] + [0])
    return _plan(f, env, bufs, offsets, arena, order)


def _module_attrs(plan: MemoryPlan) -> dict:
    p = f"memory.{plan.function}."
    return {p + "arena_bytes": plan.arena, p + "lower_bound": plan.lower_bound, p + "no_reuse": plan.no_reuse,
            p + "caching_allocator": plan.caching.reserved_peak, p + "order": plan.order,
            p + "binding": format_binding(plan.binding)}


@dataclass(frozen=True)
class PlanMemory(ModulePass):
    name: ClassVar[str] = "plan-memory"
    bind: str = ""

    def run(self, module) -> PassResult:
        stats: dict = {}
        attrs = dict(module.attrs)
        changed = False
        for f in module.functions.values():
            plan = plan_function(f, resolve_binding(module, f, self.bind))
            for op in f.ops:  # a view owns no bytes (an earlier plan's offset on it is dropped)
                if is_alias_op(op.name):
                    for r in op.results:
                        if "arena_offset" in r.attrs:
                            r.attrs = {k: v for k, v in r.attrs.items() if k not in ("arena_offset", "placement")}
                            changed = True
            for b, off in zip(plan.buffers, plan.offsets):
                if b.value is not None:
                    new = {**b.value.attrs, "placement": "transient", "arena_offset": off}
                    changed |= new != b.value.attrs
                    b.value.attrs = new
                else:
                    new = {**b.op.attrs, "workspace_offset": off}
                    changed |= new != b.op.attrs
                    b.op.attrs = new
            summary = _module_attrs(plan)
            changed |= any(attrs.get(k) != v for k, v in summary.items())
            attrs.update(summary)
            for key, val in (("buffers", len(plan.buffers)), ("arena-bytes", plan.arena),
                             ("lower-bound", plan.lower_bound), ("no-reuse", plan.no_reuse),
                             ("caching-allocator", plan.caching.reserved_peak)):
                stats[f"{key}:{f.name}"] = val
        module.attrs = attrs
        return PassResult(module, changed, stats)


def plan_module(module, bind: str = "") -> dict:
    """{function: MemoryPlan}: the one plan-memory recorded in the module, else planned now
    (at `bind`, then the module's binding attributes and the defaults)."""
    out = {}
    for f in module.functions.values():
        plan = None if bind else recorded_plan(module, f)
        out[f.name] = plan if plan is not None else plan_function(f, resolve_binding(module, f, bind))
    return out


def memory_report(module, bind: str = "") -> dict:
    """Per function: bytes, lower_bound, no_reuse, caching_allocator_estimate, ... (see MemoryPlan.summary)."""
    return {name: p.summary() for name, p in plan_module(module, bind).items()}


def memory_report_files(module, bind: str = "", pictures: bool = True) -> dict:
    """reports/memory.json and, with `pictures`, reports/memory_<fn>.png/.svg: {relpath: str | bytes}."""
    import json

    from dsv41c.passes.memory_timeline import draw_timeline

    plans = plan_module(module, bind)
    report = {"functions": {name: p.summary() for name, p in plans.items()}, "pictures": {}}
    files = {}
    if pictures:
        for name, p in plans.items():
            png, svg = draw_timeline(p)
            files[f"reports/memory_{name}.png"] = png
            files[f"reports/memory_{name}.svg"] = svg
            report["pictures"][name] = [f"reports/memory_{name}.png", f"reports/memory_{name}.svg"]
    files["reports/memory.json"] = json.dumps(report, indent=1, sort_keys=True) + "\n"
    return files
