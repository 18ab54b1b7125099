"""`precision`: search the minimal FP32 set, verify it, and write the artifacts of the final set."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol


from bisector import __version__, machine
from bisector.app.job import Job, build_job, unjudged_branches
from bisector.app.options import BackendChoice, Cache, Inputs, Search, Tolerances, split_options
from bisector.errors import UsageError
from bisector.files import ensure_dir
from bisector.heap import give_back_free_memory
from bisector.budget import Budget
from bisector.search.driver import SearchResult, run_search
from bisector.search.executors import (WORKER_INDEX, Executor, ProcessPool, RayPool, start_executor,
                                       worker_threads)
from bisector.search.judge import Verdict

if TYPE_CHECKING:
    from bisector.artifacts.constraints import Constraints
    from bisector.search.executors import Evaluate

log = logging.getLogger("bisector")


class SearchObserver(Protocol):
    """What a live display implements to follow a search (the CLI's SearchProgress does)."""

    def begin(self, candidates: int) -> None: ...

    def on_verdict(self, verdict: Verdict) -> None: ...

    # the strategies' progress events (strategies/__init__.py), and the driver's {"ranking": {"runs", "total",
    # "seconds"}} while the predicted ranking's single-node emulator runs go (they are not evaluations)
    def __call__(self, event: dict) -> None: ...

    def end(self) -> None: ...


@dataclass
class PrecisionResult:
    """The outcome of a search: the set (in topological order), whether it passed and is proven 1-minimal,
    the final verdict, the constraints record and where the artifacts went (None: not written)."""

    fp32_nodes: list[str]
    passed: bool
    minimal: bool
    verdict: Verdict
    constraints: Constraints
    artifacts: dict[str, Path] | None
    stop_reason: str | None = None


def precision(model: str | Path, *, output_dir: str | Path | None = None, plot: bool = False, mixed: bool = True,
              on_verdict: Callable[[Verdict], None] | None = None, progress: SearchObserver | None = None,
              inputs: Inputs | None = None, tolerances: Tolerances | None = None,
              backend: BackendChoice | None = None, cache: Cache | None = None, search: Search | None = None,
              **options: Any) -> PrecisionResult:
    """Search the minimal set of nodes of `model` to keep in FP32.

    Options come as typed groups (`inputs=Inputs(...)`) or flat keywords named like the flags (`atol=0.1`,
    `val_range={"x": (1, 2)}`, `strategy="auto"`, `max_evals=20`). `output_dir`: write constraints.json,
    add_constraints.py, model.mixed.onnx, layer-precision strings and report.md there (None: no files).
    `plot`: also profile.json/profile.png (emulate; costs a sensitivity profile). `mixed=False`: no
    model.mixed.onnx (the artifact whose cost grows with the weights). `progress`: a SearchObserver
    (the CLI's live display), `on_verdict`: called with every verdict.
    """
    groups = split_options(options, Inputs=inputs, Tolerances=tolerances, BackendChoice=backend, Cache=cache,
                           Search=search)
    s: Search = groups[Search]
    if s.grow_inputs and (groups[Inputs].load_inputs or groups[Inputs].data_loader_script):
        raise UsageError("--grow-inputs draws more generated input sets; the inputs here come from "
                         f"{'a script' if groups[Inputs].data_loader_script else 'files'}: give more of them instead")
    budget = Budget(max_evals=s.max_evals, time_limit=s.time_limit)  # the whole command's clock starts here
    if output_dir is not None:
        ensure_dir(Path(output_dir))  # fail on an unwritable -o before hours of search
    confirm = None
    if s.confirm_on is not None:  # a missing GPU package is exit 2 now, not after the search
        from bisector.backends import backend_factory

        confirm = dataclasses.replace(groups[BackendChoice], backend=s.confirm_on)
        backend_factory(confirm.backend, **confirm.backend_options(groups[Inputs].input_shapes))
    t0 = time.perf_counter()
    # Workers start first: their imports (or Ray's set-up) overlap the golden run and the canary here.
    executor = start_executor(groups[BackendChoice].backend, s.workers, s.ray, preload=WORKER_PRELOAD)
    try:
        job = build_job(Path(model), groups[Inputs], groups[Tolerances], groups[BackendChoice], groups[Cache],
                        **_driver_threads(executor, groups[BackendChoice].backend))
    except BaseException:
        if executor is not None:
            executor.close()
        raise
    journal = prewritten = None
    try:
        t_setup = time.perf_counter() - t0
        cat = job.catalog
        log.info("%s: %d candidates, %d pinned; golden %s", cat.path.name, len(cat.candidates), len(cat.pinned),
                 job.golden.source)
        hints, profile_nodes, t_profile = {}, None, 0.0
        if s.scores == "profile":
            t1 = time.perf_counter()
            profile_nodes = _profile(job)
            t_profile = time.perf_counter() - t1
            hints["scores"] = {n["name"]: n["score"] for n in profile_nodes}
        elif s.scores is not None:
            hints["scores"] = _load_scores(s.scores, cat.candidates)
        from bisector.costs import node_costs

        costs = node_costs(cat.model)  # estimated FP32 cost per node (reported; the objective with --objective flops)
        if s.objective == "flops":
            hints["costs"] = {n: costs.get(n, 1.0) for n in cat.candidates}
        start = _start_set(s.start_from, cat) if s.start_from is not None else None
        journal = job.journal(resume=s.resume)
        observers = [f for f in (on_verdict, progress.on_verdict if progress is not None else None) if f]
        oracle = job.oracle(budget=budget, journal=journal, on_verdict=lambda v: [f(v) for f in observers],
                            screen=True, idle=True)
        if executor is not None:
            open_job_spec(executor, Path(model), groups, job)
        oracle.executor = executor
        if output_dir is not None and mixed:
            # The large weights of the mixed model go to disk while the search runs (artifacts.prewrite): the
            # work after the search then does not grow with them. (Before the live display: it may refuse.)
            from bisector.artifacts.prewrite import WeightPrewrite

            prewritten = WeightPrewrite.start(cat, Path(output_dir) / "model.mixed.onnx")
        if progress is not None:
            progress.begin(len(cat.candidates))
        opinion = None
        try:
            result = run_search(oracle, s.strategy, s.strategy_kwargs(), hints=hints, progress=progress,
                                start=start)
            # what the search's evaluations resumed from (the emulator's latest plan) is of no use after it
            getattr(job.backend, "drop_plan_states", lambda: None)()
            if confirm is None and s.second_opinion != "off":  # --confirm-on judges the set on the hardware
                from bisector.app.second_opinion import second_opinion

                result, opinion = second_opinion(job, result, s.strategy, s.strategy_kwargs(), budget, s.max_evals,
                                                 search=s.second_opinion == "search", on_verdict=oracle.on_verdict,
                                                 progress=progress)
        finally:
            if progress is not None:
                progress.end()
            if executor is not None:
                executor.close()
                executor = None
            oracle.executor = None
        confirmed_on = None
        if confirm is not None and result.passed:
            result = _confirm(Path(model), groups, confirm, s, result, budget)
            confirmed_on = confirm.backend
        held = None
        if s.held_out != 0:  # it trades the search's FP32 references for the held-out inputs'; before the picture,
            # which shows the final set (--grow-inputs may change it)
            from bisector.app.held_out import Growth, check_held_out

            growth = None if not s.grow_inputs else Growth(
                s.grow_inputs, s.strategy, s.strategy_kwargs(), s.max_evals, on_verdict=oracle.on_verdict,
                progress=progress)
            result, held = check_held_out(job, groups[Inputs], s.held_out, result, budget, growth)
        extra_report, t_plot = "", 0.0
        if plot and output_dir is not None:
            if job.backend.name != "emulate":
                log.warning("--plot needs --backend emulate: profile.png not written")
            elif not cat.candidates:
                log.warning("no candidate nodes: profile.png not written")
            elif budget.spent():
                log.warning("--time-limit spent: profile.png not written")
            else:
                from bisector.artifacts.write import begin_artifacts

                t1 = time.perf_counter()
                begin_artifacts(Path(output_dir))  # the stale constraints.json goes before profile.* land
                extra_report = _write_profile_artifacts(job, Path(output_dir), result.fp32, profile_nodes)
                t_plot = time.perf_counter() - t1
        timings = {"setup": t_setup, "profile": t_profile, "search": result.seconds,
                   "backend_run": sum(v.seconds.get("run", 0.0) for v in oracle.history),
                   "compare": sum(v.seconds.get("compare", 0.0) for v in oracle.history), "plot": t_plot,
                   "second_opinion": opinion.seconds if opinion is not None else 0.0,
                   "held_out": held.seconds if held is not None else 0.0}
        described = (job.backend.describe(), unjudged_branches(cat, job.backend))
        paths = None
        # The search's sessions, weight copies and FP32 reference are not needed for the artifacts: free them
        # before the mixed model is built (48-layer model, 1.27 GB of weights: peak 7.1 -> see docs/benchmarks.md),
        # and before the constraints are (pydantic loads then: ~7 MB that would sit on top of the search's memory).
        # The FP16-rounded weights it still holds are handed to the mixed model's writer first (converted to FP16
        # exactly instead of by the rule again); they are within the search's own budget for them.
        rounded = getattr(job.backend, "rounded_weights", dict)() if output_dir is not None and mixed else {}
        job.backend.close()
        give_back_free_memory()
        constraints = _constraints(job, Path(model), result, s.strategy, timings, s.strategy_option, described)
        constraints.confirmed_on = confirmed_on
        constraints.node_by_node = opinion.to_json() if opinion is not None else None
        constraints.held_out = held.to_json() if held is not None else None
        constraints.objective = s.objective
        constraints.fp32_cost = {"set": sum(costs.get(n, 1.0) for n in result.fp32),
                                 "all_candidates": sum(costs.get(n, 1.0) for n in cat.candidates)}
        if output_dir is not None:
            from bisector.artifacts.write import write_artifacts

            skipped = None if mixed else "--no-mixed was given"
            if mixed and budget.spent() and _model_bytes(cat) > MIXED_SKIP_BYTES:
                skipped = "the --time-limit was spent by the search"
                log.warning("--time-limit spent: model.mixed.onnx not written (report.md says how to write it)")
            paths = write_artifacts(Path(output_dir), cat, constraints, extra_report, mixed=skipped is None,
                                    mixed_skipped=skipped or "", rounded=rounded, prewritten=prewritten)
        del rounded
        if result.workers > 1:
            log.info("%d new evaluation(s) in %d round(s) on %d workers", result.evaluations.get("new", 0),
                     result.rounds, result.workers)
        if result.stop_reason:
            log.warning("search stopped early (%s): reporting the best passing set found so far", result.stop_reason)
        order = {n: i for i, n in enumerate(cat.candidates)}
        return PrecisionResult(sorted(result.fp32, key=order.__getitem__), result.passed, result.minimal,
                               result.verdict, constraints, paths, result.stop_reason)
    finally:
        if prewritten is not None:  # a no-op once written; else its temporary file goes
            prewritten.discard()
        if executor is not None:  # failed before the search
            executor.close()
        job.close()
        if journal is not None:
            journal.close()


def _confirm(model: Path, groups: dict, confirm: BackendChoice, s: Search, found: SearchResult,
             budget: Budget) -> SearchResult:
    """Judge the set found here on the hardware backend; where it fails there, extend (then shrink) it there.
    --time-limit runs on the command's one clock (`budget.started`); --max-evals counts this search's own."""
    executor = start_executor(confirm.backend, s.workers, s.ray, preload=WORKER_PRELOAD)  # workers there, too
    try:
        there = build_job(model, groups[Inputs], groups[Tolerances], confirm, groups[Cache],
                          **_driver_threads(executor, confirm.backend))
    except BaseException:
        if executor is not None:
            executor.close()
        raise
    with there:
        journal = there.journal(resume=s.resume)
        try:
            oracle = there.oracle(budget=Budget(max_evals=s.max_evals, time_limit=s.time_limit,
                                                started=budget.started), journal=journal, screen=True,
                                  idle=True)
            if executor is not None:
                open_job_spec(executor, model, {**groups, BackendChoice: confirm}, there)
                oracle.executor = executor
            result = run_search(oracle, s.strategy, s.strategy_kwargs(), start=found.fp32)
        finally:
            if executor is not None:
                executor.close()
            if journal is not None:
                journal.close()
    log.info("--confirm-on %s: the set of %d node(s) %s there; final set %d node(s)", confirm.backend,
             len(found.fp32), _confirm_outcome(oracle.history, found.fp32, result.fp32), len(result.fp32))
    return result


def _confirm_outcome(history: list[Verdict], found: frozenset[str], final: frozenset[str]) -> str:
    """How --confirm-on's search on the other backend ended, from its verdict of the set found here: a failing set
    is not necessarily extended (the search from it may settle on another, even smaller, set)."""
    first = next((v for v in history if v.fp32 == found), None)
    if first is not None and not first.passed:
        return "fails" + (" (extended)" if final > found else ", so it was replaced")
    if first is None:  # not judged there (no verdict recorded): say only how the set changed
        return "holds" if final <= found else "was extended" if final > found else "was replaced"
    return "holds (then shrunk)" if final < found else "holds"


# Modules a worker imports before it receives its job (forkserver: once, in the server).
WORKER_PRELOAD = ("bisector.app.job", "bisector.backends.emulate.backend")


@dataclass
class JobSpec:
    """The real worker: `build_job` from the model path and the typed option groups, then `judge` per plan.

    `golden`: the driver's golden outputs; the worker judges against exactly these (ORT FP32 with another
    thread count can differ in the last bits, and a borderline verdict must not depend on the worker).
    `inputs_digest`: the driver's inputs, checked. `model_bytes`: the model itself, for Ray nodes that cannot
    read `model` (a model with external data needs a shared filesystem)."""

    model: Path
    inputs: Any
    tolerances: Any
    backend: Any
    cache: Any
    golden: list | None = None
    inputs_digest: str | None = None
    threads: int = 0
    model_bytes: bytes | None = None

    def open(self) -> tuple[Evaluate, Callable[[], None]]:
        from bisector.fp16.plan import Plan

        model = Path(self.model)
        if not model.exists() and self.model_bytes is not None:
            import tempfile

            fd, name = tempfile.mkstemp(suffix=".onnx", prefix="bisector-worker-")
            with os.fdopen(fd, "wb") as f:
                f.write(self.model_bytes)
            model = Path(name)
        extra = {"threads": self.threads} if self.threads and self.backend.backend == "emulate" else {}
        backend = self.backend
        if os.environ.get(WORKER_INDEX, "0") != "0" and backend.save_timing_cache is not None:
            # one writer for the shared file: the first worker saves its TensorRT timing cache, the others not
            backend = dataclasses.replace(backend, save_timing_cache=None)
        job = build_job(model, self.inputs, self.tolerances, backend, self.cache,
                        canary=backend.backend != "emulate", **extra)
        if self.inputs_digest is not None and job.inputs_info["digest"] != self.inputs_digest:
            job.close()
            raise UsageError("a worker generated other inputs than the driver (the input files differ there?)")
        if self.golden is not None:
            job.golden.outputs = self.golden
        candidates = job.catalog.candidates

        def evaluate(fp32: frozenset) -> dict:
            return job.judge(Plan(frozenset(fp32), candidates), lean=True).to_json()  # a search verdict: lean

        return evaluate, job.close


# With the --time-limit spent, the mixed ONNX (its cost grows with the weights: converting and writing them) is
# written only for models below this size; the other artifacts are small and always written.
MIXED_SKIP_BYTES = int(float(os.environ.get("BISECTOR_MIXED_SKIP_MB", "64")) * 2**20)


def _model_bytes(cat) -> int:
    """The model's bytes on disk: its file and the external data files its initializers name."""
    total = Path(cat.path).stat().st_size
    for f in cat.external_files:
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total


def _driver_threads(executor: Executor | None, backend: str) -> dict:
    """The driver's own ORT threads when it judges plans as one slot of a local pool (emulate): the same share
    of the cores as each worker, so that the slots run side by side and judge alike."""
    if isinstance(executor, ProcessPool) and executor.wants_local and backend == "emulate":
        return {"threads": worker_threads(executor, backend)}
    return {}


def open_job_spec(executor: Executor, model: Path, groups: dict, job: Job) -> None:
    """Hand a started executor the job to open in each worker: the model path and the typed option groups, held
    to the driver's inputs digest and golden outputs."""
    spec = JobSpec(Path(model).resolve(), groups[Inputs], groups[Tolerances], groups[BackendChoice], groups[Cache],
                   golden=job.golden.outputs, inputs_digest=job.inputs_info["digest"],
                   threads=worker_threads(executor, groups[BackendChoice].backend))
    if isinstance(executor, RayPool) and executor.address != "local" and Path(model).stat().st_size < 1_500_000_000:
        spec.model_bytes = Path(model).read_bytes()  # for Ray nodes that cannot read the path
    if getattr(executor, "wants_local", False):
        from bisector.fp16.plan import Plan

        candidates = job.catalog.candidates
        executor.open(spec, local=lambda fp32: job.judge(Plan(frozenset(fp32), candidates), lean=True).to_json())
    else:
        executor.open(spec)
    log.info("judging plans on %d %s worker(s)", executor.workers, executor.kind)


def _constraints(job: Job, model: Path, result: SearchResult, strategy: str, timings: dict,
                 strategy_options: dict | None = None, described: tuple[dict, dict] | None = None) -> Constraints:
    """`described`: the backend's (describe(), unjudged branches), taken before it was closed."""
    cat = job.catalog
    # pydantic, imported once the search is over (and its backend closed): ~7-10 MB less at its peak
    from bisector.artifacts.constraints import Constraints, Evaluations, Golden

    backend_info, unjudged = described or (job.backend.describe(), unjudged_branches(cat, job.backend))

    return Constraints(
        tool_version=__version__, model=str(model), model_sha256=cat.sha256, backend=backend_info,
        tolerances=job.tolerance.describe(), inputs=job.inputs_info, fp32_nodes=sorted(result.fp32),
        passed=result.passed, minimal=result.minimal, stop_reason=result.stop_reason,
        evaluations=Evaluations(**result.evaluations),
        golden=Golden(source=job.golden.source, reference_runs=job.golden.reference_runs, runner=job.golden.runner),
        strategy=strategy, strategy_options=dict(strategy_options or {}), candidates=len(cat.candidates),
        pinned=cat.pinned, unjudged_branches=unjudged, timings=timings,
        fp16_unreachable={k: v.to_json() for k, v in result.unreachable.items()},
        outputs={k: v.to_json() for k, v in result.verdict.outputs.items()},
        worst_input_set=result.verdict.worst_set, headroom=_headroom(result.verdict), machine=machine.description(),
    )


def _headroom(verdict: Verdict) -> float | None:
    """1 - excess of the worst output: the fraction of the tolerance the final set leaves unused."""
    excess = verdict.excess
    return None if excess == float("inf") else 1.0 - excess


def _load_scores(source: str, candidates) -> dict[str, float]:
    from bisector.sensitivity import load_scores

    loaded = load_scores(source)
    if not set(loaded) & set(candidates):
        raise UsageError(f"--scores {source} names none of this model's candidates (a profile of another model?)")
    return {n: loaded.get(n, 0.0) for n in candidates}


def _start_set(path: Path, cat) -> frozenset[str]:
    from bisector.artifacts.constraints import Constraints

    recorded = Constraints.read(path).fp32_nodes
    missing = cat.unknown(recorded)
    if missing:
        raise UsageError(f"--start-from {path}: node(s) not in this model: {missing}")
    log.info("starting from %d FP32 node(s) of %s", len(recorded), path)
    return frozenset(n for n in recorded if n in cat.candidates)


def _profile(job: Job) -> list[dict]:
    from bisector.sensitivity import compute_scores

    if job.backend.name != "emulate":
        raise UsageError("--scores profile needs --backend emulate; run `bisector profile` and pass its profile.json")
    if not job.catalog.candidates:
        return []
    return compute_scores(job.catalog, job.backend, job.feeds_list, job.tolerance)


def _write_profile_artifacts(job: Job, output_dir: Path, fp32: frozenset[str], nodes: list[dict] | None) -> str:
    """profile.json + profile.png next to the other artifacts; returns the report section that shows them."""
    from bisector.app.profile import write_profile_files

    nodes = nodes if nodes is not None else _profile(job)
    write_profile_files(job, output_dir, nodes, frozenset(fp32), {"model": str(job.catalog.path),
                                                                 "fp32_nodes": sorted(fp32)}, png=True)
    from bisector.text import markdown_code

    top = ", ".join(f"{markdown_code(n['name'])} ({n['score']:.3g})" for n in nodes[:5])
    return ("## FP16 sensitivity\n\nPer-node score (local FP16 error in units of the tolerance; see `bisector profile`)"
            f", final FP32 nodes highlighted; below, each output's error histogram for the final plan. Top: {top}.\n\n"
            "![profile](profile.png)\n")
