"""gather-engram-rows: an Engram layer dequantizes the table rows it reads, not its whole table.

An Engram layer looks up `T x n` rows (n = heads x (max n-gram - 1)) of an n-gram embedding table of
some 1.6 million rows per layer at the published widths. Traced, the lookup reads the table through a
`dsv41.dequant_weight` of all of it, every step:

    %t = dsv41.dequant_weight(%w, %s) {fmt = "fp8_row", ...}     bf16[1574980, 256]: 806 MB written
    %y = dsv41.engram_apply(%H, %rows, %t, %wkv, ...)             reads T x n rows of it

The table's scales are per row (`fp8_row`, `fp4_row`: one scale per 32 columns of the row), so
dequantizing commutes with gathering rows. The pass rewrites the pair to

    %g = dsv41.dequant_rows(%w, %s, %rows) {...}                  bf16[T, n, 256]
    %t2 = aten.reshape(%g) {size = [T*n, 256]}
    %i = aten.arange() {end = T*n}
    %r2 = aten.reshape(%i) {size = [T, n]}
    %y = dsv41.engram_apply(%H, %r2, %t2, %wkv, ...)              table[rows] == %g, bit for bit

(the engram op is unchanged: it indexes the gathered rows by their own positions). The whole-table
dequantization, now unused, is left to `dce`.

Matched: an `engram_apply` whose table operand is a `dequant_weight` of a 2-D row-scaled weight
(with its scale) that nothing else reads. Stats: `gathered:<function>`, `table_bytes_avoided:<function>`
(the bytes of the whole-table values no longer made, at T = 1 for symbolic sizes: decode's figure).
Known gaps: the Engram value projection (`wkv`, FP8 32x32 blocks) is still dequantized whole every
step: it is a matrix product, the work of an fp8_gemm kernel call, not of a gather.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsv41c.ir.builder import Builder
from dsv41c.ir.symbolic import mul
from dsv41c.ir.types import i64
from dsv41c.passes.base import ModulePass, PassResult
from dsv41c.passes.rewrite import use_counts

ROW_FORMATS = ("fp8_row", "fp4_row")  # row-scaled, with a scale operand


def _bytes_at_one(t) -> int:
    n = t.nbytes
    return n if isinstance(n, int) else int(n.evaluate({s: 1 for s in n.free_symbols()}))


@dataclass(frozen=True)
class GatherEngramRows(ModulePass):
    name: ClassVar[str] = "gather-engram-rows"

    def run(self, module) -> PassResult:
        import dsv41c.ir.ops_dsv41  # noqa: F401  (dequant_rows)

        stats: dict = {}
        total = 0
        for f in module.functions.values():
            uses = use_counts(f)
            b = Builder(f)
            out, gathered, avoided = [], 0, 0
            for op in f.ops:
                if op.name == "dsv41.engram_apply":
                    table = op.operands[2]
                    d = table.op
                    if (d is not None and d.name == "dsv41.dequant_weight" and d.attrs.get("fmt") in ROW_FORMATS
                            and len(d.operands) == 2 and table.type.rank == 2 and uses.get(id(table)) == 1):
                        rows = op.operands[1]
                        side = {k: op.attrs[k] for k in ("stream",) if k in op.attrs}  # where the engram op runs
                        attrs = {**{k: d.attrs[k] for k in ("fmt", "dtype", "bf16_round", "block")}, **side}
                        g = b.create("dsv41.dequant_rows", [d.operands[0], d.operands[1], rows], attrs, loc=d.loc)
                        n = mul(rows.type.shape[0], rows.type.shape[1])
                        D = table.type.shape[1]
                        t2 = b.create("aten.reshape", [g.results[0]], {"size": (n, D), **side}, loc=d.loc)
                        idx = b.create("aten.arange", [], {"end": n, "start": 0, "step": 1, "dtype": i64, **side},
                                       loc=op.loc)
                        r2 = b.create("aten.reshape", [idx.results[0]], {"size": tuple(rows.type.shape), **side},
                                      loc=op.loc)
                        out += [g, t2, idx, r2]
                        op.operands = [op.operands[0], r2.results[0], t2.results[0], *op.operands[3:]]
                        gathered += 1
                        avoided += _bytes_at_one(table.type)
                out.append(op)
            f.ops = out
            stats[f"gathered:{f.name}"] = gathered
            stats[f"table_bytes_avoided:{f.name}"] = avoided
            total += gathered
        return PassResult(module, total > 0, stats)
