"""`run_batch`: several models from one nightly config, each searched or verified through the API.

    [defaults]                       # flags every model gets (Polygraphy spelling, as on the command line)
    args = ["--fp16", "--atol", "1e-1"]
    output_dir = "nightly_out"

    [[model]]
    name = "seed"                    # optional; default: the file's stem
    path = "fixtures/needs_constraints.onnx"
    mode = "precision"               # precision (search) | verify (check a recorded set)
    args = ["--val-range", "x:[1,2]"]
    expect_fp32 = ["Add", "Sub"]     # optional: a different set found is a regression

Relative paths are resolved against the config file's folder. `parallel_models = N` under [defaults] runs N
models at once, each in its own process (outcomes still in config order); `--workers`/`--ray` in `args` parallelise
the evaluations inside each model's search instead. A model's error (exit 2/3) is recorded and the
batch goes on with the next one. `args` are command-line flags: whoever runs the batch turns them into options
(`parse_args`; the CLI uses its own flag parser), so the config means exactly what the flags mean.
"""

from __future__ import annotations

import logging
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from bisector.errors import BisectorError, UsageError

log = logging.getLogger("bisector")


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path
    name: Optional[str] = None
    mode: Literal["precision", "verify"] = "precision"
    args: list[str] = []
    constraints: Optional[Path] = None
    expect_fp32: Optional[list[str]] = None


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: list[str] = []
    output_dir: Path = Path("bisector_batch")
    parallel_models: int = 1  # models searched at once, each in its own worker process (issue 16)


class BatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    defaults: Defaults = Defaults()
    model: list[ModelEntry]


# A name becomes a folder under output_dir: letters, digits and ._- only, and not a path of its own.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def load_config(path: str | Path) -> BatchConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML ({exc})") from None
    try:
        config = BatchConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"{path}: invalid batch config ({problems})") from None
    base = path.parent
    names = set()
    for entry in config.model:
        entry.path = entry.path if entry.path.is_absolute() else base / entry.path
        if entry.constraints is not None and not entry.constraints.is_absolute():
            entry.constraints = base / entry.constraints
        entry.name = entry.name or entry.path.stem
        if not _SAFE_NAME.match(entry.name) or entry.name in (".", ".."):
            raise UsageError(f"{path}: model name {entry.name!r} cannot be a folder name under output_dir; give it a "
                             "`name` of letters, digits, '.', '_' and '-'")
        if entry.name in names:
            raise UsageError(f"{path}: two models are named {entry.name!r}; give them distinct `name`s")
        names.add(entry.name)
        if entry.mode == "verify" and entry.constraints is None:
            raise UsageError(f"{path}: model {entry.name!r} has mode verify but no `constraints` file")
    if not config.defaults.output_dir.is_absolute():
        config.defaults.output_dir = base / config.defaults.output_dir
    return config


@dataclass
class ModelOutcome:
    name: str
    mode: str
    exit_code: int
    status: str
    seconds: float
    fp32_nodes: list[str] | None = None
    regression: str = ""
    error: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)  # OutputComparison per output (final plan)
    missing_nodes: list[str] = field(default_factory=list)
    # the second opinion (bisector.app.second_opinion): whether the set passed with every node run alone too;
    # False: it sits at the edge of the tolerance (said in the status, not a regression); None: not judged so
    node_by_node: bool | None = None
    # the held-out inputs (bisector.app.held_out): whether the set passed on input sets the search did not use;
    # False: fitted to the searched inputs (said in the status, not a regression); None: not judged so
    held_out: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "exit_code": self.exit_code, "status": self.status,
                "seconds": self.seconds, "fp32_nodes": self.fp32_nodes, "regression": self.regression,
                "error": self.error, "missing_nodes": self.missing_nodes, "node_by_node_passed": self.node_by_node,
                "held_out_passed": self.held_out,
                "outputs": {k: v.to_json() for k, v in self.outputs.items()}}


@dataclass
class BatchResult:
    models: list[ModelOutcome]

    @property
    def exit_code(self) -> int:
        codes = [m.exit_code for m in self.models]
        return next((c for c in (3, 2, 1) if c in codes), 0)


STATUS = {0: "ok", 1: "REGRESSED", 2: "ERROR (input)", 3: "ERROR (backend)"}


def run_batch(config: BatchConfig, parse_args: Callable[[str, list[str]], dict[str, Any]],
              only: list[str] | None = None, on_model: Callable[[ModelEntry], None] | None = None,
              parallel: int | None = None) -> BatchResult:
    """Run every entry (or those named in `only`). `parse_args(mode, args)` turns an entry's flags into API
    keyword options. `parallel`: models at once (default: the config's `parallel_models`), each in a worker
    process; the outcomes come back in config order either way."""
    entries = [e for e in config.model if not only or e.name in only]
    if only and len(entries) != len(set(only)):
        known = [e.name for e in config.model]
        raise UsageError(f"--only names unknown model(s) {sorted(set(only) - set(known))}; the config has {known}")
    parallel = parallel if parallel is not None else config.defaults.parallel_models
    if parallel < 1:
        raise UsageError(f"parallel_models {parallel}: must be at least 1")
    if parallel > 1 and len(entries) > 1:
        return BatchResult(_run_parallel(config, entries, parse_args, on_model, parallel))
    outcomes = []
    for e in entries:
        if on_model is not None:
            on_model(e)
        t0 = time.perf_counter()
        try:
            options = parse_args(e.mode, [*config.defaults.args, *e.args])
        except BisectorError as exc:
            outcomes.append(_failed(e, exc, time.perf_counter() - t0))
            continue
        outcomes.append(_run_entry(e, config.defaults.output_dir, options))
    return BatchResult(outcomes)


