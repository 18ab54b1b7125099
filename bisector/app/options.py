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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional

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
DEFAULT_MARGIN = 1.0


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


@dataclass
class Inputs:
    """Inputs: generated like Polygraphy's data loader, or loaded from files; golden outputs from a file."""

    panel: ClassVar[str] = "Inputs"
    val_range: Any = option("--val-range", multi=True, cli=Optional[list[str]], default=None,
                            help="Input value ranges: x:[1,2], or [0,1] for all inputs (default [0,1]).")
    input_shapes: Any = option("--input-shapes", multi=True, cli=Optional[list[str]], default=None,
                               help="Shapes for dynamic inputs: x:[1,3,224,224].")
    seed: int = option("--seed", default=1, help="Seed for generated inputs.")
    iterations: int = option("--iterations", default=1, help="Generated input sets; a plan must pass on every one.")
    load_inputs: Any = option("--load-inputs", multi=True, cli=Optional[list[Path]], default=None,
                              help="Input sets: Polygraphy JSON (polygraphy run --save-inputs) or .npz.")
    save_inputs: Optional[Path] = option("--save-inputs", default=None,
                                         help="Save the input sets used (Polygraphy JSON, or .npz).")
    load_outputs: Optional[Path] = option("--load-outputs", default=None,
                                          help="Golden outputs (Polygraphy RunResults JSON) instead of running ORT FP32.")

    def __post_init__(self) -> None:
        tokens = _tokens(self.val_range)
        if tokens is not None or self.val_range is None:
            self.val_range = parse_val_range(tokens)
        else:
            self.val_range = {(None if k in ("", "*", None) else k): (float(v[0]), float(v[1]))
                              for k, v in dict(self.val_range).items()}
        tokens = _tokens(self.input_shapes)
        if tokens is not None or self.input_shapes is None:
            self.input_shapes = parse_input_shapes(tokens)
        else:
            self.input_shapes = {k: tuple(int(d) for d in v) for k, v in dict(self.input_shapes).items()}
        if isinstance(self.load_inputs, (str, Path)):
            self.load_inputs = [self.load_inputs]
        self.load_inputs = [Path(p) for p in (self.load_inputs or [])]
        if self.iterations < 1:
            raise UsageError(f"--iterations {self.iterations}: must be at least 1")
        if self.seed < 0 or self.seed >= 2**32:
            raise UsageError(f"--seed {self.seed}: must lie in [0, 2**32)")


