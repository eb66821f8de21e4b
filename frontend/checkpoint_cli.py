"""`dsv41c init-checkpoint --preset P -o DIR [--seed N] [--force]`: write a random checkpoint.

Prints one line: where, how many tensors and shards, total bytes, and the index hash (the
same sha256 `open_checkpoint(DIR).index_hash` reports). Errors (unknown preset, existing
non-empty DIR without --force, a preset too large to write) are `ConfigError` /
`CheckpointError`, which the CLI prints as one line with exit status 2.
"""
from __future__ import annotations

from dsv41c.frontend.checkpoint_writer import write_random_checkpoint
from dsv41c.frontend.config import preset


def cmd_init_checkpoint(args) -> int:
    cfg = preset(args.preset)
    res = write_random_checkpoint(cfg, args.output, seed=args.seed, force=args.force)
    print(f"{res.path}: preset {args.preset}, seed {args.seed}: {res.n_tensors} tensors, {res.n_shards} shard(s), "
          f"{res.total_size} bytes, index sha256 {res.index_hash}")
    return 0
