"""`--emit onnx`: the target-independent tiny @prefill as ONNX passes the full checker, runs in onnxruntime equal to
the eager reference (kv-quant off), and defines every dsv41 op it calls as a function; the packed KV functions give
the eager ops' bytes; its refusals come first."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from dsv41c.frontend.config import preset
from dsv41c.frontend.export_mlir import ExportError
from dsv41c.frontend.export_onnx import NEXT, target_independent_ir, to_onnx
from dsv41c.frontend.onnx_builder import DOMAIN, onnx_dtype

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def exported():
    cfg = preset("tiny")
    module = target_independent_ir(cfg, kv_quant=False, max_context=64)
    model, report = to_onnx(module)
    return cfg, module, model, report


def test_the_full_checker_passes(exported):
    _, _, model, _ = exported
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 21), (DOMAIN, 1)}


def test_every_domain_op_is_a_node_of_a_function_in_the_model(exported):
    _, module, model, report = exported
    in_ir = {op.name.split(".", 1)[1] for op in module.functions["prefill"].ops if op.name.startswith("dsv41.")}
    defined = {(f.domain, f.name, f.overload) for f in model.functions}
    called = {(n.domain, n.op_type, n.overload) for n in model.graph.node if n.domain == DOMAIN}
    assert {"sparse_attention", "moe", "hc_mixes", "compressor_step", "dequant_weight"} <= in_ir
    assert {name for _, name, _ in defined} == in_ir  # one function (or a few overloads) per op, nothing else
    assert called == defined  # every node has its function, and every function is called
    assert all(f.node and all(n.domain in ("", None) for n in f.node) for f in model.functions)  # standard ops only
    assert sorted(report["functions"]) == sorted(f"{DOMAIN}.{x}" for x in in_ir)
    assert not any(n.domain == "" and n.op_type.startswith("dsv41") for n in model.graph.node)


def _feeds(cfg, module, ids):
    import onnxruntime as ort

    from dsv41c.frontend.model.weights import stored_state_dict

    sd = stored_state_dict(cfg, seed=3)
    feeds = {}
    for a in module.functions["prefill"].args:
        if a.name == "ids":
            x = ids
        elif a.name.startswith("state."):
            x = torch.zeros(list(a.type.shape), dtype=a.type.dtype.torch)
            if a.name == "state.tokens_tail":
                x[:] = cfg.engram_pad_token_id
        else:
            x = sd[a.name]
        t = onnx_dtype(a.type.dtype)
        if x.dtype == torch.bfloat16:
            arr = x.view(torch.int16).numpy().view(np.uint16)
        elif x.element_size() == 1 and x.dtype not in (torch.uint8, torch.int8, torch.bool):
            arr = x.view(torch.uint8).numpy()
        else:
            arr = x.numpy()
        arr = np.array(arr, order="C")  # (np.ascontiguousarray would make a 0-d state 1-d)
        feeds[a.name] = (ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, onnx_element_type=t)
                         if t == onnx.TensorProto.BFLOAT16 else arr)
    return sd, feeds


def test_onnxruntime_runs_the_prefill_equal_to_the_eager_reference(exported):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra: pip install -e '.[test]'")
    from dsv41c.frontend.model.model import ReferenceModel
    from dsv41c.frontend.model.weights import dequantize_stored

    cfg, module, model, _ = exported
    ids = torch.randint(0, cfg.vocab_size, (19,), generator=torch.Generator().manual_seed(5))
    sd, feeds = _feeds(cfg, module, ids)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # load time; the numbers are the same
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    ref = ReferenceModel(cfg, dequantize_stored(cfg, sd), kv_quant=False)
    state = ref.new_state()
    # a prompt, then one token on the state the model returned (decode is the same graph at T = 1)
    for chunk in (ids[:18], ids[18:]):
        feeds["ids"] = chunk.numpy()
        out = dict(zip(names, sess.run(names, feeds)))
        want = ref.prefill(state, chunk).numpy()
        rel = np.linalg.norm(out["logits"] - want) / np.linalg.norm(want)
        assert out["logits"].shape == want.shape and rel <= 1e-4, (len(chunk), rel)
        feeds.update({k[len(NEXT):]: v for k, v in out.items() if k.startswith(NEXT)})
    assert int(feeds["state.pos"]) == 19


def test_an_op_outside_the_table_is_refused_naming_it():
    from dsv41c.ir.parser import parse_module

    m = parse_module("func @prefill(%x: f32[4, 8]) -> (f32[4, 8]) {\n"
                     "  %0 = aten.cumsum(%x) {dim = 0} : (f32[4, 8]) -> f32[4, 8]\n  return %0\n}\n")
    with pytest.raises(ExportError, match=r"no ONNX form for aten\.cumsum \(x1\): not in the op table"):
        to_onnx(m)


@pytest.mark.parametrize("fmt", ["fp8_ue8m0", "fp4_e4m3", "fp4_ue8m0"])
def test_the_packed_kv_functions_give_the_eager_bytes(fmt):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra: pip install -e '.[test]'")
    from onnx import TensorProto as TP
    from onnx import helper

    from dsv41c.frontend.export_onnx_kv import kv_pack_nodes, kv_unpack_nodes
    from dsv41c.frontend.onnx_builder import Nodes
    from dsv41c.prims.kv_pack import kv_pack, kv_unpack

    x = torch.randn(7, 4, 64, generator=torch.Generator().manual_seed(1)) * torch.logspace(-4, 3, 64)
    x[0, 0, :32] = 0.0  # an all-zero block
    n = Nodes()
    codes, scales = kv_pack_nodes(n, "x", TP.FLOAT, fmt)
    n.op("Identity", codes, out_names=["codes"])
    n.op("Identity", scales, out_names=["scales"])
    n.op("Identity", kv_unpack_nodes(n, codes, scales, fmt, TP.FLOAT), out_names=["values"])
    g = helper.make_graph(n.nodes, "pack", [helper.make_tensor_value_info("x", TP.FLOAT, [7, 4, 64])],
                          [helper.make_tensor_value_info(k, t, None)
                           for k, t in (("codes", TP.UINT8), ("scales", TP.UINT8), ("values", TP.FLOAT))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    c, s = kv_pack(x, fmt)
    assert np.array_equal(got[0], c.view(torch.uint8).numpy()) and np.array_equal(got[1], s.view(torch.uint8).numpy())
    assert np.array_equal(got[2], kv_unpack(c, s, fmt, torch.float32).numpy())


@pytest.mark.parametrize("case", ["directory", "unwritable", "bfloat16"])
def test_bad_input_is_refused_by_the_check_before_the_compile(tmp_path, case):
    from dsv41c.frontend.exports import check_emits

    path, kv_quant, dtype, want = {
        "directory": (str(tmp_path), False, "float32", "is a directory; give a file path"),
        "unwritable": ("/proc/dsv41c/model.onnx", False, "float32", "cannot write into /proc"),
        "bfloat16": (str(tmp_path / "m.onnx"), False, "bfloat16", "add --activation-dtype float32")}[case]
    with pytest.raises(ExportError, match=want):
        check_emits([("onnx", path)], kv_quant=kv_quant, dtype=dtype)
    assert list(tmp_path.iterdir()) == []


def test_the_cli_fails_in_one_line_and_writes_nothing(tmp_path):
    p = subprocess.run([sys.executable, "-m", "dsv41c", "compile", "--preset", "tiny", "-o", str(tmp_path / "a.dsv41c"),
                        "--kv-quant", "off", "--emit", "onnx", str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"--emit onnx {tmp_path}: is a directory" in p.stderr
    assert list(tmp_path.iterdir()) == []
