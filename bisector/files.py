"""Write-then-rename, so an interrupted or failed write (disk full) never leaves a half-written artifact."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from bisector.errors import UsageError


def ensure_dir(path: Path) -> Path:
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"output directory {path} is not writable")
    return path


def write_file_atomic(path: Path, fill: Callable[[BinaryIO], None]) -> None:
    """Write `path` through `fill(file)` into a temporary file next to it, then rename: all or nothing."""
    path = Path(path)
    ensure_dir(path.parent if str(path.parent) else Path("."))
    fd, tmp = None, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            fd = None
            fill(_Sink(f, path))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise UsageError(f"cannot write {path}: {reason}; nothing was left half-written") from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


class _Sink:
    """The temporary file as `fill` sees it: every write goes through `_write` (one place to fail in tests)."""

    def __init__(self, f: BinaryIO, path: Path):
        self._f, self.path = f, path

    def write(self, data) -> int:
        _write(self._f, data, self.path)
        return len(data)

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
    write_bytes_atomic(path, text.encode())
