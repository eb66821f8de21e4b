"""DSpark drafting and greedy speculative decoding == plain greedy decoding (spec §3.11)."""
import functools

import torch

from dsv41c.frontend.config import preset
from dsv41c.frontend.model.dspark import DSparkDrafter
from dsv41c.frontend.model.generate import dspark_generate, greedy_generate
from dsv41c.frontend.model.model import ReferenceModel
from dsv41c.frontend.model.weights import random_state_dict

torch.set_num_threads(1)
N_NEW = 10


@functools.lru_cache(maxsize=None)
def _model(kv_quant=False):
    cfg = preset("mini")
    return ReferenceModel(cfg, random_state_dict(cfg, seed=1), kv_quant=kv_quant)


PROMPT = [3, 141, 59, 26, 535, 89, 79, 323, 84, 626, 433, 83, 279, 50, 288, 419, 716, 939, 937, 510]


@functools.lru_cache(maxsize=None)
def _greedy(kv_quant=False):
    return greedy_generate(_model(kv_quant), PROMPT, N_NEW)


def test_drafter_block_shape_and_confidence():
    m = _model()
    st = m.new_state()
    m.prefill(st, PROMPT)
    # one ctx row per processed token, the last W kept
    assert st.dspark_ctx.shape == (min(len(PROMPT), m.cfg.sliding_window), m.cfg.hidden_size)
    tokens, conf = DSparkDrafter(m).draft(st, PROMPT[-1], first=7)
    assert len(tokens) == m.cfg.dspark_block_size and tokens[0] == 7
    assert all(0 <= t < m.cfg.vocab_size for t in tokens)
    assert conf.shape == (m.cfg.dspark_block_size,) and ((conf > 0) & (conf < 1)).all()


def test_dspark_greedy_equals_plain_greedy():
    m = _model()
    got, stats = dspark_generate(m, PROMPT, N_NEW, chunk=7)
    assert got == _greedy()
    assert stats.rounds > 0 and stats.drafted > 0
    print(stats.summary())


class _OracleDrafter:
    """Proposes the true greedy continuation, with one wrong token every second round, to drive
    full acceptance, partial acceptance and rollback through the verification loop."""

    def __init__(self, model, truth):
        self.m, self.truth, self.round = model, truth, 0

    def draft(self, state, anchor, first):
        B = self.m.cfg.dspark_block_size
        k = state.pos - len(PROMPT) + 1  # truth[k] is the token after `first`
        out = [first] + [self.truth[k + i] if k + i < len(self.truth) else 0 for i in range(B - 1)]
        self.round += 1
        if self.round % 2 == 0 and B > 2:
            out[2] = (out[2] + 1) % self.m.cfg.vocab_size
        return out, torch.ones(B)


def test_speculative_loop_accepts_and_rolls_back_correctly():
    m = _model()
    truth = _greedy()
    got, stats = dspark_generate(m, PROMPT, N_NEW, drafter=_OracleDrafter(m, truth))
    assert got == truth
    assert 4 in stats.per_round and 1 in stats.per_round  # a fully and a partly accepted round
    assert stats.rounds < N_NEW - 1


def test_dspark_with_kv_quant_on_equals_plain_greedy():
    got, _ = dspark_generate(_model(True), PROMPT, 6)
    assert got == _greedy(True)[:6]
