"""Writing files we can trust (DESIGN §8/§9): every artifact is written into a temporary file in its own directory,
fsynced and renamed over the target — all or nothing, even on a full disk or a kill.

- The rename replaces whatever sits at the target *itself*: a symlink planted at an artifact path is replaced by
  the new file, never followed (the temporary file is created with O_EXCL, so it cannot be a planted link either).
- New files get the ordinary mode (0666 minus the umask), not mkstemp's 0600.
- Temporary names are `.{name}.bisector-{pid}.{random}.tmp`; `clean_stale_temporaries` removes only such names
  whose process is gone (a killed run's leftovers), never anything else.
- A write that resolves onto an input of this process (the model, loaded inputs, golden outputs: `protect`) is
  refused with a UsageError (exit 2) instead of destroying the input.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from bisector.errors import UsageError

_TEMP = re.compile(r"^\..+\.bisector-(\d+)\.[A-Za-z0-9_]+\.tmp$")
_protected: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of inputs -> how to name them
_umask_lock = threading.Lock()


def ensure_dir(path: Path) -> Path:
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {path}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise UsageError(f"output directory {path} is not a directory")
    if not os.access(path, os.W_OK):
        raise UsageError(f"output directory {path} is not writable")
    return path


def protect(path: Path | str | None, what: str = "an input") -> None:
    """Remember `path` as an input of this run: no write of ours may land on it (same file, any spelling)."""
    if path is None:
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    _protected[(st.st_dev, st.st_ino)] = f"{what} {path}"


def check_not_input(path: Path | str, flag: str | None = None) -> None:
    """UsageError when writing `path` would overwrite a protected input (also through a symlink or hard link)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    hit = _protected.get((st.st_dev, st.st_ino))
    if hit is not None:
        raise UsageError(f"{flag + ' ' if flag else ''}{path}: refusing to write there, it is {hit}")


def _mode() -> int:
    with _umask_lock:
        mask = os.umask(0)
        os.umask(mask)
    return 0o666 & ~mask


def temp_prefix(path: Path) -> str:
    return f".{path.name}.bisector-{os.getpid()}."


def write_file_atomic(path: Path, fill: Callable[[BinaryIO], None], into: "AtomicFile | None" = None) -> None:
    """Write `path` through `fill(file)` into a temporary file next to it, then rename: all or nothing. `into`: an
    `AtomicFile` of `path` begun earlier (its content so far is kept; `fill` appends)."""
    with (into if into is not None else AtomicFile(path)) as f:
        fill(f.sink)


class AtomicFile:
    """A file written over time into a temporary file next to `path`, then either committed (fsync, rename over
    `path`) or discarded: all or nothing. As a context manager: committed when the block ends normally, discarded
    when it raises. Any OSError is a UsageError naming `path` (nothing is left half-written)."""

    def __init__(self, path: Path):
        self.path = path = Path(path)
        check_not_input(path)
        parent = path.parent if str(path.parent) else Path(".")
        ensure_dir(parent)
        clean_stale_temporaries(parent, [path.name])  # a killed run's, of this file
        self._f = self._tmp = None
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=parent)
            try:
                os.fchmod(fd, _mode())
                self._f = os.fdopen(fd, "wb")
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            self.discard()
            raise self._error(exc) from None
        self.sink = _Sink(self._f, path)

    def _error(self, exc: OSError) -> UsageError:
        reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        return UsageError(f"cannot write {self.path}: {reason}; nothing was left half-written")

    def commit(self) -> None:
        try:
            self._sync()
            self._publish()
            _fsync_dir(self.path.parent)
        except OSError as exc:
            self.discard()
            raise self._error(exc) from None

    def _sync(self) -> None:
        """The content on the disk (the file still under its temporary name)."""
        self.sink.close()
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()

    def _publish(self) -> None:
        os.replace(self._tmp, self.path)  # replaces a symlink at `path` itself, never its target
        self._tmp = None

    def discard(self) -> None:
        """Drop what was written (the target is untouched); safe to call more than once."""
        sink = getattr(self, "sink", None)
        if sink is not None:
            sink.close()
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
        if self._tmp is not None and os.path.lexists(self._tmp):
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
        self._tmp = None

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.commit()
            return
        self.discard()
        if isinstance(exc, OSError):
            raise self._error(exc) from None


