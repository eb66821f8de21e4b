"""Load a compiled artifact and serve it: `load(path) -> CompiledModel`.

    model = dsv41c.load("tiny.dsv41c")            # checkpoint=DIR rebinds the weights
    s = model.new_session()
    logits = model.prefill(s, [1, 2, 3])          # [T, vocab]; call again to prefill in chunks
    logits = model.decode(s)                      # [vocab]: feeds the greedy token of the last logits
    logits = model.decode(s, token=17)            # ... or the token given
    ids = model.generate([1, 2, 3], max_new_tokens=8)   # greedy, like the reference's greedy_generate

Order of checks (nothing is read before the one above it passed): the manifest
(`read_manifest`: format version, config hash, every file's sha256), the target
(`check_target`), the checkpoint binding (`bind_checkpoint`: index / inventory hash),
then `program.json`. Weights are mapped lazily (`WeightMap`): a tensor is read from its
shard the first time a function needs it. A session holds the serving state the plan
declares (`state.*` arguments: windows, compressed caches, compressor carry, token tail)
and is updated functionally by each call (the plan returns the new state).

`decode(session)` without a token decodes the session's pending greedy token: the argmax
of the logits of the last position processed (so prefill + decode + decode ... is greedy
generation); `decode(session, token)` feeds an explicit token.
A GPU artifact (`cuda:*`, `rocm:*`) runs on the device: its kernel binaries are loaded and
checked first (`kernel_binaries.py`), weights are kept there as stored (FP8/FP4 codes + scales,
BF16), the state and every value the plan makes live there (the plan's factory ops run under
the device as default).
On a CUDA device decode is a CUDA graph (`decode_graph.py`): a session's first decode runs op by
op, its second captures the step, every later one replays it (`DSV41C_CUDA_GRAPHS=0`, or
`model.cuda_graphs = False`, keeps every step op by op; so does an `observe` hook). The capacity
the artifact was compiled for is checked here, before each step on a device.
Known gaps: the cpu plan runs on the CPU whatever `device` says (`device` is only checked
against the target); one sequence per session; the arena (`arena.py`: allocated at a function's first
run) holds only the values of ATen ops, the rest come from torch's allocator run op by op and from a
graph's own pool in the captured step; on a CUDA device it is off unless `DSV41C_ARENA=1` (a decode
step writing into it failed to capture on the H200; `DSV41C_ARENA=0` turns it off on the CPU too);
prefill is not captured.
"""
from __future__ import annotations

import contextlib
import json
import operator
import os

import torch

from dsv41c.runtime.executor import Program
from dsv41c.runtime.manifest import ArtifactError, check_target, read_manifest
from dsv41c.runtime.weights import WeightMap, bind_checkpoint


class InputError(ValueError):
    """Input the model cannot take (bad token ids, decode before prefill, ...)."""


def token_tensor(ids) -> torch.Tensor:
    """`ids` (a sequence of ints or an integer tensor) as a 1-D int64 tensor, or InputError saying why not."""
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InputError(f"token ids must be integers, got a {ids.dtype} tensor")
        return ids.to(torch.int64).reshape(-1)
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise InputError(f"token ids must be a sequence of integers, got {type(ids).__name__}")
    out = []
    for t in ids:
        try:
            if isinstance(t, bool):
                raise TypeError
            t = operator.index(t)  # ints, numpy ints, one-element integer tensors
        except (TypeError, ValueError, RuntimeError):
            raise InputError(f"token id {t!r} is not an integer ({type(t).__name__})") from None
        if not -2**63 <= t < 2**63:
            raise InputError(f"token id {t} is out of range (not even a 64-bit integer)")
        out.append(t)
    return torch.tensor(out, dtype=torch.int64)


