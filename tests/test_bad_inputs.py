"""Bad input through the real command line: one line on stderr, exit 2, nothing lost.

Each case runs `python -m dsv41c ...` in a subprocess and checks what a user sees and what
is left on disk: the exit status, exactly one stderr line naming the file or argument, no
"Traceback", no temporary name (`.tmp-`, `.ckpt-`, `.opt-`, `.dsv41c-probe-`), nothing of
the user's removed and nothing half-written. Output paths are checked before any work, so
almost every case fails in well under a second; the cases that need an artifact share the
session's `tiny_off` build (conftest.py). "Disk full" is a real failing write: the child's
RLIMIT_FSIZE is set low, so a write past it fails with EFBIG as a full disk fails with
ENOSPC; both are OSErrors met in the middle of a write.
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest

TEMP_MARKS = (".tmp-", ".ckpt-", ".opt-", ".dsv41c-probe-", ".tmp.npy")
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "dce.ir")


def cli(*args, fsize=None, cwd=None, timeout=300):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "dsv41c", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout, preexec_fn=limit if fsize is not None else None)


def one_line_error(r, *needles, code=2):
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dsv41c") and ": error: " in lines[0], lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not any(m in lines[0] for m in TEMP_MARKS), lines[0]
    return lines[0]


def no_temporaries(d):
    left = [n for n in os.listdir(d) if n.startswith(".")]
    assert not left, left


@pytest.fixture
def user_dir(tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "important.txt").write_text("keep me\n")
    return d


# ----------------------------------------------------------------------------- compile -o / --dump-dir
def test_compile_force_never_replaces_a_directory_that_is_not_an_artifact(user_dir, tmp_path):
    one_line_error(cli("compile", "--preset", "tiny", "-o", user_dir, "--force"),
                   f"-o {user_dir}", "not a dsv41c artifact", "even with --force")
    one_line_error(cli("compile", "--preset", "tiny", "-o", user_dir), "not a dsv41c artifact")
    assert (user_dir / "important.txt").read_text() == "keep me\n"
    no_temporaries(tmp_path)


@pytest.mark.parametrize("case", ["file", "under_file", "proc", "dump_dir_file", "dump_filter", "dump_dir_under_file"])
def test_compile_output_paths_fail_before_any_work(case, tmp_path):
    f = tmp_path / "hostname"
    f.write_text("h\n")
    art = tmp_path / "a.dsv41c"
    args, needles = {
        "file": (["-o", f], [f"-o {f}", "not a directory"]),
        "under_file": (["-o", f / "x.dsv41c"], [str(f), "is not a directory"]),
        "proc": (["-o", "/proc/x.dsv41c"], ["-o /proc/x.dsv41c", "cannot write in /proc"]),
        "dump_dir_file": (["-o", art, "--dump-dir", f], [f"--dump-dir {f}", "not a directory"]),
        "dump_dir_under_file": (["-o", art, "--dump-dir", f / "d"], [str(f), "is not a directory"]),
        "dump_filter": (["-o", art, "--dump-dir", tmp_path / "d", "--dump-filter", "("],
                        ["--dump-filter", "not a regular expression"]),
    }[case]
    if case == "proc" and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    one_line_error(cli("compile", "--preset", "tiny", *args), *needles)
    assert f.read_text() == "h\n" and not art.exists() and not (tmp_path / "d").exists()
    no_temporaries(tmp_path)


def test_missing_parents_are_not_created_by_the_check(tmp_path):
    """The path check creates nothing: a later error (here the preset) leaves no new directory."""
    out = tmp_path / "new" / "sub" / "x.dsv41c"
    one_line_error(cli("compile", "--preset", "nope", "-o", out), "unknown preset 'nope'")
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- opt
@pytest.mark.parametrize("case", ["binary", "empty", "comments", "out_dir", "out_missing_dir", "trailing_comma",
                                  "empty_item", "missing_input", "input_dir"])
def test_opt_bad_input(case, tmp_path):
    src = tmp_path / "in.ir"
    src.write_bytes({"binary": b"func @f\xff\xfe\x00 {", "empty": b"", "comments": b"# nothing\n\n"}.get(
        case, open(GOLDEN, "rb").read()))
    p, out, needles = "dce", None, []
    if case == "binary":
        needles = [str(src), "not UTF-8 text", "offset 7"]
    elif case in ("empty", "comments"):
        needles = [str(src), "no function"]
    elif case == "out_dir":
        out, needles = tmp_path, [f"-o {tmp_path}", "is a directory"]
    elif case == "out_missing_dir":
        out, needles = tmp_path / "nope" / "o.ir", ["does not exist"]
    elif case == "trailing_comma":
        p, needles = "dce,", ["empty pass name", "'dce,'"]
    elif case == "empty_item":
        p, needles = "dce,,cse", ["empty pass name at item 2"]
    elif case == "missing_input":
        src, needles = tmp_path / "missing.ir", [str(tmp_path / "missing.ir"), "No such file"]
    elif case == "input_dir":
        src, needles = tmp_path, [str(tmp_path), "Is a directory"]
    r = cli("opt", src, "-p", p, *(["-o", out] if out else []))
    one_line_error(r, *needles)
    assert r.stdout == ""
    assert not (tmp_path / "nope").exists()
    no_temporaries(tmp_path)


def test_opt_disk_full_leaves_the_old_output_and_no_partial_file(tmp_path):
    out = tmp_path / "out.ir"
    out.write_text("old\n")
    one_line_error(cli("opt", GOLDEN, "-p", "dce", "-o", out, fsize=64), f"-o {out}", "cannot write",
                   "nothing written")
    assert out.read_text() == "old\n"
    no_temporaries(tmp_path)


def test_dump_dir_disk_full_leaves_no_truncated_dump(tmp_path):
    d = tmp_path / "dumps"
    one_line_error(cli("opt", GOLDEN, "-p", "dce", "--dump-dir", d, fsize=64), "00_input.ir", "cannot write")
    assert os.listdir(d) == [], os.listdir(d)  # no truncated 00_input.ir, no temporary
    r = cli("opt", GOLDEN, "-p", "dce", "--dump-dir", d)  # and with room, every dump is whole
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(d)) == ["00_input.ir", "01_dce.diff", "01_dce.ir", "index.json"]
    assert "func @decode" in (d / "00_input.ir").read_text()
    assert json.loads((d / "index.json").read_text())["failed"] is None


# ----------------------------------------------------------------------------- init-checkpoint, kernels
def test_init_checkpoint_force_never_replaces_a_directory_that_is_not_a_checkpoint(user_dir, tmp_path):
    one_line_error(cli("init-checkpoint", "--preset", "tiny", "-o", user_dir, "--force"),
                   "not a checkpoint directory", "even with --force")
    assert (user_dir / "important.txt").read_text() == "keep me\n"
    one_line_error(cli("init-checkpoint", "--preset", "tiny", "-o", user_dir / "important.txt" / "ck"),
                   "is not a directory")
    no_temporaries(tmp_path)


def test_kernels_build_output_checked_before_triton_loads(user_dir, tmp_path):
    one_line_error(cli("kernels", "--build", "--targets", "cuda:sm90", "-o", user_dir),
                   f"-o {user_dir}", "not a dsv41c kernel build")
    assert os.listdir(user_dir) == ["important.txt"]
    no_temporaries(tmp_path)


# ----------------------------------------------------------------------------- argument values
@pytest.mark.parametrize("args, needles", [
    (["run", "A", "--ids", "99999999999999999999999"], ["argument --ids", "not a 64-bit integer"]),
    (["run", "A", "--ids", "1,,2"], ["argument --ids", "empty token id"]),
    (["run", "A", "--ids", "1", "--max-new-tokens", "-1"], ["argument --max-new-tokens", ">= 0"]),
    (["run", "A", "--ids", "1", "--device", "banana"], ["argument --device", "unknown device 'banana'"]),
    (["generate", "C", "--ids", "1", "--chunk", "-1"], ["argument --chunk", ">= 0"]),
    (["compile", "--preset", "tiny", "-o", "X", "--seed", "x"], ["argument --seed"]),
    (["compile", "--preset", "tiny", "-o", "X", "--kv-quant", "maybe"], ["argument --kv-quant"]),
    (["compile", "--preset", "tiny", "-o", "X", "--memory-budget", "0"], ["argument --memory-budget", "less than one byte"]),
    (["compile", "--preset", "tiny"], ["-o/--output"]),
    (["frobnicate"], ["invalid choice"]),
])
def test_bad_argument_values_are_one_line_before_any_work(args, needles, tmp_path):
    one_line_error(cli(*args, cwd=tmp_path), *needles)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- run
def _copy_with(art, tmp_path, name, **fields):
    a = tmp_path / name
    shutil.copytree(art, a)
    mpath = a / "manifest.json"
    m = json.loads(mpath.read_text())
    for k, v in fields.items():
        if k == "max_context":
            m["options"]["max_context"] = v
        else:
            m[k] = v
    mpath.write_text(json.dumps(m))
    return a


def test_run_bad_requests_fail_before_generating(tiny_off, tmp_path):
    one_line_error(cli("run", tiny_off, "--ids", "-2,3"), "token id -2 is out of range", "512 tokens")
    one_line_error(cli("run", tiny_off, "--ids", "5", "--device", "cuda"),
                   "artifact target 'cpu' cannot run on device 'cuda'")
    one_line_error(cli("run", tiny_off, "--ids", "5,6", "--max-new-tokens", "1000000000"),
                   "--max-new-tokens 1000000000", "max_position_embeddings (4096 positions)", "at most 4094")
    one_line_error(cli("run", tiny_off, "--ids", "5", "--logits-out", tmp_path / "nope" / "l.npy"),
                   "--logits-out", "does not exist")
    one_line_error(cli("run", tiny_off, "--ids", "5", "--logits-out", tmp_path), "--logits-out", "is a directory")
    assert sorted(os.listdir(tmp_path)) == []


def test_run_limits_and_devices_come_from_the_manifest(tiny_off, tmp_path):
    a = _copy_with(tiny_off, tmp_path, "short.dsv41c", max_context=4)
    one_line_error(cli("run", a, "--ids", "1,2,3", "--max-new-tokens", "2"),
                   "the artifact's --max-context (4 positions)", "at most 1 new tokens")
    a = _copy_with(tiny_off, tmp_path, "gpu.dsv41c", target="cuda:sm90")
    one_line_error(cli("run", a, "--ids", "1", "--device", "cpu"),
                   "artifact target 'cuda:sm90' cannot run on device 'cpu'", "it runs on: cuda")


@pytest.mark.gpu
def test_a_gpu_index_this_machine_lacks_is_named(tiny_off, tmp_path):
    import torch

    a = _copy_with(tiny_off, tmp_path, "gpu.dsv41c", target="cuda:sm90")
    n = torch.cuda.device_count()
    one_line_error(cli("run", a, "--ids", "1", "--device", f"cuda:{n}"), f"device 'cuda:{n}' does not exist",
                   f"this machine has {n} GPU")


def test_run_prints_the_tokens_when_the_logits_file_cannot_be_written(tiny_off, tmp_path):
    out = tmp_path / "l.npy"
    r = cli("run", tiny_off, "--ids", "5,17", "--max-new-tokens", "2", "--logits-out", out, fsize=1024)
    one_line_error(r, f"--logits-out {out}", "cannot write")
    toks = r.stdout.strip().split(",")
    assert len(toks) == 2 and all(t.isdigit() for t in toks), r.stdout
    assert not out.exists()
    no_temporaries(tmp_path)


def test_a_short_write_the_writer_does_not_report_still_fails(tiny_off, tmp_path):
    """np.save into a real file writes through a C stream whose failed final flush it ignores: one
    prompt token's logits (2176 bytes) past a 1024-byte limit left a truncated file and exit 0."""
    out = tmp_path / "l.npy"
    r = cli("run", tiny_off, "--ids", "5", "--max-new-tokens", "1", "--logits-out", out, fsize=1024)
    one_line_error(r, f"--logits-out {out}", "cannot write", "nothing written")
    assert r.stdout.strip().isdigit(), r.stdout
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, needles", [
    (["--systems", "eager,bogus"], ["argument --systems", "unknown system(s) bogus"]),
    (["--systems", ","], ["argument --systems", "no system given"]),
    (["--systems", "eager", "--prefill", "8,x"], ["argument --prefill", "'x' in '8,x'"]),
    (["--systems", "eager", "--decode-context", "0"], ["argument --decode-context", ">= 1, got 0"]),
    (["--systems", "dsv41c"], ["needs --artifact"]),
    (["--systems", "dsv41c", "--artifact", "missing.dsv41c"], ["missing.dsv41c", "not a dsv41c artifact"]),
    (["--systems", "eager", "--prefill", "8", "--out", "nope/b.json"], ["--out nope/b.json", "does not exist"]),
])
def test_bench_requests_are_checked_before_any_worker_starts(args, needles, tmp_path):
    out = [] if "--out" in args else ["--out", "b.json"]
    one_line_error(cli("bench", "--preset", "tiny", *args, *out, cwd=tmp_path), *needles)
    assert os.listdir(tmp_path) == []


