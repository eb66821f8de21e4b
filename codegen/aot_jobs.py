"""Running the kernel compiles of an ahead-of-time build: cache first, then forked workers, with progress.

`run_jobs(jobs, build_one, tmp, ...)` takes `[(template name, template, target, spec)]` and
returns one manifest entry per job, in completion order:
1. each job's cache key (`kernel_cache.kernel_key`) is looked up; a hit copies the cached
   files into `tmp` and costs no compile;
2. the misses compile in forked children, `jobs` at once (default: the CPU count), each under
   a time limit (DSV41C_AOT_TIMEOUT seconds, default 600): a compiler that hangs or crashes
   fails that kernel only, never the build; a built kernel is stored in the cache;
3. progress: a tqdm bar on a terminal (`dsv41c/progress.py`'s test, so `DSV41C_PROGRESS=0` turns it off),
   else one line per kernel (CI logs), on `log`.
DSV41C_AOT_ISOLATE=0 compiles in this process, one at a time (debugging).

Forking, not a process pool: a child inherits the imported templates and Triton, so a kernel
starts compiling at once, and a child that dies takes nothing of the parent's state with it.
Known gap: the time limit is per kernel; the build as a whole has none.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from dsv41c.progress import on_terminal


def default_jobs() -> int:
    env = int(os.environ.get("DSV41C_AOT_JOBS", "0") or 0)  # kept for scripts that set it
    return max(1, env or os.cpu_count() or 1)


class Progress:
    """A tqdm bar when `log` is a terminal, else one line per finished kernel."""

    def __init__(self, log, total: int, desc: str):
        self.log, self.total, self.done, self.bar = log, total, 0, None
        if total and on_terminal(log):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="kernel", file=log, dynamic_ncols=True)

    def update(self, e: dict, seconds: float, cached: bool) -> None:
        self.done += 1
        if self.log is None:
            return
        head = f"[{self.done}/{self.total}] {e['target']} {e['template']}/{e['variant']}"
        if e["status"] == "built":
            mi = e.get("matrix_instructions") or {}
            check = mi.get("check", "?")
            what = check if check != "ok" else f"ok: {mi['expected']} x{sum(mi['found'].values())}"
            line = f"{head}: {'cached' if cached else f'built {seconds:.1f}s'} ({what})"
        else:
            line = f"{head}: FAILED {e['error'].splitlines()[0] if e.get('error') else '?'}"
        if self.bar is not None:
            if e["status"] != "built":
                self.bar.write(line, file=self.log)
            self.bar.update(1)
        else:
            print(line, file=self.log, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _failed_entry(job, why: str) -> dict:
    name, t, tg, spec = job
    return {"template": name, "module": t.module, "variant": spec.variant, "target": tg.name,
            "keys": json.loads(json.dumps(spec.keys or {}, default=str)), "status": "failed", "error": why}


def run_jobs(jobs, build_one, tmp: str, log=None, parallel: int | None = None, cache=None) -> list:
    """Entries for `jobs` (see the module docstring); `cache`: a KernelCache or None (no cache)."""
    import triton

    from dsv41c.codegen.kernel_cache import kernel_key, module_closure_hash

    parallel = max(1, parallel or default_jobs())
    timeout = float(os.environ.get("DSV41C_AOT_TIMEOUT", "600"))
    progress = Progress(log, len(jobs), "kernels")
    results, todo, keys, module_hash = [], [], {}, {}
    try:
        for i, job in enumerate(jobs):
            name, t, tg, spec = job
            if cache is not None:
                if t.module not in module_hash:
                    module_hash[t.module] = module_closure_hash(t.module)
                keys[i] = kernel_key(name, t.module, spec, tg.name, triton.__version__, module_hash[t.module])
                e = cache.fetch(keys[i], tmp)
                if e is not None:
                    results.append(e)
                    progress.update(e, 0.0, cached=True)
                    continue
            todo.append((i, job))

        def finish(i, e, seconds):
            if cache is not None and e["status"] == "built":
                cache.store(keys[i], e, tmp)
            results.append(e)
            progress.update(e, seconds, cached=False)

        if os.environ.get("DSV41C_AOT_ISOLATE", "1") == "0" or not hasattr(os, "fork"):
            for i, job in todo:
                t0 = time.time()
                finish(i, build_one(*job, tmp), time.time() - t0)
        else:
            _drive(todo, build_one, tmp, parallel, timeout, finish, log)
    finally:
        progress.close()
    return results


def _drive(pending, build_one, tmp, parallel, timeout, finish, log):
    running: dict = {}  # pid -> (index, job, start, result path)
    if log is not None:
        log.flush()
    sys.stdout.flush()
    try:
        while pending or running:
            while pending and len(running) < parallel:
                i, job = pending.pop(0)
                rpath = os.path.join(tmp, f".result-{i}.json")
                pid = os.fork()
                if pid == 0:  # the child: compile, write the entry, leave without running any cleanup
                    code = 3
                    try:
                        entry = build_one(*job, tmp, restore=False)
                        with open(rpath + ".part", "w") as f:
                            json.dump(entry, f)
                        os.rename(rpath + ".part", rpath)  # the parent sees a whole entry or none
                        code = 0
                    finally:
                        os._exit(code)
                running[pid] = (i, job, time.time(), rpath)
            finished = False
            for pid, (i, job, t0, rpath) in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                late = not done and time.time() - t0 > timeout
                if late:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                if not (done or late):
                    continue
                finished = True
                del running[pid]
                if os.path.exists(rpath):
                    with open(rpath) as f:
                        e = json.load(f)
                    os.remove(rpath)
                else:
                    e = _failed_entry(job, f"timed out after {timeout:.0f} s (DSV41C_AOT_TIMEOUT)" if late else
                                      f"the compiler process died ({_exit_text(status)})")
                finish(i, e, time.time() - t0)
            if not finished:
                time.sleep(0.02)
    finally:  # interrupted: no compiler child outlives the build
        for pid in running:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
                os.waitpid(pid, 0)


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"
