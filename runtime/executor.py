"""Runs one function of a cpu `program.json` (codegen/cpu.py wrote it) with torch ops.

`Program(spec)` prepares each op once: the target resolved through `torch.ops`
(`aten.matmul` -> the overload packet, `aten.slice.Tensor` -> the overload,
`dsv41.moe.default` -> the domain op) or a built-in for host integers (`rt.*`), and its
argument template compiled to getters. `run(inputs)` binds the size symbols from the
inputs' shapes, runs the ops in order (freeing each slot after its last use), binds
data-dependent sizes where the plan says (`bind`), and returns the outputs.

Symbolic sizes (`{"dim": "N20+n20"}`) are evaluated from the bindings; the expression
text is checked to hold only names, integers, `+ - * //` and parentheses before it is
compiled, so a crafted program cannot run code. Errors name the op, its location and
target (`ExecutionError`). Imports nothing from the compiler.
`kernel.<template>` targets (GPU plans) call that template's launcher (`runtime/kernels.py`).
`rt.cache_append` / `rt.ring_append` write the session's state buffers in place (`dsv41c/prims/state.py`).
Streams: a step's `stream` (absent: 0) is its queue on a device; `rt.record` makes an event
token in its slot and `rt.wait` takes one. Here, on the CPU, the steps run in program order
(one valid schedule of the streams), so both are no-ops; `_Op.stream` keeps the index for a
device executor that maps streams to torch.cuda.Stream and events to torch.cuda.Event.
On a CUDA device the steps' streams and events are real (`device_streams.py`).
Ops marked `once` (hoist-invariants: they read only weights and constants) run at a function's first
call; the results later ops read are kept and bound on every later call with the same weight tensors
on the same device, and the ops are skipped.
A run can be recorded into a CUDA graph (`capturing`, see `decode_graph.py`).
Arena (`arena.py`): where plan-memory placed a function's transient values, the function's arena is
allocated at its first run on a device and each ATen op with an out= form writes its result at the
value's offset; `Function.use_arena = False` leaves every value to torch's allocator.
Known gaps: kernel launchers and domain ops allocate their results (see arena.py).
"""
from __future__ import annotations

import ast

import torch

import dsv41c.ops  # noqa: F401  (registers torch.ops.dsv41)
from dsv41c.prims.state import cache_append_, ring_append_
from dsv41c.aten_targets import out_form, takes_device
from dsv41c.runtime.arena import Arena, ArenaSlot, out_overload, write_into
from dsv41c.runtime.manifest import ArtifactError


class ExecutionError(RuntimeError):
    """An op of the plan failed at run time (names the op, its location and target)."""


_OK_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.USub,
             ast.Name, ast.Load, ast.Constant)


