"""Official-format checkpoints: open, validate, dequantize.

Reading (`open_checkpoint(path, validate=True) -> Checkpoint`):
  config.json (via `load_config`; a bad one raises `ConfigError`), then
  `model.safetensors.index.json` ({"metadata": {"total_size": N}, "weight_map": {name: shard}})
  or a single `model.safetensors`. Validation reads shard HEADERS only (8-byte length +
  JSON, parsed here so a truncated or foreign file gets a precise message) and checks:
  every indexed shard exists, index and shard headers agree name for name, each shard's
  data is complete, `total_size` equals the sum of tensor bytes, and the text tensors
  match `inventory.expected_tensors(cfg)` exactly (missing / unexpected / shape / dtype).
  `vision.*`, `aligner.*`, `image_start/end/newline` are skipped. Tensor data is read
  lazily, one tensor at a time, through `safetensors.safe_open(..., framework="pt")`.

Dequantization (`Checkpoint.weight(prefix, dtype)`), keyed on the stored dtype:
  - `X.weight` F8_E4M3 + `X.scale` F8_E8M0 on b×b blocks -> numerics.dequant_fp8_weight;
    `*.attn.wo_a` is then rounded to BF16 (the reference converter's "wo_a exception",
    spec §3.13) before the cast to `dtype`;
  - `X.weight` I8 (packed E2M1, low nibble first) + E8M0 [out, in/32] -> dequant_fp4_weight;
  - `*.engram.embed` F8_E4M3 + E8M0 [rows, dim/32]: one scale per row per 32 columns;
  - anything else (BF16 / F32): cast to `dtype`.
  `mtp.0.main_proj` may be FP8 + scale (what we write) or BF16 without a scale (spec §6.4).

STATE-DICT KEY CONVENTION (`Checkpoint.state_dict`, consumed by the reference model):
  for a quantized pair `X.weight` + `X.scale` the key is `X.weight` and the value is the
  dequantized float matrix [out, in] (no `.scale` key); every other tensor keeps its
  checkpoint name (`layers.3.hc_attn_fn`, `layers.3.attn.attn_sink`, `norm.weight`, ...).
  Names are the official ones, without a `model.` prefix.

Writing random checkpoints in the same format: `checkpoint_writer.py`.

Known gaps: `weight()`/`state_dict()` dequantize engram tables whole (fine for tiny/mini/
bench; ~100 GB each for `full`, where a row gather is needed).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct

import torch

from dsv41c import formats
from dsv41c.frontend.config import ModelConfig, load_config
from dsv41c.frontend.inventory import TensorSpec, expected_tensors, is_ignored

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_WRITE_BYTES = 100 * 10**9  # `bench` is ~36 GB; `full` (~509 GB) is the published checkpoint
DEFAULT_SHARD_BYTES = 5 * 2**30
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_TORCH_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I8": torch.int8,
                 "U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu}


class CheckpointError(ValueError):
    """A checkpoint directory that does not hold a valid DeepSeek-V4.1-Flash checkpoint."""


def _fmt(spec: TensorSpec) -> str:
    return f"{spec.dtype} {list(spec.shape)}"


# ============================================================================ headers

def _read_header(path: str, why: str = "") -> tuple[dict, int]:
    """Safetensors header of `path`: ({name: (dtype, shape, (begin, end))}, data_start)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if n < 2 or 8 + n > size:
                raise CheckpointError(f"{path}: not a safetensors file (header length {n}, file {size} B)")
            raw = json.loads(f.read(n))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: shard file does not exist{why}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: malformed safetensors header: {e}") from None
    out, end_max = {}, 0
    for name, ent in raw.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (b, e) = ent["dtype"], tuple(int(d) for d in ent["shape"]), ent["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: malformed header entry for tensor '{name}': {ent!r}") from None
        out[name] = (dt, shape, (int(b), int(e)))
        end_max = max(end_max, int(e))
    if 8 + n + end_max > size:
        raise CheckpointError(f"{path}: truncated: data ends at byte {8 + n + end_max}, file has {size} B")
    return out, 8 + n


# ============================================================================ reading

