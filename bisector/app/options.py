"""Typed option groups: what the API takes, each declared once.

Every field is one option: its Python type and default are what `bisector.precision(...)` and friends accept; its
metadata (flag spellings, help, the value shape on the command line) is what `bisector.cli` turns into a flag in
the group's help panel. Adding an option is adding a field here. Values arrive either typed (from Python: `atol=0.1`,
`val_range={"x": (1, 2)}`) or as Polygraphy-style flag tokens (from the CLI: `["1e-3", "out0:1e-2"]`); each group's
`__post_init__` normalises both through `bisector.values`, the one parser of such values.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional, Sequence

from bisector.compare import Tolerance
from bisector.errors import UsageError
from bisector.values import (
    ERROR_STATS,
    PerOutput,
    parse_error_stat,
    parse_input_shapes,
    parse_tolerance,
    parse_val_range,
)

# Headroom the search demands by default: a plan is accepted only if its worst output's error is at most this
# fraction of the tolerance (issue: 1-minimal sets found on the CPU sit at the edge, where GPU FP16 differs).
DEFAULT_MARGIN = 0.9  # measured on an H100: docs/verification.md, issue 19


def option(*flags: str, help: str, cli: Any = None, default: Any = dataclasses.MISSING,
           default_factory: Any = dataclasses.MISSING, multi: bool = False, show_default: bool = True) -> Any:
    """A dataclass field that is also a command-line option.

    `cli`: the type the flag parses to before the group normalises it (default: the field's own type);
    `multi`: Polygraphy's space-separated multi-value flag (`--atol 1e-3 out0:1e-2`)."""
    meta = {"flags": flags, "help": help, "cli": cli, "multi": multi, "show_default": show_default}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _tokens(value: Any) -> list[str] | None:
    """Flag tokens when a value came from the command line, else None."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _mapping(value: Any, name: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise UsageError(f"{name}={value!r}: give a mapping {{input name: value}} or flag tokens like 'x:[1,2]'")
    return value


def _range(name: Any, value: Any) -> tuple[float, float]:
    """A val_range value given as Python (low, high): checked as --val-range checks its tokens."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2 \
            or not all(_is_real(v) for v in value):
        raise UsageError(f"val_range {name!r}: {value!r}: expected two numbers (low, high)")
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise UsageError(f"val_range {name!r}: {value!r}: expected finite low <= high")
    return lo, hi


def _dims(name: str, value: Any) -> tuple[int, ...]:
    """An input_shapes value given as Python dims: checked as --input-shapes checks its tokens."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) \
            or not all(_is_int(d) and d >= 0 for d in value):
        raise UsageError(f"input_shapes {name!r}: {value!r}: dimensions must be non-negative integers")
    return tuple(int(d) for d in value)


def _per_output(value: Any, default: Any, flag: str, parse) -> PerOutput:
    if isinstance(value, PerOutput):
        return value
    tokens = _tokens(value)
    if tokens is not None or value is None:
        return parse(tokens or [])
    if isinstance(value, Mapping):  # {"": default, "out0": 1e-2} or {"default": ..., "per_output": {...}}
        if "per_output" in value or "default" in value:
            d, per = value.get("default", default), dict(value.get("per_output", {}))
        else:
            per = {k: v for k, v in value.items() if k}
            d = value.get("", default)
        tokens = [str(d)] + [f"{k}:{v}" for k, v in per.items()]
        return parse(tokens)
    return parse([str(value)])


def _one_value(value: Any, default: Any, flag: str, kind: type) -> Any:
    """A flag Polygraphy takes per output (`--error-quantile 0.95 out0:0.8`) that bisector takes once: one plain
    value is it; a per-output form is refused (exit 2) rather than read as something else."""
    tokens = _tokens(value)
    if tokens is None:
        return default if value is None else value
    if not tokens:
        return default
    from bisector.values import split_name

    if len(tokens) > 1 or split_name(tokens[0])[0]:
        raise UsageError(f"{flag} {' '.join(tokens)}: per-output values (NAME:VALUE) are not supported by bisector; "
                         f"give one {flag} for all outputs")
    try:
        return kind(tokens[0])
    except ValueError:
        raise UsageError(f"{flag} {tokens[0]!r}: expected {'an integer' if kind is int else 'a number'}") from None


def _check_backend(name: str, flag: str) -> None:
    from bisector.backends import BACKENDS

    if name not in BACKENDS:
        raise UsageError(f"{flag} {name!r}: choose one of {', '.join(BACKENDS)}")


SEED_LIMIT = 2**32  # numpy's RandomState (Polygraphy's data loader) takes seeds below it


@dataclass
class Inputs:
    """Inputs: generated like Polygraphy's data loader, or loaded from files; golden outputs from a file."""

    panel: ClassVar[str] = "Inputs"
    val_range: Any = option("--val-range", multi=True, cli=Optional[list[str]], default=None,
                            help="Input value ranges: x:[1,2], or [0,1] for all inputs (default [0,1]).")
    input_shapes: Any = option("--input-shapes", "--inputs", multi=True, cli=Optional[list[str]], default=None,
                               help="Shapes for dynamic inputs: x:[1,3,224,224].")
    seed: int = option("--seed", default=1, help="Seed for generated inputs.")
    iterations: int = option("--iterations", "--iters", default=1, help="Generated input sets; a plan must pass on every one.")
    load_inputs: Any = option("--load-inputs", "--load-input-data", multi=True, cli=Optional[list[Path]], default=None,
                              help="Input sets: Polygraphy JSON (polygraphy run --save-inputs) or .npz.")
    save_inputs: Optional[Path] = option("--save-inputs", "--save-input-data", default=None,
                                         help="Save the input sets used (Polygraphy JSON, or .npz).")
    load_outputs: Any = option("--load-outputs", "--load-results", multi=True, cli=Optional[list[Path]], default=None,
                               help="Golden outputs (Polygraphy RunResults JSON, one or more files) instead of running "
                                    "ORT FP32; the FP32 reference runner among them is golden.")
    data_loader_script: Optional[str] = option("--data-loader-script", default=None,
                                               help="Polygraphy data loader script FILE[:FUNC] (default load_data): "
                                                    "FUNC() returns or yields {input: array} per iteration.")

    def __post_init__(self) -> None:
        if isinstance(self.val_range, str):  # one token, as on the command line
            self.val_range = [self.val_range]
        tokens = _tokens(self.val_range)
        if tokens is not None or self.val_range is None:
            self.val_range = parse_val_range(tokens)
        else:
            self.val_range = {(None if k in ("", "*", None) else k): _range(k, v)
                              for k, v in _mapping(self.val_range, "val_range").items()}
        if isinstance(self.input_shapes, str):
            self.input_shapes = [self.input_shapes]
        tokens = _tokens(self.input_shapes)
        if tokens is not None or self.input_shapes is None:
            self.input_shapes = parse_input_shapes(tokens)
        else:
            self.input_shapes = {k: _dims(k, v) for k, v in _mapping(self.input_shapes, "input_shapes").items()}
        for name in ("seed", "iterations"):
            if not _is_int(getattr(self, name)):
                raise UsageError(f"--{name} {getattr(self, name)!r}: must be an integer")
        if isinstance(self.load_outputs, (list, tuple)):  # several files: Polygraphy's nargs="+"
            files = [Path(p) for p in self.load_outputs]
            self.load_outputs = None if not files else files[0] if len(files) == 1 else files
        elif self.load_outputs is not None:
            self.load_outputs = Path(self.load_outputs)
        if isinstance(self.load_inputs, (str, Path)):
            self.load_inputs = [self.load_inputs]
        self.load_inputs = [Path(p) for p in (self.load_inputs or [])]
        if self.iterations < 1:
            raise UsageError(f"--iterations {self.iterations}: must be at least 1")
        if self.seed < 0 or self.seed >= SEED_LIMIT:
            raise UsageError(f"--seed {self.seed}: must lie in [0, 2**32)")
        if self.seed + self.iterations - 1 >= SEED_LIMIT:  # input set i is generated from seed + i, as in Polygraphy
            raise UsageError(f"--seed {self.seed} with --iterations {self.iterations}: the last input set's seed "
                             f"({self.seed + self.iterations - 1}) must lie below 2**32")


@dataclass
class Tolerances:
    """Tolerances: Polygraphy's comparison semantics (DESIGN §5), plus the headroom the search demands."""

    panel: ClassVar[str] = "Tolerances"
    atol: Any = option("--atol", "--abs-tol", multi=True, cli=Optional[list[str]], default=None,
                       help="Absolute tolerance, per output with out:value (Polygraphy default 1e-5, too strict "
                            "for FP16: try 1e-1).")
    rtol: Any = option("--rtol", "--rel-tol", multi=True, cli=Optional[list[str]], default=None,
                       help="Relative tolerance, per output with out:value (Polygraphy default 1e-5).")
    check_error_stat: Any = option("--check-error-stat", multi=True, cli=Optional[list[str]], default=None,
                                   help=f"{', '.join(ERROR_STATS)} (default elemwise); per output with out:stat.")
    error_quantile: Any = option("--error-quantile", multi=True, cli=Optional[list[str]], default=None,
                                   help="Quantile for --check-error-stat quantile, one for all outputs (default 0.99).")
    margin: float = option("--margin", default=DEFAULT_MARGIN,
                           help="Headroom: accept a plan only if its worst error is at most this fraction of the "
                                "tolerance (1 = just within tolerance).")

    def __post_init__(self) -> None:
        self.atol = _per_output(self.atol, 1e-5, "--atol", lambda t: parse_tolerance(t, 1e-5, "--atol"))
        self.rtol = _per_output(self.rtol, 1e-5, "--rtol", lambda t: parse_tolerance(t, 1e-5, "--rtol"))
        self.check_error_stat = _per_output(self.check_error_stat, "elemwise", "--check-error-stat", parse_error_stat)
        self.error_quantile = _one_value(self.error_quantile, 0.99, "--error-quantile", float)
        if not _is_real(self.error_quantile) or not 0.0 <= self.error_quantile <= 1.0 or math.isnan(self.error_quantile):
            raise UsageError(f"--error-quantile {self.error_quantile}: must lie in [0, 1]")
        if not _is_real(self.margin) or not (0.0 < self.margin <= 1.0):
            raise UsageError(f"--margin {self.margin!r}: must lie in (0, 1] (1 = no headroom)")

    def tolerance(self) -> Tolerance:
        return Tolerance(atol=self.atol, rtol=self.rtol, stat=self.check_error_stat, quantile=self.error_quantile,
                         margin=self.margin)

    @classmethod
    def recorded(cls, described: Mapping[str, Any]) -> "Tolerances":
        """The tolerances a constraints.json recorded (`Tolerance.describe()`), typed again."""
        return cls(atol=described.get("atol"), rtol=described.get("rtol"),
                   check_error_stat=described.get("check_error_stat"),
                   error_quantile=float(described.get("error_quantile", 0.99)),
                   margin=float(described.get("margin", 1.0)))


@dataclass
class BackendChoice:
    """Backend: where plans run. TensorRT options are ignored by emulate and ort-cuda."""

    panel: ClassVar[str] = "Backend"
    backend: str = option("--backend", default="emulate",
                          help="emulate (CPU FP16 storage emulation), ort-cuda, tensorrt, tensorrt-rtx.")
    fp16_arithmetic: str = option("--fp16-arithmetic", default="storage",
                                  help="emulate: storage (DESIGN §4: FP16 tensors, FP32 math inside a layer) or gpu "
                                       "(also the FP16 bias epilogue of ORT-CUDA Conv/Gemm).")
    precision_constraints: str = option("--precision-constraints", default="obey",
                                        help="TensorRT 10 weak typing: obey, prefer or none (Polygraphy's). Emulate "
                                             "applies the requested precisions exactly, whatever this says.")
    strongly_typed: bool = option("--strongly-typed", default=False,
                                  help="TensorRT >= 10.12: build strongly typed from the mixed-precision ONNX.")
    load_timing_cache: Optional[Path] = option("--load-timing-cache", default=None, help="TensorRT timing cache to start from.")
    save_timing_cache: Optional[Path] = option("--save-timing-cache", default=None,
                                               help="Save the search's shared TensorRT timing cache here.")
    builder_optimization_level: Optional[int] = option("--builder-optimization-level", default=None,
                                                       help="TensorRT builder optimization level (0-5).")
    tactic_sources: Any = option("--tactic-sources", multi=True, cli=Optional[list[str]], default=None,
                                 help="TensorRT tactic sources to enable.")
    save_engines: Optional[Path] = option("--save-engines", default=None,
                                          help="Keep each candidate's TensorRT engine in this directory.")

    def __post_init__(self) -> None:
        _check_backend(self.backend, "--backend")
        from bisector.fp16.arithmetic import check_mode

        self.fp16_arithmetic = check_mode(self.fp16_arithmetic)
        if self.precision_constraints not in ("obey", "prefer", "none"):
            raise UsageError(f"--precision-constraints {self.precision_constraints!r}: choose obey, prefer or none")
        if self.builder_optimization_level is not None and not 0 <= self.builder_optimization_level <= 5:
            raise UsageError(f"--builder-optimization-level {self.builder_optimization_level}: choose 0-5")

    def backend_options(self, input_shapes: Mapping[str, tuple[int, ...]], **extra: Any) -> dict[str, Any]:
        """Keyword options for the backend factory; each backend takes the ones it knows."""
        return {
            "fp16_arithmetic": self.fp16_arithmetic, "precision_constraints": self.precision_constraints, "strongly_typed": self.strongly_typed or None,
            "load_timing_cache": self.load_timing_cache, "save_timing_cache": self.save_timing_cache,
            "builder_optimization_level": self.builder_optimization_level, "tactic_sources": self.tactic_sources,
            "save_engines": self.save_engines, "input_shapes": dict(input_shapes) or None, **extra,
        }


@dataclass
class Cache:
    """Cache: golden outputs and the journal of evaluations."""

    panel: ClassVar[str] = "Cache"
    cache_dir: Optional[Path] = option("--cache-dir", default=None,
                                       help="Golden outputs and the journal (default: the user cache dir).")
    no_cache: bool = option("--no-cache", default=False, help="Neither read nor write the golden cache or journal.")

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)  # the Python API may pass a str
        if self.cache_dir is not None and not self.no_cache:
            p = self.cache_dir
            if p.exists() and not p.is_dir():
                raise UsageError(f"--cache-dir {p}: not a directory")


