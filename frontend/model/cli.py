"""CLI handlers on the eager reference: `dsv41c reference` and `dsv41c generate`.

    dsv41c reference CKPT_DIR --ids 1,2,3 [--dtype float32|float64|bfloat16] [--kv-quant on|off] --out X.npy
        logits [T, vocab] (float32 .npy) of one prefill from position 0 (`forward_full`).
    dsv41c generate CKPT_DIR --ids ... --max-new-tokens N [--dspark] [--kv-quant on|off] [--chunk C]
        greedy generation; prints the generated ids (comma-separated) on stdout; with
        --dspark, speculative decoding with the DSpark drafter (same ids) and its
        acceptance statistics on stderr.

Errors a user can meet: bad ids -> `InputError` (names the id and the vocabulary size),
bad checkpoint -> `CheckpointError`, bad config -> `ConfigError`; the CLI prints them as
one line (exit 2). The output path (`--out`), the ids (against the vocabulary) and the
length (the prompt plus --max-new-tokens within max_position_embeddings) are checked
before any weight is read; the output file is written whole through a temporary name
once the logits exist (no half-written output, `dsv41c/outputs.py`).
Small models run single-threaded: for them the intra-op thread start-up costs more than it
saves (about 10× slower on a loaded 2-core machine).
"""
from __future__ import annotations

import os
import sys

import torch

from dsv41c.frontend.config import load_config
from dsv41c.frontend.model.errors import InputError
from dsv41c.outputs import check_output_file, write_file_atomic


def _check_ids(cfg, ids) -> None:
    if not ids:
        raise InputError("no token ids given")
    for t in ids:
        if not 0 <= int(t) < cfg.vocab_size:
            raise InputError(f"token id {t} is out of range: the vocabulary has {cfg.vocab_size} tokens "
                             f"(ids 0..{cfg.vocab_size - 1})")


def _load(args):
    from dsv41c.frontend.model.model import load_reference

    cfg = load_config(args.checkpoint)
    _check_ids(cfg, args.ids)
    n = getattr(args, "max_new_tokens", None)
    if n is not None and len(args.ids) + int(n) > cfg.max_position_embeddings:
        raise InputError(f"--max-new-tokens {n}: the prompt ({len(args.ids)} tokens) plus {n} new tokens exceed the "
                         f"model's max_position_embeddings ({cfg.max_position_embeddings} positions)")
    if cfg.hidden_size <= 1024:
        torch.set_num_threads(1)
    return load_reference(args.checkpoint, getattr(args, "dtype", "float32") or "float32",
                          kv_quant=getattr(args, "kv_quant", True))


def cmd_reference(args) -> int:
    import numpy as np

    check_output_file(args.out, "--out")
    model = _load(args)
    with torch.no_grad():
        logits = model.forward_full(args.ids)
    write_file_atomic(os.fspath(args.out), lambda fh: np.save(fh, logits.to(torch.float32).numpy()), "--out")
    return 0


def cmd_generate(args) -> int:
    from dsv41c.frontend.model.generate import dspark_generate, greedy_generate

    model = _load(args)
    n = int(getattr(args, "max_new_tokens", 16))
    if n < 0:
        raise InputError(f"--max-new-tokens must be ≥ 0, got {n}")
    chunk = int(getattr(args, "chunk", 0) or 0)
    if chunk < 0:
        raise InputError(f"--chunk must be >= 0, got {chunk}")
    with torch.no_grad():
        if getattr(args, "dspark", False):
            if not model.has_dspark:
                raise InputError(f"{args.checkpoint}: the checkpoint has no DSpark (mtp.*) weights")
            ids, stats = dspark_generate(model, args.ids, n, chunk=chunk)
            print(stats.summary(), file=sys.stderr)
        else:
            ids = greedy_generate(model, args.ids, n, chunk=chunk)
    print(",".join(str(t) for t in ids))
    return 0
