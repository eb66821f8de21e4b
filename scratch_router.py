import json, os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks.common import ms_graph
from dsv41c.codegen.triton import moe_router as mr
E, D = 384, 5120
gw = (torch.randn(E, D, device="cuda") * 0.02).bfloat16()
bias = torch.randn(E, device="cuda") * 0.01
rows = []
for T in (1, 2, 4, 8):
    x = torch.randn(T, D, device="cuda").bfloat16()
    ref = mr.router(x, gw, bias, 6, fused=False, tokens=False)
    for fused in (True, False):
        for tokens in ((False,) if T == 1 else (True, False)):
            f = lambda: mr.router(x, gw, bias, 6, fused=fused, tokens=tokens)
            w, i = f()
            g = ms_graph(f)
            r = {"T": T, "fused": fused, "tokens": tokens, "graph_us": float(g) * 1e3, "cold_us": g.cold * 1e3,
                 "ids_equal_per_token_two_launch": bool(torch.equal(i, ref[1]))}
            rows.append(r); print(json.dumps(r), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "router_sweep.json"), "w"), indent=1)
