"""Engram n-gram hashing: multipliers, the prime walk, and per-position table row ids.

Spec §3.9/3.10:
- multipliers per engram layer l: numpy `default_rng(10007·l).integers(0, (int64max //
  compressed_vocab)//2, size=max_ngram, dtype=int64)·2 + 1` (odd);
- primes: starting above `engram_vocab_size - 1`, for every (layer, n, head) in order the
  next prime not handed out before (one global "seen" set; each n restarts the walk at
  `engram_vocab_size - 1`, so in effect the primes are consecutive);
- per position p, compressed tokens t_i = tok[p-i] (pad id where p-i < 0 or where any of
  tok[p-i..p] is DEAD — HF blocks cumulatively from shift 0, so a DEAD token's own ids are
  all pad), h = t_0·m_0, then for i = 1..max_n-1: h ^= t_i·m_i and the
  (i+1)-gram hash for head k is h mod prime[n][k];
- row id = hash + offset, offsets the exclusive prefix sum of the layer's primes in
  n-major, head-minor order; each layer's primes sum to its `engram_num_embeddings`.

Token map: with no tokenizer, the identity map (compressed id = token id) is used, and
pad id = token_map[engram_pad_token_id] = engram_pad_token_id.
Known gap: the tokenizer-derived compressed vocabulary (NFKC→…→Strip) needs the
official tokenizer, which is not available here.
"""
from __future__ import annotations

import functools

import numpy as np
import torch


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):  # deterministic below 3.3e24
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@functools.lru_cache(maxsize=None)
def _primes_cached(layer_ids: tuple, max_ngram: int, n_heads: int, vocab: int) -> tuple:
    seen: set[int] = set()
    out = []
    for _layer in layer_ids:
        per_layer = []
        for _n in range(2, max_ngram + 1):
            cur = vocab - 1
            row = []
            for _h in range(n_heads):
                cur += 1
                while not _is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                row.append(cur)
            per_layer.append(tuple(row))
        out.append(tuple(per_layer))
    return tuple(out)


def engram_primes(layer_ids, max_ngram: int, n_heads: int, vocab: int) -> list:
    """[layer][n-2][head] -> prime modulus. Flattened per layer in n-major, head-minor order."""
    primes = _primes_cached(tuple(layer_ids), int(max_ngram), int(n_heads), int(vocab))
    return [[p for row in layer for p in row] for layer in primes]


def engram_multipliers(layer_id: int, max_ngram: int, compressed_vocab: int) -> np.ndarray:
    rng = np.random.default_rng(10007 * int(layer_id))
    hi = (np.iinfo(np.int64).max // int(compressed_vocab)) // 2
    return rng.integers(0, hi, size=int(max_ngram), dtype=np.int64) * 2 + 1


def engram_row_ids(tokens: torch.Tensor, cfg, layer_pos: int, dead: torch.Tensor | None = None,
                   token_map: torch.Tensor | None = None) -> torch.Tensor:
    """Row ids [T, (max_n-1)·n_heads] (int64) into engram layer `layer_pos`'s table.

    tokens: [T] int64 token ids of one sequence from position 0 (or with `history`
    prepended by the caller). dead: optional [T] bool marking tokens that break n-gram
    history (image-span tokens). token_map: optional [vocab] compressed-id map.
    """
    layer_id = cfg.engram_layer_ids[layer_pos]
    max_n, heads = cfg.engram_max_ngram_size, cfg.engram_n_heads
    primes = engram_primes(cfg.engram_layer_ids, max_n, heads, cfg.engram_vocab_size)[layer_pos]
    mult = torch.from_numpy(engram_multipliers(layer_id, max_n, cfg.engram_compressed_vocab_size))
    # hashed where the ids live: int64 products wrap modulo 2^64 on the CPU and on a GPU alike (as numpy
    # spells them), and on a GPU nothing is read back to the host (a decode step can be a CUDA graph)
    t = tokens.to(torch.int64)
    if token_map is not None:
        t = token_map.to(device=t.device, dtype=torch.int64)[t]
    pad = int(token_map[cfg.engram_pad_token_id]) if token_map is not None else cfg.engram_pad_token_id
    T = t.shape[0]
    d = dead.to(t.device, torch.bool) if dead is not None else torch.zeros(T, dtype=torch.bool, device=t.device)
    # shifted[i][p] = t[p-i], pad where the look-back leaves the sequence or crosses DEAD.
    # As HF (`DeepseekV41NgramHashState`): the blocking is cumulative and starts at shift 0,
    # so a DEAD token itself hashes as all-pad (its gate is forced to 0 anyway).
    blocked = d.clone()
    shifted = [torch.where(blocked, torch.full_like(t, pad), t)]
    for i in range(1, max_n):
        s = torch.full_like(t, pad)
        s[i:] = t[:-i] if T > i else s[i:]
        b = torch.ones_like(d)
        b[i:] = d[:-i] if T > i else b[i:]
        blocked = blocked | b
        shifted.append(torch.where(blocked, torch.full_like(t, pad), s))
    h = shifted[0] * mult[0]
    cols = []
    offsets = np.concatenate([[0], np.cumsum(primes)[:-1]]).astype(np.int64)
    for i in range(1, max_n):
        h = h ^ (shifted[i] * mult[i])
        for k in range(heads):
            j = (i - 1) * heads + k
            cols.append(torch.remainder(h, primes[j]) + int(offsets[j]))
    return torch.stack(cols, dim=-1).to(tokens.device)
