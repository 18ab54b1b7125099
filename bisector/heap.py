"""Process-wide heap setting for the CLI: freed large arrays go back to the system; the process's peak memory.

glibc serves allocations from 128 KiB up with their own memory maps, returned to the system on free — but after
the first such block is freed it raises that threshold (up to 32 MiB), so later activations, weight copies and
serialised models come from the heap and stay in the process after they are freed. A search allocates and frees
activation-sized arrays on every evaluation; with the threshold left dynamic its peak RSS grew by what it had
ever freed (4-layer transformer: 396 -> 324 MB peak with the threshold fixed, same wall time within noise;
docs/benchmarks.md, "Scale, fourth round"). Setting the threshold explicitly turns the dynamic raise off.

Only the CLI calls this: a library should not change its host process's allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own initial value


def keep_large_blocks_mapped() -> bool:
    """Fix glibc's mmap threshold at its default; False where the C library is not glibc (nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, their own policy
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def give_back_free_memory() -> bool:
    """Return the heap's free memory to the system now (glibc's malloc_trim), after a collection; False where the
    C library is not glibc. Called once a search's backend is closed: its sessions and caches are freed, but glibc
    keeps freed small blocks in the process, and what is loaded after the search (pydantic for constraints.json,
    the mixed model's writer) then sat on top of the search's peak (the 1200-node MatMul/Tanh chain: 127 MB
    before the backend closed, 131 MB at the end; with this, 111 MB after closing and 127 at the end). Unlike
    `keep_large_blocks_mapped` it changes no policy, so a library may call it: it frees only what is free."""
    import gc

    gc.collect()
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far, in bytes; None where unknown (no `resource` module, or a
    platform whose `ru_maxrss` unit is not KiB: macOS reports bytes)."""
    try:
        import resource
    except ImportError:
        return None
    if not sys.platform.startswith("linux"):
        return None
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except OSError:
        return None
    return int(peak) * 1024 if peak > 0 else None
