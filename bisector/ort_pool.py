"""ONNX Runtime session options for every session bisector builds, and the process-wide intra-op pool.

The emulator runs a model as dozens to hundreds of small sessions (bisector.backends.emulate.executor). Each with
a pool of its own, a pool's threads sleep between that session's runs, so every parallel section of the next run
first wakes them (spinning pools instead starve each other: 10x slower), and a session built single-threaded to
spare threads ran at half speed until rebuilt. One pool for all of them stays warm from one block's run to the
next: an all-FP16 evaluation of a 12 x 384 transformer 60.5 -> 44.9 ms, of a YOLOX-style detector 52.0 -> 39.7 ms
(docs/benchmarks.md, "Scale, eighteenth round"). Most of ORT's kernels give the same results at any thread
count; a MatMul whose output is small against its inner sum does not (MLAS splits that sum across threads), so
a machine with another pool size can compute other last bits (README, known issues).

ONNX Runtime's Python binding makes this a decision for the whole process: once the shared pool is asked for,
it refuses any session with a pool of its own, including sessions the host program builds itself. So the
shared pool is on in processes bisector owns (its command line: `cli.main.entry` calls `own_process`) and off by
default for a program that imports bisector's API, whose own sessions must keep working; `BISECTOR_SHARED_POOL=1`
turns it on there, `=0` off everywhere. Every session bisector builds takes its options from `session_options`,
so all of them agree with the process's choice.
"""

from __future__ import annotations

import os
import threading

from bisector.cores import usable_cores

_LOCK = threading.Lock()
_STATE: dict[str, int | bool] = {}


def own_process() -> None:
    """This process runs bisector and nothing else (the command line, a worker): its sessions share one pool."""
    _STATE.setdefault("own", True)


def shared() -> bool:
    """Whether sessions run on the shared pool; the first call that says yes creates it (usable cores)."""
    active = _STATE.get("active")
    if active is not None:
        return bool(active)
    with _LOCK:
        if "active" not in _STATE:
            setting = os.environ.get("BISECTOR_SHARED_POOL", "")
            want = setting == "1" or (setting != "0" and _STATE.get("own", False))
            if want:
                import onnxruntime as ort

                _STATE.setdefault("size", usable_cores())
                try:
                    ort.set_global_thread_pool_sizes(int(_STATE["size"]), 1)
                except Exception:  # noqa: BLE001 - an ORT build without it: pools per session, as before
                    want = False
            _STATE["active"] = want
    return bool(_STATE["active"])


def describe() -> str:
    """How this process's sessions get their threads, for the record (constraints.json's `machine`)."""
    if shared():
        n = int(_STATE["size"])
        return f"one shared pool of {n} thread{'s' if n != 1 else ''}"
    return f"a pool per session (up to {usable_cores()} threads)"


def session_options(threads: int | None = None):
    """ORT session options on the shared pool where it is on; else with `threads` intra-op threads of the
    session's own (None: ORT's default)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if shared():
        opts.use_per_session_threads = False
    elif threads:
        opts.intra_op_num_threads = threads
    return opts