class Checkpoint:
    """A lazily-read official checkpoint. Build with `open_checkpoint`."""

    def __init__(self, path: str, config: ModelConfig, weight_map: dict, index_hash: str):
        self.path, self.config, self.index_hash = path, config, index_hash
        self._map = weight_map  # every indexed name (incl. ignored ones) -> shard file name
        self._headers: dict[str, tuple[dict, int]] = {}
        self._handles: dict = {}
        self._block = config.weight_block_size[0]

    # ------------------------------------------------------------------ listing
    def names(self) -> list[str]:
        """Text-model tensor names (vision/aligner/image markers left out), sorted."""
        return sorted(n for n in self._map if not is_ignored(n))

    def __contains__(self, name: str) -> bool:
        return name in self._map

    def shard_of(self, name: str) -> str:
        return os.path.join(self.path, self._map[name])

    def _header(self, shard: str, why: str = "") -> tuple[dict, int]:
        if shard not in self._headers:
            self._headers[shard] = _read_header(os.path.join(self.path, shard), why)
        return self._headers[shard]

    def spec(self, name: str) -> TensorSpec:
        """Stored (shape, dtype) of `name`, from its shard header."""
        dt, shape, _ = self._entry(name)
        return TensorSpec(shape, dt)

    def _entry(self, name: str):
        if name not in self._map:
            raise CheckpointError(f"{self.path}: no tensor '{name}' in the checkpoint")
        hdr, _ = self._header(self._map[name], f" (index lists tensor '{name}' in it)")
        if name not in hdr:
            raise CheckpointError(f"{self.shard_of(name)}: index lists tensor '{name}' in this shard, "
                                  f"but the shard does not hold it")
        return hdr[name]

    # ------------------------------------------------------------------ data
    def raw(self, name: str) -> torch.Tensor:
        """The tensor as stored (float8_e4m3fn, float8_e8m0fnu, int8, bfloat16, float32)."""
        dt, shape, (b, e) = self._entry(name)
        shard = self._map[name]
        try:
            if shard not in self._handles:
                from safetensors import safe_open

                self._handles[shard] = safe_open(os.path.join(self.path, shard), framework="pt")
            return self._handles[shard].get_tensor(name)
        except Exception:  # noqa: BLE001 - an older safetensors without F8_E8M0: read the bytes ourselves
            if dt not in _TORCH_DTYPES:
                raise CheckpointError(f"{self.shard_of(name)}: tensor '{name}' has unsupported dtype {dt}") from None
            with open(self.shard_of(name), "rb") as f:
                f.seek(self._header(shard)[1] + b)
                buf = bytearray(f.read(e - b))
            return torch.frombuffer(buf, dtype=torch.uint8).view(_TORCH_DTYPES[dt]).reshape(shape)

    def weight(self, prefix: str, dtype=torch.float32) -> torch.Tensor:
        """Dequantized tensor of a module prefix (`layers.3.attn.wq_a`) or a plain tensor name."""
        base = prefix[: -len(".weight")] if prefix.endswith(".weight") else prefix
        w_name, s_name = base + ".weight", base + ".scale"
        has_scale = w_name in self._map and s_name in self._map
        name = w_name if w_name in self._map else prefix
        try:
            fmt = formats.stored_format(name, self.spec(name).dtype, has_scale)
        except ValueError as e:  # quantized codes without scales mean nothing
            raise CheckpointError(f"{self.shard_of(name)}: {e}") from None
        w = self.raw(name)
        return formats.dequant_stored(w, self.raw(s_name) if has_scale else None, fmt, torch.float32,
                                 formats.rounds_through_bf16(name), self._block).to(dtype)

    def state_dict(self, dtype=torch.float32, include_engram_tables: bool = True) -> dict[str, torch.Tensor]:
        """Every text tensor dequantized; keys per the module docstring's convention."""
        out = {}
        for name in self.names():
            if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in self._map:
                continue
            if not include_engram_tables and name.endswith("engram.embed.weight"):
                continue
            out[name] = self.weight(name, dtype)
        return out

    # ------------------------------------------------------------------ validation
    def validate(self, total_size: int | None = None) -> None:
        """Check headers against the index and the config's inventory; raise CheckpointError."""
        by_shard: dict[str, list[str]] = {}
        for name, shard in self._map.items():
            by_shard.setdefault(shard, []).append(name)
        actual: dict[str, TensorSpec] = {}
        where: dict[str, str] = {}
        nbytes = 0
        for shard, names in sorted(by_shard.items()):  # first what the index promises ...
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            hdr, _ = self._header(shard, f" (index lists tensor '{names[0]}'{more} in it)")
            for name in names:
                if name not in hdr:
                    raise CheckpointError(f"{os.path.join(self.path, shard)}: index lists tensor '{name}' in this "
                                          f"shard, but the shard does not hold it")
        for shard in sorted(by_shard):  # ... then what the shards hold beyond it
            hdr, _ = self._header(shard)
            for name, (dt, shape, (b, e)) in hdr.items():
                if self._map.get(name) != shard:
                    raise CheckpointError(f"{os.path.join(self.path, shard)}: holds tensor '{name}', which the "
                                          f"index does not list in this shard")
                k = _DTYPE_BYTES.get(dt)
                if k is not None and e - b != math.prod(shape) * k:
                    raise CheckpointError(f"{os.path.join(self.path, shard)}: tensor '{name}' {dt} {list(shape)} "
                                          f"spans {e - b} bytes, expected {math.prod(shape) * k}")
                nbytes += e - b
                if not is_ignored(name):
                    actual[name], where[name] = TensorSpec(shape, dt), os.path.join(self.path, shard)
        if total_size is not None and total_size != nbytes:
            raise CheckpointError(f"{os.path.join(self.path, INDEX_FILE)}: metadata.total_size is {total_size}, "
                                  f"but the shards hold {nbytes} bytes of tensors")
        expected = expected_tensors(self.config)
        mp = "mtp.0.main_proj"  # BF16 without a scale in some dumps (spec §6.4): accept it
        if actual.get(f"{mp}.weight", TensorSpec((), "")).dtype == "BF16" and f"{mp}.scale" not in actual:
            expected.pop(f"{mp}.scale", None)
            expected[f"{mp}.weight"] = TensorSpec(expected[f"{mp}.weight"].shape, "BF16")
        what = f"for config '{self.config.name}' ({self.config.num_hidden_layers} layers, " \
               f"{self.config.n_routed_experts} experts)"
        missing = [n for n in expected if n not in actual]
        if missing:
            rest = f" (and {len(missing) - 1} more missing: {', '.join(missing[1:4])}...)" if len(missing) > 1 else ""
            raise CheckpointError(f"{self.path}: tensor '{missing[0]}' is missing, expected "
                                  f"{_fmt(expected[missing[0]])} {what}{rest}")
        extra = sorted(n for n in actual if n not in expected)
        if extra:
            rest = f" (and {len(extra) - 1} more: {', '.join(extra[1:4])}...)" if len(extra) > 1 else ""
            raise CheckpointError(f"{where[extra[0]]}: unexpected tensor '{extra[0]}' ({_fmt(actual[extra[0]])}) "
                                  f"{what}{rest}")
        for name, exp in expected.items():
            got = actual[name]
            if got.shape != exp.shape:
                raise CheckpointError(f"{where[name]}: tensor '{name}' has shape {list(got.shape)}, expected "
                                      f"{list(exp.shape)} {what}")
            if got.dtype != exp.dtype:
                raise CheckpointError(f"{where[name]}: tensor '{name}' has dtype {got.dtype}, expected "
                                      f"{exp.dtype} {what}")


