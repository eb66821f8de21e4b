"""Greedy generation on the reference model: plain, and speculative with DSpark.

`greedy_generate(model, ids, n, chunk=0)`: prefill the prompt (in chunks of `chunk`
tokens, 0 = one chunk), then argmax + decode one token at a time. Exactly `n` new tokens
(no EOS stop: random test models have no meaningful EOS).

`dspark_generate(model, ids, n, chunk=0, drafter=None)`: greedy speculative decoding whose
output equals `greedy_generate` token for token, because every emitted token is the
target's own argmax:
  1. After the prompt, y = argmax(target logits at the last position) is known, not yet
     processed; the anchor is the last processed token.
  2. The drafter proposes B tokens for the next B positions with row 0 forced to y
     (dspark.py explains why row 0 is already known); drafts d_1..d_{B-1} follow it.
  3. Snapshot the state; feed [y, d_1..d_k] (k ≤ B-1, capped by the tokens still
     wanted) to the target in one chunk -> logits at each of those positions.
  4. Accept the longest prefix with d_i == argmax(logits[i-1]); the next y is
     argmax(logits[a]) after a accepted drafts.
  5. If some draft was rejected, restore the snapshot and re-feed [y, d_1..d_a] so the
     state holds exactly the committed tokens (rollback by snapshot/restore).
Each round costs one target forward (two on rejection) and emits 1 + a tokens.
Statistics: rounds, drafted, accepted, per-round accepted counts.

Both take an optional `drafter` (anything with `.draft(state, anchor, first)` returning
(tokens, confidence)), so tests can drive acceptance with an oracle drafter.
Known gaps: greedy only; no confidence-threshold truncation (the confidence head's value
is returned by the drafter but every draft is verified).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def _prefill(model, state, ids, chunk: int) -> torch.Tensor:
    ids = model.check_ids(ids)
    step = chunk if chunk and chunk > 0 else ids.shape[0]
    out = None
    for i in range(0, ids.shape[0], step):
        out = model.prefill(state, ids[i:i + step])
    return out[-1]


def greedy_generate(model, ids, max_new_tokens: int, chunk: int = 0) -> list[int]:
    state = model.new_state()
    logits = _prefill(model, state, ids, chunk)
    out = []
    for i in range(max_new_tokens):
        tok = int(torch.argmax(logits))
        out.append(tok)
        if i + 1 < max_new_tokens:
            logits = model.decode(state, tok)
    return out


@dataclass
class SpecStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    per_round: list = field(default_factory=list)

    @property
    def tokens_per_round(self) -> float:
        return (self.accepted + self.rounds) / max(self.rounds, 1)

    def summary(self) -> str:
        return (f"dspark: {self.rounds} verification rounds, {self.accepted}/{self.drafted} drafted tokens accepted, "
                f"{self.tokens_per_round:.2f} tokens per target forward; accepted per round {self.per_round}")


def dspark_generate(model, ids, max_new_tokens: int, chunk: int = 0, drafter=None):
    """-> (generated ids, SpecStats). Output == greedy_generate(model, ids, max_new_tokens, chunk)."""
    if drafter is None:
        from dsv41c.frontend.model.dspark import DSparkDrafter

        drafter = DSparkDrafter(model)
    stats = SpecStats()
    state = model.new_state()
    ids = model.check_ids(ids)
    y = int(torch.argmax(_prefill(model, state, ids, chunk)))
    anchor = int(ids[-1])
    out = [y]
    while len(out) < max_new_tokens:
        tokens, _conf = drafter.draft(state, anchor, first=y)
        drafts = [int(t) for t in tokens[1:]][: max_new_tokens - len(out) - 1]
        snapshot = state.clone() if drafts else None
        feed = [y] + drafts
        logits = model.prefill(state, feed)
        a = 0
        while a < len(drafts) and drafts[a] == int(torch.argmax(logits[a])):
            a += 1
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += a
        stats.per_round.append(a)
        if a < len(drafts):  # roll back the rejected drafts
            state = snapshot
            model.prefill(state, feed[: 1 + a])
        out.extend(drafts[:a])
        anchor = feed[a]
        y = int(torch.argmax(logits[a]))
        out.append(y)
    return out[:max_new_tokens], stats
