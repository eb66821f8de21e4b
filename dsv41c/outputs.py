"""Output paths: checked before any work starts, written atomically, never half there.

A leaf module (standard library only; every component may import it). The rules, the same
for every command that writes:

- `check_output_dir(path, what, force, replaceable)` (artifacts, checkpoints,
  kernel builds): an existing empty directory is reused; an existing `replaceable` one
  (an artifact for `compile -o`) needs `force`; anything else that exists (a file, a link,
  a directory of the user's) is refused, `force` or not. Missing parent directories are
  created when the output is written (like `mkdir -p`), so the nearest existing ancestor
  must be a directory we can create entries in.
- `check_dir_to_fill(path, what)` (`--dump-dir`): an existing directory we can write in
  (our earlier dumps in it are replaced, nothing else), or one that can be created.
- `check_output_file(path, what)` (`opt -o`, `run --logits-out`, `reference --out`): not a
  directory; its parent must exist already (like a shell redirect: a missing directory is
  more likely a typo than a wish); an existing file is replaced.
- Writability is probed by creating and removing a hidden entry, not by `os.access`:
  root passes `os.access` on `/proc`, and read-only mounts only show themselves on write.
- `write_file_atomic(path, data)`: a temporary file in the same directory, renamed over
  `path` once whole (the bytes on disk are counted against the bytes written, so a short
  write that a library did not report still fails); on failure the temporary file is
  removed and `path` is untouched.
- Every failure is an `OutputError` whose one line names the option and the user's path,
  never a temporary name.
- `note_kept(path)` records a finished output, so that an interrupt can say what it kept.

Known gaps: no fsync before the rename (a power cut can still leave an empty file on
some filesystems; an error or Ctrl-C cannot); parents created for an output that then
fails are left in place (they are empty).
"""
from __future__ import annotations

import errno
import os
import tempfile

_KEPT: list = []


class OutputError(Exception):
    """An output path that cannot be written; one line naming the option and the path."""


def _label(what: str | None, path: str) -> str:
    return f"{what} {path}" if what else str(path)


def reason(e: OSError) -> str:
    """The operating system's words for `e`, without the file name it carries."""
    return e.strerror or type(e).__name__


def note_kept(path: str) -> None:
    _KEPT.append(os.path.abspath(path))


def kept(since: int = 0) -> list:
    """The outputs finished so far (since the `len(kept())` a caller noted at its start)."""
    return list(_KEPT[since:])


def _probe(dirpath: str) -> None:
    """Create and remove a hidden directory in `dirpath` (raises OSError where we cannot write)."""
    os.rmdir(tempfile.mkdtemp(prefix=".dsv41c-probe-", dir=dirpath))


def _nearest_existing(path: str) -> str:
    p = os.path.dirname(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    return p


def _check_parent(path: str, label: str, create_parents: bool) -> None:
    parent = os.path.dirname(path)
    if not os.path.lexists(parent) and not create_parents:
        raise OutputError(f"{label}: directory {parent} does not exist")
    anc = _nearest_existing(path)
    if not os.path.isdir(anc):
        raise OutputError(f"{label}: cannot be created: {anc} is not a directory")
    try:
        _probe(anc)
    except OSError as e:
        raise OutputError(f"{label}: cannot write in {anc} ({reason(e)})") from None


def check_output_dir(path, what: str | None = "-o", force: bool = False, replaceable=None,
                     kind: str = "dsv41c artifact", force_option: str | None = "--force") -> str:
    """Check that directory output `path` can be written; return its absolute path.

    `replaceable(path) -> bool` says whether an existing non-empty directory is one of ours
    (`force` replaces only those); None: no existing non-empty directory is replaced.
    `force_option` is the flag the messages name (None: a command that always replaces its
    own outputs, called with force=True)."""
    if not path:
        raise OutputError(f"{what or 'output'}: empty path")
    out = os.path.abspath(os.fspath(path))
    label = _label(what, path)
    if os.path.islink(out):
        raise OutputError(f"{label}: is a symbolic link; refusing to replace it")
    if os.path.lexists(out):
        if not os.path.isdir(out):
            raise OutputError(f"{label}: exists and is not a directory; refusing to replace it")
        try:
            empty = not os.listdir(out)
        except OSError as e:
            raise OutputError(f"{label}: cannot read it ({reason(e)})") from None
        if not empty:
            if replaceable is None or not replaceable(out):
                raise OutputError(f"{label}: exists and is not a {kind}; refusing to replace it"
                                  + (f" even with {force_option}" if force and force_option else ""))
            if not force:
                raise OutputError(f"{label}: already exists (pass {force_option} to replace it)")
    _check_parent(out, label, create_parents=True)
    return out


def check_dir_to_fill(path, what: str | None = "--dump-dir") -> str:
    """Check a directory that files are added to (`--dump-dir`): an existing directory we can
    write in, or one that can be created; return its absolute path."""
    if not path:
        raise OutputError(f"{what or 'output'}: empty path")
    out = os.path.abspath(os.fspath(path))
    label = _label(what, path)
    if os.path.lexists(out):
        if not os.path.isdir(out):
            raise OutputError(f"{label}: exists and is not a directory")
        try:
            _probe(out)
        except OSError as e:
            raise OutputError(f"{label}: cannot write in it ({reason(e)})") from None
        return out
    _check_parent(out, label, create_parents=True)
    return out


def check_output_file(path, what: str | None = "-o") -> str:
    """Check that file output `path` can be written; return its absolute path."""
    if not path:
        raise OutputError(f"{what or 'output'}: empty path")
    out = os.path.abspath(os.fspath(path))
    label = _label(what, path)
    if os.path.isdir(out):
        raise OutputError(f"{label}: is a directory")
    if os.path.lexists(out) and not os.path.isfile(out) and not os.path.islink(out):
        raise OutputError(f"{label}: exists and is not a regular file")
    _check_parent(out, label, create_parents=False)
    return out


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


class _Counted:
    """A binary file object that only has `write` (and counts the bytes): a writer function sees no
    real file, so every byte goes through Python's `write`, whose errors are raised. (numpy's
    `np.save` into a real file writes through a duplicate C stream and ignores the error of its
    final flush: on a full disk it leaves a truncated file and reports success.)"""

    def __init__(self, fh):
        self._fh, self.written = fh, 0

    def write(self, b) -> int:
        n = self._fh.write(b)
        self.written += n
        return n

    def flush(self) -> None:
        self._fh.flush()


def write_file_atomic(path, data, what: str | None = None) -> str:
    """Write `data` (str, bytes, or a function taking a binary file object) to `path` atomically."""
    out = os.path.abspath(os.fspath(path))
    d, base = os.path.split(out)
    label = _label(what, path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d)
    except OSError as e:
        raise OutputError(f"{label}: cannot write ({reason(e)})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            out_fh = _Counted(fh)
            if callable(data):
                data(out_fh)
            else:
                out_fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            size = os.fstat(fh.fileno()).st_size
            if size != out_fh.written:
                raise OSError(errno.EIO, f"short write: {size} of {out_fh.written} bytes reached the file")
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, out)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OutputError(f"{label}: cannot write ({reason(e)}); nothing written") from None
        raise
    return out
