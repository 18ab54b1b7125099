"""Arrays a process reads only now and then, kept in a file and read through memory maps whose pages it gives back.

Some weights are read only while a session is being built: ONNX Runtime copies a Conv's weight into its own
blocked layout (NCHWc) and never reads the array again (`backends.emulate.executor._session`). Held as ordinary
arrays, such weights — the model's FP32 values and their FP16-rounded copies — stayed in the process for the
whole search: on a 20 MB detector, 40 MB of a 265 MB peak (docs/benchmarks.md, "Scale, seventeenth round").

Here they live in an unlinked temporary file, read through read-only shared memory maps. After a build,
`release` tells the kernel the process no longer needs their pages (`MADV_DONTNEED`): they leave the process's
resident set and stay in the page cache, which the kernel may reclaim, and the next reader faults them back in
from there (a few ms per 20 MB). Nothing is lost: the data is the file's. The same call gives back the pages of
external-data weights, which `model.weights` maps from the model's own files.

Where the temporary directory is a tmpfs or ramfs, its pages would be RAM all the same (charged to a container's
memory limit too), so nothing is paged there; nor where the file cannot be written (disk full, read-only temp
dir, no `pwrite`): `put` returns None and the caller keeps its array in memory, as before.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import contextlib
import itertools
import threading
from typing import Callable, Iterator

import numpy as np

ENV = "BISECTOR_WEIGHT_PAGES"  # "0": arrays stay in memory and maps keep their pages (`put`, `release`: no-ops)
SEGMENT_BYTES = 64 << 20
CONVERT_SLICE_BYTES = 4 << 20  # `put_converted`'s slices: a few MB, reused from the allocator's cache  # one memory map per 64 MiB of arrays (fewer maps than one per array: vm.max_map_count)
_PAGE = mmap.PAGESIZE
_GRAIN = mmap.ALLOCATIONGRANULARITY  # a map's file offset must be a multiple of this (64 KiB on Windows)
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)  # Linux, macOS, BSDs; not Windows (release does nothing)


def _off() -> bool:
    return os.environ.get(ENV, "").strip() == "0"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class PageFile:
    """Read-only arrays backed by one unlinked temporary file (`put`); created on first use."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._failed = False
        self._segment: mmap.mmap | None = None
        self._segment_start = 0  # file offset of the current segment
        self._used = 0  # bytes of the current segment given out
        self._lock = threading.Lock()  # evaluation threads may convert weights at once

    def put(self, array: np.ndarray) -> np.ndarray | None:
        """A read-only copy of `array` in the file (same dtype, shape and values), or None where it cannot be
        written. Arrays start on a page boundary, so that releasing one drops no page of another."""
        a = np.ascontiguousarray(array)
        if a.dtype.hasobject or a.nbytes == 0:
            return None
        view = self.put_pieces(a.nbytes, iter([a]))
        return None if view is None else view.view(a.dtype).reshape(a.shape)

    def put_converted(self, source: np.ndarray, convert: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
        """`put(convert(source))` for an elementwise `convert`, converted and written a slice at a time: no
        whole-size array is made (a fresh array's first touch cost as much as writing it to the file: an FP16 copy
        of a 1.27 GB model's weights took 1.0 s more written whole than converted into the file)."""
        flat = np.ascontiguousarray(source).reshape(-1)
        if flat.size == 0:
            return None
        step = max(1, CONVERT_SLICE_BYTES // max(flat.itemsize, 1))
        first = np.ascontiguousarray(convert(flat[:step]))
        if first.dtype.hasobject:
            return None
        rest = (np.ascontiguousarray(convert(flat[start : start + step])) for start in range(step, flat.size, step))
        view = self.put_pieces(flat.size * first.dtype.itemsize, itertools.chain([first], rest))
        return None if view is None else view.view(first.dtype).reshape(np.shape(source))

    def put_pieces(self, nbytes: int, pieces: Iterator) -> np.ndarray | None:
        """`nbytes` written from `pieces` (buffers, in order) as one read-only uint8 array in the file, or None
        where it cannot be written (or the pieces hold another number of bytes)."""
        if nbytes <= 0 or _off():
            return None
        try:
            with self._lock:
                if self._failed:
                    return None
                segment, offset = self._reserve(nbytes)
                at = self._segment_start + offset
                end = at + nbytes
                for piece in pieces:
                    if isinstance(piece, np.ndarray):  # any dtype and byte order: its bytes as they are
                        piece = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
                    data = memoryview(piece).cast("B")
                    if at + len(data) > end:
                        return None
                    done = 0
                    while done < len(data):
                        done += os.pwrite(self._fd, data[done:], at + done)
                    at += len(data)
                if at != end:
                    return None
        except (OSError, ValueError):
            self._failed = True  # a full disk stays full: later arrays stay in memory without trying
            return None
        return np.frombuffer(segment, np.uint8, nbytes, offset)

    def _reserve(self, nbytes: int) -> tuple[mmap.mmap, int]:
        """(segment, offset in it) with room for `nbytes`, mapping a new segment where the current one is full."""
        if self._fd is None:
            if not hasattr(os, "pwrite") or in_ram(tempfile.gettempdir()):
                raise OSError("no disk-backed temporary directory")
            fd, path = tempfile.mkstemp(prefix="bisector-pages-")
            os.unlink(path)  # a killed process leaves nothing behind
            self._fd = fd
        if self._segment is None or self._used + nbytes > len(self._segment):
            start = _round_up(self._segment_start + (len(self._segment) if self._segment is not None else 0), _GRAIN)
            size = max(SEGMENT_BYTES, _round_up(nbytes, _GRAIN))
            os.ftruncate(self._fd, start + size)  # sparse: only written pages take disk space
            # Old segments stay mapped through the arrays that view them (numpy keeps their buffer alive).
            self._segment = mmap.mmap(self._fd, size, offset=start, access=mmap.ACCESS_READ)
            self._segment_start, self._used = start, 0
        offset = self._used
        self._used = _round_up(offset + nbytes, _PAGE)
        return self._segment, offset

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the maps keep the file's data while arrays view them

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def in_ram(directory: str) -> bool:
    """Whether `directory` is on a tmpfs or ramfs (Linux: the mount table; elsewhere: False)."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return False
    path = os.path.realpath(directory)
    best, kind = "", ""
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fstype
    return kind in ("tmpfs", "ramfs")


def _mapping(array: object) -> mmap.mmap | None:
    """The memory map an array views (our segments, np.memmap's), or None for an ordinary array."""
    base = array
    for _ in range(16):  # views of views: a handful of levels at most
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)  # frombuffer: a memoryview
        if base is None:
            return None
    return None


def file_backed(array: object) -> bool:
    """Whether `array` views a memory-mapped file (its pages can be given back: `release`)."""
    return _mapping(array) is not None


def release(array: object) -> None:
    """Give back the resident pages of a file-backed array's bytes (nothing for an ordinary array, or where the
    platform has no madvise). Safe while other threads or ONNX Runtime read it: a read faults the page back in
    from the file."""
    m = _mapping(array)
    if m is None or _DONTNEED is None or not isinstance(array, np.ndarray) or array.nbytes == 0 or _off():
        return
    try:
        base = np.frombuffer(m, np.uint8, 1).ctypes.data
        start = array.ctypes.data - base
        end = start + array.nbytes
        start = start // _PAGE * _PAGE
        end = min(_round_up(end, _PAGE), len(m))
        if 0 <= start < end:
            m.madvise(_DONTNEED, start, end - start)
    except (OSError, ValueError):
        pass  # advice only: keeping the pages is always correct


@contextlib.contextmanager
def releasing(arrays: list, every: float = 0.05) -> Iterator[None]:
    """Give back the pages of `arrays` every `every` seconds while the block runs, and once at its end: for a
    call that reads each array once and keeps a copy (ONNX Runtime prepacking a session's weights), so that the
    process holds the pages read in the last moment, not all of them beside all the copies (a 604 MB model's
    golden session: 1265 -> 733 MiB peak; docs/benchmarks.md, "Scale, seventeenth round")."""
    mapped = [a for a in arrays if file_backed(a)]
    if not mapped or _DONTNEED is None or _off():
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            for a in mapped:
                release(a)

    thread = threading.Thread(target=loop, name="bisector-release-pages", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for a in mapped:
            release(a)
