"""`debug precision`: Polygraphy's `debug precision --check CMD`, with any check command as the oracle.

    import bisector
    r = bisector.debug_precision("net.onnx", check=["python", "check.py"])          # a command, like --check
    r = bisector.debug_precision("net.onnx", passes=lambda c: top1(c.outputs[0]) == top1(c.golden[0]))

Per candidate FP32 set the check sees the candidate's files (`polygraphy_debug.onnx`, `.json`, and `.engine` where
TensorRT is installed; `bisector.backends.check`), and its end is read as Polygraphy reads it. The search is the
ordinary one (`search.driver.run_search`) over a `CheckOracle`: journaled, budgeted, resumable. Without `mode` the
default strategy runs (a 1-minimal named set); `mode="bisect"|"linear"` gives Polygraphy's prefix/suffix semantics.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from bisector import __version__
from bisector.app.options import (
    BackendChoice,
    Cache,
    Inputs,
    Search,
    Tolerances,
    option,
    split_options,
)
from bisector.artifacts.candidate import CandidateFiles, EngineWriter
from bisector.backends.check import (
    OUTCOMES,
    CheckSpec,
    in_process_command,
    names_engine,
    run_check,
    run_in_process,
    tensorrt_installed,
)
from bisector.budget import Budget
from bisector.errors import BuildFailure, UsageError
from bisector.files import ensure_dir, write_text_atomic
from bisector.fp16.plan import Plan
from bisector.search.check_oracle import (
    CheckJournal,
    CheckOracle,
    CheckVerdict,
    load_replay,
    replay_document,
)
from bisector.search.judge import Verdict

if TYPE_CHECKING:
    from bisector.artifacts.constraints import DebugConstraints

log = logging.getLogger("bisector")

# flags of `debug precision` itself: after --check they belong to the check command (Polygraphy's REMAINDER)
_OWN_FLAGS = ("--no-remove-intermediate", "--fail-code", "--fail-regex", "--ignore-fail-code", "--show-output",
              "--hide-fail-output", "--check-timeout", "--iter-artifact", "--artifacts-dir", "--mode", "--dir",
              "--save-debug-replay", "--load-debug-replay", "--on-check-error")


def _ints(value: Any, flag: str) -> list[int] | None:
    if value is None or value == []:
        return None
    items = [value] if isinstance(value, (int, str)) else list(value)
    try:
        return [int(v) for v in items]
    except ValueError:
        raise UsageError(f"{flag}: exit codes are integers, got {items}") from None


@dataclass
class Check:
    """Check command: how the --check command's end is read (Polygraphy's flags), its candidate files, and the
    search mode. Everything after --check is the check command."""

    panel: ClassVar[str] = "Check"
    mode: Optional[str] = option("--mode", default=None,
                                 help="bisect or linear: Polygraphy's contiguous prefix/suffix search (a count, "
                                      "not a minimal set). Default: --strategy (auto), a 1-minimal named set.")
    dir: Optional[str] = option("--dir", default=None, help="With --mode: forward (FP32 prefix, Polygraphy's "
                                                            "default) or reverse (suffix).")
    higher_precision: str = option("-p", "--precision", default="float32",
                                   help="Precision of the marked nodes: float32 (float16 needs INT8, unsupported).")
    bf16: bool = option("--bf16", default=False, help="Search for BF16 instead of FP16 (the candidate's ONNX is "
                                                      "typed BF16).")
    fail_codes: Any = option("--fail-code", "--fail-returncode", multi=True, cli=Optional[list[str]], default=None,
                             help="Exit codes of the check that count as failures; any other passes.")
    ignore_fail_codes: Any = option("--ignore-fail-code", "--ignore-fail-returncode", multi=True,
                                    cli=Optional[list[str]], default=None,
                                    help="Exit codes of the check not to count as failures.")
    fail_regex: Any = option("--fail-regex", multi=True, cli=Optional[list[str]], default=None,
                             help="Regular expression(s): the check fails only if its output matches one (with "
                                  "--fail-code: only when the code also is a failure code).")
    show_output: bool = option("--show-output", default=False, help="Show the check's output for passing "
                                                                    "candidates too.")
    hide_fail_output: bool = option("--hide-fail-output", default=False, help="Hide the check's output for "
                                                                              "failing candidates.")
    check_timeout: Optional[float] = option("--check-timeout", default=None,
                                            help="Kill a check running longer than this (seconds): verdict "
                                                 "`timeout`, not a failure.")
    on_check_error: str = option("--on-check-error", default="stop",
                                 help="A check that times out, crashes (signal) or cannot be prepared: stop (exit "
                                      "3, resumable) or fail (count the candidate as failing, as Polygraphy does).")
    iter_artifact: Path = option("--iter-artifact", "--intermediate-artifact", default=Path("polygraphy_debug.engine"),
                                 help="Where each candidate's files go: <base>.onnx, <base>.json, <base>.engine "
                                      "(TensorRT installed).")
    remove_intermediate: bool = option("--remove-intermediate/--no-remove-intermediate", default=True,
                                       help="Remove the candidate's files after each check.")
    iter_info: Optional[Path] = option("--iter-info", "--iteration-info", default=None,
                                       help="Write {\"iteration\": N, \"fp32_nodes\": [...]} here before each check.")
    artifacts: Any = option("--artifacts", multi=True, cli=Optional[list[Path]], default=None,
                            help="Files the check writes, moved after each check into --artifacts-dir/good|bad.")
    artifacts_dir: Path = option("--artifacts-dir", "--art-dir", default=Path("polygraphy_artifacts"),
                                 help="Where --artifacts are sorted.")
    in_process: bool = option("--in-process/--subprocess-check", default=True,
                              help="Run a `bisector run …` check inside this process (no interpreter start per "
                                   "candidate; --check-timeout does not apply). Other checks are always processes.")
    engine: bool = option("--engine/--no-engine", default=True,
                          help="Build <base>.engine per candidate where TensorRT is installed.")
    save_debug_replay: Optional[Path] = option("--save-debug-replay", default=None,
                                               help="Write every verdict here (JSON; updated after each check).")
    load_debug_replay: Optional[Path] = option("--load-debug-replay", default=None,
                                               help="Answer candidates from a replay saved by --save-debug-replay "
                                                    "(the journal does this already within one cache dir).")

    def __post_init__(self) -> None:
        if self.mode not in (None, "bisect", "linear"):
            raise UsageError(f"--mode {self.mode!r}: choose bisect or linear")
        if self.dir not in (None, "forward", "reverse"):
            raise UsageError(f"--dir {self.dir!r}: choose forward or reverse")
        if self.higher_precision == "float16":
            raise UsageError("-p float16 marks nodes FP16 above an INT8 build; bisector searches FP16/BF16 builds "
                             "and keeps nodes in float32 (-p float32)")
        if self.higher_precision != "float32":
            raise UsageError(f"-p {self.higher_precision!r}: choose float32")
        self.fail_codes = _ints(self.fail_codes, "--fail-code")
        self.ignore_fail_codes = _ints(self.ignore_fail_codes, "--ignore-fail-code")
        if isinstance(self.fail_regex, str):
            self.fail_regex = [self.fail_regex]
        self.fail_regex = list(self.fail_regex) if self.fail_regex else None
        if self.show_output and self.hide_fail_output:
            raise UsageError("--show-output and --hide-fail-output exclude each other (as in Polygraphy)")
        if self.on_check_error not in ("stop", "fail"):
            raise UsageError(f"--on-check-error {self.on_check_error!r}: choose stop or fail")
        if isinstance(self.artifacts, (str, Path)):
            self.artifacts = [self.artifacts]
        self.artifacts = [Path(p) for p in (self.artifacts or [])]
        self.iter_artifact = Path(self.iter_artifact)
        if self.iter_artifact.name in ("", ".", ".."):  # '' and '.' become Path('.'): no file name to write to
            raise UsageError(f"--iter-artifact {str(self.iter_artifact)!r}: give a file name, like polygraphy_debug.onnx")
        self.artifacts_dir = Path(self.artifacts_dir)

    def spec(self, command: list[str]) -> CheckSpec:
        return CheckSpec(list(command), self.fail_codes, self.ignore_fail_codes, self.fail_regex, self.show_output,
                         self.hide_fail_output, self.check_timeout)

    @property
    def base(self) -> Path:
        p = self.iter_artifact
        return p.with_suffix("") if p.suffix in (".engine", ".onnx", ".json", ".plan") else p


DEBUG_GROUPS: tuple[type, ...] = (Inputs, Tolerances, BackendChoice, Cache, Search, Check)


@dataclass
class DebugResult:
    """The outcome: the set (topological order), whether it passed under the check and is proven 1-minimal, the
    constraints record (with its `check` block), where the artifacts went, every verdict, checks actually run."""

    fp32_nodes: list[str]
    passed: bool
    minimal: bool
    constraints: DebugConstraints
    artifacts: dict[str, Path] | None
    verdicts: list[CheckVerdict]
    checks_run: int
    stop_reason: str | None = None


# ---- checkers ------------------------------------------------------------------------------------------------


class CommandChecker:
    """Writes the candidate's files, runs the command, reads its end (Polygraphy's iterate/run_check)."""

    def __init__(self, files: CandidateFiles, spec: CheckSpec, opts: Check,
                 in_process_main: Callable[[list[str]], int] | None = None):
        self.files = files
        self.spec = spec
        self.opts = opts
        self.in_process_main = in_process_main
        self.started = time.strftime("%x").replace("/", "-") + "_" + time.strftime("%X").replace(":", "-")

    def describe(self) -> dict[str, Any]:
        return {"kind": "command", **self.spec.describe(), "cwd": os.getcwd(), "iter_artifact": str(self.files.base),
                "precision": self.files.precision,
                "engine": self.files.engine_builder.describe() if self.files.engine_builder is not None else None}

    def check(self, plan: Plan, iteration: int, timeout: float | None) -> CheckVerdict:
        seconds: dict[str, float] = {}
        try:
            seconds.update(self.files.write(plan, iteration))
        except BuildFailure as exc:
            self.files.remove()
            return CheckVerdict(plan.fp32, False, {}, 0, seconds, status="error", reason=f"engine build failed: {exc}",
                                iteration=iteration)
        env = {"BISECTOR_DEBUG_ITERATION": str(iteration), "BISECTOR_DEBUG_ONNX": str(self.files.onnx_path.resolve()),
               "BISECTOR_DEBUG_JSON": str(self.files.json_path.resolve())}
        if self.opts.iter_info is not None:
            import json

            write_text_atomic(self.opts.iter_info, json.dumps({"iteration": iteration - 1,
                                                               "fp32_nodes": sorted(plan.fp32)}) + "\n")
        inner = _in_process(self.spec.command, self.opts, self.in_process_main)
        try:
            out = run_check(self.spec, timeout, env) if inner is None else \
                run_in_process(self.spec, inner, self.in_process_main)  # type: ignore[arg-type]
        finally:
            if self.opts.remove_intermediate:
                self.files.remove()
            if self.opts.iter_info is not None:
                self.opts.iter_info.unlink(missing_ok=True)
        seconds["check"] = out.seconds
        self._sort_artifacts(out.status == "pass", iteration)
        return CheckVerdict(plan.fp32, out.status == "pass", {}, 0, seconds, status=out.status,
                            returncode=out.returncode, signal=out.signal, reason=out.reason, output=out.output,
                            timeout=out.timeout, iteration=iteration)

    def _sort_artifacts(self, success: bool, iteration: int) -> None:
        for art in self.opts.artifacts:
            if not art.exists():
                log.error("artifact %s does not exist, skipping (was the check supposed to write it?)", art)
                continue
            dest = self.opts.artifacts_dir / ("good" if success else "bad") / \
                f"{art.stem}_{self.started}_N{iteration - 1}{art.suffix}"
            if dest.exists():
                log.error("%s already exists; not overwriting, artifact skipped", dest)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(art), str(dest))

    def close(self) -> None:
        if self.opts.remove_intermediate:
            self.files.remove()
        if self.files.engine_builder is not None:
            self.files.engine_builder.close()


class Candidate(os.PathLike):
    """What a `passes` callable receives: the in-process twin of the check's view of one candidate.

    `fp32` (the set), `outputs` (one dict per input set, computed by the backend under this plan), `golden`,
    `feeds`; `candidate["y"]` is `outputs[0]["y"]`; `path` (or `os.fspath(candidate)`) is a directory holding
    `polygraphy_debug.onnx` and `.json`, written on first use."""

    def __init__(self, job, plan: Plan, iteration: int, precision: str):
        self.job, self.plan, self.iteration, self.precision = job, plan, iteration, precision
        self.fp32 = plan.fp32
        self._outputs: list[dict] | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def outputs(self) -> list[dict]:
        if self._outputs is None:
            names = list(self.job.catalog.output_names)
            self._outputs = [dict(self.job.backend.run(self.plan, feeds, names)) for feeds in self.job.feeds_list]
        return self._outputs

    @property
    def golden(self) -> list[dict]:
        return list(self.job.golden.outputs)

    @property
    def feeds(self) -> list[dict]:
        return list(self.job.feeds_list)

    def __getitem__(self, name: str):
        return self.outputs[0][name]

    @property
    def path(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="bisector_candidate_")
            CandidateFiles(self.job.catalog, Path(self._dir.name) / "polygraphy_debug", self.precision).write(
                self.plan, self.iteration)
        return Path(self._dir.name)

    def __fspath__(self) -> str:
        return str(self.path)

    def cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


class PassesChecker:
    """A Python `passes(candidate) -> bool` as the check."""

    def __init__(self, job, passes: Callable[[Candidate], bool], precision: str):
        self.job, self.passes, self.precision = job, passes, precision

    def describe(self) -> dict[str, Any]:
        return {"kind": "passes", "function": _callable_name(self.passes)}

    def check(self, plan: Plan, iteration: int, timeout: float | None) -> CheckVerdict:
        cand = Candidate(self.job, plan, iteration, self.precision)
        t0 = time.perf_counter()
        try:
            ok = bool(self.passes(cand))
        except Exception as exc:  # the user's function failed: an error verdict, not a fail
            return CheckVerdict(plan.fp32, False, {}, 0, {"check": time.perf_counter() - t0}, status="error",
                                reason=f"passes() raised {type(exc).__name__}: {exc}", iteration=iteration)
        finally:
            cand.cleanup()
        return CheckVerdict(plan.fp32, ok, {}, 0, {"check": time.perf_counter() - t0}, status="pass" if ok else "fail",
                            reason=f"passes() returned {ok}", iteration=iteration)

    def close(self) -> None:
        pass


def _in_process(command: list[str], opts: Check, main: Callable[[list[str]], int] | None) -> list[str] | None:
    """bisector's own argv when the check is bisector and can run in this process (the CLI hands down its entry
    point), else None."""
    if not opts.in_process or main is None:
        return None
    return in_process_command(command)


def _callable_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _callable_digest(fn: Callable) -> str | None:
    """The source of a `passes` callable, hashed: its journal key (None: no source, no journal)."""
    try:
        src = inspect.getsource(fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn))
    except (OSError, TypeError):
        return None
    return hashlib.sha256(src.encode()).hexdigest()


# ---- the API -------------------------------------------------------------------------------------------------


def debug_precision(model: str | Path, check: list[str] | None = None, *, passes: Callable[[Candidate], bool] | None = None,
                    output_dir: str | Path | None = None, progress=None,
                    on_verdict: Callable[[Verdict], None] | None = None, inputs: Inputs | None = None,
                    tolerances: Tolerances | None = None, backend: BackendChoice | None = None,
                    cache: Cache | None = None, search: Search | None = None, debug: Check | None = None,
                    in_process_main: Callable[[list[str]], int] | None = None, **options: Any) -> DebugResult:
    """Search the FP32 set with a check as the oracle: `check` a command (argv list, run in the current directory
    once per candidate, after the candidate's files are written there) or `passes(candidate) -> bool` in process.

    Options: the groups of `precision` plus `Check` (`mode="bisect"`, `fail_codes=[1]`, `check_timeout=60`,
    `on_check_error="fail"`, `iter_artifact="polygraphy_debug.engine"`, …) as typed groups or flat keywords.
    `in_process_main`: bisector's CLI entry point (`bisector.cli.main.main`, which the CLI hands down): a check
    that is `bisector run …` then runs in this process instead of as a subprocess (`in_process=False` to refuse).
    Raises UsageError (exit 2: e.g. the check names an engine and TensorRT is absent), AccuracyFailure (exit 1:
    even all-FP32 fails the check), CheckError (exit 3: a check timed out, crashed or could not be prepared)."""
    groups = split_options(options, DEBUG_GROUPS, Inputs=inputs, Tolerances=tolerances, BackendChoice=backend,
                           Cache=cache, Search=search, Check=debug)
    c: Check = groups[Check]
    s: Search = groups[Search]
    if (check is None) == (passes is None):
        raise UsageError("debug precision needs exactly one oracle: a check command (--check CMD…) or passes=")
    if check is not None:
        check = [str(t) for t in check]
        spec = c.spec(check)  # validates the command and the flags that read its end
        _check_environment(check, c, in_process_main)
    precision = "bf16" if c.bf16 else "fp16"
    strategy, direction = (c.mode, c.dir or s.direction or "forward") if c.mode else (s.strategy, c.dir or s.direction)
    budget = Budget(max_evals=s.max_evals, time_limit=s.time_limit)
    if output_dir is not None:
        ensure_dir(Path(output_dir))
    replay = load_replay(c.load_debug_replay) if c.load_debug_replay is not None else None

    t0 = time.perf_counter()
    job = None
    checker: Any = None
    journal: CheckJournal | None = None
    try:
        if check is not None:
            from bisector.model.catalog import Catalog

            catalog = Catalog.load(Path(model))
            files = CandidateFiles(catalog, c.base, precision)
            existing = [p for p in files.paths() + [files.engine_path] if p.exists()]
            if existing:
                raise UsageError(f"{existing[0]} already exists, refusing to overwrite (as Polygraphy does): remove "
                                 f"it or choose another --iter-artifact")
            hints, start = _search_inputs(s, catalog)
            if c.engine and tensorrt_installed():
                b = groups[BackendChoice]
                files.engine_builder = EngineWriter(catalog, b.backend_options(groups[Inputs].input_shapes), precision)
            checker = CommandChecker(files, spec, c, in_process_main)
            from bisector.app.job import warn_unsplit_branches

            warn_unsplit_branches(catalog, _unjudged(catalog, None, files))  # build_job says it for the other path
            cache_dir = None if groups[Cache].no_cache else (groups[Cache].cache_dir or _default_cache_dir())
        else:
            from bisector.app.job import build_job

            job = build_job(Path(model), groups[Inputs], groups[Tolerances], groups[BackendChoice], groups[Cache])
            catalog = job.catalog
            hints, start = _search_inputs(s, catalog)
            checker = PassesChecker(job, passes, precision)  # type: ignore[arg-type]
            cache_dir = job.cache_dir
        description = {"kind": "debug-precision", "model_sha256": catalog.sha256, "check": checker.describe(),
                       "bisector": __version__}
        if job is not None:
            from bisector.app.job import golden_digest

            digest = _callable_digest(passes)  # type: ignore[arg-type]
            description.update(inputs=job.inputs_info["digest"], golden=golden_digest(job.golden),
                               backend=job.backend.describe(), passes_source=digest)
            if digest is None:
                log.info("passes() has no source to key the journal by: its verdicts are not journaled")
                cache_dir = None
        sqlite = None
        if cache_dir is not None:
            from bisector.search.journal import SqliteJournal

            sqlite = SqliteJournal(Path(cache_dir) / "journal.sqlite", description, resume=s.resume)
        journal = CheckJournal(sqlite, replay, on_error=c.on_check_error, timeout=c.check_timeout)
        return _search(model, catalog, job, checker, journal, description, check=check, passes=passes, c=c, s=s,
                       strategy=strategy, direction=direction, precision=precision, budget=budget, hints=hints,
                       start=start, output_dir=output_dir, progress=progress, on_verdict=on_verdict, t0=t0,
                       files=files if check is not None else None)
    finally:
        if checker is not None:
            checker.close()
        if journal is not None:
            journal.close()
        if job is not None:
            job.close()


def _search(model, catalog, job, checker, journal, description, *, check, passes, c: Check, s: Search, strategy,
            direction, precision, budget, hints, start, output_dir, progress, on_verdict, t0, files) -> DebugResult:
    """The search over a CheckOracle and the artifacts of its result (resources are the caller's to close)."""
    observers = [f for f in (on_verdict, progress.on_verdict if progress is not None else None) if f]

    def saw(v: Verdict) -> None:
        for f in observers:
            f(v)
        if c.save_debug_replay is not None:
            import json

            write_text_atomic(c.save_debug_replay, json.dumps(replay_document(oracle.history, description), indent=1))

    oracle = CheckOracle(checker, catalog.candidates, journal, budget, saw, on_error=c.on_check_error,
                         check_timeout=c.check_timeout)
    t_setup = time.perf_counter() - t0
    if progress is not None:
        progress.begin(len(catalog.candidates))
    try:
        from bisector.search.driver import run_search

        result = run_search(oracle, strategy, {"direction": direction}, hints=hints, progress=progress,
                            start=start)
    finally:
        if progress is not None:
            progress.end()
    verdicts: list[CheckVerdict] = [v for v in oracle.history if isinstance(v, CheckVerdict)]
    check_info = {
        "command": list(check) if check is not None else None,
        "passes": _callable_name(passes) if passes is not None else None,
        "mode": c.mode, "direction": direction, "precision": precision,
        "fail_codes": c.fail_codes, "ignore_fail_codes": c.ignore_fail_codes, "fail_regex": c.fail_regex,
        "check_timeout": c.check_timeout, "on_check_error": c.on_check_error,
        "checks_run": oracle.iterations, "check_seconds": round(sum(v.check_seconds for v in verdicts
                                                                   if v.source == "new"), 4),
        "verdicts": [v.summary() for v in verdicts], "outcomes": OUTCOMES,
    }
    timings = {"setup": t_setup, "search": result.seconds,
               "check": sum(v.check_seconds for v in verdicts if v.source == "new"),
               "write": sum(v.seconds.get("write", 0.0) for v in verdicts if v.source == "new"),
               "engine": sum(v.seconds.get("engine", 0.0) for v in verdicts if v.source == "new")}
    from bisector.artifacts.constraints import DebugConstraints, Evaluations, Golden

    constraints = DebugConstraints(
        tool_version=__version__, model=str(model), model_sha256=catalog.sha256,
        backend=_backend_record(check, passes, job, files if check is not None else None, c,
                                checker.in_process_main if check is not None else None),
        precision=precision,
        tolerances=job.tolerance.describe() if job is not None else {"decided_by": "the check command"},
        inputs=job.inputs_info if job is not None else {"source": "the check command's own", "sets": "its"},
        fp32_nodes=sorted(result.fp32), passed=result.passed, minimal=result.minimal,
        stop_reason=result.stop_reason, evaluations=Evaluations(**result.evaluations),
        golden=Golden(source=job.golden.source if job is not None else "check"),
        strategy=f"{strategy}" + (f" ({direction})" if direction else ""), candidates=len(catalog.candidates),
        pinned=catalog.pinned, timings=timings, check=check_info, headroom=None, worst_input_set=0,
        unjudged_branches=_unjudged(catalog, job, files if check is not None else None))
    paths = None
    if output_dir is not None:
        from bisector.artifacts.write import write_artifacts

        paths = write_artifacts(Path(output_dir), catalog, constraints, _report_section(check_info))
    order = {n: i for i, n in enumerate(catalog.candidates)}
    return DebugResult(sorted(result.fp32, key=order.__getitem__), result.passed, result.minimal, constraints,
                       paths, verdicts, oracle.iterations, result.stop_reason)


def _search_inputs(s: Search, catalog) -> tuple[dict, frozenset[str] | None]:
    """--scores (a profile.json) and --start-from (a constraints.json) as for `precision`."""
    from bisector.sensitivity import load_scores

    hints: dict[str, Any] = {}
    if s.scores == "profile":
        raise UsageError("--scores profile computes sensitivity with the emulate backend, not with a check: run "
                         "`bisector profile MODEL -o DIR` and pass --scores DIR/profile.json")
    if s.scores is not None:
        loaded = load_scores(s.scores)
        if not set(loaded) & set(catalog.candidates):
            raise UsageError(f"--scores {s.scores} names none of this model's candidates (a profile of another "
                             "model?)")
        hints["scores"] = {n: loaded.get(n, 0.0) for n in catalog.candidates}
    if getattr(s, "objective", "count") == "flops":
        from bisector.costs import node_costs

        costs = node_costs(catalog.model)
        hints["costs"] = {n: costs.get(n, 1.0) for n in catalog.candidates}
    if getattr(s, "confirm_on", None) is not None:
        raise UsageError("--confirm-on re-judges with bisector's comparison; debug precision's judge is the check "
                         "command: make the check run on that hardware instead")
    if getattr(s, "grow_inputs", 0):
        raise UsageError("--grow-inputs searches on with bisector's comparison on generated inputs; debug precision's "
                         "judge is the check command: give the check more inputs instead")
    if getattr(s, "held_out", None):
        raise UsageError("--held-out judges with bisector's comparison on generated inputs; debug precision's judge is "
                         "the check command: give the check more inputs instead")
    start = None
    if s.start_from is not None:
        from bisector.artifacts.constraints import Constraints

        recorded = Constraints.read(s.start_from).fp32_nodes
        missing = catalog.unknown(recorded)
        if missing:
            raise UsageError(f"--start-from {s.start_from}: node(s) not in this model: {missing}")
        start = frozenset(n for n in recorded if n in catalog.candidates)
    return hints, start


def _backend_record(check, passes, job, files, c: Check, main) -> dict[str, str]:
    """constraints.json's `backend`: what judged the candidates."""
    if check is None:
        return {"backend": "passes", "function": _callable_name(passes), "outputs_from": job.backend.name}
    rec = {"backend": "check", "command": " ".join(check)}
    if _in_process(check, c, main) is not None:
        rec["run"] = "in process"
    if files.engine_builder is not None:
        rec["engine"] = "tensorrt " + str(files.engine_builder.describe().get("tensorrt", ""))
    return rec


def _default_cache_dir() -> Path:
    from bisector.model.golden import default_cache_dir

    return default_cache_dir()


def _check_environment(check: list[str], c: Check, main: Callable[[list[str]], int] | None) -> None:
    """Before any work: the check names an engine and TensorRT is absent (exit 2, with what to run instead); the
    program does not exist; debug flags that landed in the check command."""
    engine = names_engine(check, str(c.base) + ".engine")
    if engine is not None and not tensorrt_installed():
        onnx_name, json_name = f"{c.base}.onnx", f"{c.base}.json"
        raise UsageError(
            f"the check command needs a TensorRT engine ({engine!r}) but TensorRT is not installed here, so no "
            f"{c.base}.engine can be built. Rewrite the check to use the candidate's ONNX or constraints, which are "
            f"written for every candidate: e.g. `--check polygraphy run {onnx_name} --onnxrt --load-outputs "
            f"golden.json --atol 1e-1` (ONNX Runtime's CPU provider computes FP16 nodes in FP32: prefer a GPU "
            f"provider) or `--check bisector run MODEL --fp16 --constraints {json_name} --load-outputs golden.json "
            f"--atol 1e-1` (bisector's FP16 emulation); or install TensorRT (pip install 'bisector[tensorrt]')")
    prog = check[0]
    if _in_process(check, c, main) is not None:
        log.info("the check is bisector itself: it runs in this process (--subprocess-check to run it as a process)")
        if c.check_timeout is not None:
            log.warning("--check-timeout does not apply to a check run in process; add --subprocess-check to "
                        "enforce it")
    elif os.sep not in prog and shutil.which(prog) is None:
        raise UsageError(f"the check command's program {prog!r} is not on PATH")
    if os.sep in prog and not Path(prog).exists():
        raise UsageError(f"the check command's program {prog} does not exist")
    if "--onnxrt" in check and "--providers" not in check and any(t.endswith(".onnx") for t in check):
        log.warning("the check runs the candidate's ONNX with ONNX Runtime's default (CPU) provider, which computes "
                    "FP16 nodes in FP32: it will pass nearly every candidate. Give it a GPU provider (--providers "
                    "cuda) or check with `bisector run MODEL --fp16 --constraints %s.json …` (FP16 emulation)", c.base)
    stray = [t for t in check[1:] if t.split("=")[0] in _OWN_FLAGS]
    if stray:
        log.warning("the check command contains %s, a flag of debug precision itself: everything after --check is "
                    "the check command (as in Polygraphy); put debug precision's flags before --check",
                    " ".join(stray))


def _report_section(info: dict) -> str:
    cmd = " ".join(info["command"]) if info["command"] else f"passes={info['passes']}"
    rows = ["| # | FP32 nodes | verdict | exit code | seconds | source | reason |", "|---|---|---|---|---|---|---|"]
    for v in info["verdicts"]:
        code = v["returncode"] if v["returncode"] is not None else (v["signal"] or "-")
        rows.append(f"| {v['iteration'] or '-'} | {len(v['fp32'])} | {v['status']} | {code} | {v['seconds']:.3f} | "
                    f"{v['source']} | {v['reason'].replace('|', '/')} |")
    mode = f"--mode {info['mode']} --dir {info['direction']}" if info["mode"] else "default strategy"
    return (f"## Check command\n\n`{cmd}`\n\n{mode}; {info['checks_run']} check(s) run, "
            f"{info['check_seconds']:.2f}s in checks. Verdicts in the order the search asked:\n\n"
            + "\n".join(rows) + "\n")


def _unjudged(catalog: Any, job: Any, files: Any) -> dict[str, int]:
    """If candidates whose branches no verdict computed in FP16: the job's backend decides; a check command gets
    the candidate ONNX (branches FP32) unless TensorRT writes it an engine from the model's own nodes."""
    from bisector.app.job import unjudged_branches

    if job is not None:
        return unjudged_branches(catalog, job.backend)
    engines = getattr(files, "engine_builder", None)
    return unjudged_branches(catalog, engines.backend) if engines is not None else dict(catalog.unsplit_branches)
