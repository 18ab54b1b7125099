"""Options shared by commands, spelled as in Polygraphy. Multi-value flags take space-separated values
(see argv.py); each is declared once here and reused by every command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

import typer

Model = Annotated[Path, typer.Argument(help="The ONNX model.", show_default=False)]
ValRange = Annotated[Optional[list[str]], typer.Option("--val-range", help="Input value ranges: x:[1,2] or [0,1] for all (default [0,1]).")]
InputShapes = Annotated[Optional[list[str]], typer.Option("--input-shapes", help="Shapes for dynamic inputs: x:[1,3,224,224].")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for generated inputs.")]
Iterations = Annotated[int, typer.Option("--iterations", help="Number of generated input sets; a plan must pass on every one.")]
LoadInputs = Annotated[Optional[list[Path]], typer.Option("--load-inputs", help="Input sets: Polygraphy JSON (polygraphy run --save-inputs) or .npz.")]
SaveInputs = Annotated[Optional[Path], typer.Option("--save-inputs", help="Save the input sets used (Polygraphy JSON, or .npz).")]
LoadOutputs = Annotated[Optional[Path], typer.Option("--load-outputs", help="Golden outputs from Polygraphy RunResults JSON instead of running ORT FP32.")]
Atol = Annotated[Optional[list[str]], typer.Option("--atol", help="Absolute tolerance, per output with out:value (Polygraphy default 1e-5, too strict for FP16: try 1e-1).")]
Rtol = Annotated[Optional[list[str]], typer.Option("--rtol", help="Relative tolerance, per output with out:value (Polygraphy default 1e-5).")]
ErrorStat = Annotated[Optional[list[str]], typer.Option("--check-error-stat", help="elemwise (default), mean, median, max or quantile; per output with out:stat.")]
ErrorQuantile = Annotated[float, typer.Option("--error-quantile", help="Quantile for --check-error-stat quantile.")]
Fp16 = Annotated[bool, typer.Option("--fp16", help="Reduced precision to search for: FP16 (the default and only one).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="emulate (CPU FP16 storage emulation), ort-cuda, tensorrt, tensorrt-rtx.")]
CacheDir = Annotated[Optional[Path], typer.Option("--cache-dir", help="Cache for golden outputs and the journal (default: the user cache dir).")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the golden cache.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and tracebacks.")]
# TensorRT backends (ignored by emulate / ort-cuda)
Fp16Arithmetic = Annotated[str, typer.Option("--fp16-arithmetic", help="emulate: storage (default; DESIGN §4: FP16 tensors, FP32 math inside a layer) or gpu (also the FP16 bias epilogue of ORT-CUDA Conv/Gemm, measured in issue 19).")]
PrecisionConstraints = Annotated[str, typer.Option("--precision-constraints", help="TensorRT 10 weak typing: obey (default) or prefer.")]
StronglyTyped = Annotated[bool, typer.Option("--strongly-typed", help="TensorRT >= 10.12: build strongly typed from the mixed-precision ONNX.")]
LoadTimingCache = Annotated[Optional[Path], typer.Option("--load-timing-cache", help="TensorRT timing cache to start from.")]
SaveTimingCache = Annotated[Optional[Path], typer.Option("--save-timing-cache", help="Save the search's shared TensorRT timing cache here.")]
OptLevel = Annotated[Optional[int], typer.Option("--builder-optimization-level", help="TensorRT builder optimization level (0-5).")]
TacticSources = Annotated[Optional[list[str]], typer.Option("--tactic-sources", help="TensorRT tactic sources to enable (space-separated).")]
SaveEngines = Annotated[Optional[Path], typer.Option("--save-engines", help="Keep each candidate's TensorRT engine in this directory.")]
JunitOut = Annotated[Optional[Path], typer.Option("--junit", help="Write JUnit XML here: one test case per model output.")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Write a machine-readable summary here (`-`: to stdout, which then holds nothing else).")]


_TRT_FLAGS = ("fp16_arithmetic", "precision_constraints", "strongly_typed", "load_timing_cache", "save_timing_cache",
              "builder_optimization_level", "tactic_sources", "save_engines")


def job_options(flags: Mapping[str, Any], **overrides: Any):
    """JobOptions from a command's flag values, picked by parameter name (commands pass `locals()`), so the
    shared input/tolerance/backend flags are mapped in one place instead of a long positional call per command."""
    from bisector.app.job import JobOptions

    f = {**flags, **overrides}
    backend_opts = f.get("backend_options")
    if backend_opts is None:
        backend_opts = backend_options(f.get("input_shapes"), **{k: f[k] for k in _TRT_FLAGS if k in f})
    return JobOptions(
        model=f["model"], val_range=f.get("val_range") or [], input_shapes=f.get("input_shapes") or [],
        seed=1 if f.get("seed") is None else f["seed"], iterations=1 if f.get("iterations") is None else f["iterations"], load_inputs=f.get("load_inputs") or [],
        save_inputs=f.get("save_inputs"), load_outputs=f.get("load_outputs"), atol=f.get("atol") or [],
        rtol=f.get("rtol") or [], check_error_stat=f.get("check_error_stat") or [],
        error_quantile=f.get("error_quantile", 0.99), backend=f.get("backend", "emulate"),
        backend_options=backend_opts, cache_dir=f.get("cache_dir"), no_cache=bool(f.get("no_cache")),
    )


def strategy_help() -> str:
    try:
        from bisector.search.driver import available_strategies

        names = ", ".join(sorted(available_strategies()))
    except Exception:  # help text must never fail
        names = "?"
    return f"Search strategy plugin (entry-point group bisector.strategies). Installed: {names}."


def setup_logging(verbose: bool) -> None:
    """Our log lines on stderr; other libraries (matplotlib, onnx) keep their own, quieter, defaults."""
    logger = logging.getLogger("bisector")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[bisector] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted (a captured or redirected stderr included)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass




def backend_options(input_shapes, fp16_arithmetic="storage", precision_constraints="obey", strongly_typed=False, load_timing_cache=None,
                    save_timing_cache=None, builder_optimization_level=None, tactic_sources=None,
                    save_engines=None) -> dict:
    """Backend keyword options from flags; each backend takes the ones it knows (see backends/__init__.py)."""
    from bisector.errors import UsageError
    from bisector.values import parse_input_shapes

    if precision_constraints not in ("obey", "prefer"):
        raise UsageError(f"--precision-constraints {precision_constraints!r}: choose obey or prefer")
    from bisector.fp16.arithmetic import check_mode

    return {
        "fp16_arithmetic": check_mode(fp16_arithmetic), "precision_constraints": precision_constraints, "strongly_typed": strongly_typed or None,
        "load_timing_cache": load_timing_cache, "save_timing_cache": save_timing_cache,
        "builder_optimization_level": builder_optimization_level, "tactic_sources": tactic_sources,
        "save_engines": save_engines, "input_shapes": parse_input_shapes(input_shapes) or None,
    }


def json_to_stdout(json_out) -> bool:
    return json_out is not None and str(json_out) == "-"


def write_json(json_out, text: str) -> None:
    """`--json FILE` (written atomically) or `--json -` (stdout, which then carries the JSON alone)."""
    if json_to_stdout(json_out):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from bisector.files import write_text_atomic

        write_text_atomic(json_out, text)


def human_output(json_out):
    """Where human-readable lines go: stdout, or stderr when stdout carries `--json -`."""
    if json_to_stdout(json_out):
        return lambda message: typer.echo(message, err=True)
    return typer.echo