def write_files_atomic(items: Iterable[tuple[Path, Callable[[BinaryIO], None], "AtomicFile | None"]]) -> None:
    """Several files, each all or nothing as `write_file_atomic` writes it, committed as a group: every file's
    content goes to the disk first, then they are renamed in the order given, then each directory is synced once.
    Where any file fails before the renames, none is renamed (the artifacts of a search: all old or all new). One
    directory sync instead of one per file: on this machine's disk an fsync costs 0.1-0.3 ms and the difference is
    not measurable; on storage where each costs a journal commit it halves them. Items: (path, fill, into) as
    `write_file_atomic` takes them."""
    opened: list[AtomicFile] = []
    current: AtomicFile | None = None
    try:
        for path, fill, into in items:
            current = into if into is not None else AtomicFile(path)
            opened.append(current)
            fill(current.sink)
        for f in opened:
            current = f
            f._sync()
        for f in opened:
            current = f
            f._publish()
    except BaseException as exc:
        for f in opened:
            f.discard()
        if isinstance(exc, OSError) and current is not None:
            raise current._error(exc) from None
        raise
    for directory in dict.fromkeys(f.path.parent for f in opened):
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def clean_stale_temporaries(directory: Path, names: Iterable[str] | None = None) -> list[Path]:
    """Remove our own temporary files (`.{name}.bisector-{pid}.*.tmp`) left in `directory` by killed runs: only
    that pattern, only when process `pid` no longer exists, only for `names` when given. Returns what went."""
    wanted = set(names) if names is not None else None
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP.match(e.name)
        if not m or not e.is_file(follow_symlinks=False):
            continue
        if wanted is not None and not any(e.name.startswith(f".{n}.bisector-") for n in wanted):
            continue
        if _alive(int(m.group(1))):
            continue
        try:
            os.unlink(e.path)
            removed.append(Path(e.path))
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid() or pid <= 0:
        return True  # our own (another thread may be writing it), or not a process id: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # exists, someone else's (or unknowable): leave it
    return True


def remove_file(path: Path) -> None:
    """Remove `path` (a link itself, never its target); absent is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot replace {path}: {exc.strerror or exc}") from None


# A large file's pages go to the disk while the rest is written (`_FlushBehind`), so that the final fsync waits for
# the tail only: on a 1.27 GB model the mixed model's 0.68 GB of FP16 weights waited 0.36 s in fsync after ~1 s of
# CPU-bound converting and writing.
FLUSH_BEHIND_BYTES = 64 << 20


class _FlushBehind:
    """A thread that runs fdatasync on the temporary file whenever `kick`ed (at most one at a time; kicks while
    one runs fold into one). Errors are left to the final fsync, which reports them."""

    def __init__(self, fd: int):
        self._fd, self._wake, self._stop, self._thread = fd, threading.Event(), False, None

    def kick(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="bisector-flush-behind", daemon=True)
            self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            try:
                getattr(os, "fdatasync", os.fsync)(self._fd)  # macOS has fsync only
            except OSError:
                return

    def close(self) -> None:
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            self._thread.join()


class _Sink:
    """The temporary file as `fill` sees it: every write goes through `_write` (one place to fail in tests)."""

    def __init__(self, f: BinaryIO, path: Path):
        self._f, self.path = f, path
        self._unflushed = 0
        self._behind = _FlushBehind(f.fileno())

    def write(self, data) -> int:
        _write(self._f, data, self.path)
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        self._unflushed += n
        if self._unflushed >= FLUSH_BEHIND_BYTES:
            self._unflushed = 0
            self._f.flush()  # what the buffer holds goes to the kernel first
            self._behind.kick()
        return len(data)

    def close(self) -> None:
        self._behind.close()

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def seekable(self) -> bool:
        return True

    def read(self, *_):  # present so that numpy and zipfile treat it as a file; never used for reading
        raise OSError("write-only")


def _write(f: BinaryIO, data, path: Path) -> None:
    f.write(data)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_file_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8", errors="surrogateescape"))
