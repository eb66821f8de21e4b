"""`dsv41c reference` / `dsv41c generate` end to end on a tiny official-format checkpoint."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dsv41c.frontend.checkpoint_writer import write_random_checkpoint
from dsv41c.frontend.config import preset
from dsv41c.frontend.model.generate import greedy_generate
from dsv41c.frontend.model.model import load_reference

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = [5, 17, 300, 2, 99, 7, 64, 511, 0, 42, 42, 42]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    write_random_checkpoint(preset("tiny"), d, seed=3)
    return str(d)


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "dsv41c", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_reference_writes_float32_logits_of_forward_full(ckpt, tmp_path):
    out = tmp_path / "logits.npy"
    r = _run("reference", ckpt, "--ids", ",".join(map(str, IDS)), "--dtype", "float32", "--kv-quant", "off",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (len(IDS), 512)
    want = load_reference(ckpt, "float32", kv_quant=False).forward_full(IDS).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_generate_dspark_prints_the_greedy_ids(ckpt):
    r = _run("generate", ckpt, "--ids", ",".join(map(str, IDS)), "--max-new-tokens", "5", "--dspark",
             "--chunk", "5", "--kv-quant", "off")
    assert r.returncode == 0, r.stderr
    want = greedy_generate(load_reference(ckpt, "float32", kv_quant=False), IDS, 5)
    assert r.stdout.strip() == ",".join(map(str, want))
    assert "dspark:" in r.stderr and "accepted" in r.stderr


def test_out_of_range_id_is_one_line_error_exit_2(ckpt, tmp_path):
    out = tmp_path / "x.npy"
    r = _run("reference", ckpt, "--ids", "1,2,512", "--out", str(out))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "512" in lines[0] and "vocabulary has 512 tokens" in lines[0], r.stderr
    assert not out.exists()
