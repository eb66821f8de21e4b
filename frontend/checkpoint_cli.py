"""`dsv41c init-checkpoint --preset P -o DIR [--seed N] [--force]`: write a random checkpoint.

Prints one line: where, how many tensors and shards, total bytes, and the index hash (the
same sha256 `open_checkpoint(DIR).index_hash` reports). Errors (unknown preset, existing
non-empty DIR without --force, a DIR that is not a checkpoint even with --force, a DIR we
cannot write, a preset too large to write) are `ConfigError` / `CheckpointError` /
`OutputError`, which the CLI prints as one line with exit status 2; DIR is checked
(`dsv41c/outputs.py`) before any tensor is generated, and a write that fails on the way
(disk full, ...) is reported against DIR, never the temporary directory beside it.
"""
from __future__ import annotations

import os

from dsv41c.frontend.config import preset
from dsv41c.outputs import OutputError, check_output_dir, note_kept, reason


def _is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def cmd_init_checkpoint(args) -> int:
    check_output_dir(args.output, "-o", force=args.force, replaceable=_is_checkpoint, kind="checkpoint directory")
    cfg = preset(args.preset)
    from dsv41c.frontend.checkpoint_writer import write_random_checkpoint  # torch: after the cheap checks

    try:
        res = write_random_checkpoint(cfg, args.output, seed=args.seed, force=args.force)
    except OSError as e:
        raise OutputError(f"-o {args.output}: cannot write the checkpoint ({reason(e)}); nothing written") from None
    note_kept(res.path)
    print(f"{res.path}: preset {args.preset}, seed {args.seed}: {res.n_tensors} tensors, {res.n_shards} shard(s), "
          f"{res.total_size} bytes, index sha256 {res.index_hash}")
    return 0
