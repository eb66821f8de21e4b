"""lower-kv-fp4: the KV path's fake quantizers become packed state: codes + scales written in place.

What: every fake-quantize op (`dsv41.fq_compressed_kv`, `dsv41.fq_indexer`, `dsv41.fq_window_kv`)
becomes `dsv41.kv_pack` (codes, scales) plus, where the value itself is read, `dsv41.kv_unpack`;
a state buffer whose every write appends fake-quantized rows is stored packed instead:
- `state.comp_kv.<g>` [C, D] f32 -> `.codes` fp4e2m1x2 [C, D/2] + `.scales` fp8e4m3 [C, D/16]
  (E2M1, one E4M3 scale per 16 channels);
- `state.index_k.<g>` [C, Dk] -> `.codes` fp4e2m1x2 [C, Dk/2] + `.scales` e8m0 [C, Dk/32];
- `state.window.<L>` [W-1, D] -> `.codes` fp8e4m3 [W-1, D] + `.scales` e8m0 [W-1, D/32].
These are the layouts the kernels read (codegen/triton/kv_quant.py, compressor.py, sparse_attention.py:
packed FP4 low nibble = even channel, one scale byte per block, a row per entry / ring slot).
Each append of the float buffer becomes two appends (codes, scales) at the same row; each read
of a buffer version becomes one `kv_unpack` of it, placed before its first reader; the function
arguments and results (and the module's `outputs` names) change accordingly, so the state layout
of a kv-quant build is the packed one (`program.json` lists it, the runtime allocates it).

Why it is exact: `kv_unpack(kv_pack(x))` is the fake quantizer, bit for bit (`prims/kv_pack.py`),
and a zero-filled packed buffer unpacks to the zero-filled float buffer it replaces, so the plan
computes the same bits before and after; only the bytes it keeps change.

Algorithm, per function, two forward walks: (1) follow each state argument through the ops that
write it (registry `updates`); a buffer is packed when every write is a `cache_append` /
`ring_append` whose rows come from one fake quantizer (all of one format); (2) rewrite: fake
quantizers -> pack (+ unpack for their other readers), packed appends -> two appends, reads of a
packed version -> one unpack. Every function must pack the same buffers (the runtime keeps one
state for all of them).
Stats: `packed_buffers`, `fake_quant_removed`, `pack_ops`, `unpack_ops`, and from the packed
buffers' types: `kv_bytes_per_token:global` (per token of context, every KV group: the row bytes of
its caches / its ratio; 890 on `full`), `kv_bytes_per_token:window_per_layer` (a window row),
`window_bytes_per_layer` (the ring's rows x a row).
Refusals (PassError naming function, buffer and op): a buffer some of whose writes append
fake-quantized rows and some not, or rows of two formats; functions that pack different buffers.
Known gaps: the unpack of a cache version reads the whole buffer (the kernels that read the packed
form in place replace these unpacks in specialize-kernels); the indexer queries are packed and
unpacked at once (no kernel keeps them packed yet).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.core import Op, Value
from dsv41c.ir.ops_state import packed_types
from dsv41c.ir.registry import lookup
from dsv41c.ir.types import TensorType
from dsv41c.passes.base import ModulePass, PassError, PassResult

FAKE_QUANT = {"dsv41.fq_compressed_kv": "fp4_e4m3", "dsv41.fq_indexer": "fp4_ue8m0", "dsv41.fq_window_kv": "fp8_ue8m0"}
APPENDS = {"dsv41.cache_append": "cache", "dsv41.ring_append": "ring"}  # op -> its buffer operand (rows: operand 1)
PARTS = ("codes", "scales")


def _writes(op):
    """[(written value, its new value)] through the registry's `updates`."""
    d = lookup(op.name)
    if d is None or not d.updates:
        return []
    args, _ = d.bind(op.operands, op.attrs)
    return [(args[w], op.results[r]) for w, r in d.updates if args.get(w) is not None]


def _buffers(f) -> dict:
    """state argument name -> packed format, for the buffers every write of which appends fake-quantized rows."""
    root: dict = {id(a): a for a in f.args}
    fmts: dict = {}  # argument name -> [(format or None, op)]
    for op in f.ops:
        for v, new in _writes(op):
            a = root.get(id(v))
            if a is None:
                continue
            root[id(new)] = a
            rows = op.operands[1] if op.name in APPENDS and len(op.operands) > 1 else None
            fmt = FAKE_QUANT.get(rows.op.name) if rows is not None and rows.op is not None else None
            fmts.setdefault(a.name, []).append((fmt, op))
    out = {}
    for name, ws in fmts.items():
        kinds = {fmt for fmt, _ in ws}
        if kinds == {None}:
            continue  # a float buffer (kv-quant off, or a carry)
        bad = next((op for fmt, op in ws if fmt is None), None)
        if bad is not None or len(kinds) > 1:
            op = bad or ws[-1][1]
            raise PassError(f"lower-kv-fp4: @{f.name}: buffer {name} is written by {op.name} at loc({op.loc}) with "
                            + ("rows that are not fake-quantized, and elsewhere with fake-quantized rows"
                               if bad is not None else f"rows of formats {', '.join(sorted(kinds))}")
                            + ": it cannot be stored in one packed format")
        out[name] = kinds.pop()
    return out


