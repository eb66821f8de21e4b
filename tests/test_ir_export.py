"""torch.export -> IR -> interpreter equals eager, and the cleanup pipeline keeps it so.

Uses the tracer's converter (`frontend/export_ir.py`) on a small module with a dynamic
token dim: linear, RMSNorm, views/transposes, matmul, softmax, top-k, advanced indexing,
cat + slice (a symbolic `T-1`), arange. It pins what the IR must accept from export.
"""
from __future__ import annotations

import pytest
import torch

from dsv41c.ir.core import Module
from dsv41c.ir.interpreter import interpret
from dsv41c.ir.parser import parse_module
from dsv41c.ir.printer import print_module
from dsv41c.ir.verifier import verify
from dsv41c.passes.manager import PassManager
from dsv41c.passes.pipeline import build_pipeline

export_ir = pytest.importorskip("dsv41c.frontend.export_ir")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = torch.nn.Linear(16, 32, bias=False)
        self.norm_w = torch.nn.Parameter(torch.randn(32))

    def forward(self, x, idx):
        h = self.wq(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_w
        q = h.view(h.shape[0], 4, 8).transpose(0, 1)
        v, i = torch.topk(torch.softmax(q @ q.transpose(1, 2), dim=-1), 2, dim=-1)
        return v, i, x[:, idx].sum(-1), torch.cat([h, h], dim=-1)[1:], torch.arange(x.shape[0]) * 2 + 1


def test_exported_program_runs_equal_through_the_ir():
    torch.manual_seed(0)
    model, x, idx = Small(), torch.randn(6, 16), torch.tensor([1, 3])
    ep = torch.export.export(model, (x, idx), dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}, "idx": None})
    ep = ep.run_decompositions({})
    n_in = sum(1 for n in ep.graph.nodes if n.op == "placeholder")
    f = export_ir.convert(ep, "prefill", [f"a{i}" for i in range(n_in)], [f"o{i}" for i in range(5)],
                          {(n_in - 2, 0): "T"})
    m = Module([f])
    verify(m)
    assert parse_module(print_module(m)) == m
    params = [p.detach() for p in ep.state_dict.values()]
    for t in (6, 3):
        xt = torch.randn(t, 16)
        got = interpret(m, "prefill", params + [xt, idx])
        want = model(xt, idx)
        assert all(torch.allclose(a.float(), b.float(), atol=1e-6) and a.dtype == b.dtype for a, b in zip(want, got))
    out = PassManager(build_pipeline(), verify_each=True).run(m.clone()).module
    ins = params + [x, idx]
    assert all(torch.equal(a, b) for a, b in zip(interpret(m, "prefill", ins), interpret(out, "prefill", ins)))
