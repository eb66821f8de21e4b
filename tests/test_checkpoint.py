"""Checkpoint inventory, reader/validator, random writer and the init-checkpoint command.

One tiny checkpoint (several shards) is written once per session; tests that corrupt a
checkpoint work on a copy. Every bad-input test checks that exactly one CheckpointError
(or ConfigError) comes out and that it names the file and the tensor at fault.
"""
import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsv41c.cli import main as cli_main
from dsv41c.frontend import checkpoint as ckmod
from dsv41c.frontend import checkpoint_writer as ckwriter
from dsv41c import formats
from dsv41c.frontend.checkpoint import CheckpointError, open_checkpoint
from dsv41c.frontend.checkpoint_writer import write_random_checkpoint
from dsv41c.frontend.config import ConfigError, preset
from dsv41c.frontend.inventory import expected_tensors, total_bytes

SHARD = 1 << 20  # ~5 shards for tiny, so shard-level errors can be exercised


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck") / "tiny"
    write_random_checkpoint(preset("tiny"), d, seed=0, max_shard_bytes=SHARD)
    return d


@pytest.fixture
def copy(tiny_dir, tmp_path):
    d = tmp_path / "tiny"
    shutil.copytree(tiny_dir, d)
    return d


def _tensors(d):
    """name -> tensor of every shard of a checkpoint directory."""
    wm = json.loads((d / ckmod.INDEX_FILE).read_text())["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        with safe_open(str(d / shard), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def _rewrite(d, tensors, n_shards=2):
    """Replace the shards of `d` by `tensors` (written with the safetensors library), fix the index."""
    for p in d.glob("model*.safetensors*"):
        p.unlink()
    names = sorted(tensors)
    wm = {}
    for i in range(n_shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i::n_shards]}
        save_file(part, str(d / fname), metadata={"format": "pt"})
        wm.update({n: fname for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (d / ckmod.INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# ============================================================================ inventory

def test_full_inventory_matches_published_index():
    cfg = preset("full")
    inv = expected_tensors(cfg)
    # 96,085 published tensors = 95,819 text + 266 vision (patch 2 + 32×8 blocks + norm 1 + aligner 4 + markers 3)
    assert len(inv) == 95819
    assert len(inv) + 2 + 32 * 8 + 1 + 4 + 3 == 96085
    # the byte count reconciles with index total_size 510,286,023,000 once the BF16 vision tensors are added
    vision = 2 * (1024 * 588 + 1024 + 32 * (3072 * 1024 + 3072 + 1024 * 1024 + 1024 + 5632 * 1024 + 1024 * 2816
                                             + 2 * 1024) + 1024 + 5120 * 9216 + 5120 + 5120 * 5120 + 5120 + 3 * 5120)
    assert total_bytes(inv) + vision == 510_286_023_000
    assert not any("hc_head" in n or n.startswith("model.") for n in inv)
    # weighted tensor counts of spec §2: 4 compressors (3 with wgate), 8 indexer queries, 4 indexer key sets
    assert sum(n.endswith("compressor.wkv.weight") for n in inv) == 4
    assert sum(n.endswith("compressor.wgate.weight") for n in inv) == 3
    assert sum(n.endswith("indexer.wq_b.weight") for n in inv) == 8
    assert sum(n.endswith("indexer.wk.weight") for n in inv) == 4
    spot = {
        "layers.0.attn.wq_b.scale": ((1024, 40), "F8_E8M0"),
        "layers.0.attn.wo_a.weight": ((8192, 4096), "F8_E4M3"),
        "layers.5.ffn.experts.383.w2.weight": ((5120, 1152), "I8"),
        "layers.5.ffn.experts.0.w1.scale": ((2304, 160), "F8_E8M0"),
        "layers.20.attn.indexer.wk.weight": ((128, 512), "BF16"),
        "layers.14.engram.embed.weight": ((384016682, 256), "F8_E4M3"),
        "layers.14.engram.embed.scale": ((384016682, 8), "F8_E8M0"),
        "layers.1.engram.wkv.scale": ((800, 192), "F8_E8M0"),
        "mtp.0.main_proj.weight": ((5120, 15360), "F8_E4M3"),
        "mtp.2.confidence_head.proj.weight": ((1, 5376), "BF16"),
        "mtp.1.ffn.experts.127.w3.weight": ((2304, 2560), "I8"),
        "layers.39.hc_ffn_fn": ((24, 20480), "F32"),
    }
    for name, (shape, dtype) in spot.items():
        assert inv[name] == (shape, dtype), name
    assert "layers.24.attn.compressor.wkv.weight" not in inv and "layers.24.attn.indexer.wq_b.weight" in inv
    assert "mtp.0.ffn.experts.128.w1.weight" not in inv and "mtp.0.attn.indexer.wq_b.weight" not in inv


def test_full_preset_is_refused_by_the_writer(tmp_path):
    with pytest.raises(CheckpointError, match="too large"):
        write_random_checkpoint(preset("full"), tmp_path / "full")
    assert list(tmp_path.iterdir()) == []


# ============================================================================ round trip

def test_write_open_validate_state_dict(tiny_dir):
    cfg = preset("tiny")
    inv = expected_tensors(cfg)
    ck = open_checkpoint(tiny_dir)
    assert ck.config == cfg and len(ck.names()) == len(inv)
    assert len(list(tiny_dir.glob("model-*-of-*.safetensors"))) > 1
    sd = ck.state_dict()
    assert not any(k.endswith(".scale") for k in sd)
    for name, spec in inv.items():
        if name.endswith(".scale"):
            continue
        shape = spec.shape if spec.dtype != "I8" else (spec.shape[0], spec.shape[1] * 2)
        assert sd[name].shape == shape and sd[name].dtype == torch.float32, name
    # dequantization is the numerics codecs applied to the stored bytes
    w = sd["layers.3.attn.wq_a.weight"]
    assert torch.equal(w, formats.dequant_fp8_weight(ck.raw("layers.3.attn.wq_a.weight"), ck.raw("layers.3.attn.wq_a.scale")))
    assert ck.raw("layers.3.attn.wq_a.scale").dtype == torch.float8_e8m0fnu
    e = sd["layers.0.ffn.experts.1.w2.weight"]
    assert torch.equal(e, formats.dequant_fp4_weight(ck.raw("layers.0.ffn.experts.1.w2.weight"),
                                                ck.raw("layers.0.ffn.experts.1.w2.scale")))
    wo_a = sd["layers.3.attn.wo_a.weight"]
    assert torch.equal(wo_a, wo_a.to(torch.bfloat16).float())  # the wo_a exception: BF16-rounded
    assert ck.weight("layers.3.attn.wo_a", torch.float64).dtype == torch.float64
    assert torch.equal(ck.weight("layers.0.hc_attn_fn"), sd["layers.0.hc_attn_fn"])
    # sane random values: unit-variance linears, norms near 1, unit embeddings
    assert abs(w.std().item() * cfg.hidden_size**0.5 - 1) < 0.2
    assert abs(sd["layers.7.attn_norm.weight"].mean().item() - 1) < 0.1
    assert abs(sd["embed.weight"].std().item() - 1) < 0.1
    assert abs(sd["layers.1.engram.embed.weight"].std().item() - 1) < 0.1
    small = ck.state_dict(dtype=torch.bfloat16, include_engram_tables=False)
    assert "layers.1.engram.embed.weight" not in small and "layers.1.engram.wkv.weight" in small
    assert small["norm.weight"].dtype == torch.bfloat16


def test_mini_round_trip(tmp_path):
    cfg = preset("mini")
    res = write_random_checkpoint(cfg, tmp_path / "mini", seed=1)
    assert res.n_tensors == len(expected_tensors(cfg)) and res.n_shards == 1
    ck = open_checkpoint(tmp_path / "mini")
    assert ck.index_hash == res.index_hash
    assert ck.weight("layers.8.attn.indexer.wq_b").shape == (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)
    assert ck.weight("mtp.0.main_proj").shape == (cfg.hidden_size, 3 * cfg.hidden_size)


def test_deterministic_by_seed(tiny_dir, tmp_path):
    again = write_random_checkpoint(preset("tiny"), tmp_path / "again", seed=0, max_shard_bytes=SHARD)
    assert _files(tiny_dir) == _files(tmp_path / "again")
    assert open_checkpoint(tiny_dir).index_hash == again.index_hash
    other = write_random_checkpoint(preset("tiny"), tmp_path / "seed1", seed=1, max_shard_bytes=SHARD)
    a, b = _files(tiny_dir), _files(tmp_path / "seed1")
    assert a.keys() == b.keys()
    assert all(a[k] != b[k] for k in a if k.endswith(".safetensors"))
    assert other.index_hash == again.index_hash  # the index lists layout only, not values


def test_single_file_checkpoint_and_ignored_vision_tensors(copy):
    t = _tensors(copy)
    t["vision.blocks.0.norm1.weight"] = torch.ones(1024, dtype=torch.bfloat16)
    t["aligner.w1.bias"] = torch.zeros(5120, dtype=torch.bfloat16)
    t["image_newline"] = torch.zeros(5120, dtype=torch.bfloat16)
    for p in copy.glob("model*.safetensors*"):
        p.unlink()
    save_file(t, str(copy / ckmod.SINGLE_FILE))
    ck = open_checkpoint(copy)
    assert "image_newline" not in ck.names() and len(ck.names()) == len(expected_tensors(ck.config))
    assert len(ck.index_hash) == 64


def test_main_proj_may_be_bf16(copy):
    t = _tensors(copy)
    w = formats.dequant_fp8_weight(t.pop("mtp.0.main_proj.weight"), t.pop("mtp.0.main_proj.scale"))
    t["mtp.0.main_proj.weight"] = w.to(torch.bfloat16)
    _rewrite(copy, t)
    ck = open_checkpoint(copy)
    assert torch.equal(ck.weight("mtp.0.main_proj"), w.to(torch.bfloat16).float())


# ============================================================================ bad input

def test_missing_tensor(copy):
    t = _tensors(copy)
    del t["layers.5.attn.kv_norm.weight"]
    _rewrite(copy, t)
    with pytest.raises(CheckpointError, match=r"'layers\.5\.attn\.kv_norm\.weight' is missing, expected BF16 \[64\]"):
        open_checkpoint(copy)


def test_extra_tensor(copy):
    t = _tensors(copy)
    t["layers.0.attn.bogus.weight"] = torch.zeros(3)
    _rewrite(copy, t)
    with pytest.raises(CheckpointError, match=r"model-0000\d-of-00002\.safetensors: unexpected tensor "
                                              r"'layers\.0\.attn\.bogus\.weight'"):
        open_checkpoint(copy)


def test_misshaped_tensor(copy):
    t = _tensors(copy)
    t["layers.2.attn.indexer.wk.weight"] = torch.zeros(32, 63, dtype=torch.bfloat16)
    _rewrite(copy, t)
    with pytest.raises(CheckpointError, match=r"safetensors: tensor 'layers\.2\.attn\.indexer\.wk\.weight' has "
                                              r"shape \[32, 63\], expected \[32, 64\]"):
        open_checkpoint(copy)


def test_wrong_dtype(copy):
    t = _tensors(copy)
    t["layers.4.ffn.gate.bias"] = t["layers.4.ffn.gate.bias"].to(torch.bfloat16)
    _rewrite(copy, t)
    with pytest.raises(CheckpointError, match=r"'layers\.4\.ffn\.gate\.bias' has dtype BF16, expected F32"):
        open_checkpoint(copy)


def test_missing_shard_file(copy):
    (copy / "model-00002-of-00005.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00005\.safetensors: shard file does not exist "
                                              r"\(index lists tensor 'layers\.\d+\.[\w.]+'"):
        open_checkpoint(copy)


def test_index_names_tensor_its_shard_lacks(copy):
    idx = json.loads((copy / ckmod.INDEX_FILE).read_text())
    name = next(n for n, s in idx["weight_map"].items() if s == "model-00001-of-00005.safetensors")
    idx["weight_map"][name] = "model-00002-of-00005.safetensors"
    (copy / ckmod.INDEX_FILE).write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match=rf"model-00002-of-00005\.safetensors: index lists tensor '{name}'"):
        open_checkpoint(copy)


def test_truncated_shard_and_wrong_total_size(copy):
    idx = json.loads((copy / ckmod.INDEX_FILE).read_text())
    idx["metadata"]["total_size"] += 1
    (copy / ckmod.INDEX_FILE).write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match="metadata.total_size"):
        open_checkpoint(copy)
    shard = copy / "model-00003-of-00005.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"model-00003-of-00005\.safetensors: truncated"):
        open_checkpoint(copy)


def test_malformed_index_json(copy):
    (copy / ckmod.INDEX_FILE).write_text('{"weight_map": {"embed.weight": ')
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: malformed JSON"):
        open_checkpoint(copy)
    (copy / ckmod.INDEX_FILE).write_text('{"weight_map": ["embed.weight"]}')
    with pytest.raises(CheckpointError, match="weight_map"):
        open_checkpoint(copy)


def test_malformed_config_json(copy, capsys):
    (copy / "config.json").write_text('{"text_config": {"vocab_size": 512,')
    with pytest.raises(ConfigError, match=r"config\.json: malformed JSON at line 1"):
        open_checkpoint(copy)
    # through the CLI: one line, exit status 2
    assert cli_main(["plan", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsv41c plan: error:") and "config.json" in err and "\n" not in err
    cfg = json.loads(json.dumps(preset("tiny").to_json_dict()))
    cfg["text_config"]["hidden_size"] = "64"
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="hidden_size"):
        open_checkpoint(copy)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps(preset("tiny").to_json_dict()))
    with pytest.raises(CheckpointError, match="neither model.safetensors.index.json nor model.safetensors"):
        open_checkpoint(tmp_path)


# ============================================================================ atomic writes, CLI

def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    real, calls = ckwriter._unit_pieces, []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 500:
            raise RuntimeError("disk on fire")
        return real(*a, **k)

    monkeypatch.setattr(ckwriter, "_unit_pieces", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_random_checkpoint(preset("tiny"), tmp_path / "out", max_shard_bytes=SHARD)
    assert list(tmp_path.iterdir()) == []
    # an existing checkpoint survives a failed --force rewrite untouched
    monkeypatch.setattr(ckwriter, "_unit_pieces", real)
    write_random_checkpoint(preset("tiny"), tmp_path / "out")
    before = _files(tmp_path / "out")
    calls.clear()
    monkeypatch.setattr(ckwriter, "_unit_pieces", failing)
    with pytest.raises(RuntimeError):
        write_random_checkpoint(preset("tiny"), tmp_path / "out", seed=5, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and _files(tmp_path / "out") == before


def test_cli_init_checkpoint(tmp_path, capsys):
    out = tmp_path / "ck"
    assert cli_main(["init-checkpoint", "--preset", "tiny", "-o", str(out), "--seed", "2"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "3347 tensors" in line and "1 shard(s)" in line
    assert open_checkpoint(out).index_hash in line
    # an existing non-empty directory is refused without --force, replaced with it
    assert cli_main(["init-checkpoint", "--preset", "tiny", "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert cli_main(["init-checkpoint", "--preset", "tiny", "-o", str(out), "--force"]) == 0
    assert cli_main(["init-checkpoint", "--preset", "huge", "-o", str(tmp_path / "x")]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_force_only_replaces_a_checkpoint(tmp_path):
    other = tmp_path / "mydata"
    other.mkdir()
    (other / "notes.txt").write_text("precious")
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        write_random_checkpoint(preset("tiny"), other, force=True)
    assert (other / "notes.txt").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    write_random_checkpoint(preset("tiny"), empty)  # an empty directory is fine without --force
    assert open_checkpoint(empty).config.name == "empty"


def test_raw_reader_fallback_matches_safetensors(tiny_dir):
    # an older safetensors without F8_E8M0 support: raw() reads the bytes itself from the header offsets
    ck = open_checkpoint(tiny_dir)
    names = ["layers.2.attn.wkv.scale", "layers.2.attn.wkv.weight", "layers.0.ffn.experts.0.w1.weight",
             "layers.0.hc_ffn_base", "head.weight"]
    want = {n: ck.raw(n) for n in names}

    class Broken:
        def get_tensor(self, name):
            raise TypeError("data type 'F8_E8M0' not understood")

    ck._handles = {s: Broken() for s in set(ck._map.values())}
    for n in names:
        got = ck.raw(n)
        assert got.dtype == want[n].dtype and torch.equal(got.view(torch.uint8), want[n].view(torch.uint8)), n
