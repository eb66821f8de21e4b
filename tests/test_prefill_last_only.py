"""`prefill(..., last_only=True)`: the last position's logits alone, equal to the last row of the full
logits, for the compiled artifact (across its chunks) and the eager reference; the state after it is
the same, so decoding continues identically."""
import torch

import dsv41c
from dsv41c.frontend.model.model import load_reference

IDS = [5, 17, 42, 7, 99, 3, 8, 9, 11]


def test_artifact_last_only_is_the_last_row(tiny_off):
    m = dsv41c.load(tiny_off)
    a, b = m.new_session(), m.new_session()
    full = m.prefill(a, IDS)
    last = m.prefill(b, IDS, last_only=True)
    assert last.shape == (1, full.shape[1])
    assert torch.equal(last, full[-1:])
    assert torch.equal(m.decode(a, 4), m.decode(b, 4))
    assert a.tokens == b.tokens == IDS + [4]


def test_reference_last_only_is_the_last_row(tiny_off):
    import os

    ref = load_reference(os.path.join(tiny_off, "checkpoint"), "float32", kv_quant=False)
    a, b = ref.new_state(), ref.new_state()
    full = ref.prefill(a, IDS)
    last = ref.prefill(b, IDS, last_only=True)
    assert last.shape == (1, full.shape[1])
    torch.testing.assert_close(last, full[-1:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ref.decode(a, 4), ref.decode(b, 4), rtol=1e-6, atol=1e-6)
