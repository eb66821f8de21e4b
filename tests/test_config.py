"""Config reading, validation errors, presets, and the layer plan of the published config."""
import copy
import json
import subprocess
import sys

import pytest

from dsv41c.frontend.config import (FULL_CONFIG_JSON, ConfigError, config_from_dict, load_config, preset,
                                    preset_config_json, PRESETS)
from dsv41c.frontend.layer_plan import cache_bytes, layer_plan, plan_as_json

FIXTURE = "tests/fixtures/full_config.json"

# Spec §2, one row per backbone layer: (mode, kv_group, topk_from, candidates, rope, engram)
SPEC_PLAN = {0: ("swa", None, None, None, "main", None), 1: ("swa", None, None, None, "main", 0)}
for _i in range(2, 20):
    _g = 2 if _i < 8 else 8 if _i < 14 else 14
    SPEC_PLAN[_i] = ("full" if _i == _g else "reuse", _g, _g, None, "compress", 1 if _i == 14 else None)
for _i in range(20, 40):
    _t = 20 + 4 * ((_i - 20) // 4)
    mode = "full" if _i == 20 else "reindex" if _i == _t else "reuse"
    cand = "produces" if _i == 20 else "consumes" if mode == "reindex" else None
    SPEC_PLAN[_i] = (mode, 20, _t, cand, "compress", None)


def test_fixture_is_the_published_config():
    cfg = load_config(FIXTURE)
    assert cfg.hidden_size == 5120 and cfg.num_hidden_layers == 40 and cfg.n_routed_experts == 384
    assert cfg.compress_ratios == tuple([0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0])
    assert cfg.rope_scaling.factor == 16 and cfg.rope_scaling.original_max_position_embeddings == 65536
    assert cfg.gate_temp == 1.0  # absent from the release: HF default
    assert cfg.weight_block_size == (32, 32)
    assert cfg.hash() == preset("full").hash()


def test_full_layer_plan_matches_spec_table():
    plan = layer_plan(preset("full"))
    assert len(plan) == 43
    for spec in plan[:40]:
        assert (spec.mode, spec.kv_group, spec.topk_source, spec.candidates, spec.rope, spec.engram) == \
            SPEC_PLAN[spec.index], spec.index
        assert spec.part == ("encoder" if spec.index < 20 else "decoder")
        assert spec.ratio == (0 if spec.index < 2 else 2 if spec.index < 20 else 1)
    assert all(s.part == "dspark" and s.mode == "swa" and s.rope == "main" for s in plan[40:])


def test_full_global_kv_is_890_bytes_per_token():
    cb = cache_bytes(preset("full"))
    assert cb["global_kv_bytes_per_token"] == 890
    assert cb["compressed_entry_bytes"] == {"latent": 288, "index_key": 68, "total": 356}
    assert cb["window_kv_bytes_per_layer"] == 128 * 528


@pytest.mark.parametrize("name", PRESETS)
def test_presets_keep_the_official_id_lists(name):
    cfg = preset(name)
    if name != "mini":
        assert cfg.num_hidden_layers == 40
        assert cfg.kv_source_layer_ids == (2, 8, 14, 20)
        assert cfg.index_source_layer_ids == (2, 8, 14, 20, 24, 28, 32, 36)
        assert cfg.engram_layer_ids == (1, 14) and cfg.dspark_target_layer_ids == (37, 38, 39)
    modes = {s.mode for s in layer_plan(cfg)}
    assert modes == {"swa", "full", "reindex", "reuse"}
    # the preset's config.json parses back to the same config
    assert config_from_dict(json.loads(json.dumps(preset_config_json(name)))).hash() == cfg.hash()


def test_tiny_plan_equals_full_plan():
    strip = lambda p: [(s.part, s.ratio, s.mode, s.kv_group, s.topk_source, s.candidates, s.rope, s.engram) for s in p]
    assert strip(layer_plan(preset("tiny"))) == strip(layer_plan(preset("full")))


def _bad(mutate):
    d = copy.deepcopy(FULL_CONFIG_JSON)
    mutate(d["text_config"])
    return d


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.pop("hidden_size"), "missing field 'text_config.hidden_size'"),
    (lambda t: t.update(hidden_size="5120"), "'text_config.hidden_size' must be int"),
    (lambda t: t.update(compress_ratios=[0] * 40), "compress_ratios': has 40 entries"),
    (lambda t: t.update(kv_source_layer_ids=[2, 8, 14, 21]), "KV source layer 21 must also be an index source"),
    (lambda t: t.update(index_source_layer_ids=[2, 8, 14, 20, 24, 28, 32]), None),  # valid: fewer reindex layers
    (lambda t: t.update(index_source_layer_ids=[8, 2, 14, 20]), "strictly increasing"),
    (lambda t: t.update(kv_source_layer_ids=[1, 8, 14, 20]), "layer 1 has compress ratio 0"),
    (lambda t: t.update(candidate_source_layer_id=24), "candidate_source_layer_id"),
    (lambda t: t.update(candidate_source_layer_id=14), "must be the last KV source layer"),
    (lambda t: t.update(engram_num_embeddings=[1]), "engram_num_embeddings"),
    (lambda t: t.update(engram_layer_ids=[1, 45]), "engram_layer_ids': layer 45 outside"),
    (lambda t: t.update(o_groups=7), "o_groups"),
    (lambda t: t.update(num_key_value_heads=8), "num_key_value_heads"),
    (lambda t: t.update(head_dim=500), "head_dim"),
    (lambda t: t.update(rope_scaling={"rope_type": "yarn"}), "rope_scaling"),
])
def test_bad_config_names_the_field(mutate, message):
    d = _bad(mutate)
    if message is None:
        config_from_dict(d)
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        config_from_dict(d, where="config.json")


def test_malformed_json_names_file_and_position(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"text_config": {"vocab_size": 12,,}}')
    with pytest.raises(ConfigError, match=r"config.json: malformed JSON at line 1 column"):
        load_config(str(tmp_path))


def test_engram_pad_id_alias_is_accepted():
    d = copy.deepcopy(FULL_CONFIG_JSON)
    d["text_config"]["engram_pad_id"] = d["text_config"].pop("engram_pad_token_id")
    assert config_from_dict(d).engram_pad_token_id == 2


def test_plan_cli_json_and_table():
    out = subprocess.run([sys.executable, "-m", "dsv41c", "plan", "--preset", "full", "--json"],
                         capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    assert j["global_kv_bytes_per_token"] == 890
    assert [sorted(x) for x in j["layers"]][0] == sorted(
        ["index", "part", "ratio", "mode", "kv_group", "topk_source", "candidates", "rope", "engram"])
    assert j["layers"][24] == {"index": 24, "part": "decoder", "ratio": 1, "mode": "reindex", "kv_group": 20,
                               "topk_source": 24, "candidates": "consumes", "rope": "compress", "engram": None}
    table = subprocess.run([sys.executable, "-m", "dsv41c", "plan", FIXTURE],
                           capture_output=True, text=True)
    assert table.returncode == 0 and "890 B/token" in table.stdout


def test_plan_cli_bad_config_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    r = subprocess.run([sys.executable, "-m", "dsv41c", "plan", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "top level must be a JSON object" in r.stderr
