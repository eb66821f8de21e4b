"""CLI handlers on a compiled artifact: `dsv41c run` and `dsv41c inspect`.

    dsv41c run ARTIFACT [--checkpoint DIR] --ids 1,2,3 [--max-new-tokens N] [--logits-out FILE.npy]
               [--device D]
        greedy generation through the compiled plan; prints the generated ids
        (comma-separated) on stdout, like `dsv41c generate`; `--logits-out` writes the
        prompt positions' logits [T, vocab] as float32 .npy, like `dsv41c reference`.
    dsv41c inspect ARTIFACT [--json] [--memory]
        manifest summary, pipeline, op counts per kind per function, reports; `--json` adds
        `arena` per function, `csa2` per function (the CSA2 producers share-csa2-state counted:
        compressors by ratio, indexer-key producers, scorers, top-k, candidates, duplicates) and
        `streams` per function (ops per stream, events, per layer the cost model's serial time
        against the scheduled streams' time, from reports/streams.json), and for a --ced-split
        build `ced_split` (the suffix per decoder layer, prefill FLOPs with and without);
        `--memory` prints the memory plan (runtime/memory_view.py).

Order of checks, all before the first token is computed: `--logits-out` (a writable file
path, `dsv41c/outputs.py`), the artifact (manifest, hashes), the device against the
artifact's target, the ids against the vocabulary, and the length: the prompt plus
`--max-new-tokens` must fit `context_limit` (the model's `max_position_embeddings`, or the
artifact's `max_context` option where it has one). Bad artifacts raise `ArtifactError`,
bad ids and lengths `RequestError` (one line, exit 2). The logits file is written whole
through a temporary name right after the prefill; should that write still fail, the tokens
are generated and printed all the same and the error follows (exit 2). A generation that
runs longer than `PROGRESS_AFTER_S` prints its progress on stderr; Ctrl-C prints the
tokens generated so far before the CLI reports the interrupt.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

from dsv41c.outputs import OutputError, check_output_file, note_kept, write_file_atomic
from dsv41c.runtime.memory_view import REPORT as MEMORY_REPORT, arena_summary, format_memory

PROGRESS_AFTER_S = 5.0  # a decode loop running longer than this shows its progress on stderr
PROGRESS_EVERY_S = 10.0  # one line this often into a log; a terminal's line is rewritten every 2 s


def context_limit(manifest: dict) -> tuple:
    """(positions, what limits them) of a compiled model: the smaller of the model's
    max_position_embeddings and the artifact's max_context option (when it has one)."""
    text = manifest["config"].get("text_config", manifest["config"])
    limits = [(int(text["max_position_embeddings"]), "the model's max_position_embeddings")] \
        if "max_position_embeddings" in text else []
    mc = (manifest.get("options") or {}).get("max_context")
    if mc:
        limits.append((int(mc), "the artifact's --max-context"))
    return min(limits, key=lambda x: x[0]) if limits else (None, None)  # a tie names the model's limit


class RequestError(ValueError):
    """Ids or a length the artifact cannot take, found from its manifest before torch is imported."""


def _check_request(m: dict, ids: list, n: int) -> None:
    """The ids against the vocabulary and the length against `context_limit`, from the manifest alone."""
    if n < 0:
        raise RequestError(f"--max-new-tokens must be >= 0, got {n}")
    text = m["config"].get("text_config", m["config"])
    vocab = int(text["vocab_size"])
    for t in ids:
        if not 0 <= t < vocab:
            raise RequestError(f"token id {t} is out of range: the vocabulary has {vocab} tokens (ids 0..{vocab - 1})")
    limit, why = context_limit(m)
    if limit is not None and len(ids) + n > limit:
        raise RequestError(f"--max-new-tokens {n}: the prompt ({len(ids)} tokens) plus {n} new tokens exceed "
                         f"{why} ({limit} positions); at most {max(limit - len(ids), 0)} new tokens fit")