SECOND_OPINIONS = ("check", "search", "off")  # bisector.app.second_opinion


@dataclass
class Search:
    """Search: the strategy plugin, what it starts from, and its budgets."""

    panel: ClassVar[str] = "Search"
    strategy: str = option("--strategy", default="auto",
                           help="Search strategy plugin (entry-point group bisector.strategies).")
    objective: str = option("--objective", default="count",
                            help="What the smallest set minimises: count (nodes) or flops (estimated FP32 cost: "
                                 "one Add is cheaper to keep than one MatMul).")
    direction: Optional[str] = option("--direction", default=None,
                                      help="bisect/linear: forward (FP32 prefix) or reverse (suffix).")
    strategy_option: Any = option("--strategy-option", multi=True, cli=Optional[list[str]], default=None,
                                  help="KEY=VALUE for the strategy's constructor, repeatable (e.g. auto's "
                                       "use_prediction=false: probes instead of the predicted ranking).")
    scores: Optional[str] = option("--scores", default=None,
                                   help="Per-node FP16 sensitivity to order the search: a profile.json, or `profile` "
                                        "to compute it first (emulate).")
    start_from: Optional[Path] = option("--start-from", default=None,
                                        help="A constraints.json found elsewhere: confirm its FP32 set here and "
                                             "extend or shrink it, instead of searching from scratch.")
    confirm_on: Optional[str] = option("--confirm-on", default=None,
                                       help="Re-judge the final set on this backend (ort-cuda, tensorrt, …) and, "
                                            "where it fails there, extend it there (as --start-from does).")
    second_opinion: str = option("--second-opinion", default="check",
                                 help="emulate: check (judge the final set again with every node run alone, not "
                                      "through fused blocks; warn and record where it fails so), search (then "
                                      "search on from such a set until one passes both ways) or off.")
    held_out: Optional[int] = option("--held-out", default=None,
                                     help="precision: judge the final set on N more generated input sets the search "
                                          "did not use (the seeds after --seed and --iterations) and warn where it "
                                          "fails there: fitted to the searched inputs. Default: 1 after a search of "
                                          "at least 30 evaluations, where it costs a tenth of them at most. 0: off. "
                                          "Generated inputs only.")
    grow_inputs: int = option("--grow-inputs", default=0,
                              help="precision: where the final set fails its held-out input sets, let them join the "
                                   "searched inputs and search on from the set (extend, then shrink), up to N times; "
                                   "each set found is judged on the input sets after all those searched. With "
                                   "--margin 0.5 for a set that holds on inputs no search saw. --held-out defaults to "
                                   "4 with it. Generated inputs; not with --confirm-on.")
    resume: bool = option("--resume/--no-resume", default=True,
                          help="Answer repeated plans from the journal of earlier runs with the same key.")
    max_evals: Optional[int] = option("--max-evals", default=None,
                                      help="Stop after this many new evaluations; report the best passing set so far.")
    time_limit: Optional[float] = option("--time-limit", default=None,
                                         help="Stop after this many seconds (search and artifacts); report the best "
                                              "passing set so far.")
    workers: Optional[int] = option("--workers", default=None,
                                    help="Judge independent plans at once on N worker processes on this machine "
                                         "(GPU backends: one GPU each; emulate: the cores shared). With --ray: the "
                                         "number of Ray actors (default: the cluster's GPUs, or CPUs for emulate).")
    ray: Optional[str] = option("--ray", default=None,
                                help="Judge plans on Ray actors (needs the ray extra of bisector): ray://host:10001, "
                                     "auto (RAY_ADDRESS or the local cluster) or local (start one here).")

    def __post_init__(self) -> None:
        for name in ("max_evals", "workers", "held_out", "grow_inputs"):  # before any comparison: workers="2" is a message, not a TypeError
            if getattr(self, name) is not None and not _is_int(getattr(self, name)):
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)!r}: must be an integer")
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"--workers {self.workers}: must be at least 1")
        if self.ray is not None and not (self.ray in ("auto", "local") or self.ray.startswith("ray://")
                                         or ":" in self.ray):
            raise UsageError(f"--ray {self.ray!r}: give ray://host:10001, host:6379, auto or local")
        if self.direction not in (None, "forward", "reverse"):
            raise UsageError(f"--direction {self.direction!r}: choose forward or reverse")
        if self.second_opinion not in SECOND_OPINIONS:
            raise UsageError(f"--second-opinion {self.second_opinion!r}: choose {', '.join(SECOND_OPINIONS)}")
        if self.objective not in ("count", "flops"):
            raise UsageError(f"--objective {self.objective!r}: choose count or flops")
        self.strategy_option = strategy_options(self.strategy, self.strategy_option)
        if self.confirm_on is not None:
            _check_backend(self.confirm_on, "--confirm-on")
        if self.held_out is not None and self.held_out < 0:
            raise UsageError(f"--held-out {self.held_out}: must be 0 (off) or more input sets")
        if self.grow_inputs < 0:
            raise UsageError(f"--grow-inputs {self.grow_inputs}: must be 0 (off) or more rounds")
        if self.grow_inputs and self.held_out == 0:
            raise UsageError("--grow-inputs needs held-out input sets to grow by: not with --held-out 0")
        if self.grow_inputs and self.confirm_on is not None:
            raise UsageError("--grow-inputs searches on from the set on the search's backend; with --confirm-on the "
                             "final set is the hardware's: choose one")
        if self.max_evals is not None and self.max_evals < 1:
            raise UsageError(f"--max-evals {self.max_evals}: must be at least 1")
        if self.time_limit is not None and not (_is_real(self.time_limit) and self.time_limit > 0
                                                and math.isfinite(self.time_limit)):
            raise UsageError(f"--time-limit {self.time_limit}: must be a positive number of seconds")

    def strategy_kwargs(self) -> dict[str, Any]:
        """What the strategy's constructor gets: --direction (for bisect/linear) and the --strategy-option values."""
        return {"direction": self.direction, **self.strategy_option}


