"""How many CPUs this process may really use.

ONNX Runtime's default intra-op thread count is the machine's physical cores, and it pins those threads, so a
`taskset`, a container's cpuset or a CPU quota is ignored: on a 2-CPU slice of a 16-core host a default session
runs 16 pinned threads (measured on the device machine: a `taskset -c 0,1` baseline that really used every core).
Sessions we create take their thread count from here instead.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores() -> int:
    """The CPUs of this process's affinity mask, capped by a cgroup v2 CPU quota (`cpu.max`); at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> float | None:
    """CPUs allowed by a cgroup v2 quota ("200000 100000" -> 2.0); None without one ("max ...", no file)."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