def cmd_run(args) -> int:
    from dsv41c.runtime.manifest import check_target, read_manifest

    logits_out = getattr(args, "logits_out", None)
    if logits_out:
        check_output_file(logits_out, "--logits-out")
    n = int(args.max_new_tokens)
    # what the manifest alone can tell is checked before torch is imported or a weight is read
    m = read_manifest(args.artifact)
    if not getattr(args, "interpret", False):  # --interpret runs a GPU plan on the cpu: the loader checks that
        check_target(m, getattr(args, "device", None))
    _check_request(m, list(args.ids), n)

    import numpy as np
    import torch

    from dsv41c.runtime.loader import load

    model = load(args.artifact, device=getattr(args, "device", None), checkpoint=getattr(args, "checkpoint", None),
                 interpret=getattr(args, "interpret", False), seeded_weights=getattr(args, "seeded_weights", None))
    prompt = model._check_ids(args.ids)
    text = model.manifest["config"].get("text_config", {})
    if text.get("hidden_size", 0) <= 1024:
        torch.set_num_threads(1)  # small models: thread start-up costs more than it saves
    s = model.new_session()
    ids, side_error = [], None
    try:
        logits = model.prefill(s, prompt)
        if logits_out:
            try:
                write_file_atomic(logits_out, lambda fh: np.save(fh, logits.to(torch.float32).numpy()), "--logits-out")
                note_kept(logits_out)
            except OutputError as e:
                side_error = e  # the tokens are still wanted: report once they are printed
        t0 = last = time.monotonic()
        tty = sys.stderr.isatty()
        every = 2.0 if tty else PROGRESS_EVERY_S
        for i in range(n):
            tok = int(torch.argmax(s.last_logits))
            ids.append(tok)
            if i + 1 < n:
                model.decode(s, tok)
            now = time.monotonic()
            if now - t0 > PROGRESS_AFTER_S and now - last > every:
                last = now
                print(f"run: {i + 1}/{n} tokens ({(i + 1) / (now - t0):.1f} tokens/s)", file=sys.stderr, flush=True,
                      end="\r" if tty else "\n")
        if tty and last > t0:
            print(file=sys.stderr)
    except KeyboardInterrupt:
        print(",".join(str(t) for t in ids), flush=True)  # what was generated is the user's
        raise KeyboardInterrupt(f"after {len(ids)} of {n} tokens (those are on stdout)") from None
    print(",".join(str(t) for t in ids), flush=True)
    if side_error is not None:
        raise side_error
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
        calls: dict = {}
        for op in fn["ops"]:
            k = op.get("kernel")
            if k:
                per = calls.setdefault(k["template"], {})
                per[k["variant"]] = per.get(k["variant"], 0) + 1
        out["functions"][name] = {"ops": len(fn["ops"]), "args": dict(sorted(roles.items())),
                                  "op_counts": dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
                                  "kernel_calls": calls}
    out["files"] = sorted(m["files"])
    out["reports"] = {}
    for rel in sorted(m["files"]):
        if rel.startswith("reports/") and rel.endswith(".json"):
            with open(os.path.join(path, rel)) as f:
                out["reports"][rel] = json.load(f)
    out["arena"] = arena_summary(out["reports"].get(MEMORY_REPORT))
    out["streams"] = (out["reports"].get("reports/streams.json") or {}).get("functions", {})
    if "reports/ced_split.json" in out["reports"]:
        out["ced_split"] = out["reports"]["reports/ced_split.json"]
    for rec in out["reports"].get("reports/passes.json", {}).get("passes", []):
        for key, n in rec.get("stats", {}).items():  # compute ops left outside kernel calls (specialize-kernels)
            if key.startswith("aten_left:") and key[len("aten_left:"):] in out["functions"]:
                out["functions"][key[len("aten_left:"):]]["aten_left"] = n
            if rec.get("name") == "share-csa2-state" and ":" in key:  # the CSA2 producers per function
                what, _, fn = key.rpartition(":")
                if fn in out["functions"]:
                    out["functions"][fn].setdefault("csa2", {})[what] = n
    plan = out["reports"].get("reports/layer_plan.json", {})
    if plan:
        out["kv_bytes_per_token"] = {"global": plan.get("global_kv_bytes_per_token"),
                                     "window_per_layer": plan.get("window_kv_bytes_per_token_per_layer"),
                                     "source": "layer plan"}
    for rec in out["reports"].get("reports/passes.json", {}).get("passes", []):
        st = rec.get("stats", {})
        if rec.get("name") == "lower-kv-fp4" and "kv_bytes_per_token:global" in st:  # the packed state's own bytes
            out["kv_bytes_per_token"] = {"global": st["kv_bytes_per_token:global"],
                                         "window_per_layer": st.get("kv_bytes_per_token:window_per_layer"),
                                         "window_bytes_per_layer": st.get("window_bytes_per_layer"),
                                         "source": "lower-kv-fp4"}
    return out


def cmd_inspect(args) -> int:
    d = describe(args.artifact)
    if getattr(args, "memory", False) and not getattr(args, "json", False):
        print(format_memory(args.artifact, d["reports"].get(MEMORY_REPORT)))
        return 0
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
