"""gather-engram-rows: the Engram lookup dequantizes the rows it reads, bit for bit as the whole table did."""
from __future__ import annotations

from pathlib import Path

import torch

from dsv41c.ir.interpreter import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.passes.gather_engram_rows import GatherEngramRows
from dsv41c.passes.manager import PassManager
from dsv41c.passes.registry import parse_pipeline

GOLDEN = Path(__file__).parent / "golden" / "gather-engram-rows.ir"


def _inputs(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 255, (1000, 64), generator=g, dtype=torch.uint8)
    w[(w & 0x7F) == 0x7F] = 0  # no NaN codes
    s = torch.randint(118, 136, (1000, 2), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return [torch.randn(T, 4, 64, generator=g).bfloat16(), torch.randint(0, 1000, (T, 6), generator=g),
            w.view(torch.float8_e4m3fn), s, (torch.randn(320, 384, generator=g) / 20).bfloat16(),
            torch.randn(4, 64, generator=g).bfloat16(), torch.randn(4, 64, generator=g).bfloat16()]


def test_the_gathered_lookup_equals_the_whole_table_bit_for_bit():
    before = parse_module(GOLDEN.read_text())
    after = parse_module(GOLDEN.read_text())
    res = GatherEngramRows().run(after)
    assert res.changed and res.stats["gathered:decode"] == 1  # the shared table stays
    assert res.stats["table_bytes_avoided:decode"] == 1000 * 64 * 2
    for T, seed in ((1, 0), (5, 1)):
        want = interpret(before, "decode", _inputs(T, seed))
        got = interpret(after, "decode", _inputs(T, seed))
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_the_kill_switch_leaves_the_lookup_whole():
    m = parse_module(GOLDEN.read_text())
    res = PassManager(parse_pipeline("gather-engram-rows"), env={"DSV41C_DISABLE_GATHER_ENGRAM_ROWS": "1"}).run(m)
    assert res.records[0].disabled
    assert not any(op.name == "dsv41.dequant_rows" for op in m.functions["decode"].ops)


def test_dequant_rows_is_the_rows_of_dequant_weight_for_every_row_format():
    from dsv41c import formats
    from dsv41c.ops.weights import dequant_rows, dequant_weight

    g = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 40, (3, 5), generator=g)
    s = torch.randint(120, 130, (40, 2), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    fp8 = torch.randint(0, 120, (40, 64), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    fp4 = torch.randint(-128, 128, (40, 32), generator=g, dtype=torch.int8)
    for w, fmt in ((fp8, "fp8_row"), (fp4, "fp4_row")):
        assert fmt in formats.STORED_FORMATS
        whole = dequant_weight(w, s, fmt, torch.bfloat16, False, 32)
        assert torch.equal(dequant_rows(w, s, rows, fmt, torch.bfloat16, False, 32), whole[rows])
