"""The reference interpreter: runs any IR function on the CPU through the registry.

    outputs = interpret(module, "decode", [ids, kv20, ...])   # or {"ids": ids, ...}

Algorithm: bind the symbols of the argument types from the actual inputs (a plain symbol
binds directly; a compound dim like `2*T+1` is solved when it is linear in its one unbound
symbol, else checked), then run ops in order. For each op: bind operands and attributes by
its schema, fill `?` dims from their index operands, evaluate symbolic attributes with
the bindings, map dtypes to torch, and call the op's reference implementation with its
arguments in schema order. With `check=True` (default) each result is checked against its
declared type (dtype and shape; a symbol first seen in a result, e.g. after `nonzero`, is
bound there). `on_op(op, outputs)` is called after each op (the numeric-oracle hook).
A `kernel.call` that names an `op` runs that op's reference.

Storage: `fp4e2m1x2` tensors are uint8 bytes (torch's float4_e2m1fn_x2 inputs are viewed
as bytes); `index` values are Python ints; events are opaque tokens.

Streams: by default ops run in program order (a valid schedule); `order=` runs them in
another order, e.g. `random_order(f, seed)`, one of the interleavings streams and events
allow, and an operand read before its producer ran is an error naming the op.

Known gaps: no stride/aliasing model (views are copies, ops that write mutate their
operand tensor in place), so a buffer reused too early is not detected here (the
verifier's stream check is).
"""
from __future__ import annotations

import torch

from dsv41c.ir.attrs import DYN
from dsv41c.ir.core import Module, Value
from dsv41c.ir.ops_runtime import effective
from dsv41c.ir.printer import format_string, function_namer
from dsv41c.ir.schema import Args
from dsv41c.ir.symbolic import SymExpr
from dsv41c.ir.types import DType, IndexType, TensorType, fp4e2m1x2


class InterpreterError(RuntimeError):
    """An op that failed or produced a value its declared type does not allow."""


def interpret(module: Module, function: str, inputs, *, check: bool = True, on_op=None, order=None) -> list:
    return Interpreter(module, check=check, on_op=on_op).run(function, inputs, order=order)


def random_order(f, seed: int) -> list[int]:
    """A random execution order of f's ops that a GPU could take: each stream's ops in program
    order, a `stream.wait` only after the `stream.record` of its event, the streams otherwise
    interleaved at random (`seed`). Data dependences are NOT consulted: a use on another
    stream without an event then runs before its definition and the interpreter says so."""
    import random

    from dsv41c.ir.happens_before import op_stream

    rng = random.Random(seed)
    queues: dict[int, list] = {}
    for i, op in enumerate(f.ops):
        queues.setdefault(op_stream(op), []).append(i)
    heads = {s: 0 for s in queues}
    recorded: set = set()
    order = []
    while len(order) < len(f.ops):
        ready = []
        for s in sorted(queues):
            if heads[s] < len(queues[s]):
                op = f.ops[queues[s][heads[s]]]
                if op.name != "stream.wait" or not op.operands or id(op.operands[0]) in recorded \
                        or op.operands[0].op is None:
                    ready.append(s)
        if not ready:
            raise InterpreterError(f"@{f.name}: the streams deadlock (a wait whose event is recorded later on its "
                                   "own stream)")
        s = rng.choice(ready)
        # run a random stretch of that stream, as a GPU runs a burst of one queue
        for _ in range(rng.randint(1, 8)):
            if heads[s] >= len(queues[s]):
                break
            i = queues[s][heads[s]]
            op = f.ops[i]
            if op.name == "stream.wait" and op.operands and op.operands[0].op is not None \
                    and id(op.operands[0]) not in recorded:
                break
            heads[s] += 1
            order.append(i)
            if op.name == "stream.record":
                recorded.update(id(r) for r in op.results)
    return order


def _as_storage(x, t):
    if isinstance(t, TensorType) and t.dtype is fp4e2m1x2 and isinstance(x, torch.Tensor) \
            and x.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        return x.view(torch.uint8)
    return x


