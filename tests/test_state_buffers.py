"""Fixed-capacity state buffers: the append ops, the verifier's state rules, and the capacity at run time."""
from __future__ import annotations

import pytest
import torch

import dsv41c.ops  # noqa: F401
from dsv41c.ir import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.verifier import verify_errors

ops = torch.ops.dsv41

HEAD = ("func @step(%state.comp_kv.2: f32[4, 8] {{placement = \"persistent\"}}, %rows: f32[2, 8], %at: i64[]) "
        "-> ({rt}) {{\n")
APPEND = ('  %new = dsv41.cache_append(%state.comp_kv.2, %rows, %at) {{name = "state.comp_kv.2", ratio = 2}} '
          ': (f32[4, 8], f32[2, 8], i64[]) -> f32[4, 8] loc("layers.2.attn.compressor")\n')


def _module(body: str, rt: str = "f32[4, 8]"):
    return parse_module(HEAD.format(rt=rt) + body + "\n}\n")


def test_a_read_of_the_old_buffer_after_the_write_is_refused_naming_function_buffer_and_ops():
    body = APPEND.format() + ('  %old = aten.neg(%state.comp_kv.2) : (f32[4, 8]) -> f32[4, 8] loc("layers.3.attn")\n'
                              '  return %old')
    errs = verify_errors(_module(body))
    assert len(errs) == 1
    e = errs[0]
    assert e.startswith('@step: op #1 aten.neg (%old) at loc("layers.3.attn"): operand 0 reads %state.comp_kv.2, '
                        "the old value of buffer %state.comp_kv.2, after op #0 dsv41.cache_append")
    assert "layers.2.attn.compressor" in e and "read %new" in e


def test_the_same_read_before_the_write_is_accepted():
    body = ('  %old = aten.neg(%state.comp_kv.2) : (f32[4, 8]) -> f32[4, 8] loc("layers.3.attn")\n' + APPEND.format()
            + "  return %new")
    assert verify_errors(_module(body)) == []


def test_two_writes_of_one_buffer_version_are_refused():
    second = APPEND.format().replace("%new =", "%new2 =").replace("layers.2.", "layers.8.")
    body = APPEND.format() + second + "  return %new2"
    errs = verify_errors(_module(body))
    assert any(e.startswith("@step: op #1 dsv41.cache_append (%new2)") and "writes buffer %state.comp_kv.2" in e
               and "op #0 dsv41.cache_append" in e and "two writes of one buffer version" in e for e in errs), errs


def test_returning_the_old_value_after_the_write_is_refused():
    errs = verify_errors(_module(APPEND.format() + "  return %state.comp_kv.2"))
    assert errs == ["@step: return value 0 (%state.comp_kv.2) is the old value of buffer %state.comp_kv.2, which op "
                    "#0 dsv41.cache_append at loc(layers.2.attn.compressor) wrote in place (return the written value)"]


def test_a_read_on_another_stream_must_be_ordered_before_the_write():
    read = '  %old = aten.neg(%state.comp_kv.2) {stream = 1} : (f32[4, 8]) -> f32[4, 8] loc("layers.3.attn")\n'
    racing = read + APPEND.format() + "  return %new"
    errs = verify_errors(_module(racing))
    assert any("operand 0 reads %state.comp_kv.2" in e and "on another stream, not ordered before op #1" in e
               for e in errs), errs
    ordered = (read + '  %e = stream.record() {stream = 1} : () -> event\n'
               '  stream.wait(%e) {stream = 0} : (event) -> ()\n' + APPEND.format() + "  return %new")
    assert verify_errors(_module(ordered)) == []


def test_the_traced_step_writes_every_cache_and_window_after_its_reads():
    from dsv41c.frontend.config import preset
    from dsv41c.frontend.trace import trace

    cfg = preset("tiny")
    m, _ = trace(cfg, progress=None, max_context=40)
    assert verify_errors(m) == []
    f = m.functions["decode"]
    types = {a.name: str(a.type) for a in f.args}
    assert types["state.comp_kv.2"] == "f32[20, 64]" and types["state.comp_kv.20"] == "f32[40, 64]"
    assert types["state.window.0"] == f"f32[{cfg.sliding_window - 1}, 64]"
    assert not any(s.free_symbols() for a in f.args for s in [a.type])  # no growing dim left in decode
    writes = {op.attrs["name"] for op in f.ops if op.name in ("dsv41.cache_append", "dsv41.ring_append")}
    assert writes == {k for k in types if k.startswith(("state.comp_kv.", "state.index_k.", "state.window."))}


