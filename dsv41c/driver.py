"""The compile driver, `dsv41c compile`: config (+ checkpoint) -> trace -> pass pipeline -> codegen -> artifact.

    build_artifact(out, checkpoint=DIR | preset="tiny", target="cpu", kv_quant=True, ...)

It stands above the stages it strings together (frontend, passes, codegen) and imports them; none of them imports
it. `cmd_compile` is the command's entry: it checks OUT (`--force` replaces an artifact, nothing else) and
--dump-dir before it hands the options to `build_artifact` (progress and the compile time go to stderr), so a bad
path fails in milliseconds, not after the trace; a write that fails on the way (disk full, ...) is reported
against OUT.

Steps (progress on stderr, one line each):
1. config: `load_config(CKPT_DIR)` (and the checkpoint's headers validated), or a preset;
2. a checkpoint for `tiny`/`mini` without one: a seeded random checkpoint is written and
   embedded as `checkpoint/` (location recorded relative, so the artifact runs as is);
   `bench`/`full` without one: the plan alone (the loader then asks for checkpoint=DIR;
   the inventory hash to check it against is computed from the config);
3. trace (`frontend/trace.py`) -> IR module with @prefill/@decode;
4. the pipeline (`passes/pipeline.py`) through the PassManager (timings, verify-each,
   dumps), then a final verify;
   on a terminal, tracing and the pipeline each show a progress bar above those lines (the layers stamped, the
   passes run; `dsv41c/progress.py`), as the kernel builds do; a log gets the lines alone;
5. codegen (`codegen/cpu.py`): program.json; the kernel variants the plan calls, built into `kernels/` for the
   Triton targets (`codegen/aot.py`);
6. `write_artifact`: manifest.json (versions, target, config + hash, checkpoint location +
   index hash + inventory hash, pipeline + options, the persistent state's layout), plan.ir, program.json, reports/
   (passes.json: per-pass changed flag + stats, and wall-clock seconds when --timings is
   asked; trace.json; layer_plan.json/.txt with cache bytes; ops.json; streams.json: ops per
   stream, events, and per layer the serial against the scheduled streams' time; chunks.json
   with `--memory-budget`: the chunk plan-chunks chose and its table of chunk against arena;
   ced_split.json with `--ced-split`: the suffix per decoder layer and the prefill FLOPs).
Determinism: nothing time- or path-dependent is written unless asked (--timings records
seconds, and then the artifact is reproducible except for reports/passes.json).
Known gaps: an Ascend artifact carries no kernel binaries (its plan calls none yet, and building the emitted
AscendC sources needs the CANN toolchain).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter

from dsv41c.artifact_format import is_artifact
from dsv41c.codegen.artifact import dumps_json, write_artifact
from dsv41c.outputs import OutputError, check_dir_to_fill, check_output_dir, kept, reason
from dsv41c.codegen.cpu import PlanError, emit_program

ACTIVATION_DTYPES = ("float32", "bfloat16")


def all_targets() -> tuple:
    """`cpu` and every target of the kernel matrix."""
    from dsv41c.codegen.matrix import TARGETS as MATRIX_TARGETS

    return ("cpu",) + tuple(MATRIX_TARGETS)


def tmp_ckpt_parent(out: str) -> str:
    return os.path.dirname(os.path.abspath(out))


def kernel_requests(module, target: str) -> list:
    """(template, variant, target) of every kernel.call of the plan, and of the other binaries a call's launch runs
    (its `key.components`, "template/variant,..."), each once however many layers call it."""
    seen = set()
    for op in module.ops():
        if op.name == "kernel.call" and not op.attrs.get("op"):
            seen.add((op.attrs["template"], op.attrs["variant"], target))
            for c in filter(None, str(op.attrs.get("key.components", "")).split(",")):  # binaries its launch runs
                seen.add((*c.split("/", 1), target))
    return sorted(seen)


def _kernel_build_note(target: str, wanted: bool) -> str:
    from dsv41c.codegen.matrix import TARGETS as MATRIX_TARGETS

    if target == "cpu":
        return "none: the cpu plan runs reference ops"
    if not MATRIX_TARGETS[target].triton:
        return (f"not built: {target} has no kernel variant the plan can call yet, and building its emitted "
                f"AscendC sources (dsv41c kernels --build) needs the CANN toolchain, absent here")
    return "built into kernels/" if wanted else "not built (--no-kernels)"


def _build_kernels(module, target: str, cfg, wanted: bool, parent: str):
    """Build the variants the plan calls into a temporary `kernels/` (-> its path, manifest entries).

    Triton targets: binaries through the shared kernel cache (codegen/aot.py). Ascend: the plan calls no
    kernel binary; its sources are emitted by `dsv41c kernels --build` and building them needs the CANN
    toolchain, which this machine lacks, so the manifest says so. `wanted` False (--no-kernels): the plan only."""
    from dsv41c.codegen.matrix import TARGETS as MATRIX_TARGETS

    requests = kernel_requests(module, target)
    if target == "cpu":
        return None, []
    tg = MATRIX_TARGETS[target]
    if not wanted or not tg.triton:
        why = "not built (--no-kernels)" if not wanted else f"not built: {target} kernels need their own toolchain"
        return None, [{"template": t, "variant": v, "target": g, "status": why} for t, v, g in requests]
    from dsv41c.codegen.aot import build_variants
    from dsv41c.codegen.triton.widths import ModelWidths

    tmp = tempfile.mkdtemp(prefix=".kernels-", dir=parent)
    out_dir = os.path.join(tmp, "kernels")
    _log(f"building {len(requests)} kernel variant(s) for {target}")
    entries = build_variants(requests, out_dir, widths=ModelWidths.of(cfg), log=sys.stderr)
    failed = [e for e in entries if e.get("status") != "built"]
    if failed:
        shutil.rmtree(tmp, ignore_errors=True)
        e = failed[0]
        raise PlanError(f"kernel {e['template']}/{e['variant']} for {target} failed to build: "
                        f"{e.get('error', 'unknown error')}")
    return out_dir, entries


def _log(msg):
    print(f"compile: {msg}", file=sys.stderr, flush=True)


def expected_inventory_hash(cfg) -> str:
    """The runtime's inventory hash (runtime/weights.py) of a checkpoint of `cfg`, from the config alone."""
    from dsv41c.frontend.trace import inventory

    lines = sorted(f"{n} {s.dtype} {list(s.shape)}" for n, s in inventory(cfg).items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _versions() -> dict:
    import torch

    import dsv41c

    try:
        import triton

        tv = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional for the cpu target
        tv = None
    return {"dsv41c_version": dsv41c.__version__, "torch_version": torch.__version__, "triton_version": tv}


def _state_layout(module) -> dict:
    """The persistent state the runtime allocates once: name -> IR dtype and shape (packed codes and scales where
    lower-kv-fp4 ran, so a kv-quant build's layout differs from a --kv-quant off one's)."""
    f = module.functions.get("prefill") or next(iter(module.functions.values()))
    return {a.name: {"dtype": a.type.dtype.name, "shape": [d if isinstance(d, int) else str(d) for d in a.type.shape]}
            for a in f.args if a.attrs.get("placement") == "persistent"}


def _op_counts(module) -> dict:
    return {name: dict(sorted(Counter(op.name for op in f.ops).items())) for name, f in module.functions.items()}


def build_artifact(out: str, checkpoint: str | None = None, preset: str | None = None, target: str = "cpu",
                   kv_quant: bool = True, seed: int = 0, dump_dir=None, dump_filter=None, timings: bool = False,
                   verify_each: bool = False, force: bool = False, activation_dtype: str | None = None,
                   kernels: bool = True, max_context: int | None = None, memory_budget: int | None = None,
                   ced_split: bool = False) -> dict:
    from dsv41c.frontend.config import ConfigError, load_config
    from dsv41c.frontend.config import preset as preset_config
    from dsv41c.frontend.layer_plan import plan_as_json, plan_as_table
    from dsv41c.frontend.trace import trace
    from dsv41c.ir.printer import print_module
    from dsv41c.ir.verifier import VerifyError, verify
    from dsv41c.passes.base import PassError
    from dsv41c.passes.manager import PassManager
    from dsv41c.passes.pipeline import build_pipeline, pipeline_specs
    from dsv41c.passes.plan_memory import binding_attrs, memory_report_files
    from dsv41c.passes.stream_cost import stream_report_json
    from dsv41c.passes.plan_chunks import chunk_report_files
    from dsv41c.passes.split_ced_prefill import ced_report_files
    from dsv41c.runtime.weights import index_hash, inventory_hash

    t_start = time.perf_counter()
    if (checkpoint is None) == (preset is None):
        raise ConfigError("compile: give either a checkpoint directory or --preset NAME (not both)")
    target_names = all_targets()
    if target not in target_names:
        raise PlanError(f"unknown target '{target}' (targets: {', '.join(target_names)})")
    act = activation_dtype or ("float32" if target == "cpu" else "bfloat16")
    if act not in ACTIVATION_DTYPES:
        raise PlanError(f"unknown activation dtype '{act}' (choose {' or '.join(ACTIVATION_DTYPES)})")
    check_output_dir(out, "-o", force=force, replaceable=is_artifact)  # before any work; --force replaces artifacts only
    tmp_ckpt = kernel_dir = None
    try:
        if checkpoint is not None:
            from dsv41c.frontend.checkpoint import open_checkpoint

            cfg = load_config(checkpoint)
            open_checkpoint(checkpoint)  # headers vs index vs inventory, before any work
            ck = {"location": os.path.abspath(checkpoint), "index_hash": index_hash(checkpoint),
                  "inventory_hash": inventory_hash(checkpoint)}
            _log(f"config from {checkpoint} (hash {cfg.hash()})")
        else:
            cfg = preset_config(preset)
            _log(f"preset '{preset}' (config hash {cfg.hash()})")
            if preset in ("tiny", "mini"):
                from dsv41c.frontend.checkpoint_writer import write_random_checkpoint

                parent = os.path.dirname(os.path.abspath(out))
                os.makedirs(parent, exist_ok=True)
                tmp_ckpt = tempfile.mkdtemp(prefix=".ckpt-", dir=parent)
                _log(f"writing a random checkpoint (seed {seed}) into the artifact")
                write_random_checkpoint(cfg, os.path.join(tmp_ckpt, "checkpoint"), seed=seed, progress=False)
                src = os.path.join(tmp_ckpt, "checkpoint")
                ck = {"location": "checkpoint", "index_hash": index_hash(src), "inventory_hash": inventory_hash(src)}
            else:
                ck = {"location": None, "index_hash": None, "inventory_hash": expected_inventory_hash(cfg)}
        _log(f"tracing prefill + decode ({cfg.num_hidden_layers} layers, kv_quant={'on' if kv_quant else 'off'})")
        import torch

        ctx = int(max_context or cfg.max_position_embeddings)
        if ctx > cfg.max_position_embeddings:
            raise PlanError(f"--max-context {ctx} exceeds the model's max_position_embeddings "
                            f"({cfg.max_position_embeddings})")
        module, tinfo = trace(cfg, kv_quant=kv_quant, dtype=getattr(torch, act), progress=sys.stderr,
                              max_context=ctx)
        _log(f"traced in {tinfo.seconds:.1f} s: {tinfo.ops} ops, {tinfo.stamps} segment stamps")
        module.attrs = {**module.attrs, **binding_attrs(cfg, max_context=ctx)}  # the arena at the planned context
        passes = build_pipeline(pipeline_specs(target, memory_budget or 0, ced_split))
        pm = PassManager(passes, verify_each=verify_each, timings=timings, dump_dir=dump_dir, dump_filter=dump_filter,
                         progress=sys.stderr)
        t0 = time.perf_counter()
        result = pm.run(module)
        module = result.module
        try:
            verify(module)
        except VerifyError as e:
            raise PassError(f"IR invalid after the pipeline; rerun with --verify-each to find the pass: {e}") from e
        _log(f"pipeline ({len(passes)} passes) in {time.perf_counter() - t0:.1f} s")
        program = emit_program(module, {"state.tokens_tail": cfg.engram_pad_token_id})
        kernel_dir, kernel_entries = _build_kernels(module, target, cfg, kernels, tmp_ckpt_parent(out))
        plan_text = print_module(module)
        records = []
        for r in result.records:
            rec = {"index": r.index, "name": r.name, "spec": r.spec, "changed": r.changed, "stats": r.stats,
                   "disabled": r.disabled}
            if timings:
                rec["seconds"] = round(r.seconds, 4)
            records.append(rec)
        files = {
            "plan.ir": plan_text,
            "program.json": program,
            "reports/passes.json": dumps_json({"pipeline": [p.spec() for p in passes], "passes": records}),
            "reports/trace.json": dumps_json({"segments_exported": sorted(tinfo.exports) if not timings
                                              else tinfo.exports, "stamps": tinfo.stamps, "ops": tinfo.ops}),
            "reports/ops.json": dumps_json(_op_counts(module)),
            "reports/layer_plan.json": dumps_json(plan_as_json(cfg)),
            "reports/layer_plan.txt": plan_as_table(cfg) + "\n",
            "reports/streams.json": dumps_json(stream_report_json(module)),
            **memory_report_files(module),
            **chunk_report_files(result.records),
            **ced_report_files(result.records),
        }
        config = cfg.to_json_dict()
        manifest = {**_versions(), "target": target, "config": config, "config_hash": cfg.hash(), "checkpoint": ck,
                    "pipeline": [p.spec() for p in passes], "program": "program.json", "plan": "plan.ir",
                    "options": {"kv_quant": bool(kv_quant), "dtype": act, "seed": seed if tmp_ckpt else None,
                                "max_context": ctx},
                    "kernels": kernel_entries, "kernel_build": _kernel_build_note(target, kernels),
                    "functions": {n: {"ops": len(f.ops), "args": len(f.args)} for n, f in module.functions.items()},
                    "state": _state_layout(module)}
        if memory_budget:  # the runtime prefills in chunks of at most this many tokens
            manifest["options"].update(chunk=module.attrs.get("chunk"), memory_budget=memory_budget)
        if "ced.suffix" in module.attrs:  # a prompt longer than the suffix may prefill through @prefill_encoder
            manifest["options"].update(ced_split={"encoder": module.attrs["ced.encoder"],
                                                  "suffix": module.attrs["ced.suffix"]})
        copy = {"checkpoint": os.path.join(tmp_ckpt, "checkpoint")} if tmp_ckpt else {}
        if kernel_dir:
            copy["kernels"] = kernel_dir
        path = write_artifact(out, manifest, files, copy, force=force)
    finally:
        if tmp_ckpt:
            shutil.rmtree(tmp_ckpt, ignore_errors=True)
        if kernel_dir:
            shutil.rmtree(os.path.dirname(kernel_dir), ignore_errors=True)
    total = time.perf_counter() - t_start
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    _log(f"wrote {path} ({size / 1e6:.1f} MB) in {total:.1f} s")
    return {"path": path, "seconds": total, "trace_seconds": tinfo.seconds, "ops": tinfo.ops}


def _scrub(text: str, parent: str, out: str) -> str:
    """`text` with the hidden temporaries beside OUT (`.ckpt-…`, `.tmp-…`) named as OUT."""
    return re.sub(re.escape(parent.rstrip(os.sep) + os.sep) + r"\.[^\s:'\"]*", lambda m: out, text)


def _ours(filename, parent: str) -> bool:
    """Whether an OSError's file is one of the hidden temporaries the compile writes beside OUT."""
    if not filename:
        return False
    rel = os.path.relpath(os.path.abspath(os.fspath(filename)), parent)
    return not rel.startswith("..") and rel.startswith(".")


def cmd_compile(args) -> int:
    out = check_output_dir(args.output, "-o", force=getattr(args, "force", False), replaceable=is_artifact)
    if getattr(args, "dump_dir", None):
        check_dir_to_fill(args.dump_dir, "--dump-dir")
    emits = getattr(args, "emit", None)
    if emits:
        from dsv41c.frontend.exports import check_emits

        act = getattr(args, "activation_dtype", None) or ("float32" if args.target == "cpu" else "bfloat16")
        check_emits(emits, kv_quant=args.kv_quant, dtype=act)  # an unknown format or unusable path fails first
    parent, since = os.path.dirname(out), len(kept())
    try:
        build_artifact(args.output, checkpoint=args.checkpoint, preset=args.preset, target=args.target,
                       kv_quant=args.kv_quant, seed=getattr(args, "seed", 0), dump_dir=getattr(args, "dump_dir", None),
                       dump_filter=getattr(args, "dump_filter", None), timings=getattr(args, "timings", False),
                       verify_each=getattr(args, "verify_each", False), force=getattr(args, "force", False),
                       activation_dtype=getattr(args, "activation_dtype", None),
                       kernels=not getattr(args, "no_kernels", False),
                       max_context=getattr(args, "max_context", None),
                       memory_budget=getattr(args, "memory_budget", None),
                       ced_split=getattr(args, "ced_split", False))
    except OSError as e:
        if _ours(e.filename, parent) or _ours(e.filename2, parent):
            raise OutputError(f"-o {args.output}: cannot write the artifact ({reason(e)}); nothing written") from None
        raise
    except Exception as e:  # a user error about the checkpoint written beside OUT names OUT, not the temporary
        msg = str(e)
        if type(e).__name__ in ("CheckpointError", "OutputError") and _scrub(msg, parent, args.output) != msg:
            raise OutputError(_scrub(msg, parent, args.output)) from None
        raise
    except KeyboardInterrupt:
        if out in kept(since):  # the artifact was complete and in place: not a failure
            print(f"compile: wrote {out} (interrupted after it was complete)", file=sys.stderr)
            return 0
        raise
    if emits:
        from dsv41c.frontend.config import load_config, preset
        from dsv41c.frontend.exports import run_emits

        cfg = preset(args.preset) if args.preset else load_config(args.checkpoint)
        run_emits(emits, cfg, kv_quant=args.kv_quant, log=sys.stderr, dtype=act,
                  max_context=getattr(args, "max_context", None))
    return 0