def open_checkpoint(path: str, validate: bool = True) -> Checkpoint:
    """Open an official-format checkpoint directory (see the module docstring)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a checkpoint directory")
    cfg = load_config(os.path.join(path, "config.json"))
    index = os.path.join(path, INDEX_FILE)
    total_size = None
    if os.path.exists(index):
        with open(index, "rb") as f:
            data = f.read()
        try:
            d = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index}: malformed JSON: {e}") from None
        wm = d.get("weight_map") if isinstance(d, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise CheckpointError(f"{index}: field 'weight_map' must be an object {{tensor name: shard file}}")
        for name, shard in wm.items():
            if os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise CheckpointError(f"{index}: tensor '{name}' maps to '{shard}', not a file name in {path}")
        meta = d.get("metadata", {})
        total_size = meta.get("total_size") if isinstance(meta, dict) else None
        if total_size is not None and (not isinstance(total_size, int) or isinstance(total_size, bool)):
            raise CheckpointError(f"{index}: field 'metadata.total_size' must be an integer, got {total_size!r}")
        ck = Checkpoint(path, cfg, dict(wm), hashlib.sha256(data).hexdigest())
    elif os.path.exists(os.path.join(path, SINGLE_FILE)):
        hdr, _ = _read_header(os.path.join(path, SINGLE_FILE))
        listing = "".join(f"{n} {hdr[n][0]} {list(hdr[n][1])}\n" for n in sorted(hdr))
        ck = Checkpoint(path, cfg, {n: SINGLE_FILE for n in hdr}, hashlib.sha256(listing.encode()).hexdigest())
    else:
        raise CheckpointError(f"{path}: neither {INDEX_FILE} nor {SINGLE_FILE} found")
    if validate:
        ck.validate(total_size)
    return ck
