"""CLI handlers on a compiled artifact: `dsv41c run` and `dsv41c inspect`.

    dsv41c run ARTIFACT [--checkpoint DIR] --ids 1,2,3 [--max-new-tokens N] [--logits-out FILE.npy]
        greedy generation through the compiled plan; prints the generated ids
        (comma-separated) on stdout, like `dsv41c generate`; `--logits-out` writes the
        prompt positions' logits [T, vocab] as float32 .npy, like `dsv41c reference`.
    dsv41c inspect ARTIFACT [--json]
        manifest summary, pipeline, op counts per kind per function, reports.

Bad artifacts raise `ArtifactError`, bad ids `InputError` (one line, exit 2). The logits
file is written whole through a temporary name once the logits exist.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter

import torch


def cmd_run(args) -> int:
    import numpy as np

    from dsv41c.runtime.loader import InputError, load

    model = load(args.artifact, device=getattr(args, "device", None), checkpoint=getattr(args, "checkpoint", None))
    text = model.manifest["config"].get("text_config", {})
    if text.get("hidden_size", 0) <= 1024:
        torch.set_num_threads(1)  # small models: thread start-up costs more than it saves
    n = int(args.max_new_tokens)
    if n < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {n}")
    s = model.new_session()
    logits = model.prefill(s, args.ids)
    if getattr(args, "logits_out", None):
        out = os.fspath(args.logits_out)
        tmp = out + ".tmp.npy"
        np.save(tmp, logits.to(torch.float32).numpy())
        os.replace(tmp, out)
    ids = []
    for i in range(n):
        tok = int(torch.argmax(s.last_logits))
        ids.append(tok)
        if i + 1 < n:
            model.decode(s, tok)
    print(",".join(str(t) for t in ids))
    return 0


def describe(path: str) -> dict:
    """The facts `inspect` shows (validated manifest, op counts, reports)."""
    from dsv41c.runtime.manifest import read_manifest

    m = read_manifest(path)
    out = {k: m[k] for k in ("format_version", "dsv41c_version", "torch_version", "target", "config_hash",
                             "checkpoint", "pipeline", "options") if k in m}
    out["triton_version"] = m.get("triton_version")
    text = m["config"].get("text_config", {})
    out["model"] = {k: text.get(k) for k in ("num_hidden_layers", "hidden_size", "vocab_size", "n_routed_experts")}
    with open(os.path.join(path, m.get("program", "program.json"))) as f:
        prog = json.load(f)
    out["functions"] = {}
    for name, fn in prog["functions"].items():
        kinds = Counter(op["target"] for op in fn["ops"])
        roles = Counter(a["role"] for a in fn["args"])
        out["functions"][name] = {"ops": len(fn["ops"]), "args": dict(sorted(roles.items())),
                                  "op_counts": dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))}
    out["files"] = sorted(m["files"])
    out["reports"] = {}
    for rel in sorted(m["files"]):
        if rel.startswith("reports/") and rel.endswith(".json"):
            with open(os.path.join(path, rel)) as f:
                out["reports"][rel] = json.load(f)
    return out


def cmd_inspect(args) -> int:
    d = describe(args.artifact)
    if getattr(args, "json", False):
        print(json.dumps(d, indent=1, sort_keys=True))
        return 0
    ck = d["checkpoint"]
    print(f"artifact   {args.artifact}")
    print(f"format     {d['format_version']}  (dsv41c {d['dsv41c_version']}, torch {d['torch_version']}, "
          f"triton {d.get('triton_version')})")
    print(f"target     {d['target']}   config {d['config_hash']}   model {d['model']}")
    print(f"checkpoint {ck.get('location') or '(none: pass --checkpoint)'}  index {str(ck.get('index_hash'))[:12]}"
          f"  inventory {str(ck.get('inventory_hash'))[:12]}")
    print(f"options    {json.dumps(d['options'], sort_keys=True)}")
    print(f"pipeline   {', '.join(d['pipeline'])}")
    for name, fn in d["functions"].items():
        print(f"@{name}: {fn['ops']} ops, args {fn['args']}")
        for target, n in list(fn["op_counts"].items()):
            print(f"    {n:6d}  {target}")
    passes = d["reports"].get("reports/passes.json", {}).get("passes", [])
    if passes:
        print("passes:")
        for p in passes:
            stats = ", ".join(f"{k}={v}" for k, v in p.get("stats", {}).items())
            secs = f" {p['seconds']:.3f}s" if "seconds" in p else ""
            print(f"    {p['index']:2d} {p['name']:<14} changed={p['changed']}{secs}  {stats}"[:160])
    print(f"reports    {', '.join(sorted(d['reports'])) or 'none'}")
    sys.stdout.flush()
    return 0