class Interpreter:
    def __init__(self, module: Module, *, check: bool = True, on_op=None):
        self.module, self.check, self.on_op = module, check, on_op

    def run(self, function: str, inputs, order=None) -> list:
        """`order`: op positions in the order to run them (e.g. `random_order`); default program order."""
        if function not in self.module.functions:
            raise InterpreterError(f"no function @{function} (have: {', '.join(self.module.functions)})")
        f = self.module.functions[function]
        if isinstance(inputs, dict):
            missing = [a.name for a in f.args if a.name not in inputs]
            if missing:
                raise InterpreterError(f"@{f.name}: missing input(s) {', '.join(missing)}")
            inputs = [inputs[a.name] for a in f.args]
        inputs = list(inputs)
        if len(inputs) != len(f.args):
            raise InterpreterError(f"@{f.name} takes {len(f.args)} inputs, got {len(inputs)}")
        self.names = function_namer(f)
        self.env: dict[int, object] = {}
        self.syms: dict[str, int] = {}
        pairs = []
        for a, x in zip(f.args, inputs):
            x = _as_storage(x, a.type)
            self._check_kind(a.type, x, f"@{f.name}: input {self.names(a)}")
            if isinstance(a.type, TensorType):
                pairs += list(zip(a.type.shape, x.shape))
            self.env[id(a)] = x
        self._bind(pairs, f"@{f.name}: inputs")
        for i in range(len(f.ops)) if order is None else order:
            self._run_op(f, i, f.ops[i])
        if f.returns is None:
            raise InterpreterError(f"@{f.name} has no return")
        return [self.env[id(v)] for v in f.returns]

    # ------------------------------------------------------------------ symbols
    def _bind(self, pairs, where):
        todo = [(d, int(n)) for d, n in pairs]
        while todo:
            rest = []
            for d, n in todo:
                val = d.subs(self.syms) if isinstance(d, SymExpr) else d
                if isinstance(val, int):
                    if val != n:
                        raise InterpreterError(f"{where}: dim {d} = {val} but the tensor has {n}")
                    continue
                solved = _solve_linear(val, n)
                if solved is None:
                    rest.append((d, n))
                    continue
                name, value = solved
                self.syms[name] = value
            if len(rest) == len(todo):
                syms = sorted(set().union(*(d.free_symbols() for d, _ in rest)) - set(self.syms))
                raise InterpreterError(f"{where}: cannot bind symbol(s) {', '.join(syms)} from the shapes")
            todo = rest

    def _concrete(self, v):
        if isinstance(v, SymExpr):
            return v.evaluate(self.syms)
        if isinstance(v, DType):
            return v.torch
        if isinstance(v, tuple):
            return [self._concrete(x) for x in v]
        return v

    def _check_kind(self, t, x, where):
        if isinstance(t, TensorType):
            if not isinstance(x, torch.Tensor):
                raise InterpreterError(f"{where}: expected a tensor {t}, got {type(x).__name__}")
            if self.check and x.dtype != t.dtype.torch:
                raise InterpreterError(f"{where}: expected dtype {t.dtype} ({t.dtype.torch}), got {x.dtype}")
            if self.check and x.dim() != t.rank:
                raise InterpreterError(f"{where}: expected {t}, got shape {list(x.shape)}")
        elif isinstance(t, IndexType) and not (isinstance(x, int) and not isinstance(x, bool)):
            raise InterpreterError(f"{where}: expected an index (int), got {type(x).__name__}")

    # ------------------------------------------------------------------ ops
    def _where(self, f, i, op):
        res = ", ".join(self.names(r) for r in op.results)
        return f"@{f.name}: op #{i} {op.name}" + (f" ({res})" if res else "") + (
            f" at loc({format_string(op.loc)})" if op.loc is not None else "")

    def _run_op(self, f, i, op):
        opdef, attrs = effective(op.name, op.attrs)
        args, dyn = opdef.bind(op.operands, attrs)
        if dyn:
            attrs = opdef.resolve_dyn(attrs, [self.env[id(v)] for v in dyn])
        cargs = Args()
        missing = [v for v in op.operands if id(v) not in self.env]
        if missing:
            raise InterpreterError(f"{self._where(f, i, op)}: operand {self.names(missing[0])} has not been computed "
                                   "yet (a cross-stream use with no event ordering it after its definition)")
        for a in opdef.schema.args:
            v = args[a.name]
            if isinstance(v, Value):
                cargs[a.name] = self.env[id(v)]
            elif isinstance(v, list):
                cargs[a.name] = [self.env[id(x)] for x in v]
            else:
                cargs[a.name] = self._concrete(attrs.get(a.name, v))
        for k, v in dict.items(args):
            if k not in cargs:
                cargs[k] = self._concrete(attrs.get(k, v))
        assert not any(v is DYN for v in dict.values(cargs))
        try:
            out = opdef.impl(cargs)
        except Exception as e:
            raise InterpreterError(f"{self._where(f, i, op)}: reference failed: {type(e).__name__}: {e}") from e
        outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(op.results):
            raise InterpreterError(f"{self._where(f, i, op)}: reference gave {len(outs)} value(s) for "
                                   f"{len(op.results)} result(s)")
        for r, x in zip(op.results, outs):
            x = _as_storage(x, r.type)
            where = f"{self._where(f, i, op)}: result {self.names(r)}"
            self._check_kind(r.type, x, where)
            if isinstance(r.type, TensorType) and self.check:
                self._bind(list(zip(r.type.shape, x.shape)), where)
            self.env[id(r)] = x
        if self.on_op is not None:
            self.on_op(op, outs)


def _solve_linear(e: SymExpr, n: int):
    """(symbol, value) if e = c*S + rest with rest constant, else None."""
    syms = e.free_symbols()
    if len(syms) != 1 or e.has_floordiv():
        return None
    (s,) = syms
    coeff, const = 0, 0
    for mono, c in e.terms:
        if mono == ():
            const = c
        elif mono == (s,):
            coeff = c
        else:
            return None
    if coeff == 0 or (n - const) % coeff:
        return None
    return s, (n - const) // coeff