@dataclass(frozen=True)
class LowerKvFp4(ModulePass):
    name: ClassVar[str] = "lower-kv-fp4"

    def run(self, module) -> PassResult:
        stats = {"packed_buffers": 0, "fake_quant_removed": 0, "pack_ops": 0, "unpack_ops": 0}
        packed_by_fn = {}
        for f in module.functions.values():
            bufs = _buffers(f)
            packed_by_fn[f.name] = bufs
            _rewrite(f, bufs, stats)
        layouts = {tuple(sorted(b.items())) for b in packed_by_fn.values()}
        if len(layouts) > 1:
            a, b = list(packed_by_fn)[:2]
            raise PassError(f"lower-kv-fp4: @{a} and @{b} would store different state buffers packed "
                            f"({sorted(packed_by_fn[a])} vs {sorted(packed_by_fn[b])}): the runtime keeps one state")
        changed = stats["fake_quant_removed"] > 0 or stats["packed_buffers"] > 0
        if changed:
            outs = module.attrs.get("outputs")
            bufs = next(iter(packed_by_fn.values()), {})
            if outs:
                module.attrs = {**module.attrs, "outputs": tuple(
                    x for n in outs for x in ([f"{n}.{p}" for p in PARTS] if n in bufs else [n]))}
            stats.update(kv_bytes(module))
        return PassResult(module, changed, stats)


def _rewrite(f, bufs: dict, stats: dict) -> None:
    uses: dict = {}
    for op in f.ops:
        for v in op.operands:
            uses.setdefault(id(v), []).append(op)
    packed: dict = {}   # id(float buffer version) -> (codes, scales, fmt, dtype)
    # the packed state arguments, in place of the float ones
    args = []
    for a in f.args:
        fmt = bufs.get(a.name)
        if fmt is None:
            args.append(a)
            continue
        ct, st = packed_types(a.type, fmt)
        parts = [Value(t, f"{a.name}.{p}", dict(a.attrs), owner=f) for p, t in zip(PARTS, (ct, st))]
        args += parts
        packed[id(a)] = (*parts, fmt, a.type.dtype)
        stats["packed_buffers"] += 1
    for i, v in enumerate(args):
        v.owner, v.index = f, i
    f.args = args
    sub: dict = {}      # id(old value) -> new value
    pack_of: dict = {}  # id(fake-quantized value) -> (codes, scales)
    out: list = []

    def unpacked(v, loc):
        """The float value of packed buffer version v (one kv_unpack per version, before its first reader)."""
        if id(v) not in sub:
            c, s, fmt, dt = packed[id(v)]
            u = Op("dsv41.kv_unpack", [c, s], [TensorType(dt, tuple(v.type.shape))], {"fmt": fmt, "dtype": dt}, loc,
                   [f"{v.name}.unpacked" if v.name else None])
            out.append(u)
            stats["unpack_ops"] += 1
            sub[id(v)] = u.result
        return sub[id(v)]

    for op in f.ops:
        fmt = FAKE_QUANT.get(op.name)
        if fmt is not None:
            x, y = op.operands[0], op.result
            x = sub.get(id(x), x)
            ct, st = packed_types(x.type, fmt)
            p = Op("dsv41.kv_pack", [x], [ct, st], {"fmt": fmt}, op.loc,
                   [f"{y.name}.{part}" if y.name else None for part in PARTS])
            out.append(p)
            stats["pack_ops"] += 1
            stats["fake_quant_removed"] += 1
            pack_of[id(y)] = tuple(p.results)
            readers = [u for u in uses.get(id(y), ()) if not _packed_rows_of(u, y, packed)]
            if readers or any(r is y for r in f.returns or ()):
                u = Op("dsv41.kv_unpack", list(p.results), [y.type], {"fmt": fmt, "dtype": y.type.dtype}, op.loc,
                       [y.name])
                out.append(u)
                stats["unpack_ops"] += 1
                sub[id(y)] = u.result
            continue
        if op.name in APPENDS and id(op.operands[0]) in packed:
            buf, rows, at = op.operands
            c, s, bfmt, dt = packed[id(buf)]
            rc, rs = pack_of[id(rows)]
            new = []
            for part, cur, r in (("codes", c, rc), ("scales", s, rs)):
                attrs = dict(op.attrs)
                attrs["name"] = f"{op.attrs.get('name', '')}.{part}"
                w = Op(op.name, [cur, r, sub.get(id(at), at)], [cur.type], attrs, op.loc,
                       [f"{op.result.name}.{part}" if op.result.name else None])
                out.append(w)
                new.append(w.result)
            packed[id(op.result)] = (*new, bfmt, dt)
            continue
        operands = []
        for v in op.operands:
            if id(v) in packed:
                operands.append(unpacked(v, op.loc))
            else:
                operands.append(sub.get(id(v), v))
        op.operands = operands
        out.append(op)
    rets, types = [], []
    for v in f.returns or ():
        if id(v) in packed:
            c, s = packed[id(v)][:2]
            rets += [c, s]
            types += [c.type, s.type]
        else:
            v = sub.get(id(v), v)
            rets.append(v)
            types.append(v.type)
    f.ops, f.returns, f.result_types = out, rets, types


