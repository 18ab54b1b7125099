"""The FP32 reference tensors an emulated evaluation reads, with the large ones kept on disk.

A search keeps the reference of every block boundary for its whole length (any plan may start recomputing at
any block), which on a model with large activations is several times what one inference holds at once (ORT
frees each activation after its last reader). Tensors from `threshold` bytes up are therefore written once to
an unlinked temporary file and read back into a fresh array each time an evaluation needs them: the data stays
in the page cache, not in this process, and an evaluation holds only the copies it is using (a conv net at
144²: 74 MB of boundaries held -> read per block at ~5 GB/s, 1 ms per 5 MB activation).

The file is unlinked as soon as it is created, so a killed search leaves nothing behind. Where it cannot be
written (disk full, read-only temp dir) tensors simply stay in memory.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Iterator, Mapping

import numpy as np

from bisector.model.golden import SWAP_ENV, POLYGRAPHY_SWAP_ENV, swap_threshold_bytes

# Below this a tensor is held. Reading one back costs ~20 us per 128 KB from the page cache; holding them cost a
# 12-layer transformer's search (128 x 384 activations, 196-786 KB each) 35 MB of its peak at 1 MiB.
SPILL_DEFAULT_BYTES = 128 << 10
_CHUNK = 1 << 30  # pread/pwrite move at most ~2 GB per call on Linux


def spill_threshold() -> int | None:
    """Bytes from which reference tensors go to disk: BISECTOR_ARRAY_SWAP_THRESHOLD_MB (or Polygraphy's
    spelling) when set (negative: never), else 128 KiB."""
    if (os.environ.get(SWAP_ENV) or os.environ.get(POLYGRAPHY_SWAP_ENV) or "").strip():
        return swap_threshold_bytes()
    return SPILL_DEFAULT_BYTES


class ReferenceStore(Mapping):
    """name -> array. Small arrays (and everything when spilling is off) are held; large ones are on disk."""

    def __init__(self, threshold: int | None = None):
        self.threshold = threshold
        self._held: dict[str, np.ndarray] = {}
        self._spilled: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}  # name -> (offset, dtype, shape)
        self._fd: int | None = None
        self._end = 0
        self._lock = threading.Lock()  # evaluation threads may read while another writes (offsets only)

    # ---- writing -----------------------------------------------------------------------------------------
    def hold(self, name: str, value: np.ndarray) -> None:
        """Keep `value` in memory whatever its size (weights and feeds: they are held elsewhere anyway)."""
        self._spilled.pop(name, None)
        self._held[name] = value

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        if isinstance(value, (list, tuple)):  # a sequence value (a list of arrays, as ORT gives it): held as is
            self.hold(name, value)
            return
        a = np.asarray(value)
        if (self.threshold is None or a.nbytes < self.threshold or a.dtype.hasobject
                or not self._write(name, np.ascontiguousarray(a))):
            self.hold(name, value)

    def update(self, items) -> None:  # type: ignore[override]
        for k, v in (items.items() if isinstance(items, Mapping) else items):
            self[k] = v

    def _write(self, name: str, a: np.ndarray) -> bool:
        try:
            with self._lock:
                if self._fd is None:
                    fd, path = tempfile.mkstemp(prefix="bisector-reference-")
                    os.unlink(path)
                    self._fd = fd
                offset, self._end = self._end, self._end + a.nbytes
            view = memoryview(a.reshape(-1).view(np.uint8))
            done = 0
            while done < len(view):
                done += os.pwrite(self._fd, view[done : done + _CHUNK], offset + done)
        except OSError:
            return False
        self._held.pop(name, None)
        self._spilled[name] = (offset, a.dtype, a.shape)
        return True

    # ---- reading -----------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        held = self._held.get(name)
        if held is not None:
            return held
        offset, dtype, shape = self._spilled[name]
        out = np.empty(shape, dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done : done + _CHUNK]], offset + done)
            if n <= 0:
                raise OSError(f"the reference file ended early reading {name!r}")
            done += n
        return out

    def dtype_of(self, name: str) -> np.dtype | None:
        """A tensor's dtype without reading it (None: not here)."""
        held = self._held.get(name)
        if held is not None:
            return np.dtype(object) if isinstance(held, (list, tuple)) else np.asarray(held).dtype
        spilled = self._spilled.get(name)
        return spilled[1] if spilled else None

    def nbytes_of(self, name: str) -> int:
        """A tensor's size in bytes without reading it (0: not here, or not an array)."""
        held = self._held.get(name)
        if held is not None:
            return int(getattr(held, "nbytes", 0))
        spilled = self._spilled.get(name)
        return int(np.prod(spilled[2], dtype=np.int64)) * spilled[1].itemsize if spilled else 0

    def __contains__(self, name: object) -> bool:
        return name in self._held or name in self._spilled

    def __iter__(self) -> Iterator[str]:
        yield from self._held
        yield from self._spilled

    def __len__(self) -> int:
        return len(self._held) + len(self._spilled)

    @property
    def spilled_bytes(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for _, d, s in self._spilled.values())

    def computed_bytes(self, given: set[str] | frozenset[str] = frozenset()) -> int:
        """Bytes of the tensors here, held or spilled, except those named in `given` (weights and feeds)."""
        held = sum(int(getattr(v, "nbytes", 0)) for k, v in self._held.items() if k not in given)
        return held + sum(int(np.prod(s, dtype=np.int64)) * d.itemsize
                          for k, (_, d, s) in self._spilled.items() if k not in given)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
