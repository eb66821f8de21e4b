"""The layer plan: what each layer is, derived from the config alone (spec §2).

For each backbone layer i (and each DSpark stage after them):
- part: `encoder` before the decoder's KV source (the first ratio-1 layer; layers 0–19 in
  the published config), `decoder` from there on, `dspark` for the draft stages;
- ratio: `compress_ratios[i]`;
- mode: `swa` (ratio 0), `full` (a KV source: owns compressor, indexer keys and an
  indexer query), `reindex` (an index source that is not a KV source: own indexer query
  scoring the group's shared keys), `reuse` (reads the group's compressed KV and the latest
  published top-k);
- kv_group: the KV source whose compressed cache the layer reads (largest source ≤ i);
- topk_source: the index source whose top-k the layer uses (largest index source ≤ i in
  the same KV group);
- candidates: `produces` at `candidate_source_layer_id`, `consumes` at later index sources
  of the same KV group, else None;
- rope: `main` (theta 1e4) for ratio 0, `compress` (theta 1.6e5 + YaRN) otherwise;
- engram: index of the layer's Engram table, or None.

Byte accounting (spec §3.12): one compressed entry holds the 512-d latent as FP4 with one
E4M3 scale per 16 channels and the 128-d indexer key as FP4 with one UE8M0 scale per 32:
288 + 68 = 356 B; a ratio-r group adds 356/r B per token, so the published config has
3·178 + 356 = 890 B/token of global KV. Window KV (FP8 + UE8M0/32) is per layer and
bounded by the window.

`plan_attr(cfg)` / `plan_from_attr(text)`: the fields the plan derives from, as the module
attribute `layer_plan` (`num_hidden_layers=40 compress_ratios=0,0,2,... kv_source_layer_ids=...`),
so that a pass run on a dumped module (`dsv41c opt`) checks the IR against the same plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace

from dsv41c.frontend.config import ModelConfig


@dataclass(frozen=True)
class LayerSpec:
    index: int
    part: str
    ratio: int
    mode: str
    kv_group: int | None
    topk_source: int | None
    candidates: str | None
    rope: str
    engram: int | None

    @property
    def has_compressed(self) -> bool:
        return self.ratio > 0

    @property
    def owns_compressor(self) -> bool:
        return self.mode == "full"

    @property
    def owns_indexer_query(self) -> bool:
        return self.mode in ("full", "reindex")

    @property
    def is_dspark(self) -> bool:
        return self.part == "dspark"


def decoder_start(cfg: ModelConfig) -> int:
    """First decoder layer: the first ratio-1 layer, or half the stack if there is none."""
    n = cfg.num_hidden_layers
    for i in range(n):
        if cfg.compress_ratios[i] == 1:
            return i
    return n // 2


def layer_plan(cfg: ModelConfig) -> list[LayerSpec]:
    n = cfg.num_hidden_layers
    dec = decoder_start(cfg)
    plan = []
    for i in range(cfg.n_layers_total):
        r = cfg.compress_ratios[i]
        if i >= n:
            plan.append(LayerSpec(i, "dspark", 0, "swa", None, None, None, "main", None))
            continue
        part = "decoder" if i >= dec else "encoder"
        engram = cfg.engram_layer_ids.index(i) if i in cfg.engram_layer_ids else None
        if r == 0:
            plan.append(LayerSpec(i, part, 0, "swa", None, None, None, "main", engram))
            continue
        kv = max(s for s in cfg.kv_source_layer_ids if s <= i)
        topk = max(s for s in cfg.index_source_layer_ids if kv <= s <= i)
        if i == kv:
            mode = "full"
        elif i in cfg.index_source_layer_ids:
            mode = "reindex"
        else:
            mode = "reuse"
        cand = None
        c = cfg.candidate_source_layer_id
        if i == c:
            cand = "produces"
        elif mode == "reindex" and kv == c and i > c:
            cand = "consumes"
        plan.append(LayerSpec(i, part, r, mode, kv, topk, cand, "compress", engram))
    return plan


# ----------------------------------------------------------------------------- as a module attribute

_PLAN_FIELDS = ("num_hidden_layers", "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
                "candidate_source_layer_id", "engram_layer_ids")


def plan_attr(cfg) -> str:
    """The config fields `layer_plan` reads, as `name=v` or `name=v1,v2,...` separated by spaces."""
    out = []
    for k in _PLAN_FIELDS:
        v = getattr(cfg, k)
        out.append(f"{k}=" + (",".join(str(int(x)) for x in v) if isinstance(v, (tuple, list)) else str(int(v))))
    return " ".join(out)


def plan_from_attr(text: str) -> list[LayerSpec]:
    """The backbone layers' plan from a `plan_attr` string; ValueError naming the field that is wrong."""
    fields = {}
    for item in text.split():
        k, eq, v = item.partition("=")
        if not eq or k not in _PLAN_FIELDS:
            raise ValueError(f"layer_plan attribute: cannot read {item!r} (fields: {', '.join(_PLAN_FIELDS)})")
        try:
            fields[k] = tuple(int(x) for x in v.split(",") if x) if k.endswith(("ratios", "ids")) else int(v)
        except ValueError:
            raise ValueError(f"layer_plan attribute: {k} must be integers, got {v!r}") from None
    missing = [k for k in _PLAN_FIELDS if k not in fields]
    if missing:
        raise ValueError(f"layer_plan attribute: missing {', '.join(missing)}")
    n = fields["num_hidden_layers"]
    if len(fields["compress_ratios"]) < n:
        raise ValueError(f"layer_plan attribute: compress_ratios has {len(fields['compress_ratios'])} entries "
                         f"for {n} layers")
    for k in ("kv_source_layer_ids", "index_source_layer_ids"):
        for i in fields[k]:
            if not 0 <= i < n or fields["compress_ratios"][i] == 0:
                raise ValueError(f"layer_plan attribute: {k} names layer {i}, which has no compressed branch")
    for i in range(n):
        if fields["compress_ratios"][i] and not any(s <= i for s in fields["kv_source_layer_ids"]):
            raise ValueError(f"layer_plan attribute: layer {i} has ratio {fields['compress_ratios'][i]} but no "
                             "KV source at or before it")
    try:
        return layer_plan(SimpleNamespace(**fields, n_layers_total=n))
    except ValueError as e:  # e.g. a KV source that is not an index source: no top-k source for its layers
        raise ValueError(f"layer_plan attribute: not a valid plan ({e})") from None


