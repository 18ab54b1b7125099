"""The public API: what build scripts, notebooks and the CLI's commands call. `import bisector` re-exports it.

    import bisector
    result = bisector.precision("net.onnx", atol=1e-1, val_range={"x": (1, 2)}, output_dir="out")
    result.fp32_nodes, result.passed, result.minimal, result.constraints.headroom
"""

from __future__ import annotations

from bisector.app.convert import convert
from bisector.app.debug import Candidate, Check, DebugResult, debug_precision
from bisector.app.evaluate import EvaluateResult, evaluate
from bisector.app.inspect import inspect, inspect_data, trt_network
from bisector.app.polyrun import PolyRunResult, check_model, fp32_from_flags, gen_script, polyrun
from bisector.app.options import BackendChoice, Cache, Inputs, Search, Tolerances
from bisector.app.precision import PrecisionResult, precision
from bisector.app.profile import ProfileResult, profile
from bisector.app.verify import VerifyResult, verify
from bisector.artifacts.junit import Case, Suite  # result presentation the commands share
from bisector.artifacts.report_text import format_comparison
from bisector.sensitivity import profile_document
from bisector.text import one_line  # a node name on one terminal line (newlines shown as \n)

# `bisector batch`'s config models are pydantic, as is constraints.json's (`bisector.artifacts.constraints`):
# loaded on first use, so that a search through this API, which needs neither before it ends, runs without
# pydantic's ~10 MB resident (the CLI imports pydantic anyway: typer 0.29 parses its options through it).
_BATCH = frozenset({"BatchConfig", "BatchResult", "ModelEntry", "load_config", "run_batch"})


def __getattr__(name: str):
    if name in _BATCH:
        from bisector.app import batch

        return getattr(batch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "precision", "verify", "evaluate", "profile", "inspect", "run_batch", "load_config",
    "PrecisionResult", "VerifyResult", "EvaluateResult", "ProfileResult", "BatchConfig", "BatchResult", "ModelEntry",
    "Inputs", "Tolerances", "BackendChoice", "Cache", "Search", "Suite", "Case", "format_comparison",
    "profile_document", "one_line", "polyrun", "PolyRunResult", "check_model", "fp32_from_flags", "convert", "inspect_data",
    "trt_network", "gen_script",
    "debug_precision", "DebugResult", "Candidate", "Check",
]