def compile_dim(text: str):
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ArtifactError(f"program.json: bad size expression {text!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _OK_NODES) or (isinstance(node, ast.Constant) and type(node.value) is not int):
            raise ArtifactError(f"program.json: size expression {text!r} holds {type(node).__name__}")
    code = compile(tree, "<dim>", "eval")
    return lambda env: eval(code, {"__builtins__": {}}, env)  # noqa: S307 - checked above


class _Event:
    """A recorded event on the serial executor: the steps run in order, so it is always complete."""

    __slots__ = ()


_RECORDED = _Event()

_BUILTINS = {
    "rt.dim": lambda v: v,
    "rt.size": lambda t, d: int(t.shape[d]),
    "rt.numel": lambda t: int(t.numel()),
    "rt.add": lambda a, b: a + b,
    "rt.sub": lambda a, b: a - b,
    "rt.mul": lambda a, b: a * b,
    "rt.floordiv": lambda a, b: a // b,
    "rt.record": lambda: _RECORDED,  # serial execution: everything before is done already
    "rt.wait": lambda event: None,
    # state writes in place, into the buffers the session allocated once (the verifier ensures no op reads a
    # buffer's old value after its write): the same prims as the dsv41 ops' copying eager bodies
    "rt.cache_append": cache_append_,
    "rt.ring_append": ring_append_,
}


def resolve_target(name: str):
    if name in _BUILTINS:
        return _BUILTINS[name]
    if name.startswith("kernel."):  # a kernel.call of a GPU plan: its template's launcher
        from dsv41c.runtime.kernels import launcher

        return launcher(name[len("kernel."):])
    ns, _, rest = name.partition(".")
    try:
        obj = getattr(torch.ops, ns)
        for part in rest.split("."):
            obj = getattr(obj, part)
        return obj
    except (AttributeError, RuntimeError):
        raise ArtifactError(f"program.json: op target '{name}' is not available in this torch") from None


def _slots(x):
    """The slots an encoded argument reads."""
    if isinstance(x, dict):
        if "v" in x and len(x) == 1:
            yield x["v"]
        else:
            for v in x.values():
                yield from _slots(v)
    elif isinstance(x, list):
        for v in x:
            yield from _slots(v)


def _dims(rec):
    """The encoded `{"dim": ...}` arguments of a record (size expressions evaluated per call)."""
    def walk(x):
        if isinstance(x, dict):
            if "dim" in x:
                yield x
            for v in x.values():
                yield from walk(v)
        elif isinstance(x, list):
            for v in x:
                yield from walk(v)
    yield from walk([rec.get("args"), rec.get("kwargs")])


def _compile_arg(x):
    """-> getter(env, slots) for an encoded argument (see codegen/cpu.py)."""
    if isinstance(x, dict):
        if "v" in x:
            s = x["v"]
            return lambda env, vals: vals[s]
        if "dim" in x:
            f = compile_dim(x["dim"])
            return lambda env, vals: f(env)
        if "dtype" in x:
            dt = getattr(torch, x["dtype"])
            return lambda env, vals: dt
        if "float" in x:
            v = float(x["float"])
            return lambda env, vals: v
        raise ArtifactError(f"program.json: unknown argument encoding {sorted(x)}")
    if isinstance(x, list):
        parts = [_compile_arg(v) for v in x]
        if all(getattr(p, "const", False) for p in parts):
            vals_ = [p(None, None) for p in parts]
            g = lambda env, vals: list(vals_)  # noqa: E731
            g.const = True
            return g
        return lambda env, vals: [p(env, vals) for p in parts]
    g = lambda env, vals: x  # noqa: E731
    g.const = True
    return g


class _Op:
    __slots__ = ("fn", "args", "kwargs", "out", "bind", "free", "where", "rec", "stream", "factory", "once",
                 "place", "form", "alias", "out_fn")

    def __init__(self, rec):
        self.fn = resolve_target(rec["target"])
        # a factory op of the plan names no device: the run's device is given to it (torch's default-device
        # mode reaches torch.* functions only, not aten overloads called directly)
        self.factory = takes_device(self.fn) and "device" not in rec.get("kwargs", {})
        self.args = [_compile_arg(a) for a in rec["args"]]
        self.kwargs = [(k, _compile_arg(v)) for k, v in rec.get("kwargs", {}).items()]
        self.out = rec["out"]
        self.bind = rec.get("bind", ())
        self.free = rec.get("free", ())
        self.rec = rec
        self.stream = rec.get("stream", 0)
        self.once = bool(rec.get("once"))
        # arena.py: a result plan-memory placed is written into its slot where the target has an out= form
        placed = rec.get("arena") or []
        self.form = out_form(self.fn) if len(self.out) == 1 and placed and placed[0] and not self.factory else None
        self.place = ArenaSlot.compile(placed[0], compile_dim) if self.form else None
        self.alias = bool(rec.get("alias"))  # its result may share its operand's bytes: planned so
        self.out_fn = None  # the out= overload, resolved at the first write
        k = rec.get("kernel")
        self.where = f"{rec['target']}" + (f" ({k['variant']})" if k else "") + f" at loc({rec.get('loc', '?')})"


class Function:
    def __init__(self, name: str, spec: dict):
        self.name = name
        self.args = spec["args"]
        self.symbols = spec["symbols"]
        _check_arena(name, spec.get("arena"), spec["ops"])
        self.ops = [_Op(r) for r in spec["ops"]]
        self.outputs = spec["outputs"]
        self.output_names = spec["output_names"]
        self.nslots = spec["nslots"]
        self.n_streams = 1 + max((op.stream for op in self.ops), default=0)
        self._plan_once(spec["ops"])
        self.arena_spec = spec.get("arena")  # plan-memory's {"bytes", "binding"}, if it ran
        self.use_arena = self.arena_spec is not None
        self._arenas: dict = {}  # device -> Arena, allocated at the first run there and kept

    def arena(self, device) -> Arena | None:
        """The function's arena on `device` (None: the CPU), allocated on first use; None if not planned or off."""
        if not self.use_arena:
            return None
        key = str(torch.device(device)) if device is not None else "cpu"
        a = self._arenas.get(key)
        if a is None:
            a = self._arenas[key] = Arena(self.arena_spec, device)
        return a

    def _plan_once(self, recs: list):
        """The `once` ops (hoist-invariants): which argument slots they read (the cache is valid while
        those inputs are the same tensors) and which of their results a later step reads (kept)."""
        once_out = {s for op in self.ops if op.once for s in op.out}
        read_by_step, once_in = set(self.outputs), set()
        for op, rec in zip(self.ops, recs):
            slots = set(_slots(rec.get("args"))) | set(_slots(rec.get("kwargs")))
            if op.once:
                if any(("dim" in a) for a in _dims(rec)):
                    raise ArtifactError(f"program.json: @{self.name}: {op.where} runs once but reads a size symbol")
                once_in |= {x for x in slots if x < len(self.args)}
            else:
                read_by_step |= slots
        self._once_in = sorted(once_in)
        self._once_keep = once_out & read_by_step
        self._once_cache = None  # (device, the input tensors, {slot: value}) after the first call

    def _cached_once(self, inputs: list, device):
        c = self._once_cache
        if c is None or c[0] != str(device) or any(a is not b for a, b in zip(c[1], (inputs[i] for i in self._once_in))):
            return None
        return c[2]

    def _device_streams(self, device):
        if device is None or self.n_streams == 1 or torch.device(device).type != "cuda":
            return None
        from dsv41c.runtime.device_streams import DeviceStreams

        return DeviceStreams(device, self.n_streams)

    def run(self, inputs: list, observe=None, device=None, capturing: bool = False, serial: bool = False) -> list:
        """observe(record, args, result), if given, sees every op's program.json record, its positional
        arguments and its result (the per-op kernel check and bisection use it). `device`: where the plan's
        factory ops make their tensors (default: torch's default, the CPU). `capturing`: the run is being
        recorded into a CUDA graph (`decode_graph.py`): every value it makes is kept until it returns, so no
        memory of the graph's pool is handed to a later op of the same graph while another stream may still
        read it (in a graph, torch's allocator cannot see when a replayed reader is done). `serial`: every
        step on the current stream, in program order (one valid schedule of the plan's streams)."""
        vals = [None] * self.nslots
        alive = [] if capturing else None
        vals[:len(inputs)] = inputs
        env = {s: int(inputs[i].shape[d]) for s, (i, d) in self.symbols.items()}
        # the plan's streams on a GPU (device_streams.py); None: in order on the current stream
        streams = None if serial else self._device_streams(device)
        made_on: dict = {}  # id(tensor) -> the stream of the step that made it (GPU streams only)
        cached = self._cached_once(inputs, device)  # the once ops' kept results, from an earlier call
        if cached is not None:
            for k, v in cached.items():
                vals[k] = v
        keep = {} if cached is None and self._once_keep else None
        arena = self.arena(device)
        for op in self.ops:
            if op.once and cached is not None:
                continue
            args = [g(env, vals) for g in op.args]
            kwargs = {k: g(env, vals) for k, g in op.kwargs}
            if op.factory and device is not None:
                kwargs["device"] = device
            # the arena serves a result made on its device: an op whose tensor operands are all elsewhere (the
            # host's small constants) makes its result there, and writing that into the arena would be a copy
            buf = (arena.view(op.place, env) if arena is not None and op.place is not None
                   and _reads_on(args, arena.device) else None)
            try:
                if buf is not None:
                    res = _written(op, buf, args, kwargs, streams, made_on if alive is None else None)
                    if res is None:  # no out= form for these arguments: torch's allocator from now on
                        buf = op.place = op.form = None
                if buf is not None:
                    if res is not buf and (res.data_ptr() != buf.data_ptr() or res.shape != buf.shape):
                        raise ExecutionError(f"the result {tuple(res.shape)} is not the planned {tuple(buf.shape)} "
                                             f"{buf.dtype} value at arena offset {op.place.offset}")
                    arena.placed(buf)
                elif streams is None:
                    res = op.fn(*args, **kwargs)
                elif op.rec["target"] == "rt.record":
                    res = streams.record(op.stream)
                elif op.rec["target"] == "rt.wait":
                    res = streams.wait(op.stream, args[0])
                else:
                    if alive is None:  # a capture keeps every value instead
                        streams.used(args, op.stream, lambda t: made_on.get(id(t)))
                    with streams.on(op.stream):
                        res = op.fn(*args, **kwargs)
                    for r in (res if isinstance(res, (list, tuple)) else (res,)):
                        if isinstance(r, torch.Tensor):
                            made_on[id(r)] = op.stream
            except Exception as e:
                raise ExecutionError(f"@{self.name}: {op.where}: {type(e).__name__}: {e}") from e
            if arena is not None and buf is None and not op.alias:
                res = _copy_out(arena, res)
            if observe is not None:
                observe(op.rec, args, res)
            if alive is not None:
                alive.append(res)
            if len(op.out) == 1:
                vals[op.out[0]] = res
            elif op.out:  # a step with no result (rt.wait) leaves the slots alone
                for s, r in zip(op.out, res):
                    vals[s] = r
            for r, d, s in op.bind:
                env[s] = int(vals[op.out[r]].shape[d])
            if op.once and keep is not None:
                keep.update((k, vals[k]) for k in op.out if k in self._once_keep)
            for s in op.free:
                vals[s] = None
        if streams is not None:
            streams.join()
        if keep is not None:
            self._once_cache = (str(device), [inputs[i] for i in self._once_in], keep)
        return [vals[s] for s in self.outputs]


def _check_arena(fname: str, arena, recs: list) -> None:
    """Every planned slot lies inside the function's arena and names a dtype and a shape (else ArtifactError
    naming the op), so a crafted or damaged program.json cannot make a run write outside it."""
    if not any(r.get("arena") for r in recs):
        return
    size = arena.get("bytes") if isinstance(arena, dict) else None
    if type(size) is not int or size < 0:
        raise ArtifactError(f"program.json: @{fname}: arena slots are planned but the function's arena size is "
                            f"{size!r}")
    for i, rec in enumerate(recs):
        for slot in rec.get("arena") or []:
            if slot is None:
                continue
            where = f"program.json: @{fname}: op #{i} {rec.get('target')} at loc({rec.get('loc', '?')})"
            if not isinstance(slot, dict):
                raise ArtifactError(f"{where}: arena slot {slot!r} is not a record")
            off, n = slot.get("offset"), slot.get("bytes")
            if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > size:
                raise ArtifactError(f"{where}: arena slot [{off}, +{n}) is not inside the {size}-byte arena")
            if not isinstance(getattr(torch, str(slot.get("dtype")), None), torch.dtype):
                raise ArtifactError(f"{where}: arena slot dtype {slot.get('dtype')!r} is not a torch dtype")
            shape = slot.get("shape")
            if not isinstance(shape, list) or not all(type(d) in (int, str) for d in shape):
                raise ArtifactError(f"{where}: arena slot shape {slot.get('shape')!r} is not a list of sizes")
            for d in shape:
                if isinstance(d, str):
                    try:
                        compile_dim(d)  # names, integers and + - * // only
                    except ArtifactError as e:
                        raise ArtifactError(f"{where}: arena slot shape: {str(e).removeprefix('program.json: ')}") from None


def _reads_on(args, device) -> bool:
    """Does any tensor operand live on `device`?"""
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.device == device:
                return True
    return False


def _written(op, buf, args, kwargs, streams, made_on):
    """The op run with its result written into `buf`, or None where torch finds no out= overload for these
    arguments (a keyword the out form lacks, an operand type only the functional form takes)."""
    if op.out_fn is None and op.form == "out":
        op.out_fn = out_overload(op.fn, args, kwargs, buf)
        if op.out_fn is None:
            return None
    if streams is None:
        return write_into(op.out_fn, op.form, buf, args, kwargs)
    if made_on is not None:  # not capturing: the allocator's tensors read on another stream are recorded
        streams.used(args, op.stream, lambda t: made_on.get(id(t)))
    with streams.on(op.stream):
        return write_into(op.out_fn, op.form, buf, args, kwargs)


def _copy_out(arena, res):
    """A result that shares the arena's bytes without being planned there (a view some op returned of its
    input) is copied, so the arena's next tenant cannot change it."""
    if isinstance(res, torch.Tensor):
        if arena.owns(res):
            arena.stats["copied_out"] += 1
            return res.clone()
        return res
    if isinstance(res, (list, tuple)) and any(arena.owns(r) for r in res):
        arena.stats["copied_out"] += 1
        return type(res)(r.clone() if arena.owns(r) else r for r in res)
    return res


class Program:
    def __init__(self, spec: dict):
        if spec.get("format") != "dsv41c-cpu-program/1":
            raise ArtifactError(f"program.json: format {spec.get('format')!r}, this runtime reads dsv41c-cpu-program/1")
        self.functions = {n: Function(n, f) for n, f in spec["functions"].items()}

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]