@dataclass
class Tolerances:
    """Tolerances: Polygraphy's comparison semantics (DESIGN §5), plus the headroom the search demands."""

    panel: ClassVar[str] = "Tolerances"
    atol: Any = option("--atol", multi=True, cli=Optional[list[str]], default=None,
                       help="Absolute tolerance, per output with out:value (Polygraphy default 1e-5, too strict "
                            "for FP16: try 1e-1).")
    rtol: Any = option("--rtol", multi=True, cli=Optional[list[str]], default=None,
                       help="Relative tolerance, per output with out:value (Polygraphy default 1e-5).")
    check_error_stat: Any = option("--check-error-stat", multi=True, cli=Optional[list[str]], default=None,
                                   help=f"{', '.join(ERROR_STATS)} (default elemwise); per output with out:stat.")
    error_quantile: float = option("--error-quantile", default=0.99, help="Quantile for --check-error-stat quantile.")
    margin: float = option("--margin", default=DEFAULT_MARGIN,
                           help="Headroom: accept a plan only if its worst error is at most this fraction of the "
                                "tolerance (1 = just within tolerance).")

    def __post_init__(self) -> None:
        self.atol = _per_output(self.atol, 1e-5, "--atol", lambda t: parse_tolerance(t, 1e-5, "--atol"))
        self.rtol = _per_output(self.rtol, 1e-5, "--rtol", lambda t: parse_tolerance(t, 1e-5, "--rtol"))
        self.check_error_stat = _per_output(self.check_error_stat, "elemwise", "--check-error-stat", parse_error_stat)
        if not 0.0 <= self.error_quantile <= 1.0 or math.isnan(self.error_quantile):
            raise UsageError(f"--error-quantile {self.error_quantile}: must lie in [0, 1]")
        if not (0.0 < self.margin <= 1.0):
            raise UsageError(f"--margin {self.margin}: must lie in (0, 1] (1 = no headroom)")

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
    precision_constraints: str = option("--precision-constraints", default="obey",
                                        help="TensorRT 10 weak typing: obey or prefer.")
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
        from bisector.backends import BACKENDS

        if self.backend not in BACKENDS:
            raise UsageError(f"--backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.precision_constraints not in ("obey", "prefer"):
            raise UsageError(f"--precision-constraints {self.precision_constraints!r}: choose obey or prefer")
        if self.builder_optimization_level is not None and not 0 <= self.builder_optimization_level <= 5:
            raise UsageError(f"--builder-optimization-level {self.builder_optimization_level}: choose 0-5")

    def backend_options(self, input_shapes: Mapping[str, tuple[int, ...]], **extra: Any) -> dict[str, Any]:
        """Keyword options for the backend factory; each backend takes the ones it knows."""
        return {
            "precision_constraints": self.precision_constraints, "strongly_typed": self.strongly_typed or None,
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
        if self.cache_dir is not None and not self.no_cache:
            p = Path(self.cache_dir)
            if p.exists() and not p.is_dir():
                raise UsageError(f"--cache-dir {p}: not a directory")


@dataclass
class Search:
    """Search: the strategy plugin, what it starts from, and its budgets."""

    panel: ClassVar[str] = "Search"
    strategy: str = option("--strategy", default="auto",
                           help="Search strategy plugin (entry-point group bisector.strategies).")
    direction: Optional[str] = option("--direction", default=None,
                                      help="bisect/linear: forward (FP32 prefix) or reverse (suffix).")
    scores: Optional[str] = option("--scores", default=None,
                                   help="Per-node FP16 sensitivity to order the search: a profile.json, or `profile` "
                                        "to compute it first (emulate).")
    start_from: Optional[Path] = option("--start-from", default=None,
                                        help="A constraints.json found elsewhere: confirm its FP32 set here and "
                                             "extend or shrink it, instead of searching from scratch.")
    resume: bool = option("--resume/--no-resume", default=True,
                          help="Answer repeated plans from the journal of earlier runs with the same key.")
    max_evals: Optional[int] = option("--max-evals", default=None,
                                      help="Stop after this many new evaluations; report the best passing set so far.")
    time_limit: Optional[float] = option("--time-limit", default=None,
                                         help="Stop after this many seconds (search and artifacts); report the best "
                                              "passing set so far.")

    def __post_init__(self) -> None:
        if self.direction not in (None, "forward", "reverse"):
            raise UsageError(f"--direction {self.direction!r}: choose forward or reverse")
        if self.max_evals is not None and self.max_evals < 1:
            raise UsageError(f"--max-evals {self.max_evals}: must be at least 1")
        if self.time_limit is not None and not (self.time_limit > 0 and math.isfinite(self.time_limit)):
            raise UsageError(f"--time-limit {self.time_limit}: must be a positive number of seconds")


GROUPS: tuple[type, ...] = (Inputs, Tolerances, BackendChoice, Cache, Search)


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
        f = by_flag.get(tokens[i])
        if f is None:
            raise UsageError(f"unknown flag {tokens[i]!r}")
        i += 1
        values = []
        while i < len(tokens) and not tokens[i].startswith("-"):
            values.append(tokens[i])
            i += 1
        if f.metadata.get("multi"):
            out.setdefault(f.name, []).extend(values)
        elif not values:
            out[f.name] = not tokens[i - 1].startswith("--no-")
        else:
            out[f.name] = values[0]
    return out
