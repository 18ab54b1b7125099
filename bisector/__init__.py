"""bisector: find the minimal set of ONNX nodes that must stay FP32 in an FP16 build.

The Python API (`bisector.precision`, `verify`, `evaluate`, `profile`, `inspect`, `run_batch` and the option
groups) is loaded on first use, so `import bisector` and the CLI start fast.
"""

__version__ = "0.1.0"

_API = frozenset({
    "precision", "verify", "evaluate", "profile", "inspect", "run_batch", "load_config",
    "PrecisionResult", "VerifyResult", "EvaluateResult", "ProfileResult", "BatchConfig", "BatchResult", "ModelEntry",
    "Inputs", "Tolerances", "BackendChoice", "Cache", "Search",
    "debug_precision", "DebugResult", "Candidate", "Check",
})


def __getattr__(name: str):
    if name in _API:
        from bisector.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'bisector' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _API)
