"""The `cpu` target: lower the final IR to `program.json`, a flat list of torch calls per function.

The runtime may not import the IR, so each op becomes data: a torch target the runtime
looks up with `torch.ops` (`aten.matmul`, `aten.slice.Tensor`, `dsv41.moe.default`) or
one of a few runtime built-ins for host integers (`rt.dim`, `rt.size`, `rt.add`, ...),
its positional arguments and keyword arguments. Values are numbered slots.

Encoding of an argument: `{"v": slot}` a value; `{"dim": "T+15"}` a symbolic size (IR
dim text: `+ - * //` and parentheses, evaluated with the function's symbol bindings);
`{"dtype": "float32"}`; `{"float": "inf"}` for non-finite floats; lists as lists; other
JSON scalars as themselves.

Per function: `args` (name, role input|state|weight, dtype, shape, and for state the
initial fill), `symbols` (symbol -> [arg index, dim] to bind on entry), `ops` (target,
args, kwargs, out slots, `bind` = [[result, dim, symbol]] for data-dependent sizes,
`free` = slots dead after the op, `loc`), `outputs` and `output_names`.

Lowering rules: an IR op whose reference is ATen's generic `aten(name)` call is emitted
the same way (first argument positional, the rest by schema name); the others follow
`_SPECIAL` (positional order for ATen's own argument names); `dsv41.*` ops call their
custom op with every argument in schema order, except the state writes (`cache_append`,
`ring_append`), which become the runtime's in-place `rt.cache_append` / `rt.ring_append`. An op with no rule raises `PlanError`
(never a silent fallback). JSON is written with sorted keys and fixed separators, so the
same IR gives the same bytes.
A `kernel.call` (GPU targets) becomes `{"target": "kernel.<template>", "args": operands in the
contract's order, "kwargs": its specialization keys, "kernel": {template, variant, target, keys}}`:
the launcher takes the keys (what specialize-kernels decided) as keyword arguments; the runtime launches that variant
(or, interpreted, its launcher in Triton's interpreter).
Streams (GPU plans after schedule-streams): every op record carries `stream` (its stream index,
0 = main) in a function that uses more than one stream, and the function lists its `streams`;
`stream.record` becomes `{"target": "rt.record", "out": [event slot]}` and `stream.wait` becomes
`{"target": "rt.wait", "args": [{"v": event slot}]}`, both on their own stream. A device runtime
maps each index to a queue (torch.cuda.Stream) and each event slot to a torch.cuda.Event; the
reference executor runs the steps in program order, which is one valid schedule.
Arena (plan-memory ran): the values the runtime writes into its arena (ATen ops with an out= form, whose
shape is known before they run) are placed again with plan-memory's lifetimes, without the values kernel
launchers and reference ops allocate themselves; the function carries `arena` = {"bytes" (that arena),
"binding", "planned_bytes" (plan-memory's arena of every transient value), "unserved" (kernel / domain /
other: values and bytes made outside it)} and such an op carries `arena` = per result {offset, bytes
(planned at the binding), dtype, shape} or null; an op whose result may be a view of its first operand
(`ir/aliases.py`) carries `alias: true`.
`once: true` (hoist-invariants) marks an op that reads only weights and constants: the runtime runs it at
the function's first call and keeps what later calls read.
Known gaps: the program is one format for every target; `free` is by program order, so a
device runtime that frees slots itself must keep a slot read on a side stream until that
stream joins (the arena plan already does: plan-memory extends lifetimes to the joins).
"""
from __future__ import annotations

import json
import math

from dsv41c.aten_targets import aten_target, out_form, takes_device
from dsv41c.ir.aliases import is_alias_op
from dsv41c.ir.core import Value
from dsv41c.ir.happens_before import op_stream
from dsv41c.ir.registry import get
from dsv41c.ir.symbolic import SymExpr
from dsv41c.ir.types import DType, TensorType

PROGRAM_FORMAT = "dsv41c-cpu-program/1"


