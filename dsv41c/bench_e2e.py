"""`dsv41c bench`: one model, three systems, the same inputs: eager PyTorch, torch.compile and a dsv41c artifact.

    dsv41c bench --preset bench --artifact X.dsv41c --out results.json
          [--systems eager,compile,dsv41c] [--prefill 8192,32768,131072] [--decode-context 8192,32768]
          [--decode-steps 32] [--seed 0] [--device cuda]

Each system runs in its own process (`--worker SYSTEM`: the eager reference alone holds about
107 GB of bf16 weights at bench widths, so two systems never share the GPU's memory); the parent
collects their JSON and writes one file with the hardware, versions, config, every figure and the
ratios. Weights are generated on the device from `--seed` in the checkpoint's stored formats
(`dsv41c/seeded_weights.py`): the artifact binds them as stored (`load(seeded_weights=SEED)`), the
eager reference and torch.compile use their bf16 dequantization, made tensor by tensor on the
device. Prompts are seeded token ids, the same for every system.

Per system (`run_system`):
- cold prefill of each `--prefill` length from position 0 (the artifact in its plan's chunks, the
  reference in one): TTFT (s) and tok/s. The first call of a length builds what the system builds on
  first use (torch.compile's graphs, a JIT kernel the artifact's binaries miss): its time is
  `first_call_s`, and a second cold prefill of the same length is the figure; graph breaks from
  dynamo's counters;
- decode at batch 1 after a prefill of each `--decode-context` length: `--decode-steps` greedy
  steps, each timed on its own (synchronized): ms/token p50 / p99 and tok/s over the steps after the
  first two (which build what a system builds on first use: torch.compile's graphs and its dynamic
  recompile, the artifact's CUDA graph capture; `first_steps_ms`), and for the artifact whether its
  steps replayed a CUDA graph (`cuda_graph`, else `graph_error` says why not);
- the peak device memory (max allocated) over the whole worker;
- one decode step and one prefill chunk under torch.profiler: kernel launches and the time per
  kernel (top 25), on CUDA;
- a case that does not fit (out of memory) is recorded as such, and the worker goes on.
The parent also measures the ceilings once (a device-to-device copy, counting bytes read and
written; an 8192³ bf16 matmul) and the decode bytes roofline: the active weight bytes of one token
(the plan's stored weights, routed experts scaled by top-k / experts) plus the KV bytes read (every
cached entry once: global bytes per token × context), over the measured copy bandwidth; and the prefill
matmul roofline (`prefill_roofline`: 2 FLOPs per weight element a token multiplies, over the measured bf16
matmul ceiling: an upper bound on prefill tok/s, attention not counted).
On a machine without a GPU the same code runs on the CPU (a smoke test; no profiler kernels).
Known gaps: the artifact's decode is not a CUDA graph; the dsv41c system runs its plan through the Python executor, so its per-op
launch overhead is part of its figures.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

SYSTEMS = ("eager", "compile", "dsv41c")


# ----------------------------------------------------------------------------- models


def _sync(device):
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def reference_on_device(cfg, seed: int, device, dtype="bfloat16"):
    """The eager reference on seeded weights: each tensor generated stored, dequantized, kept in `dtype`."""
    import torch

    from dsv41c.frontend.inventory import expected_tensors
    from dsv41c.frontend.model.model import ReferenceModel
    from dsv41c.frontend.model.weights import dequantize_stored, seeded_stored_dict

    specs = expected_tensors(cfg)
    sd = {}
    for name in specs:
        if name.endswith(".scale") or name.startswith("mtp."):
            continue
        stored = seeded_stored_dict(cfg, seed, device, names=[name], specs=specs)
        sd[name] = dequantize_stored(cfg, stored, torch.float32, specs)[name].to(torch.bfloat16 if dtype == "bfloat16"
                                                                                  else torch.float32)
        del stored
    return ReferenceModel(cfg, sd, dtype=dtype, kv_quant=True, device=device)


class _System:
    """A model as the benchmark drives it: `new()` a state, `prefill(state, ids)`, `decode(state, token)`."""

    def __init__(self, model, new):
        self.m, self.new = model, new
        self.decode = model.decode

    def prefill(self, state, ids):
        """Logits [1, vocab] of the prompt's last position (what the first token needs) for every system."""
        return self.m.prefill(state, ids, last_only=True)