def _failed(e: ModelEntry, exc: BisectorError, seconds: float) -> ModelOutcome:
    assert e.name is not None
    log.error("%s: %s", e.name, exc)
    return ModelOutcome(e.name, e.mode, exc.exit_code, STATUS.get(exc.exit_code, f"exit {exc.exit_code}"), seconds,
                        error=str(exc))


def _run_parallel(config: BatchConfig, entries: list[ModelEntry], parse_args, on_model, parallel: int
                  ) -> list[ModelOutcome]:
    """Models at once in worker processes (forkserver: the heavy imports once); flags parsed here, so a bad flag
    is reported without starting anything."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from bisector.app.precision import WORKER_PRELOAD
    from bisector.search.executors import PRELOAD

    outcomes: list[ModelOutcome | None] = [None] * len(entries)
    todo = []
    for i, e in enumerate(entries):
        try:
            todo.append((i, e, parse_args(e.mode, [*config.defaults.args, *e.args])))
        except BisectorError as exc:
            outcomes[i] = _failed(e, exc, 0.0)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *WORKER_PRELOAD])
    with ProcessPoolExecutor(max_workers=min(parallel, max(1, len(todo))), mp_context=ctx) as pool:
        futures = []
        for i, e, options in todo:
            if on_model is not None:
                on_model(e)
            futures.append((i, pool.submit(_run_entry_in_worker, e, config.defaults.output_dir, options)))
        for i, f in futures:
            outcomes[i] = f.result()
    return [o for o in outcomes if o is not None]


def _run_entry_in_worker(e: ModelEntry, output_dir: Path, options: dict[str, Any]) -> ModelOutcome:
    """`_run_entry` in a worker process of `_run_parallel`: a process bisector owns, so its sessions share one ORT
    pool (bisector.ort_pool) of the usable cores, as each worker's sessions had before. A pool of each worker's
    share of the cores was slower: models of unequal length leave cores idle once the short one is done (two
    models, 2 cores: 12.5 s with a thread each, 8.4 s with both, 9.5 s with a pool per session)."""
    from bisector import ort_pool

    ort_pool.own_process()
    return _run_entry(e, output_dir, options)


def _run_entry(e: ModelEntry, output_dir: Path, options: dict[str, Any]) -> ModelOutcome:
    """One model: its search or verify through the API. A bisector error is the model's outcome."""
    from bisector.app.precision import precision
    from bisector.app.verify import verify

    assert e.name is not None
    t0 = time.perf_counter()
    outcome = ModelOutcome(e.name, e.mode, 0, "ok", 0.0)
    try:
        if e.mode == "precision":
            r = precision(e.path, output_dir=output_dir / e.name, **options)
            outcome.fp32_nodes, outcome.outputs = r.fp32_nodes, r.verdict.outputs
            outcome.node_by_node = (r.constraints.node_by_node or {}).get("passed")
            outcome.held_out = (r.constraints.held_out or {}).get("passed")
            outcome.exit_code = 0 if r.passed else 1
            if r.passed and e.expect_fp32 is not None and sorted(e.expect_fp32) != sorted(r.fp32_nodes):
                outcome.regression = (f"FP32 set changed: expected {sorted(e.expect_fp32)}, found "
                                      f"{sorted(r.fp32_nodes)}")
                outcome.exit_code = 1
        else:
            assert e.constraints is not None
            v = verify(e.path, e.constraints, **options)
            outcome.fp32_nodes, outcome.outputs = v.fp32_nodes, v.verdict.outputs
            outcome.missing_nodes = v.missing_nodes
            outcome.node_by_node = None if v.node_by_node is None else v.node_by_node.passed
            outcome.exit_code = 0 if v.passed else 1
    except BisectorError as exc:
        outcome.exit_code, outcome.error = exc.exit_code, str(exc)
        log.error("%s: %s", e.name, exc)
    except (OSError, MemoryError) as exc:  # the environment, for this model: exit 2 for it, the batch goes on
        reason = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else str(exc)
        outcome.exit_code, outcome.error = 2, reason or type(exc).__name__
        log.error("%s: %s", e.name, outcome.error)
    outcome.seconds = time.perf_counter() - t0
    outcome.status = STATUS.get(outcome.exit_code, f"exit {outcome.exit_code}")
    if outcome.exit_code == 0 and outcome.node_by_node is False:
        outcome.status = "ok (edge: fails node by node)"
    elif outcome.exit_code == 0 and outcome.held_out is False:
        outcome.status = "ok (fitted: fails on held-out inputs)"
    return outcome