def test_a_manifest_field_of_the_wrong_type_is_named(tiny_off, tmp_path):
    a = _copy_with(tiny_off, tmp_path, "lots.dsv41c", max_context="lots")
    one_line_error(cli("run", a, "--ids", "1"), "manifest.json", "'options.max_context' must be a positive integer")
    a = _copy_with(tiny_off, tmp_path, "kern.dsv41c", kernels={"x": 1})
    one_line_error(cli("inspect", a), "manifest field 'kernels' must be a list, got dict")


def test_reference_commands_check_before_reading_weights(tiny_off, tmp_path):
    ck = os.path.join(tiny_off, "checkpoint")
    one_line_error(cli("generate", ck, "--ids", "1,2", "--max-new-tokens", "5000"),
                   "--max-new-tokens 5000", "max_position_embeddings (4096 positions)")
    one_line_error(cli("reference", ck, "--ids", "1", "--out", tmp_path / "no" / "x.npy"), "--out", "does not exist")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_during_compile_is_one_line_exit_130_and_leaves_nothing(tmp_path):
    out = tmp_path / "a.dsv41c"
    p = subprocess.Popen([sys.executable, "-m", "dsv41c", "compile", "--preset", "tiny", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stderr.readline()  # the compile has started (its first progress line)
    assert first.startswith("compile: "), first
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Traceback" not in err and err.splitlines()[-1] == "dsv41c compile: interrupted; nothing written", err
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- in-process: API and the funnel
def test_python_api_refuses_ids_that_are_not_integers(tiny_off):
    import torch

    import dsv41c
    from dsv41c.runtime.loader import InputError

    m = dsv41c.load(tiny_off)
    s = m.new_session()
    for bad, msg in [(["a"], "token id 'a' is not an integer"), ([1.5], "not an integer"),
                     ([2**70], "not even a 64-bit integer"), ("12", "sequence of integers"),
                     (torch.tensor([1.0]), "must be integers"), ([True], "not an integer")]:
        with pytest.raises(InputError, match=msg):
            m.prefill(s, bad)
    assert s.pos == 0  # nothing was fed


def test_an_internal_error_is_one_line_exit_1(monkeypatch, capsys):
    from dsv41c import cli as c

    monkeypatch.setitem(c.HANDLERS, "plan", f"{__name__}:_crash")
    monkeypatch.delenv("DSV41C_TRACEBACK", raising=False)
    assert c.main(["plan", "--preset", "tiny"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["dsv41c plan: internal error (a bug in dsv41c): ZeroDivisionError: boom "
                   "(DSV41C_TRACEBACK=1 shows where)"]
    monkeypatch.setenv("DSV41C_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        c.main(["plan", "--preset", "tiny"])


def _crash(args):
    raise ZeroDivisionError("boom")


def test_ctrl_c_during_run_prints_the_tokens_so_far(tiny_off, monkeypatch, capsys):
    from dsv41c import cli as c
    from dsv41c.runtime.loader import CompiledModel

    real, calls = CompiledModel.decode, []

    def decode(self, s, token=None):
        calls.append(token)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, s, token)

    monkeypatch.setattr(CompiledModel, "decode", decode)
    assert c.main(["run", tiny_off, "--ids", "5,17", "--max-new-tokens", "8"]) == 130
    cap = capsys.readouterr()
    assert len(cap.out.strip().split(",")) == 2
    assert cap.err.splitlines() == ["dsv41c run: interrupted after 2 of 8 tokens (those are on stdout); nothing written"]