def build_system(system: str, cfg, seed: int, device, artifact: str | None):
    import torch

    if system == "dsv41c":
        if not artifact:
            raise ValueError("bench: the dsv41c system needs --artifact (dsv41c compile --preset NAME --target T)")
        import dsv41c

        model = dsv41c.load(artifact, device=str(device), seeded_weights=seed)
        return _System(model, model.new_session)
    ref = reference_on_device(cfg, seed, device)
    if system == "compile":
        # the forward body (positions, masks, every layer) is what torch.compile sees; the state stays Python
        ref._forward_here = torch.compile(ref._forward_here)
    return _System(ref, ref.new_state)


# ----------------------------------------------------------------------------- measuring


def _ids(n: int, vocab: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _oom(e) -> bool:
    return "out of memory" in str(e).lower()


def _timed(fn, device):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t0


def _profile(fn, device, top: int = 25) -> dict:
    import torch

    if torch.device(device).type != "cuda":
        return {"note": "no device kernels on the CPU"}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    rows, launches, total = {}, 0, 0.0
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        launches += 1
        us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        total += us
        r = rows.setdefault(ev.name, [0, 0.0])
        r[0] += 1
        r[1] += us
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernel_launches": launches, "device_time_ms": total / 1e3,
            "kernels": [{"name": n[:160], "calls": c, "ms": t / 1e3, "share": t / max(total, 1e-9)}
                        for n, (c, t) in ranked]}