class PlanError(ValueError):
    """The plan holds an op the target cannot run."""


# IR op -> (torch target, positional schema args, keyword schema args); "@dtype" = the result dtype
_VIEWS = {"aten.view": "aten.reshape", "aten.reshape": "aten.reshape", "aten.broadcast_to": "aten.expand"}
_SPECIAL = {
    "aten.to": ("aten._to_copy", ["self"], ["dtype"]),
    "aten.type_as": ("aten._to_copy", ["self"], ["@dtype"]),
    "aten.permute": ("aten.permute", ["self", "dims"], []),
    "aten.transpose": ("aten.transpose.int", ["self", "dim0", "dim1"], []),
    "aten.t": ("aten.t", ["self"], []),
    "aten.unsqueeze": ("aten.unsqueeze", ["self", "dim"], []),
    "aten.expand": ("aten.expand", ["self", "size"], []),
    "aten.flatten": ("aten.flatten.using_ints", ["self", "start_dim", "end_dim"], []),
    "aten.cat": ("aten.cat", ["tensors", "dim"], []),
    "aten.stack": ("aten.stack", ["tensors", "dim"], []),
    "aten.split_with_sizes": ("aten.split_with_sizes", ["self", "split_sizes", "dim"], []),
    "aten.split": ("aten.split.Tensor", ["self", "split_size", "dim"], []),
    "aten.chunk": ("aten.chunk", ["self", "chunks", "dim"], []),
    "aten.unbind": ("aten.unbind.int", ["self", "dim"], []),
    "aten.slice": ("aten.slice.Tensor", ["self", "dim", "start", "end", "step"], []),
    "aten.select": ("aten.select.int", ["self", "dim", "index"], []),
    "aten.narrow": ("aten.narrow", ["self", "dim", "start", "length"], []),
    "aten.repeat": ("aten.repeat", ["self", "repeats"], []),
    "aten.flip": ("aten.flip", ["self", "dims"], []),
    "aten.roll": ("aten.roll", ["self", "shifts", "dims"], []),
    "aten.tril": ("aten.tril", ["self", "diagonal"], []),
    "aten.triu": ("aten.triu", ["self", "diagonal"], []),
    "aten.arange": ("aten.arange.start_step", ["start", "end", "step"], ["dtype"]),
    "aten.full": ("aten.full", ["size", "fill_value"], ["@dtype"]),
    "aten.full_like": ("aten.full_like", ["self", "fill_value"], ["@dtype"]),
    "aten.index_select": ("aten.index_select", ["self", "dim", "index"], []),
    "aten.gather": ("aten.gather", ["self", "dim", "index"], []),
    "aten.scatter_add": ("aten.scatter_add", ["self", "dim", "index", "src"], []),
    "aten.index_add": ("aten.index_add", ["self", "dim", "index", "source"], ["alpha"]),
    "aten.embedding": ("aten.embedding", ["weight", "indices"], []),
    "aten.one_hot": ("aten.one_hot", ["self", "num_classes"], []),
    "aten.nonzero": ("aten.nonzero", ["self"], []),
    "aten.topk": ("aten.topk", ["self", "k", "dim", "largest", "sorted"], []),
    "aten.sort": ("aten.sort", ["self"], ["stable", "dim", "descending"]),
    "aten.argsort": ("aten.argsort", ["self"], ["stable", "dim", "descending"]),
    "aten.view_dtype": ("aten.view.dtype", ["self", "dtype"], []),
    "aten.scalar_tensor": ("aten.scalar_tensor", ["s"], ["dtype"]),
    "aten.sym_size": ("rt.size", ["self", "dim"], []),
    "aten.sym_numel": ("rt.numel", ["self"], []),
    "sym.const": ("rt.dim", ["value"], []),
    "sym.add": ("rt.add", ["a", "b"], []),
    "sym.sub": ("rt.sub", ["a", "b"], []),
    "sym.mul": ("rt.mul", ["a", "b"], []),
    "sym.floordiv": ("rt.floordiv", ["a", "b"], []),
}
for _n in ("clone", "alias", "detach", "contiguous"):
    _SPECIAL[f"aten.{_n}"] = ("aten.clone", ["self"], [])
