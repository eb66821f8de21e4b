"""The runtime prefills in the artifact's chunks: the same logits and state as one chunk of the whole prompt."""
from __future__ import annotations

import dsv41c


def test_chunked_prefill_equals_one_chunk(tiny_off):
    whole = dsv41c.load(tiny_off)
    chunked = dsv41c.load(tiny_off)
    chunked.manifest.setdefault("options", {})["chunk"] = 3  # what plan-chunks writes for a memory budget
    assert chunked.chunk == 3 and whole.chunk == 0
    prompt = [4, 9, 2, 7, 7, 1, 30, 8]
    s1, s2 = whole.new_session(), chunked.new_session()
    a, b = whole.prefill(s1, prompt), chunked.prefill(s2, prompt)
    assert a.shape == b.shape == (len(prompt), whole.vocab_size)
    assert float((a - b).norm() / a.norm()) <= 1e-5
    c, d = whole.decode(s1), chunked.decode(s2)
    assert float((c - d).norm() / c.norm()) <= 1e-5  # float32 sums in another order, nothing more
    assert s1.tokens == s2.tokens