def run_system(system: str, cfg, seed: int, device, artifact, prefill: list, contexts: list, steps: int,
               save=None) -> dict:
    """Every case of one system; `save(out)` after each, so a worker stopped by its time limit keeps what it measured."""
    import torch

    save = save or (lambda out: None)

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    out = {"system": system, "prefill": [], "decode": []}
    t0 = time.perf_counter()
    sysm = build_system(system, cfg, seed, dev, artifact)
    out["setup_s"] = round(time.perf_counter() - t0, 2)
    if cuda:
        out["weights_gib"] = round(torch.cuda.memory_allocated(dev) / 2**30, 2)
    with torch.no_grad():
        for T in prefill:
            row = {"tokens": T}
            ids = _ids(T, cfg.vocab_size, seed)
            try:
                # the first call of a length builds what the system builds on first use (torch.compile's graphs,
                # a JIT kernel the artifact's binaries miss, cuBLAS's set-up): its own figure, not the TTFT
                _, row["first_call_s"] = _timed(lambda: sysm.prefill(sysm.new(), ids), dev)
                _, t = _timed(lambda: sysm.prefill(sysm.new(), ids), dev)
                row.update(ttft_s=t, tok_s=T / t)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not _oom(e):
                    raise
                row["error"] = "out of memory"
                torch.cuda.empty_cache() if cuda else None
            out["prefill"].append(row)
            save(out)
        for C in contexts:
            row = {"context": C, "steps": steps}
            if cuda:  # the last case's blocks back to the device: a long prefill after another needs them whole
                torch.cuda.empty_cache()
            ids = _ids(C, cfg.vocab_size, seed)
            try:
                st = sysm.new()
                logits = sysm.prefill(st, ids)[-1]
                times = []
                for _ in range(steps):
                    tok = int(torch.argmax(logits))
                    logits, t = _timed(lambda: sysm.decode(st, tok), dev)
                    times.append(t)
                # the first two steps build what a system builds on first use (torch.compile's graphs and its
                # recompile once the length is seen to vary, a JIT kernel, the artifact's CUDA graph capture)
                warm = times[2:] if len(times) > 3 else times[1:] or times
                warm = sorted(warm)
                row.update(ms_p50=1e3 * warm[len(warm) // 2], ms_p99=1e3 * warm[min(len(warm) - 1, int(0.99 * len(warm)))],
                           tok_s=len(warm) / sum(warm), first_step_ms=1e3 * times[0],
                           first_steps_ms=[1e3 * t for t in times[:2]])
                if getattr(sysm.m, "cuda_graphs", None) is not None:  # the artifact: replayed as a CUDA graph?
                    g = st.graph
                    row.update(cuda_graph=g is not None, **({"graph_error": sysm.m.graph_error} if sysm.m.graph_error else {}))
                    if g is not None:  # captured with the plan's streams, or (that capture failed) on one
                        row.update(graph_streams="one" if g.serial else "plan",
                                   **({"graph_streams_error": g.first_error} if g.first_error else {}))
                if C == contexts[0]:
                    out["profile_decode_step"] = _profile(lambda: sysm.decode(st, int(torch.argmax(logits))), dev)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not _oom(e):
                    raise
                row["error"] = "out of memory"
                torch.cuda.empty_cache() if cuda else None
            out["decode"].append(row)
            save(out)
        if prefill:
            T = min(prefill)
            ids = _ids(T, cfg.vocab_size, seed)
            try:
                out["profile_prefill_chunk"] = dict(_profile(lambda: sysm.prefill(sysm.new(), ids), dev), tokens=T)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not _oom(e):
                    raise
                out["profile_prefill_chunk"] = {"tokens": T, "error": "out of memory"}
    if system == "compile":
        from torch._dynamo.utils import counters

        out["graph_breaks"] = int(sum(counters["graph_break"].values()))
        out["graph_break_reasons"] = sorted(counters["graph_break"])[:20]
    if cuda:
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    if system == "dsv41c" and getattr(sysm.m, "binaries", None) is not None:
        out["binaries"] = sysm.m.binaries.stats()
    if system == "dsv41c" and hasattr(sysm.m, "arena_stats"):
        out["arena"] = sysm.m.arena_stats()  # per function: its bytes, what it served (runtime/arena.py)
    return out


# ----------------------------------------------------------------------------- ceilings and roofline


def ceilings(device) -> dict:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return {"note": "ceilings are measured on a GPU only"}
    import triton.testing as tt

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_()
    b = torch.empty_like(a)
    ms = tt.do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    copy = 2 * n / (ms * 1e-3)
    del a, b
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = tt.do_bench(lambda: x @ y, warmup=25, rep=200, return_mode="median")
    mm = 2 * 8192 ** 3 / (ms * 1e-3)
    return {"copy_bytes_per_s": copy, "bf16_matmul_flop_per_s": mm}


def decode_roofline(artifact: str, cfg, contexts: list, copy_bw: float | None) -> dict:
    """Active bytes of one decode token from the plan's weight arguments, plus the KV read at each context."""
    from dsv41c.runtime.commands import describe

    with open(os.path.join(artifact, "program.json")) as f:
        spec = json.load(f)
    args = {a["name"]: a for fn in spec["functions"].values() for a in fn["args"] if a["role"] == "weight"}
    import torch

    def nbytes(a):
        n = 1
        for d in a["shape"]:
            n *= int(d)
        return n * torch.empty((), dtype=getattr(torch, a["dtype"])).element_size()

    routed = sum(nbytes(a) for n, a in args.items() if ".ffn.experts." in n)
    engram = sum(nbytes(a) for n, a in args.items() if ".engram.embed." in n)
    other = sum(nbytes(a) for n, a in args.items()) - routed - engram
    active = other + routed * cfg.num_experts_per_tok / cfg.n_routed_experts
    kv = (describe(artifact).get("kv_bytes_per_token") or {}).get("global") or 0.0
    out = {"active_weight_bytes": active, "routed_expert_bytes": routed, "kv_bytes_per_token_global": kv,
           "per_context": []}
    for C in contexts:
        b = active + kv * C
        row = {"context": C, "bytes_per_token": b}
        if copy_bw:
            row["roofline_ms"] = 1e3 * b / copy_bw
        out["per_context"].append(row)
    return out


def prefill_roofline(artifact: str, cfg, matmul_flops: float | None) -> dict:
    """The matmul FLOPs of one prefill token from the plan's weight matrices, and the tok/s they allow at the
    measured bf16 matmul ceiling: 2 FLOPs per weight element a token multiplies (the routed experts scaled by
    top-k / experts; FP4 codes two to a byte; scales, norms, the embedding and Engram tables, which are looked
    up or applied elementwise, left out). Attention over the context is not counted, so this is an upper bound
    on tok/s."""
    with open(os.path.join(artifact, "program.json")) as f:
        spec = json.load(f)
    args = {a["name"]: a for fn in spec["functions"].values() for a in fn["args"] if a["role"] == "weight"}
    routed = other = 0
    for n, a in args.items():
        if not n.endswith(".weight") or n == "embed.weight" or ".engram." in n or len(a["shape"]) < 2:
            continue
        k = 1
        for d in a["shape"]:
            k *= int(d)
        k *= 2 if a["dtype"] == "uint8" else 1  # packed FP4: two codes a byte
        if ".ffn.experts." in n:
            routed += k
        else:
            other += k
    flops = 2 * (other + routed * cfg.num_experts_per_tok / cfg.n_routed_experts)
    out = {"matmul_flops_per_token": flops}
    if matmul_flops:
        out["matmul_bound_tok_s"] = matmul_flops / flops
    return out


# ----------------------------------------------------------------------------- the driver


def _versions() -> dict:
    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    return v


def _hardware(device) -> dict:
    import torch

    if torch.device(device).type == "cuda":
        p = torch.cuda.get_device_properties(torch.device(device))
        return {"gpu": p.name, "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1)}
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}


def ratios(systems: dict) -> dict:
    """dsv41c against each baseline: prefill tok/s, decode tok/s (higher is better), peak memory (lower)."""
    out = {}
    d = systems.get("dsv41c")
    if not d or "error" in d:
        return out
    for base in ("eager", "compile"):
        b = systems.get(base)
        if not b or "error" in b:
            continue
        r = {}
        for kind, key, fig in (("prefill", "tokens", "tok_s"), ("decode", "context", "tok_s")):
            for row in d.get(kind, []):
                other = next((x for x in b.get(kind, []) if x.get(key) == row.get(key)), None)
                if other and fig in row and fig in other:
                    r[f"{kind}_{row[key]}_speedup"] = row[fig] / other[fig]
        if d.get("peak_memory_gib") and b.get("peak_memory_gib"):
            r["peak_memory_ratio"] = d["peak_memory_gib"] / b["peak_memory_gib"]
        out[f"dsv41c_vs_{base}"] = r
    return out


class RequestError(ValueError):
    """A `dsv41c bench` request that cannot run (one line naming the option; exit status 2)."""


def _lengths(text: str, option: str) -> list:
    """'8192,32768' -> [8192, 32768]: positive integers; '' -> [] (none of that kind)."""
    out = []
    for t in (x.strip() for x in text.split(",")):
        if not t:
            continue
        try:
            v = int(t)
        except ValueError:
            raise RequestError(f"argument {option}: expected comma-separated token counts, got {t!r} in {text!r}") from None
        if v < 1:
            raise RequestError(f"argument {option}: a token count must be >= 1, got {v}")
        out.append(v)
    return out


def _check_request(args) -> tuple:
    """Everything about the request that can be checked before a worker starts: the lengths, the
    systems, the artifact (its manifest) and the --out path. -> (prefill, contexts, systems)."""
    from dsv41c.outputs import check_output_file
    from dsv41c.runtime.manifest import read_manifest

    prefill = _lengths(args.prefill, "--prefill")
    contexts = _lengths(args.decode_context, "--decode-context")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()] if not args.worker else [args.worker]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        raise RequestError(f"argument --systems: unknown system(s) {', '.join(bad)} (systems: {', '.join(SYSTEMS)})")
    if not systems:
        raise RequestError(f"argument --systems: no system given (systems: {', '.join(SYSTEMS)})")
    if not prefill and not contexts:
        raise RequestError("nothing to measure: --prefill and --decode-context are both empty")
    if "dsv41c" in systems and not args.artifact:
        raise RequestError("the dsv41c system needs --artifact (dsv41c compile --preset NAME --target T)")
    if args.artifact:
        read_manifest(args.artifact, verify_files=False)
    check_output_file(args.out, "--out")
    return prefill, contexts, systems