def test_appends_write_in_place_and_refuse_past_the_capacity():
    from dsv41c.prims.state import StateCapacityError, cache_append_, ring_append_

    cache = torch.zeros(4, 2, dtype=torch.float8_e4m3fn)
    assert cache_append_(cache, torch.ones(2, 2, dtype=torch.float8_e4m3fn), 1) is cache
    assert cache.float()[:, 0].tolist() == [0, 1, 1, 0]
    with pytest.raises(StateCapacityError, match=r"state.index_k.8: appending 2 entries at row 3 \(tokens up to "
                                                 r"position 9\) exceeds its capacity of 4 rows \(8 positions at ratio 2\)"):
        cache_append_(cache, torch.ones(2, 2, dtype=torch.float8_e4m3fn), 3, 2, "state.index_k.8")
    ring = torch.zeros(3, 1)
    ring_append_(ring, torch.arange(5.0)[:, None], 7)  # positions 7..11: the last three land at 11 % 3 ...
    assert ring[:, 0].tolist() == [2.0, 3.0, 4.0]  # slots 0, 1, 2 <- positions 9, 10, 11


def test_ring_indices_read_the_rows_the_shift_buffer_held():
    from dsv41c.prims.attention import window_indices
    from dsv41c.prims.state import ring_append_, ring_window_indices

    W, R, D = 5, 4, 3
    seq = torch.randn(30, D)
    shift, ring = torch.zeros(R, D), torch.zeros(R, D)
    pos = 0
    for T in (3, 1, 6, 1, 1, 7, 2):
        kv = seq[pos:pos + T]
        positions = pos + torch.arange(T)
        a = torch.cat([shift, kv])[window_indices(positions, pos - R, W).clamp(min=0)]
        b = torch.cat([ring, kv])[ring_window_indices(positions, torch.tensor(pos), R, W).clamp(min=0)]
        valid = window_indices(positions, pos - R, W) >= 0
        assert torch.equal(a[valid], b[valid])
        shift = torch.cat([shift, kv])[T:]
        ring_append_(ring, kv, pos)
        pos += T


def test_the_interpreter_runs_appends_as_values():
    m = _module(APPEND.format() + "  return %new")
    cache = torch.zeros(4, 8)
    out = interpret(m, "step", {"state.comp_kv.2": cache, "rows": torch.ones(2, 8), "at": torch.tensor(1)})
    assert out[0][1:3].eq(1).all() and not out[0][[0, 3]].any() and not cache.any()


@pytest.mark.slow
def test_max_context_fixes_the_capacity_and_the_tokens_do_not_change(tmp_path, tiny_off):
    import json
    import os

    from dsv41c.cli import main
    from dsv41c.runtime.executor import ExecutionError
    from dsv41c.runtime.loader import load

    out = str(tmp_path / "short.dsv41c")
    assert main(["compile", "--preset", "tiny", "--kv-quant", "off", "--max-context", "24", "-o", out]) == 0
    m = json.load(open(os.path.join(out, "manifest.json")))
    assert m["options"]["max_context"] == 24
    assert m["state"]["state.comp_kv.2"] == {"dtype": "f32", "shape": [12, 64]}  # kv-quant off: the float layout
    short, full = load(out), load(tiny_off)
    state = {a["name"]: a for a in short.program["prefill"].args if a["role"] == "state"}
    assert state["state.comp_kv.2"]["shape"] == [12, 64] and state["state.index_k.20"]["shape"] == [24, 32]
    ids = [5, 17, 300, 2, 9, 41, 77, 8, 123, 64]
    assert short.generate(ids, 8, chunk=4) == full.generate(ids, 8, chunk=4)  # what fits: the same tokens
    with pytest.raises(ExecutionError, match=r"state\.comp_kv\.2: appending 13 entries at row 0 .* capacity of 12 "
                                             r"rows \(24 positions at ratio 2\)"):
        short.prefill(short.new_session(), list(range(26)))