def _packed_rows_of(op, y, packed) -> bool:
    """op appends y as the rows of a packed buffer (and reads y nowhere else)."""
    return (op.name in APPENDS and id(op.operands[0]) in packed and op.operands[1] is y
            and all(v is not y for k, v in enumerate(op.operands) if k != 1))


def kv_bytes(module) -> dict:
    """KV bytes per token from the packed state buffers' types (the first function's)."""
    f = module.functions.get("prefill") or next(iter(module.functions.values()))
    types = {a.name: a.type for a in f.args}
    ratio = {}
    for op in f.ops:
        if op.name == "dsv41.cache_append":
            ratio[op.attrs["name"].rsplit(".", 1)[0]] = op.attrs["ratio"]
    glob, window_row, window_rows = 0.0, 0, 0
    for name, r in ratio.items():
        if name.startswith(("state.comp_kv.", "state.index_k.")) and f"{name}.codes" in types:
            row = sum(_row_bytes(types[f"{name}.{p}"]) for p in PARTS)
            glob += row / r
    for name, t in types.items():
        if name.startswith("state.window.") and name.endswith(".codes"):
            window_row = _row_bytes(t) + _row_bytes(types[name[:-len("codes")] + "scales"])
            window_rows = t.shape[0]
            break
    out = {"kv_bytes_per_token:global": int(glob) if glob == int(glob) else round(glob, 3)}
    if window_row:
        out["kv_bytes_per_token:window_per_layer"] = window_row
        out["window_bytes_per_layer"] = window_row * window_rows
    return out


def _row_bytes(t: TensorType) -> int:
    n = t.dtype.itemsize
    for d in t.shape[1:]:
        n *= d
    return n


_FORMAT_OF = {("fp8e4m3", "e8m0"): "fp8_ue8m0", ("fp4e2m1x2", "fp8e4m3"): "fp4_e4m3", ("fp4e2m1x2", "e8m0"): "fp4_ue8m0"}


def packed_io(before, after, inputs: dict):
    """For checking a lowered function against the float one on the same data (inputs: a dict by argument name, or
    a list in `before`'s order; the results come the same way): -> (inputs of `before` with each
    packed state input on its format's grid, the packed inputs of `after`, a function from `after`'s results to
    `before`'s). A packed buffer only ever holds quantized rows, so the float input is fake-quantized first."""
    from dsv41c.prims.kv_pack import kv_pack, kv_unpack

    as_list = not isinstance(inputs, dict)
    if as_list:  # positional inputs, in before's argument order
        inputs = {a.name: v for a, v in zip(before.args, inputs)}
    fin, pin = dict(inputs), {}
    names = {a.name for a in after.args}
    for a in before.args:
        if a.name in names:
            pin[a.name] = inputs[a.name]
            continue
        c, s = (next(x for x in after.args if x.name == f"{a.name}.{p}") for p in PARTS)
        fmt = _FORMAT_OF[(c.type.dtype.name, s.type.dtype.name)]
        pin[c.name], pin[s.name] = kv_pack(inputs[a.name], fmt)
        fin[a.name] = kv_unpack(pin[c.name], pin[s.name], fmt, inputs[a.name].dtype)

    def results(outs):
        got, k = [], 0
        for t in before.result_types:
            at = after.result_types[k]
            if at == t:
                got.append(outs[k])
                k += 1
            else:
                fmt = _FORMAT_OF[(at.dtype.name, after.result_types[k + 1].dtype.name)]
                got.append(kv_unpack(outs[k], outs[k + 1], fmt, t.dtype.torch))
                k += 2
        return got

    if as_list:
        return [fin[a.name] for a in before.args], [pin[a.name] for a in after.args], results
    return fin, pin, results
