"""Random checkpoints in exactly the official format (names, dtypes, shapes, shards, index).

`write_random_checkpoint(cfg, out_dir, seed)` writes config.json, shards
`model-000NN-of-000MM.safetensors` and `model.safetensors.index.json` for any preset small
enough to write (the `full` preset is refused: it is the published checkpoint). Values are
drawn per tensor chunk from a generator seeded by (seed, name, chunk), so the same seed
gives byte-identical files and adding a tensor does not shift the others; they follow
`inventory.init_rule` so activations stay sane through 40 layers, and are quantized with
the shared codecs (FP8 32×32 blocks, packed FP4 experts, FP8 Engram tables). Shards are
written row chunk by row chunk (bounded memory) into a temporary directory beside the
target, which is renamed into place at the end: a failure leaves nothing half-written.
`force` replaces only a directory that holds a config.json.

Known gaps: writing `bench` (~36 GB) takes a long time on 2 cores; the random values
depend on torch's CPU RNG, stable in practice across torch 2.x but not promised by torch.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from dsv41c import formats
from dsv41c.frontend.checkpoint import DEFAULT_SHARD_BYTES, INDEX_FILE, MAX_WRITE_BYTES, CheckpointError
from dsv41c.frontend.config import ModelConfig
from dsv41c.frontend.inventory import expected_tensors, init_rule, total_bytes, units_of


@dataclass(frozen=True)
class WrittenCheckpoint:
    path: str
    n_tensors: int
    n_shards: int
    total_size: int
    index_hash: str


_CHUNK_ELEMS = 1 << 22  # rows are generated in chunks of about this many elements (bounded memory)


def _chunk_seed(seed: int, name: str, chunk: int) -> int:
    h = hashlib.sha256(f"dsv41c/{seed}/{name}/{chunk}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _bytes(t: torch.Tensor):
    return t.contiguous().view(torch.uint8).numpy()


def _unit_pieces(cfg: ModelConfig, unit: list[str], specs: dict, seed: int):
    """Yield (tensor name, bytes) in write order for one unit: [name] or [X.weight, X.scale]."""
    name = unit[0]
    spec = specs[name]
    dist, a, b = init_rule(name, spec)
    shape = spec.shape if len(spec.shape) > 1 else (1, spec.shape[0])
    rows, cols = shape[0], math.prod(shape[1:]) * (2 if spec.dtype == "I8" else 1)
    blk = cfg.weight_block_size[0]
    step = max(blk, _CHUNK_ELEMS // max(cols, 1) // blk * blk)  # multiple of the FP8 block rows
    scales = []
    for c, r0 in enumerate(range(0, rows, step)):
        g = torch.Generator().manual_seed(_chunk_seed(seed, name, c))
        n = min(step, rows - r0)
        if dist == "normal":
            x = torch.randn(n, cols, generator=g) * a + b
        else:
            x = torch.rand(n, cols, generator=g) * (b - a) + a
        if spec.dtype == "I8":
            q, s = formats.quant_fp4_weight(x, 32)
        elif spec.dtype == "F8_E4M3" and name.endswith("engram.embed.weight"):
            q, s = formats.quant_fp8_ue8m0(x, 32)
        elif spec.dtype == "F8_E4M3":
            q, s = formats.quant_fp8_weight(x, blk)
        else:
            q, s = x.to(torch.bfloat16 if spec.dtype == "BF16" else torch.float32), None
        if s is not None:
            scales.append(s)
        yield name, _bytes(q)
    if len(unit) == 2:
        yield unit[1], _bytes(torch.cat(scales, 0))


def _plan_shards(units, specs, max_shard_bytes: int) -> list[list[list[str]]]:
    """Greedy in inventory order; a unit never straddles two shards."""
    shards, cur, size = [], [], 0
    for u in units:
        ub = sum(specs[n].nbytes for n in u)
        if cur and size + ub > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(u)
        size += ub
    if cur:
        shards.append(cur)
    return shards


def _write_shard(path: str, units, specs, cfg, seed, progress) -> None:
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for u in units:
        for n in u:
            sp = specs[n]
            header[n] = {"dtype": sp.dtype, "shape": list(sp.shape), "data_offsets": [off, off + sp.nbytes]}
            off += sp.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for u in units:
            done = dict.fromkeys(u, 0)
            for n, buf in _unit_pieces(cfg, u, specs, seed):
                f.write(buf)
                done[n] += buf.nbytes
            for n in u:  # a wrong byte count would silently corrupt every later offset
                if done[n] != specs[n].nbytes:
                    raise AssertionError(f"{n}: wrote {done[n]} bytes, header says {specs[n].nbytes}")
            if progress:
                progress(u[0], sum(done.values()))


def write_random_checkpoint(cfg: ModelConfig, out_dir, seed: int = 0, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                            force: bool = False, progress: bool | None = None) -> WrittenCheckpoint:
    """Write a seeded random checkpoint for `cfg` in the official format into `out_dir`."""
    specs = expected_tensors(cfg)
    total = total_bytes(specs)
    out = os.path.abspath(os.fspath(out_dir))
    if total > MAX_WRITE_BYTES:
        raise CheckpointError(f"{out}: preset '{cfg.name}' is too large to write ({total / 1e9:.1f} GB of tensors, "
                              f"limit {MAX_WRITE_BYTES / 1e9:.0f} GB); use the published checkpoint")
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        if not force:
            raise CheckpointError(f"{out}: exists and is not an empty directory; pass force=True (--force) to "
                                  f"replace it")
        # --force deletes the old directory: only do that to something that is a checkpoint
        if not os.path.isdir(out) or not os.path.exists(os.path.join(out, "config.json")):
            raise CheckpointError(f"{out}: exists and is not a checkpoint directory (no config.json); refusing to "
                                  f"replace it even with --force")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < total + (64 << 20):
        raise CheckpointError(f"{out}: needs {total / 1e9:.2f} GB, only {free / 1e9:.2f} GB free on that disk")
    shards = _plan_shards(units_of(specs), specs, max_shard_bytes)
    show = progress if progress is not None else total > 2**30
    state = {"done": 0, "t": 0.0}

    def report(name, nb):
        state["done"] += nb
        if time.monotonic() - state["t"] > 2 or state["done"] == total:
            state["t"] = time.monotonic()
            print(f"init-checkpoint: {state['done'] / 1e9:.2f}/{total / 1e9:.2f} GB "
                  f"({100 * state['done'] / total:.0f}%) {name}", file=sys.stderr, flush=True)

    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the result is an ordinary directory
        weight_map = {}
        for i, units in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _write_shard(os.path.join(tmp, fname), units, specs, cfg, seed, report if show else None)
            weight_map.update({n: fname for u in units for n in u})
        index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2,
                           sort_keys=True).encode() + b"\n"
        with open(os.path.join(tmp, INDEX_FILE), "wb") as f:
            f.write(index)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg.to_json_dict(), f, indent=2)
            f.write("\n")
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return WrittenCheckpoint(out, len(specs), len(shards), total, hashlib.sha256(index).hexdigest())


def _swap_into_place(tmp: str, out: str) -> None:
    """Rename the finished temp dir to `out`; an existing `out` is removed only after that succeeds."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
    os.rmdir(old)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old)
    else:
        os.remove(old)