class Session:
    """One sequence's serving state plus the tokens fed so far."""

    def __init__(self, state: dict):
        self.state = state
        self.tokens: list[int] = []
        self.last_logits: torch.Tensor | None = None
        self.graph = None  # the captured decode step (decode_graph.py), on a CUDA device
        self.decodes = 0  # decode steps since the state was last replaced (the first runs op by op)

    @property
    def pos(self) -> int:
        return len(self.tokens)


class CompiledModel:
    def __init__(self, path: str, manifest: dict, program: Program, weights: WeightMap, device="cpu"):
        self.path, self.manifest, self.program, self.weights = path, manifest, program, weights
        self.device = torch.device(device)
        self.binaries = None  # the loaded kernel binaries of a GPU artifact (runtime/kernel_binaries.py)
        text = manifest["config"].get("text_config", manifest["config"])
        self.vocab_size = int(text["vocab_size"])
        self._bound: dict = {}
        self.observe = None  # observe(record, args, result) on every op of every run (checks, bisection)
        # decode captured as a CUDA graph on a CUDA device (decode_graph.py); DSV41C_CUDA_GRAPHS=0 turns it off
        self.cuda_graphs = self.device.type == "cuda" and os.environ.get("DSV41C_CUDA_GRAPHS", "1") != "0"
        self.graph_error: str | None = None  # why a capture failed (the model then decodes op by op)
        # the transient values plan-memory placed, in one arena per function (arena.py): on by default on the CPU;
        # on a CUDA device only with DSV41C_ARENA=1, since a decode step writing into it has not yet been captured
        # as a CUDA graph on the H200 (op by op it gave the allocator's answer); DSV41C_ARENA=0: off everywhere
        flag = os.environ.get("DSV41C_ARENA")
        self.arena = flag != "0" if flag is not None else self.device.type == "cpu"
        for f in program.functions.values():
            f.use_arena = f.use_arena and self.arena

    def arena_stats(self) -> dict:
        """Per function run so far: the arena's bytes and what it served ({bytes, placed, placed_bytes, ...})."""
        out = {}
        for name, f in self.program.functions.items():
            for dev, a in f._arenas.items():
                out[name] = {"bytes": a.bytes, "device": dev, "binding": a.binding, **a.stats,
                             # results plan-memory placed; of them, those written in place (an out= form)
                             "slots": sum(1 for op in f.ops if op.rec.get("arena")),
                             "slots_written": sum(1 for op in f.ops if op.place is not None)}
        return out

    def __repr__(self):
        return f"<CompiledModel {self.path} target={self.manifest['target']}>"

    # ------------------------------------------------------------------ sessions
    def new_session(self) -> Session:
        st = {}
        for a in self.program["prefill"].args:
            if a["role"] != "state":
                continue
            shape = [d if isinstance(d, int) else 0 for d in a["shape"]]  # growing caches start empty
            st[a["name"]] = torch.full(shape, a.get("fill", 0), dtype=getattr(torch, a["dtype"]), device=self.device)
        return Session(st)

    def _check_ids(self, ids) -> torch.Tensor:
        t = token_tensor(ids)
        if t.numel() == 0:
            raise InputError("no token ids given")
        bad = t[(t < 0) | (t >= self.vocab_size)]
        if bad.numel():
            raise InputError(f"token id {int(bad[0])} is out of range: the vocabulary has {self.vocab_size} "
                             f"tokens (ids 0..{self.vocab_size - 1})")
        return t

    def _weights_of(self, fname: str) -> list:
        if fname not in self._bound:
            fn = self.program[fname]
            self._bound[fname] = {a["name"]: self.weights.get(a["name"], a.get("dtype")) for a in fn.args
                                  if a["role"] == "weight"}
        return self._bound[fname]

    def _inputs(self, fname: str, session: Session, ids: torch.Tensor) -> list:
        w = self._weights_of(fname)
        return [ids if a["role"] == "input" else session.state[a["name"]] if a["role"] == "state" else w[a["name"]]
                for a in self.program[fname].args]

    def _check_capacity(self, session: Session, n: int) -> None:
        """On a device the state appends read no position back (a step stays capturable): the capacity the
        artifact was compiled for is checked here, from the session's host-side position."""
        cap = int((self.manifest.get("options") or {}).get("max_context") or 0)
        if self.device.type != "cpu" and cap and session.pos + n > cap:
            from dsv41c.prims.state import StateCapacityError

            raise StateCapacityError(
                f"the session holds {session.pos} tokens and {n} more exceed the {cap} positions the artifact "
                f"was compiled for; compile with a larger --max-context")

    def _default_device(self):
        """The device as torch's default for the run (the reference ops' own torch.* factories); nothing on the
        CPU, where it is the default already and the mode would only add a Python hook to every torch call."""
        if self.device.type == "cpu" and torch.get_default_device().type == "cpu":
            return contextlib.nullcontext()
        return torch.device(self.device)

    def _run(self, fname: str, session: Session, host_ids: torch.Tensor) -> torch.Tensor:
        fn = self.program[fname]
        self._check_capacity(session, int(host_ids.shape[0]))
        ids = host_ids.to(self.device)  # the session's token list is kept from the host copy: no device sync
        with torch.no_grad(), self._default_device():  # factory ops of the plan allocate on the device
            outs = fn.run(self._inputs(fname, session, ids), self.observe, device=self.device)
        names = fn.output_names
        session.state = {n: v for n, v in zip(names[1:], outs[1:])}
        session.graph, session.decodes = None, 0  # a captured step reads the old buffers: capture again
        session.tokens.extend(host_ids.tolist())
        session.last_logits = outs[0][-1]
        return outs[0]

    def _graph_step(self, session: Session, host_ids: torch.Tensor) -> torch.Tensor:
        """One decode step through the session's CUDA graph (captured at its second decode; decode_graph.py)."""
        if session.graph is None:
            if session.decodes == 0:  # the first runs op by op: the once ops, the launchers' and cuBLAS' set-up
                out = self._run("decode", session, host_ids)
                session.decodes = 1
                return out
            from dsv41c.runtime.decode_graph import DecodeGraph, GraphCaptureError

            fn = self.program["decode"]
            try:
                with torch.no_grad(), self._default_device():
                    session.graph = DecodeGraph(fn, self._inputs("decode", session, host_ids.to(self.device)),
                                                [(a["role"], a["name"]) for a in fn.args], session.state, self.device)
            except GraphCaptureError as e:
                self.cuda_graphs, self.graph_error = False, str(e)
                import sys

                print(f"dsv41c: decode runs op by op: {e}", file=sys.stderr)
                return self._run("decode", session, host_ids)
        self._check_capacity(session, int(host_ids.shape[0]))
        logits = session.graph.step(host_ids)
        session.decodes += 1
        session.tokens.extend(host_ids.tolist())
        session.last_logits = logits[-1]
        return logits

    # ------------------------------------------------------------------ serving
    @property
    def chunk(self) -> int:
        """The prefill chunk the compiler chose for the artifact's memory budget (0: none, any length at once)."""
        return int((self.manifest.get("options") or {}).get("chunk") or 0)

    def prefill(self, session: Session, ids, last_only: bool = False) -> torch.Tensor:
        """Logits [T, vocab] of tokens continuing the session (any T >= 1), run in chunks of at most `chunk`
        tokens where the artifact was compiled for a memory budget. `last_only`: the last position's
        logits alone, [1, vocab] (a long prompt's [T, vocab] float32 logits are T x 0.5 MB at 129K tokens
        of vocabulary: 17 GB at 32K)."""
        ids = self._check_ids(ids)
        step = self.chunk or ids.shape[0]
        parts = []
        for i in range(0, ids.shape[0], step):
            out = self._run("prefill", session, ids[i:i + step])
            parts.append(out[-1:] if last_only else out)
        if last_only:
            return parts[-1]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def decode(self, session: Session, token: int | None = None) -> torch.Tensor:
        """Logits [vocab] after feeding `token` (default: the greedy token of the last logits)."""
        if token is None:
            if session.last_logits is None:
                raise InputError("decode needs a token or a prefilled session (nothing to continue from)")
            token = int(torch.argmax(session.last_logits))
        ids = self._check_ids([int(token)])
        if self.cuda_graphs and self.observe is None:
            return self._graph_step(session, ids)[0]
        return self._run("decode", session, ids)[0]

    def generate(self, ids, max_new_tokens: int, chunk: int = 0) -> list[int]:
        """Greedy: prefill `ids` (in chunks of `chunk`, 0 = one), then exactly max_new_tokens tokens."""
        if max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        ids = self._check_ids(ids)
        s = self.new_session()
        step = chunk if chunk and chunk > 0 else ids.shape[0]
        for i in range(0, ids.shape[0], step):
            self.prefill(s, ids[i:i + step], last_only=True)
        out = []
        for i in range(max_new_tokens):
            tok = int(torch.argmax(s.last_logits))
            out.append(tok)
            if i + 1 < max_new_tokens:
                self.decode(s, tok)
        return out