# ----------------------------------------------------------------------------- bytes

def compressed_entry_bytes(cfg: ModelConfig) -> dict:
    latent = cfg.head_dim // 2 + cfg.head_dim // 16  # FP4 + one E4M3 per 16
    key = cfg.index_head_dim // 2 + cfg.index_head_dim // 32  # FP4 + one UE8M0 per 32
    return {"latent": latent, "index_key": key, "total": latent + key}


def cache_bytes(cfg: ModelConfig) -> dict:
    """Bytes of every cache: per token for the growing ones, per layer for the bounded ones."""
    plan = layer_plan(cfg)
    entry = compressed_entry_bytes(cfg)
    groups = [s for s in plan if s.mode == "full"]
    per_group = {s.index: entry["total"] / s.ratio for s in groups}
    window_row = cfg.head_dim + cfg.head_dim // 32  # FP8 + UE8M0 per 32
    n_window_layers = len(plan)
    # Partial compressor groups: up to ratio-1 raw fp32 [kv|gate] rows per ratio-2 source.
    partial = sum((s.ratio - 1) * 2 * cfg.head_dim * 4 for s in groups if s.ratio > 1)
    return {
        "global_kv_bytes_per_token": sum(per_group.values()),
        "global_kv_bytes_per_token_by_group": per_group,
        "compressed_entry_bytes": entry,
        "window_kv_bytes_per_token_per_layer": window_row,
        "window_kv_bytes_per_layer": window_row * cfg.sliding_window,
        "window_kv_bytes_total": window_row * cfg.sliding_window * n_window_layers,
        "compressor_partial_state_bytes": partial,
        "dspark_ctx_bytes_per_token": cfg.hidden_size * 2 if cfg.num_nextn_predict_layers else 0,
    }


def plan_as_json(cfg: ModelConfig) -> dict:
    layers = []
    for s in layer_plan(cfg):
        d = asdict(s)
        layers.append({k: d[k] for k in ("index", "part", "ratio", "mode", "kv_group", "topk_source",
                                         "candidates", "rope", "engram")})
    return {"config": cfg.name, "config_hash": cfg.hash(), "num_layers": cfg.num_hidden_layers,
            "layers": layers, **cache_bytes(cfg)}


def plan_as_table(cfg: ModelConfig) -> str:
    head = ("layer", "part", "ratio", "mode", "kv_group", "topk_from", "candidates", "rope", "engram")
    rows = [head]
    for s in layer_plan(cfg):
        name = str(s.index) if s.part != "dspark" else f"mtp.{s.index - cfg.num_hidden_layers}"
        rows.append((name, s.part, str(s.ratio), s.mode, _d(s.kv_group), _d(s.topk_source), _d(s.candidates),
                     s.rope, _d(s.engram)))
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    cb = cache_bytes(cfg)
    lines.append("")
    lines.append(f"global KV: {cb['global_kv_bytes_per_token']:g} B/token "
                 f"({cb['compressed_entry_bytes']['total']} B per compressed entry); "
                 f"window KV: {cb['window_kv_bytes_per_layer']} B per layer")
    return "\n".join(lines)


def _d(v) -> str:
    return "-" if v is None else str(v)
