"""Scratch (removed after the run): flip compressor.DECODE_CFG tail_pf to True when the sweep's L2-cold times favour it."""
import json, re, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if "graph_cold_ms" in r]
win = True
for ratio in (1, 2):
    on = [r["graph_cold_ms"] for r in rows if r["ratio"] == ratio and r["variant"].startswith("fused_tail_pfTrue")]
    off = [r["graph_cold_ms"] for r in rows if r["ratio"] == ratio and r["variant"].startswith("fused_tail_pfFalse")]
    print(ratio, "on", on, "off", off)
    win &= bool(on and off) and max(on) < min(off) - 0.0003
print("flip", win)
if win:
    p = "codegen/triton/compressor.py"
    s = open(p).read()
    s = s.replace('"maxnreg": None, "tail_pf": False}', '"maxnreg": None, "tail_pf": True}')
    open(p, "w").write(s)
