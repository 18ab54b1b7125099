"""What about this machine decides emulated verdicts: the CPU's instruction set and the ONNX Runtime thread pool.

Near FP16's resolution a verdict can turn on the last bit of an FP32 kernel's result, and ONNX Runtime's CPU
kernels give other last bits on another instruction set (the MLAS code path) and, for some MatMul shapes, at
another thread count (README, "Known issues"). So these belong to what a journal's rows were measured with: a
cache directory shared by machines of other kinds (a home directory on NFS, one CI cache for a mixed fleet)
must not replay one machine's verdicts as another's. Issue 15, forty-third round: two installs of the project
gave other searches on 21 of 31 registry cases at tight tolerances.
"""

from __future__ import annotations

import functools
import platform

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")  # some of the flags MLAS picks kernels by


@functools.lru_cache(maxsize=1)
def cpu() -> tuple[str, str]:
    """(model name, the ISA flags among ISA_FLAGS, or the architecture where /proc/cpuinfo has none)."""
    name = platform.processor() or platform.machine()
    isa = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info = f.read(65536)
        for line in info.splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
        flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
        isa = " ".join(x for x in ISA_FLAGS if x in flags)
    except OSError:
        pass
    return name, isa or platform.machine()


def cpu_kernels() -> str:
    """One line for a backend's description: the instruction set its CPU kernels ran with, and their threads."""
    from bisector import ort_pool

    return f"{cpu()[1]}; {ort_pool.describe()}"


def description() -> dict[str, str]:
    """Where the verdicts were measured (constraints.json's `machine`)."""
    import onnxruntime

    from bisector import ort_pool

    name, isa = cpu()
    return {"cpu": name, "isa": isa, "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(), "ort_threads": ort_pool.describe()}