def cmd_bench(args) -> int:
    import torch

    from dsv41c.frontend.config import preset

    cfg = preset(args.preset)
    prefill, contexts, systems = _check_request(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.worker:
        from dsv41c.outputs import write_file_atomic

        def save(out):
            write_file_atomic(args.out, json.dumps(out, indent=1, default=str), "--out")

        save(run_system(args.worker, cfg, args.seed, device, args.artifact, prefill, contexts, args.decode_steps,
                        save=save))
        return 0
    res = {"what": "end-to-end prefill and decode: eager PyTorch, torch.compile and dsv41c, same inputs",
           "preset": args.preset, "seed": args.seed, "device": device, "hardware": _hardware(device),
           "versions": _versions(), "config": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                                               "routed_experts": cfg.n_routed_experts,
                                               "top_k": cfg.num_experts_per_tok},
           "artifact": os.path.abspath(args.artifact) if args.artifact else None,
           "ceilings": ceilings(device), "systems": {}}
    if args.artifact:
        res["decode_roofline"] = decode_roofline(args.artifact, cfg, contexts,
                                                 res["ceilings"].get("copy_bytes_per_s"))
        res["prefill_roofline"] = prefill_roofline(args.artifact, cfg, res["ceilings"].get("bf16_matmul_flop_per_s"))
    for s in systems:
        # beside --out, so that what a worker measured survives even when the parent is stopped first
        part = f"{args.out}.{s}.part"
        cmd = [sys.executable, "-m", "dsv41c", "bench", "--worker", s, "--preset", args.preset, "--seed",
               str(args.seed), "--prefill", args.prefill, "--decode-context", args.decode_context,
               "--decode-steps", str(args.decode_steps), "--device", device, "--out", part]
        if args.artifact:
            cmd += ["--artifact", args.artifact]
        print(f"bench: {s} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
            status = f"exit status {rc}"
        except subprocess.TimeoutExpired:
            rc, status = None, f"stopped after --timeout {args.timeout} s"
        try:  # a worker that failed or was stopped keeps the cases it finished (it saves after each)
            with open(part) as f:
                got = json.load(f) if os.path.getsize(part) else None
        except (OSError, json.JSONDecodeError):
            got = None
        finally:
            if os.path.exists(part):
                os.unlink(part)
        if rc != 0:
            got = dict(got or {}, error=status + ("" if got else ", no result"))
        res["systems"][s] = got
        res["systems"][s]["wall_s"] = round(time.perf_counter() - t0, 1)
        res["ratios"] = ratios(res["systems"])
        from dsv41c.outputs import write_file_atomic

        write_file_atomic(args.out, json.dumps(res, indent=1, default=str) + "\n", "--out")
    for s, r in res["systems"].items():
        pre = ", ".join(f"{x['tokens']}: {x['tok_s']:.0f} tok/s" if "tok_s" in x else f"{x['tokens']}: {x.get('error')}"
                        for x in r.get("prefill", []))
        dec = ", ".join(f"{x['context']}: {x['ms_p50']:.1f} ms p50" if "ms_p50" in x else f"{x['context']}: {x.get('error')}"
                        for x in r.get("decode", []))
        print(f"{s:8s} prefill [{pre}]  decode [{dec}]  peak {r.get('peak_memory_gib', '-')} GiB"
              + (f"  error {r['error']}" if "error" in r else ""))
    for k, r in res.get("ratios", {}).items():
        print(k, ", ".join(f"{n} {v:.2f}" for n, v in r.items()))
    return 0