def load(path, device=None, checkpoint=None, interpret: bool = False, seeded_weights: int | None = None) -> CompiledModel:
    """Validate and load `path` (a NAME.dsv41c directory); see the module docstring. `interpret`: run a GPU
    plan's kernel calls in Triton's interpreter on the CPU (the check of a GPU plan without a GPU).
    `seeded_weights=SEED`: no checkpoint; every weight the plan binds is generated on the device from SEED
    (`runtime/seeded.py`), as benchmarks at the official widths do."""
    path = os.fspath(path)
    m = read_manifest(path)
    if interpret:
        if m["target"] == "cpu":
            raise ArtifactError(f"{path}: --interpret runs a GPU plan's kernels; this artifact's target is cpu")
        if device not in (None, "cpu"):
            raise ArtifactError(f"{path}: --interpret runs on the CPU, not on device '{device}'")
        from dsv41c.runtime.kernels import use_interpreter

        use_interpreter()
        device = "cpu"
    else:
        device = check_target(m, device)  # the device kinds a target runs on are data (artifact_format)
    binaries = None
    if m["target"] != "cpu" and not interpret:
        if not torch.cuda.is_available():
            raise ArtifactError(f"{path}: target '{m['target']}' needs a GPU and this machine has none "
                                f"(--interpret runs its kernels in Triton's interpreter on the CPU)")
        device = torch.device(device if ":" in device else f"{device}:{torch.cuda.current_device()}")
        if device.index >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            raise ArtifactError(f"{path}: device '{device}' does not exist (this machine has {n} GPU"
                                f"{'s' if n != 1 else ''}: cuda:0..cuda:{n - 1})")
        from dsv41c.runtime.kernel_binaries import load_binaries

        # every binary is loaded (and checked against this device and Triton) before the first step
        binaries = load_binaries(path, m, device).install()
    if seeded_weights is not None and checkpoint is not None:
        raise ArtifactError(f"{path}: give a checkpoint or seeded weights, not both")
    prog_file = m.get("program", "program.json")
    try:
        with open(os.path.join(path, prog_file)) as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: cannot read {prog_file} ({type(e).__name__})") from None
    if seeded_weights is not None:
        from dsv41c.runtime.seeded import SeededWeights

        args = {a["name"]: a for f in spec.get("functions", {}).values() for a in f.get("args", [])
                if a.get("role") == "weight"}
        qc = m["config"].get("quantization_config") or {}
        weights = SeededWeights(list(args.values()), seeded_weights, device, (qc.get("weight_block_size") or [32])[0])
    else:
        ckpt = bind_checkpoint(path, m, os.fspath(checkpoint) if checkpoint is not None else None)
        weights = WeightMap(ckpt, device=device)
    model = CompiledModel(path, m, Program(spec), weights, device=device)
    model.binaries = binaries
    return model