for _n, _v in (("zeros", 0), ("ones", 1), ("empty", 0)):
    _SPECIAL[f"aten.{_n}"] = ("aten.full", ["size", "#" + str(_v)], ["@dtype"])
    _SPECIAL[f"aten.{_n}_like"] = ("aten.full_like", ["self", "#" + str(_v)], ["@dtype"])
    _SPECIAL[f"aten.new_{_n}"] = ("aten.full", ["size", "#" + str(_v)], ["@dtype"])
_POSITIONAL = {"einsum": 2}
_IN_PLACE = {"dsv41.cache_append": "rt.cache_append", "dsv41.ring_append": "rt.ring_append"}


def _enc(x, slot):
    if isinstance(x, Value):
        return {"v": slot[id(x)]}
    if isinstance(x, SymExpr):
        return {"dim": str(x)}
    if isinstance(x, DType):
        return {"dtype": x.torch_name}
    if isinstance(x, float) and not math.isfinite(x):
        return {"float": repr(x)}
    if isinstance(x, (list, tuple)):
        return [_enc(v, slot) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise PlanError(f"cannot encode attribute value {x!r}")


def _full_indices(args, rank):
    out = [None] * rank
    pos = range(len(args["indices"])) if args["positions"] is None else [p % max(rank, 1) for p in args["positions"]]
    for p, v in zip(pos, args["indices"]):
        out[p] = v
    while out and out[-1] is None:
        out.pop()
    return out


def lower_op(op, slot: dict) -> dict:
    """One IR op -> {"target", "args", "kwargs"} (see the module docstring)."""
    opdef = get(op.name)
    args, dyn = opdef.bind(op.operands, op.attrs)
    if dyn:  # a `?` dim fold-shapes left: the index operand's value fills it at run time
        filled = opdef.resolve_dyn(dict(op.attrs), dyn)
        for k in filled:
            if k in args:
                args[k] = filled[k]
    name = op.name
    if name == "stream.record":
        return {"target": "rt.record", "args": [], "kwargs": {}}
    if name == "stream.wait":
        return {"target": "rt.wait", "args": [_enc(op.operands[0], slot)], "kwargs": {}}
    if name == "kernel.call" and not op.attrs.get("op"):
        from dsv41c.ir.kernel_contracts import keys_of

        return {"target": "kernel." + op.attrs["template"], "args": [_enc(v, slot) for v in op.operands],
                "kwargs": {k: _enc(v, slot) for k, v in keys_of(op.attrs).items()},  # the pass's decisions
                "kernel": {"template": op.attrs["template"], "variant": op.attrs["variant"],
                                         "target": op.attrs["target"], "keys": dict(keys_of(op.attrs))}}
    if name.startswith("dsv41."):
        names = [a.name for a in opdef.schema.args]
        # a state write runs in place in the runtime (rt.cache_append / rt.ring_append: the same arguments)
        target = _IN_PLACE.get(name, name + ".default")
        return {"target": target, "args": [_enc(args[n], slot) for n in names], "kwargs": {}}
    if name in ("aten.index", "aten.index_put"):
        full = _full_indices(args, op.operands[0].type.rank)
        pos = [args["self"], full] + ([args["values"], args["accumulate"]] if name == "aten.index_put" else [])
        return {"target": name + (".Tensor" if name == "aten.index" else ""), "args": _enc(pos, slot), "kwargs": {}}
    if name in ("aten.squeeze",):
        if args["dim"] is None:
            return {"target": "aten.squeeze", "args": [_enc(args["self"], slot)], "kwargs": {}}
        return {"target": "aten.squeeze.dims", "args": _enc([args["self"], args["dim"]], slot), "kwargs": {}}
    if name in _VIEWS:
        return {"target": _VIEWS[name], "args": _enc([args["self"], args["size"]], slot), "kwargs": {}}
    rule = _SPECIAL.get(name)
    if rule is not None:
        target, pos, kw = rule
        rdt = op.results[0].type.dtype if op.results and isinstance(op.results[0].type, TensorType) else None

        def pick(n):
            if n == "@dtype":
                return rdt
            if n.startswith("#"):
                return int(n[1:])
            return args[n]

        return {"target": target, "args": [_enc(pick(n), slot) for n in pos],
                "kwargs": {("dtype" if n == "@dtype" else n): _enc(pick(n), slot) for n in kw}}
    impl_name = getattr(opdef.impl, "__name__", "")
    short = name.split(".", 1)[1]
    if name.startswith("aten.") and impl_name == f"aten_{short}":
        items = [(a.name, args[a.name]) for a in opdef.schema.args]  # schema order, as the interpreter
        n = _POSITIONAL.get(short, 1)
        return {"target": name, "args": [_enc(v, slot) for _, v in items[:n]],
                "kwargs": {k: _enc(v, slot) for k, v in items[n:]}}
    raise PlanError(f"target cpu: no lowering for op {name} (loc {op.loc}); the cpu plan runs ATen and dsv41 ops only")


def _dims_json(t):
    return [d if isinstance(d, int) else str(d) for d in t.shape]


def _bare(d):
    if isinstance(d, SymExpr) and len(d.free_symbols()) == 1 and str(d) in d.free_symbols():
        return str(d)
    return None


def arena_plan(module, fname: str) -> dict | None:
    """The function's arena as plan-memory recorded it: {"bytes", "binding"}, or None (not planned)."""
    from dsv41c.passes.plan_memory import parse_binding

    size, text = module.attrs.get(f"memory.{fname}.arena_bytes"), module.attrs.get(f"memory.{fname}.binding")
    if not isinstance(size, int) or not isinstance(text, str):
        return None
    return {"bytes": size, "binding": parse_binding(text, f"memory.{fname}.binding")}


def lower_function(f, output_names, state_fill: dict, arena: dict | None = None) -> dict:
    slot: dict = {}
    args, symbols = [], {}
    for i, a in enumerate(f.args):
        slot[id(a)] = i
        role = "input" if a.name == "ids" else "state" if a.name.startswith("state.") else "weight"
        entry = {"name": a.name, "role": role}
        if isinstance(a.type, TensorType):
            entry.update(dtype=a.type.dtype.torch_name, shape=_dims_json(a.type))
            for d, x in enumerate(a.type.shape if role != "weight" else ()):  # weights are static
                s = _bare(x)
                if s is not None and s not in symbols:
                    symbols[s] = [i, d]
        if role == "state":
            entry["fill"] = state_fill.get(a.name, 0)
        args.append(entry)
    nslot = len(f.args)
    ops, bound = [], set(symbols)
    streams = sorted({op_stream(op) for op in f.ops} | {0})
    writer: dict = {}  # id(placed result) -> (its record, None if the runtime writes it into its arena, else who makes it)
    for op in f.ops:
        rec = lower_op(op, slot)
        known = set(bound)  # the sizes the runtime has bound before this op runs
        if len(streams) > 1:
            rec["stream"] = op_stream(op)
        if op.attrs.get("once"):
            rec["once"] = True  # hoist-invariants: run at the function's first call only
        outs, binds = [], []
        for r in op.results:
            slot[id(r)] = nslot
            outs.append(nslot)
            nslot += 1
            if isinstance(r.type, TensorType):
                for d, x in enumerate(r.type.shape):
                    s = _bare(x)
                    if s is not None and s not in bound:
                        binds.append([r.index, d, s])
                        bound.add(s)
        rec["out"] = outs
        if arena is not None:
            for r in op.results:
                if "arena_offset" in r.attrs:
                    writer[id(r)] = (rec, _arena_writer(rec, r, known, len(op.results)))
        if is_alias_op(op.name):
            rec["alias"] = True  # its result may share operand 0's bytes (planned so: ir/aliases.py)
        if binds:
            rec["bind"] = binds
        if op.loc:
            rec["loc"] = op.loc
        ops.append(rec)
    _add_frees(f, ops, slot)
    out = {"args": args, "symbols": symbols, "ops": ops, "outputs": [slot[id(v)] for v in f.returns],
           "output_names": list(output_names), "nslots": nslot, "streams": streams}
    if arena is not None:
        out["arena"] = _served_arena(f, arena, writer)
    return out


def _arena_writer(rec, r, known: set, nresults: int) -> str | None:
    """None if the runtime writes this placed result into its arena slot (an ATen target with an out= form,
    not a factory, one result, a shape known before the op runs), else who makes it: kernel / domain / other."""
    target = rec["target"]
    if target.startswith("kernel."):
        return "kernel"
    if target.startswith("dsv41."):
        return "domain"
    fn = aten_target(target)
    if (fn is None or nresults != 1 or out_form(fn) is None or (takes_device(fn) and "device" not in rec.get("kwargs", {}))
            or not r.type.free_symbols() <= known):
        return "other"
    return None


def _served_arena(f, arena: dict, writer: dict) -> dict:
    """The arena of the values the runtime writes: plan-memory's lifetimes of those values only, placed again
    (`passes/arena_fit.py`), so the bytes of values that kernel launchers and reference ops allocate for
    themselves are not reserved twice. Records each such result's slot in its op's `arena` list."""
    from dsv41c.passes.arena_fit import best_placement
    from dsv41c.passes.plan_memory import collect_buffers

    served, unserved = [], {k: {"values": 0, "bytes": 0} for k in ("kernel", "domain", "other")}
    for b in collect_buffers(f, arena["binding"]):
        if b.value is None or id(b.value) not in writer:
            continue
        kind = writer[id(b.value)][1]
        if kind is None:
            served.append(b)
        else:
            unserved[kind]["values"] += 1
            unserved[kind]["bytes"] += b.nbytes
    offsets, size, _ = best_placement([(b.start, b.end, b.size) for b in served])
    for b, off in zip(served, offsets):
        rec, t = writer[id(b.value)][0], b.value.type
        rec.setdefault("arena", [None] * len(rec["out"]))[b.value.index] = {
            "offset": off, "bytes": b.nbytes, "dtype": t.dtype.torch_name, "shape": _dims_json(t)}
    return {"bytes": size, "binding": arena["binding"], "planned_bytes": arena["bytes"], "unserved": unserved}


def _add_frees(f, ops, slot):
    """`free`: the slots whose last use is this op (returned values and weights are kept)."""
    keep = {slot[id(v)] for v in f.returns} | {slot[id(a)] for a in f.args}
    last = {}
    for i, op in enumerate(f.ops):
        for v in op.operands:
            last[slot[id(v)]] = i
        for r in op.results:  # a result nobody uses dies where it is made
            last.setdefault(slot[id(r)], i)
    frees: dict = {}
    for s, i in last.items():
        if s not in keep:
            frees.setdefault(i, []).append(s)
    for i, rec in enumerate(ops):
        if i in frees:
            rec["free"] = sorted(frees[i])


def emit_program(module, state_fill: dict) -> str:
    """The final IR module -> program.json text (deterministic bytes)."""
    outs = list(module.attrs.get("outputs", ()))
    # a function returning other values than @prefill (split-ced-prefill's @prefill_encoder) names them itself
    fns = {name: lower_function(f, list(module.attrs.get(f"outputs.{name}", outs)), state_fill,
                                arena_plan(module, name))
           for name, f in module.functions.items()}
    return json.dumps({"format": PROGRAM_FORMAT, "functions": fns}, sort_keys=True, separators=(",", ":")) + "\n"