GROUPS: tuple[type, ...] = (Inputs, Tolerances, BackendChoice, Cache, Search)


def strategy_options(strategy: str, value: Any) -> dict[str, Any]:
    """`--strategy-option` tokens (KEY=VALUE) or a mapping, checked against the strategy's constructor: a key it
    does not take, or a value that is not of its default's type (bool, int, float, str), is a UsageError."""
    if not value:
        return {}
    import inspect

    from bisector.search.driver import load_strategy_class

    if isinstance(value, Mapping):
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        pairs = []
        for token in [value] if isinstance(value, str) else value:
            key, sep, raw = str(token).partition("=")
            if not sep or not key.strip():
                raise UsageError(f"--strategy-option {token!r}: give KEY=VALUE")
            pairs.append((key.strip(), raw.strip()))
    params = {k: p for k, p in inspect.signature(load_strategy_class(strategy)).parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    out: dict[str, Any] = {}
    for key, raw in pairs:
        if key not in params:
            raise UsageError(f"--strategy-option {key}: strategy {strategy!r} takes no such option; it takes: "
                             f"{', '.join(sorted(params)) or 'none'}")
        out[key] = _typed_like(params[key].default, raw, key, str(params[key].annotation))
    return out


def _typed_like(default: Any, raw: Any, key: str, annotation: str = "") -> Any:
    """`raw` as the type of the option's default; for a None default, of its annotation (`int | None`)."""
    if not isinstance(raw, str):
        return raw  # from the Python API: as given
    text = raw.lower()
    if default is None:
        if text in ("none", "null", ""):
            return None
        kinds = {"bool": False, "int": 0, "float": 0.0}
        default = next((v for k, v in kinds.items() if re.search(rf"\b{k}\b", annotation)), None)
        if default is None:
            return raw
    try:
        if isinstance(default, bool):
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        kind = type(default).__name__
        raise UsageError(f"--strategy-option {key}={raw}: expected {'an' if kind == 'int' else 'a'} {kind}") from None
    return raw


# ---- Polygraphy `run` compatibility (issue 18): runners, comparison, TensorRT-only builder flags ----------------
PRECISION_FLAGS = ("fp16", "bf16")


@dataclass
class Runners:
    """Runners, Polygraphy-style: `--onnxrt` is the FP32 reference (golden); `--trt` is the reduced-precision runner,
    evaluated on --backend (emulate by default). With both, they are compared like `polygraphy run --trt --onnxrt`."""

    panel: ClassVar[str] = "Runners (Polygraphy)"
    onnxrt: bool = option("--onnxrt", default=False, help="Run ONNX Runtime FP32: the reference runner (golden).")
    trt: bool = option("--trt", default=False,
                       help="Run the TensorRT-like runner on --backend: FP32 unless --fp16/--bf16 (as in TensorRT).")
    bf16: bool = option("--bf16", default=False, help="BF16 storage for the non-FP32 layers (round to nearest even).")
    tf32: bool = option("--tf32", default=False,
                        help="Accepted (TF32 math is a TensorRT kernel choice; no effect on emulate).")
    layer_precisions: Any = option("--layer-precisions", multi=True, cli=Optional[list[str]], default=None,
                                   help="Per-layer precisions NAME:float32|float16 (TensorRT layer names, as the "
                                        "ONNX parser names them).")
    trt_npps: Any = option("--trt-network-postprocess-script", "--trt-npps", multi=True, cli=Optional[list[str]],
                           default=None, help="TensorRT network postprocess script FILE[:FUNC] (default postprocess); "
                                              "the precisions it sets on layers are applied.")
    trt_outputs: Any = option("--trt-outputs", multi=True, cli=Optional[list[str]], default=None,
                              help="Tensors the --trt runner returns: names, or `mark all` (emulate).")
    onnx_outputs: Any = option("--onnx-outputs", multi=True, cli=Optional[list[str]], default=None,
                               help="Tensors the --onnxrt runner returns: names, or `mark all`.")
    trt_exclude_outputs: Any = option("--trt-exclude-outputs", multi=True, cli=Optional[list[str]], default=None,
                                      help="Tensors to leave out of the --trt runner's outputs (with mark all).")
    onnx_exclude_outputs: Any = option("--onnx-exclude-outputs", multi=True, cli=Optional[list[str]], default=None,
                                       help="Tensors to leave out of the --onnxrt runner's outputs (with mark all).")
    model_type: Optional[str] = option("--model-type", default=None,
                                       help="onnx (default); engine, trt-network-script, ... need real TensorRT.")
    golden_runner: Optional[str] = option("--golden-runner", default=None,
                                          help="The runner of --load-outputs to use as golden (default: its FP32 "
                                               "reference runner, e.g. onnxrt-runner-N0-...).")
    allow_reduced_golden: bool = option("--allow-reduced-golden", default=False,
                                        help="Accept a reduced-precision runner's outputs as golden (normally refused).")
    gen_script: Optional[Path] = option("--gen-script", default=None,
                                        help="Write a Python script that reproduces this run, and exit.")

    def __post_init__(self) -> None:
        self.layer_precisions = parse_layer_precisions(self.layer_precisions)
        self.trt_npps = list(self.trt_npps or [])
        self.trt_outputs = _marked(self.trt_outputs, "--trt-outputs")
        self.onnx_outputs = _marked(self.onnx_outputs, "--onnx-outputs")
        if self.model_type not in (None, "onnx", "engine", "trt-network-script", "frozen", "keras", "ckpt", "tf",
                                   "onnx-like"):
            raise UsageError(f"--model-type {self.model_type!r}: choose onnx (or engine / trt-network-script, which "
                             f"need TensorRT)")


def parse_layer_precisions(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    from bisector.values import split_name

    out = {}
    for tok in value:
        name, prec = split_name(tok)
        if not name:
            raise UsageError(f"--layer-precisions {tok!r}: expected NAME:float32 or NAME:float16")
        out[name] = prec
    return out


def _marked(value: Any, flag: str) -> Optional[list[str]]:
    """None (the graph outputs), ["*"] (`mark all`), or tensor names."""
    if value is None:
        return None
    tokens = list(value)
    if not tokens:
        return None
    if tokens == ["mark", "all"] or tokens == ["mark all"]:
        return ["*"]
    if "mark" in tokens and "all" in tokens:
        raise UsageError(f"{flag}: `mark all` cannot be mixed with tensor names")
    return tokens


@dataclass
class Comparison:
    """Comparison: Polygraphy's comparison options besides tolerances."""

    panel: ClassVar[str] = "Comparison (Polygraphy)"
    compare_func: str = option("--compare-func", default="simple",
                               help="simple (tolerances) or indices (outputs hold indices, e.g. Top-K).")
    index_tolerance: Any = option("--index-tolerance", multi=True, cli=Optional[list[str]], default=None,
                                  help="--compare-func indices: how many places an index may move (one for all "
                                       "outputs).")
    fail_fast: bool = option("--fail-fast", default=False, help="Stop at the first mismatched output.")
    validate: bool = option("--validate", default=False, help="Fail on NaN or Inf in any runner's outputs.")
    infinities_compare_equal: bool = option("--infinities-compare-equal", default=False,
                                            help="Matching +-inf values compare equal (absdiff 0); by default "
                                                 "their absdiff is NaN, a mismatch.")

    def __post_init__(self) -> None:
        self.index_tolerance = _one_value(self.index_tolerance, 0, "--index-tolerance", int)
        if self.compare_func not in ("simple", "indices"):
            raise UsageError(f"--compare-func {self.compare_func!r}: choose simple or indices")
        if self.index_tolerance < 0:
            raise UsageError(f"--index-tolerance {self.index_tolerance}: must be at least 0")


@dataclass
class TrtBuilder:
    """TensorRT builder flags: accepted and recorded everywhere; used by --backend tensorrt, no effect on emulate."""

    panel: ClassVar[str] = "TensorRT builder (no effect on emulate)"
    int8: bool = option("--int8", default=False, help="TensorRT INT8 (needs calibration; not searched).")
    fp8: bool = option("--fp8", default=False, help="TensorRT FP8.")
    sparse_weights: bool = option("--sparse-weights", default=False, help="TensorRT structured sparsity.")
    pool_limit: Any = option("--pool-limit", "--memory-pool-limit", multi=True, cli=Optional[list[str]],
                             default=None, help="TensorRT memory pool limits, POOL:SIZE.")
    workspace: Optional[str] = option("--workspace", default=None, help="TensorRT workspace size (deprecated).")
    load_tactics: Optional[Path] = option("--load-tactics", "--load-tactic-replay", default=None, help="TensorRT tactic replay file to load.")
    save_tactics: Optional[Path] = option("--save-tactics", "--save-tactic-replay", default=None, help="TensorRT tactic replay file to save.")
    hardware_compatibility_level: Optional[str] = option("--hardware-compatibility-level", default=None,
                                                         help="TensorRT hardware compatibility level.")
    version_compatible: bool = option("--version-compatible", default=False,
                                      help="TensorRT version-compatible engine.")
    profiling_verbosity: Optional[str] = option("--profiling-verbosity", default=None,
                                                help="TensorRT profiling verbosity.")
    trt_min_shapes: Any = option("--trt-min-shapes", multi=True, cli=Optional[list[str]], default=None,
                                 help="TensorRT optimization profile minimum shapes.")
    trt_opt_shapes: Any = option("--trt-opt-shapes", multi=True, cli=Optional[list[str]], default=None,
                                 help="TensorRT optimization profile optimum shapes.")
    trt_max_shapes: Any = option("--trt-max-shapes", multi=True, cli=Optional[list[str]], default=None,
                                 help="TensorRT optimization profile maximum shapes.")
    save_engine: Optional[Path] = option("--save-engine", default=None,
                                         help="Save the TensorRT engine (needs --backend tensorrt).")
    calibration_cache: Optional[Path] = option("--calibration-cache", default=None, help="TensorRT INT8 calibration cache.")
    use_dla: bool = option("--use-dla", default=False, help="TensorRT: build for DLA.")
    allow_gpu_fallback: bool = option("--allow-gpu-fallback", default=False, help="TensorRT DLA: allow GPU fallback.")
    plugins: Any = option("--plugins", multi=True, cli=Optional[list[str]], default=None,
                          help="TensorRT plugin libraries to load.")
    onnxrt_providers: Any = option("--providers", "--onnxrt-providers", "--execution-providers", multi=True, cli=Optional[list[str]],
                                   default=None, help="ONNX Runtime execution providers (the reference runs on CPU).")

    def given(self) -> dict[str, Any]:
        """The flags set to something other than their default: {flag: value}."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v not in (None, False, [], ()):
                out[f.metadata["flags"][0]] = v if not isinstance(v, Path) else str(v)
        return out


@dataclass
class PolyLogging:
    """Polygraphy's logging flags (`-v` is --verbose)."""

    panel: ClassVar[str] = "Output"
    quiet: bool = option("-q", "--quiet", default=False, help="Warnings and errors only.")
    silent: bool = option("--silent", default=False, help="Errors only.")
    log_file: Optional[Path] = option("--log-file", default=None, help="Also write the log to this file.")

    def apply(self) -> None:
        import logging

        logger = logging.getLogger("bisector")
        if self.silent:
            logger.setLevel(logging.ERROR)
        elif self.quiet:
            logger.setLevel(logging.WARNING)
        if self.log_file is not None:
            handler = logging.FileHandler(self.log_file)
            handler.setFormatter(logging.Formatter("[bisector] %(levelname)s %(message)s"))
            logger.addHandler(handler)


POLYGRAPHY_GROUPS: tuple[type, ...] = (Runners, Comparison, TrtBuilder, PolyLogging)


def split_options(flat: Mapping[str, Any], groups: tuple[type, ...] = GROUPS, **given: Any) -> dict[type, Any]:
    """Flat keyword options (`atol=0.1, seed=3`) into group instances; groups passed whole (`inputs=Inputs(...)`)
    are kept. An unknown keyword is a UsageError naming it."""
    by_field = {f.name: g for g in groups for f in dataclasses.fields(g)}
    unknown = sorted(set(flat) - set(by_field))
    if unknown:
        raise UsageError(f"unknown option(s) {unknown}; known: {sorted(by_field)}")
    out: dict[type, Any] = {}
    for g in groups:
        whole = given.get(g.__name__)
        mine = {k: v for k, v in flat.items() if by_field[k] is g}
        if whole is not None and not isinstance(whole, g):
            # `backend="ort-cuda"`: the keyword named like the flag, which shares its name with the group's slot
            if g is BackendChoice and isinstance(whole, str):
                mine.setdefault("backend", whole)
                whole = None
            else:
                raise UsageError(f"{type(whole).__name__} {whole!r} given where a bisector.{g.__name__}(...) "
                                 f"belongs")
        if whole is not None:
            out[g] = dataclasses.replace(whole, **mine) if mine else whole
        else:
            out[g] = g(**mine)
    return out


def options_from_flags(tokens: list[str]) -> dict[str, Any]:
    """`["--val-range", "x:[1,2]", "--atol", "1e-1"]` -> `{"val_range": ["x:[1,2]"], "atol": ["1e-1"]}`: flag
    tokens of the option groups as keyword options (for scripts that keep Polygraphy-style argument lists;
    the CLI parses with its own parser)."""
    by_flag = {name: f for g in GROUPS for f in dataclasses.fields(g) for spec in f.metadata["flags"]
               for name in spec.split("/")}
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        f = by_flag.get(flag)
        if f is None:
            raise UsageError(f"unknown flag {flag!r}")
        i += 1
        values = []
        while i < len(tokens) and not tokens[i].startswith("-"):
            values.append(tokens[i])
            i += 1
        if f.metadata.get("multi"):
            out.setdefault(f.name, []).extend(values)
        elif not values:
            out[f.name] = not flag.startswith("--no-")
        else:
            out[f.name] = _flag_value(flag, values[0], f.type)
    return out


def _flag_value(flag: str, text: str, annotation: Any) -> Any:
    """A flag's text as the CLI's parser gives it to the option: a number for the int and float options
    (`--seed 3`, `--margin 0.9`, `--workers 2`), the text otherwise (the option checks it)."""
    kind = str(annotation).replace("Optional[", "").rstrip("]")
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "..."  # a pasted blob is not worth echoing whole
        raise UsageError(f"{flag} {shown!r}: must be {'an integer' if kind == 'int' else 'a number'}") from None
    return text
