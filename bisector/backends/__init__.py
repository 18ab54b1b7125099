"""Backend registry. Heavy or optional backends are imported only when chosen, so the CLI starts fast."""

from __future__ import annotations

from typing import Any, Callable

from bisector.errors import UsageError
from bisector.backends.base import Backend

BACKENDS = ("emulate", "ort-cuda", "tensorrt", "tensorrt-rtx")


def backend_factory(name: str, **options: Any) -> Callable[[], Backend]:
    """A zero-argument constructor for backend `name` (the canary builds a second instance of the same kind)."""
    if name == "emulate":
        from bisector.backends.emulate.backend import EmulateBackend

        opts = {k: v for k, v in options.items() if k in ("threads", "storage")}
        if options.get("fp16_arithmetic"):
            opts["arithmetic"] = options["fp16_arithmetic"]
        return lambda: EmulateBackend(**opts)
    if name == "ort-cuda":
        from bisector.backends.ort_cuda import OrtCudaBackend, import_ort

        import_ort(check_cuda=True)  # a missing provider is reported before golden outputs are computed

        return lambda: OrtCudaBackend(**{k: v for k, v in options.items() if k in ("device_id", "strict")})
    if name in ("tensorrt", "tensorrt-rtx"):
        from bisector.backends.tensorrt import TensorRTBackend, TensorRTRTXBackend
        from bisector.backends.trt_import import import_tensorrt, import_tensorrt_rtx

        (import_tensorrt_rtx if name == "tensorrt-rtx" else import_tensorrt)()  # fail early, exit 2, if absent
        cls = TensorRTRTXBackend if name == "tensorrt-rtx" else TensorRTBackend
        trt_keys = ("precision_constraints", "strongly_typed", "load_timing_cache", "save_timing_cache",
                    "builder_optimization_level", "tactic_sources", "save_engines", "input_shapes")
        return lambda: cls(**{k: v for k, v in options.items() if k in trt_keys and v is not None})
    raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
