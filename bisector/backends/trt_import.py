"""Lazy, honest imports of TensorRT, TensorRT-RTX and the CUDA runtime bindings.

Nothing here is imported at module load: the CLI starts fast and works without any of them.

One trap: the `tensorrt-stubs` package (installed for type checking) creates a `tensorrt/` folder holding only
`__init__.pyi`, so `import tensorrt` *succeeds* and yields an empty namespace package. A module only counts as
TensorRT when it has a string `__version__` and a `Builder`.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

from bisector.errors import UsageError

TRT_INSTALL_HINT = (
    "TensorRT is not installed: pip install 'bisector[tensorrt]' (needs an NVIDIA GPU and driver)"
)
RTX_INSTALL_HINT = (
    "TensorRT-RTX is not installed: install NVIDIA's `tensorrt-rtx` Python wheel (module `tensorrt_rtx`, or the "
    "bindings wheel alone, module `tensorrt_rtx_bindings`) from the TensorRT-RTX package for your platform, plus "
    "cuda-python (needs an NVIDIA GPU and driver)"
)
CUDA_INSTALL_HINT = (
    "the CUDA runtime bindings are not installed: pip install 'cuda-python>=12' "
    "(the TensorRT backends copy inputs and outputs with it; no PyTorch needed)"
)


def is_real_tensorrt(module: Any) -> bool:
    """True for an importable TensorRT-like module, False for the stubs' empty namespace package."""
    return isinstance(getattr(module, "__version__", None), str) and hasattr(module, "Builder")


def parse_version(text: str) -> tuple[int, ...]:
    """'10.13.0.35' -> (10, 13, 0, 35); trailing non-numeric parts (rc, post) are dropped."""
    parts: list[int] = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group(0)))
    return tuple(parts) or (0,)


def _try_import(name: str) -> tuple[ModuleType | None, str | None]:
    try:
        return importlib.import_module(name), None
    except ImportError as exc:  # ModuleNotFoundError, or a wheel whose shared libraries do not load
        return None, f"{type(exc).__name__}: {exc}"
    except OSError as exc:  # libnvinfer and friends missing or for another CUDA
        return None, f"{type(exc).__name__}: {exc}"


def import_tensorrt(module: Any = None) -> Any:
    """The `tensorrt` module (or the injected one); UsageError (exit 2) when it is absent or only stubs."""
    if module is not None:
        return module
    mod, why = _try_import("tensorrt")
    if mod is None or not is_real_tensorrt(mod):
        detail = f" ({why})" if why and "No module named" not in why else ""
        if mod is not None and why is None:
            detail = " (only type stubs were found, not the library)"
        raise UsageError(TRT_INSTALL_HINT + detail)
    return mod


def import_tensorrt_rtx(module: Any = None) -> Any:
    """`tensorrt_rtx`, else `tensorrt_rtx_bindings` (the bindings wheel alone); UsageError when neither is real."""
    if module is not None:
        return module
    reasons = []
    for name in ("tensorrt_rtx", "tensorrt_rtx_bindings"):
        mod, why = _try_import(name)
        if mod is not None and is_real_tensorrt(mod):
            return mod
        if why and "No module named" not in why:
            reasons.append(f"{name}: {why}")
    detail = f" ({'; '.join(reasons)})" if reasons else ""
    raise UsageError(RTX_INSTALL_HINT + detail)


def import_cudart(module: Any = None) -> Any:
    """cuda-python's runtime API: `cuda.bindings.runtime` (cuda-python >= 12.6), else the older `cuda.cudart`."""
    if module is not None:
        return module
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found, unused-ignore]

        return cudart
    except ImportError:
        pass
    try:
        from cuda import cudart  # type: ignore[import-not-found, no-redef, attr-defined, unused-ignore]

        return cudart
    except ImportError:
        raise UsageError(CUDA_INSTALL_HINT) from None


def tensorrt_version() -> str | None:
    """The installed TensorRT version, or None (no import error escapes). For skips and `bisector doctor`."""
    mod, _ = _try_import("tensorrt")
    return mod.__version__ if mod is not None and is_real_tensorrt(mod) else None


def tensorrt_rtx_version() -> str | None:
    for name in ("tensorrt_rtx", "tensorrt_rtx_bindings"):
        mod, _ = _try_import(name)
        if mod is not None and is_real_tensorrt(mod):
            return str(mod.__version__)
    return None
