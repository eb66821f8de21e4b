"""The runtime on compiled artifacts: equal to the eager reference, op by op, and bad artifacts.

- kv-quant off (tiny, mini): `dsv41c run` prompt logits within 1e-5 relative of
  `dsv41c reference --kv-quant off`, greedy tokens identical to `dsv41c generate`;
  chunked prefill + decode through the runtime equals one full forward.
- kv-quant on (mini): the runtime equals the reference's serving form bit for bit; every
  op of the plan, run by the runtime on the interpreter's recorded inputs, equals the IR
  registry's reference op; greedy tokens agree with the float64 reference on inputs whose
  float32-vs-float64 noise is measured small against the logit margins.
- corrupt / truncated / mismatched artifacts fail to load with a one-line reason.
Artifacts come from the session-wide fixtures in conftest.py (built once, shared with
test_compile.py).
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from dsv41c.runtime.loader import load
from dsv41c.runtime.manifest import ArtifactError

torch.set_num_threads(1)


def _ids(vocab, n, seed):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("which", ["tiny_off", "mini_off"])
def test_cli_run_equals_reference_with_kv_quant_off(which, request, tmp_path, capsys):
    from dsv41c.cli import main

    art = request.getfixturevalue(which)
    vocab = json.load(open(os.path.join(art, "manifest.json")))["config"]["text_config"]["vocab_size"]
    ids = ",".join(map(str, _ids(vocab, 48, 0)))  # 48 tokens: window, top-k and candidate blocks all bite
    ckpt = os.path.join(art, "checkpoint")
    assert main(["run", art, "--ids", ids, "--max-new-tokens", "5", "--logits-out", str(tmp_path / "run.npy")]) == 0
    got_tokens = capsys.readouterr().out.strip()
    assert main(["reference", ckpt, "--ids", ids, "--kv-quant", "off", "--out", str(tmp_path / "ref.npy")]) == 0
    assert main(["generate", ckpt, "--ids", ids, "--kv-quant", "off", "--max-new-tokens", "5"]) == 0
    ref_tokens = capsys.readouterr().out.strip()
    got, ref = np.load(tmp_path / "run.npy"), np.load(tmp_path / "ref.npy")
    assert got.shape == ref.shape == (48, vocab) and got.dtype == np.float32
    assert _rel(got, ref) < 1e-5
    assert got_tokens == ref_tokens and len(got_tokens.split(",")) == 5


def test_chunked_prefill_and_decode_equal_one_full_forward(tiny_off):
    from dsv41c.frontend.model.model import load_reference

    model = load(tiny_off)
    ref = load_reference(os.path.join(tiny_off, "checkpoint"), kv_quant=False)
    ids = _ids(model.vocab_size, 40, 1)
    full = ref.forward_full(ids)
    s = model.new_session()
    outs = [model.prefill(s, ids[a:b]) for a, b in ((0, 7), (7, 23), (23, 32))]
    outs += [model.decode(s, t)[None] for t in ids[32:]]
    got = torch.cat(outs)
    assert s.pos == 40 and _rel(got, full) < 1e-5
    assert torch.equal(got.argmax(-1), full.argmax(-1))
    # decode() without a token feeds the pending greedy token
    before = int(torch.argmax(s.last_logits))
    model.decode(s)
    assert s.tokens[-1] == before


def test_kv_quant_on_equals_serving_reference_bitwise(mini_on):
    from dsv41c.frontend.model.model import load_reference

    model = load(mini_on)
    ref = load_reference(os.path.join(mini_on, "checkpoint"), kv_quant=True)
    ids = _ids(model.vocab_size, 36, 2)
    s, st = model.new_session(), ref.new_state()
    for a, b in ((0, 13), (13, 33)):
        assert torch.equal(model.prefill(s, ids[a:b]), ref.prefill(st, ids[a:b]))
    for t in ids[33:]:
        assert torch.equal(model.decode(s, t), ref.decode(st, t))


def _check_ops(art, model, fname, inputs):
    """Run the plan in the IR interpreter; at each op run the runtime's lowered call on the
    interpreter's inputs and compare with the registry reference's result."""
    from dsv41c.ir import interpret, parse_module

    with open(os.path.join(art, "plan.ir")) as f:
        mod = parse_module(f.read(), "plan.ir")
    fn = model.program[fname]
    vals = [None] * fn.nslots
    vals[:len(inputs)] = inputs
    env = {s: int(inputs[i].shape[d]) for s, (i, d) in fn.symbols.items()}
    state = {"i": 0, "checked": 0, "names": set()}

    def on_op(op, outs):
        rop = fn.ops[state["i"]]
        state["i"] += 1
        res = rop.fn(*[g(env, vals) for g in rop.args], **{k: g(env, vals) for k, g in rop.kwargs})
        res = [res] if len(rop.out) == 1 else list(res)
        for want, got in zip(outs, res):
            if isinstance(want, torch.Tensor):
                assert want.dtype == got.dtype and want.shape == got.shape, (op.name, op.loc)
                assert torch.equal(want, got), f"{op.name} at loc({op.loc}) differs from its reference"
            else:
                assert want == got, (op.name, op.loc)
        for s, w in zip(rop.out, outs):
            vals[s] = w
        for r, d, s in rop.bind:
            env[s] = int(outs[r].shape[d])
        state["checked"] += 1
        state["names"].add(op.name)

    interpret(mod, fname, inputs, on_op=on_op)
    assert state["checked"] == len(fn.ops) == len(mod.functions[fname].ops)
    return state["names"]


def test_kv_quant_on_every_plan_op_equals_its_reference_op(mini_on):
    model = load(mini_on)
    ids = _ids(model.vocab_size, 9, 3)
    s = model.new_session()
    for fname, chunk in (("prefill", ids[:8]), ("decode", ids[8:])):
        w = model._weights_of(fname)
        fn = model.program[fname]
        x = torch.tensor(chunk)
        inputs = [x if a["role"] == "input" else s.state[a["name"]] if a["role"] == "state" else w[a["name"]]
                  for a in fn.args]
        names = _check_ops(mini_on, model, fname, inputs)
        # KV state packed (lower-kv-fp4); each KV source's chain through its cache appends one op (fuse-compressor)
        assert {"dsv41.kv_pack", "dsv41.kv_unpack", "dsv41.ring_append", "dsv41.sparse_attention",
                "dsv41.compressor_fused", "dsv41.index_scores_int8", "dsv41.select_topk", "dsv41.moe"} <= names
        (model.prefill if fname == "prefill" else model.decode)(s, chunk if fname == "prefill" else chunk[0])


def test_kv_quant_on_tokens_agree_where_float_noise_is_small(mini_on):
    from dsv41c.frontend.model.generate import greedy_generate
    from dsv41c.frontend.model.model import load_reference

    model = load(mini_on)
    ckpt = os.path.join(mini_on, "checkpoint")
    r32, r64 = load_reference(ckpt, "float32", kv_quant=True), load_reference(ckpt, "float64", kv_quant=True)
    for seed in range(10, 16):
        ids = _ids(model.vocab_size, 24, seed)
        l32, l64 = r32.forward_full(ids).double(), r64.forward_full(ids)
        noise = (l32 - l64).abs().max().item()
        top2 = l64.topk(2, dim=-1).values
        if noise < 0.1 * (top2[:, 0] - top2[:, 1]).min().item():
            break
    else:
        pytest.fail("no input with float32-vs-float64 noise below a tenth of the logit margins")
    got = model.generate(ids, 6)
    assert got == greedy_generate(r32, ids, 6)
    assert got == greedy_generate(r64, ids, 6)


# ---------------------------------------------------------------------------- bad artifacts
def _copy(src, tmp_path, name="a.dsv41c"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return str(dst)


def _edit_manifest(path, **changes):
    mp = os.path.join(path, "manifest.json")
    m = json.load(open(mp))
    for k, v in changes.items():
        if isinstance(v, dict):
            m[k].update(v)
        else:
            m[k] = v
    json.dump(m, open(mp, "w"))


def _one_line_error(path, match, **kw):
    with pytest.raises(ArtifactError) as e:
        load(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and match in msg, msg
    return msg


def test_bad_artifacts_fail_to_load_with_one_line(tiny_off, mini_off, tmp_path, capsys):
    from dsv41c.cli import main

    a = _copy(tiny_off, tmp_path, "corrupt.dsv41c")
    with open(os.path.join(a, "plan.ir"), "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    _one_line_error(a, "corrupt artifact: 'plan.ir'")
    assert main(["run", a, "--ids", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsv41c run: error: ") and "corrupt" in err[0]

    a = _copy(tiny_off, tmp_path, "truncated.dsv41c")
    os.remove(os.path.join(a, "program.json"))
    _one_line_error(a, "truncated artifact: 'program.json' is missing")

    a = _copy(tiny_off, tmp_path, "format.dsv41c")
    _edit_manifest(a, format_version=99)
    _one_line_error(a, "format version 99")

    a = _copy(tiny_off, tmp_path, "target.dsv41c")
    _edit_manifest(a, target="rocm:gfx942")
    _one_line_error(a, "artifact target 'rocm:gfx942' cannot run on device 'cpu'", device="cpu")

    a = _copy(tiny_off, tmp_path, "ckpt.dsv41c")
    _edit_manifest(a, checkpoint={"index_hash": "0" * 64})
    _one_line_error(a, "checkpoint index hash")
    # an explicit checkpoint of another model: the tensor inventory differs
    _one_line_error(tiny_off, "tensor inventory differs", checkpoint=os.path.join(mini_off, "checkpoint"))
    # ... while the artifact's own checkpoint, given explicitly, binds
    assert load(tiny_off, checkpoint=os.path.join(tiny_off, "checkpoint")).vocab_size == 512


def test_inspect_and_bad_ids(tiny_off, capsys):
    from dsv41c.cli import main

    assert main(["inspect", tiny_off, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["target"] == "cpu" and set(d["functions"]) == {"prefill", "decode"}
    counts = d["functions"]["decode"]["op_counts"]
    assert counts["dsv41.moe.default"] == 40 and counts["dsv41.sparse_attention.default"] == 40
    assert "reports/passes.json" in d["reports"]
    assert main(["inspect", tiny_off]) == 0
    text = capsys.readouterr().out
    assert "pipeline" in text and "dsv41.moe.default" in text
    assert main(["run", tiny_off, "--ids", "1,512"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("dsv41c run: error: token id 512 is out of range: the vocabulary has 512 tokens "
                   "(ids 0..511)")


def test_runtime_imports_nothing_from_the_compiler():
    import subprocess
    import sys

    code = ("import sys, dsv41c.runtime.loader, dsv41c.runtime.commands; "
            "print(sorted({k.split('.')[1] for k in sys.modules if k.startswith('dsv41c.')}))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True).stdout
    parts = set(eval(out))  # noqa: S307 - our own subprocess' list of names
    assert not parts & {"frontend", "ir", "passes", "codegen"}, parts
