"""dsv41c's IR: typed SSA over tensors with symbolic dims, an op registry, text form.

Files (one idea each): `symbolic.py` (dims: ints and polynomials over symbols),
`types.py` (dtypes, tensor/index/event types), `attrs.py` (attribute values), `core.py`
(Value, Op, Function, Module), `schema.py` + `registry.py` (op schemas, shape rules,
references, costs, effects), `shape_rules.py` + `ops_*.py` (the registered ops),
`printer.py` / `parser.py` (text), `verifier.py`, `interpreter.py`, `builder.py`,
`testing.py` (random well-typed modules for pass tests), `lazy_torch.py`. The
torch.export -> IR converter is the tracer's, `frontend/export_ir.py`.

Text syntax (printer and parser round-trip exactly: print(parse(print(m))) == print(m)):

    module {config_hash = "ab12"}                   # optional module attributes
    func @decode(%x: bf16[T, 5120], %kv20: fp4e2m1x2[L, 256] {placement = "persistent"},
                 %w: bf16[5120, 1280]) -> (bf16[T, 1280]) {
      %3 = aten.mm(%x, %w) : (bf16[T, 5120], bf16[5120, 1280]) -> bf16[T, 1280] loc("layers.0.attn.wq_a")
      %4 = aten.mul(%3) {other = 0.5} : (bf16[T, 1280]) -> bf16[T, 1280]
      %5 = aten.view(%4) {size = [T, 10, 128]} : (bf16[T, 1280]) -> bf16[T, 10, 128]
      %v, %i = aten.topk(%5) {k = 8} : (bf16[T, 10, 128]) -> (bf16[T, 10, 8], i64[T, 10, 8])
      %n = aten.sym_size(%5) {dim = 0} : (bf16[T, 10, 128]) -> index
      %6 = aten.view(%4, %n) {size = [?, 1280]} : (bf16[T, 1280], index) -> bf16[T, 1280]
      %7 {arena_offset = 4096} = aten.neg(%6) : (bf16[T, 1280]) -> bf16[T, 1280]
      %e = stream.record() {stream = 1} : () -> event
      stream.wait(%e) {stream = 0} : (event) -> ()
      return %7
    }

- A module is an optional `module {attrs}` line and `func`s. A function: `func @name(`
  arguments `%name: type {value attrs}` `) -> (result types) {` ops, `return %a, %b` `}`.
- An op: `%r1, %r2 = name(%operands) {attrs} : (operand types) -> result type(s) loc("...")`.
  No results: no `%... =`, and `-> ()`. One result type is bare, several are in
  parentheses. `loc(...)` is optional. Value attributes (`arena_offset`, `placement`)
  follow the value where it is defined: `%7 {arena_offset = 4096} = ...`.
- Types: `DTYPE[dims]` with DTYPE one of f64 f32 bf16 f16 fp8e4m3 e8m0 fp4e2m1x2 (packed
  pairs: one element = one byte) i8 u8 i32 i64 bool; `f32[]` is 0-d; `index` (a host
  integer, torch's SymInt); `event` (a stream event).
- Dims: ints or integer expressions over symbols with `+ - * //` and parentheses: `T`,
  `L//2`, `(L+1)//2`, `64*T`; printed in one canonical form (`ir/symbolic.py`).
- Attribute values: ints `-1`; floats always with `.`/`e` or `inf`/`nan` (`1.0`, `1e-20`,
  `-0.0`; printed with `repr`, so they read back to the same double); strings in double
  quotes with escapes `\\" \\\\ \\n \\t \\r \\uXXXX \\UXXXXXXXX`; `true`/`false`; `none`; dtype
  names; dims (`T*64`); `?` (a dim from the next trailing `index` operand); lists `[...]`.
  Attribute dictionaries print sorted by key.
- Value names: `%` then letters, digits, `_` or `.`; unique per function. The printer keeps
  each value's name hint where it can and numbers the rest.
- `#` starts a comment to the end of the line (golden files put `# RUN:` lines there).

Public API:
- `Module`, `Function`, `Op`, `Value` (core.py); `TensorType`, `IndexType`/`INDEX`,
  `EventType`/`EVENT`, `DType` and the dtypes, `tensor(dtype, *dims)`, `sym`, `parse_dim`;
- `register(schema, *, shape, impl, cost=None, writes=(), sync=False)`, `lookup(name)`,
  `all_ops()`, `Cost`, `ShapeError`;
- `parse_module(text, filename)` / `IRParseError`; `print_module(m)`;
- `verify(m)` / `VerifyError`; `interpret(m, fn, inputs)` / `InterpreterError`;
- `Builder(func)`.
"""
__all__ = ["Function", "Module", "Op", "Value", "Cost", "ShapeError", "all_ops", "lookup", "register", "SymExpr",
           "parse_dim", "sym", "DTYPES", "EVENT", "INDEX", "DType", "EventType", "IndexType", "TensorType", "Type",
           "bf16", "bool_", "dtype", "e8m0", "f16", "f32", "f64", "fp4e2m1x2", "fp8e4m3", "i8", "i32", "i64", "tensor",
           "u8", "parse_module", "IRParseError", "print_module", "verify", "VerifyError", "interpret",
           "InterpreterError", "Builder"]

from dsv41c.ir.core import Function, Module, Op, Value  # noqa: F401,E402
from dsv41c.ir.registry import Cost, ShapeError, all_ops, lookup, register  # noqa: F401,E402
from dsv41c.ir.symbolic import SymExpr, parse_dim, sym  # noqa: F401,E402
from dsv41c.ir.types import (DTYPES, EVENT, INDEX, DType, EventType, IndexType, TensorType, Type,  # noqa: F401,E402
                             bf16, bool_, dtype, e8m0, f16, f32, f64, fp4e2m1x2, fp8e4m3, i8, i32, i64, tensor, u8)


def __getattr__(name):
    # Heavier pieces load on first use, so `import dsv41c.ir` stays cheap.
    lazy = {"parse_module": "parser", "IRParseError": "parser", "print_module": "printer",
            "verify": "verifier", "VerifyError": "verifier", "interpret": "interpreter",
            "InterpreterError": "interpreter", "Builder": "builder"}
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(f"dsv41c.ir.{lazy[name]}"), name)
    raise AttributeError(name)
