"""`bisector precision`: the search."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector import __version__
from bisector.cli.options import (
    Atol,
    BackendOpt,
    CacheDir,
    ErrorQuantile,
    ErrorStat,
    Fp16,
    InputShapes,
    Iterations,
    JsonOut,
    JunitOut,
    LoadInputs,
    LoadOutputs,
    LoadTimingCache,
    Model,
    NoCache,
    OptLevel,
    Fp16Arithmetic, PrecisionConstraints,
    Rtol,
    SaveEngines,
    SaveInputs,
    SaveTimingCache,
    Seed,
    StronglyTyped,
    TacticSources,
    ValRange,
    Verbose,
    human_output,
    job_options,
    setup_logging,
    strategy_help,
    write_json,
)
from bisector.errors import UsageError

log = logging.getLogger("bisector")


def precision(
    model: Model,
    fp16: Fp16 = True,
    atol: Atol = None,
    rtol: Rtol = None,
    check_error_stat: ErrorStat = None,
    error_quantile: ErrorQuantile = 0.99,
    val_range: ValRange = None,
    input_shapes: InputShapes = None,
    seed: Seed = 1,
    iterations: Iterations = 1,
    load_inputs: LoadInputs = None,
    save_inputs: SaveInputs = None,
    load_outputs: LoadOutputs = None,
    strategy: Annotated[str, typer.Option("--strategy", help=strategy_help())] = "auto",
    direction: Annotated[Optional[str], typer.Option("--direction", help="bisect/linear: forward (FP32 prefix) or reverse (suffix).")] = None,
    backend: BackendOpt = "emulate",
    fp16_arithmetic: Fp16Arithmetic = "storage",
    precision_constraints: PrecisionConstraints = "obey",
    strongly_typed: StronglyTyped = False,
    load_timing_cache: LoadTimingCache = None,
    save_timing_cache: SaveTimingCache = None,
    builder_optimization_level: OptLevel = None,
    tactic_sources: TacticSources = None,
    save_engines: SaveEngines = None,
    output_dir: Annotated[Path, typer.Option("-o", "--output-dir", help="Where to write the artifacts.")] = Path("bisector_out"),
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    scores: Annotated[Optional[str], typer.Option("--scores", help="Per-node FP16 sensitivity to order the search: a profile.json from `bisector profile`, or `profile` to compute it first (emulate).")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Live progress on stderr when it is a terminal (plain lines otherwise).")] = True,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Write profile.json/profile.png (per-node sensitivity, final FP32 nodes, output error histograms) with the artifacts (emulate).")] = True,
    start_from: Annotated[Optional[Path], typer.Option("--start-from", help="A constraints.json found elsewhere (e.g. on emulate): confirm its FP32 set on this backend and extend or shrink it, instead of searching from scratch.")] = None,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Answer repeated plans from the journal of earlier runs with the same model, inputs, backend and tolerances.")] = True,
    max_evals: Annotated[Optional[int], typer.Option("--max-evals", help="Stop after this many new evaluations; report the best passing set so far (minimal: false).")] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="Stop after this many seconds; report the best passing set so far.")] = None,
    json_out: JsonOut = None,
    junit: JunitOut = None,
    verbose: Verbose = False,
) -> None:
    """Search the minimal set of nodes to keep in FP32 and write constraints.json, add_constraints.py,
    model.mixed.onnx, layer-precision strings and report.md."""
    from bisector.artifacts.constraints import Constraints, Evaluations, Golden
    from bisector.files import ensure_dir
    from bisector.artifacts.write import write_artifacts
    from bisector.artifacts.junit import Suite
    from bisector.search.oracle import Budget
    from bisector.sensitivity import load_scores
    from bisector.cli.progress import SearchProgress
    from bisector.search.driver import run_search
    from bisector.app.job import build_job

    setup_logging(verbose)
    if direction not in (None, "forward", "reverse"):
        raise UsageError(f"--direction {direction!r}: choose forward or reverse")
    if max_evals is not None and max_evals < 1:
        raise UsageError(f"--max-evals {max_evals}: must be at least 1")
    if time_limit is not None and time_limit <= 0:
        raise UsageError(f"--time-limit {time_limit}: must be positive")
    ensure_dir(output_dir)  # fail on an unwritable -o before hours of search
    t0 = time.perf_counter()
    job = build_job(job_options(locals()))
    t_setup = time.perf_counter() - t0
    cat = job.catalog
    log.info("%s: %d candidates, %d pinned; golden %s", cat.path.name, len(cat.candidates), len(cat.pinned), job.golden.source)
    hints, profile_nodes, t_profile = {}, None, 0.0
    if scores == "profile":
        t1 = time.perf_counter()
        profile_nodes = _profile(job)
        t_profile = time.perf_counter() - t1
        hints["scores"] = {n["name"]: n["score"] for n in profile_nodes}
    elif scores is not None:
        loaded = load_scores(scores)
        if not set(loaded) & set(cat.candidates):
            raise UsageError(f"--scores {scores} names none of this model's candidates (a profile of another model?)")
        hints["scores"] = {n: loaded.get(n, 0.0) for n in cat.candidates}
    start = None
    if start_from is not None:
        recorded = Constraints.read(start_from).fp32_nodes
        missing = cat.unknown(recorded)
        if missing:
            raise UsageError(f"--start-from {start_from}: node(s) not in this model: {missing}")
        start = frozenset(n for n in recorded if n in cat.candidates)
        log.info("starting from %d FP32 node(s) of %s", len(start), start_from)
    journal = job.journal(resume=resume)
    budget = Budget(max_evals=max_evals, time_limit=time_limit)
    display = SearchProgress(len(cat.candidates), live=None if progress else False, max_evals=max_evals,
                             time_limit=time_limit)
    oracle = job.oracle(budget=budget, journal=journal, on_verdict=display.on_verdict)
    try:
        with display:
            result = run_search(oracle, strategy, {"direction": direction}, hints=hints, progress=display, start=start)
        extra_report = ""
        if plot and job.backend.name == "emulate":
            extra_report = _write_profile_artifacts(job, output_dir, result.fp32, profile_nodes)
    finally:
        job.close()
        if journal is not None:
            journal.close()
    run_s = sum(v.seconds.get("run", 0.0) for v in oracle.history)
    cmp_s = sum(v.seconds.get("compare", 0.0) for v in oracle.history)
    constraints = Constraints(
        tool_version=__version__, model=str(model), model_sha256=cat.sha256, backend=job.backend.describe(),
        tolerances=job.tolerance.describe(), inputs=job.inputs_info, fp32_nodes=sorted(result.fp32),
        passed=result.passed, minimal=result.minimal, stop_reason=result.stop_reason,
        evaluations=Evaluations(**result.evaluations),
        golden=Golden(source=job.golden.source, reference_runs=job.golden.reference_runs),
        strategy=strategy, candidates=len(cat.candidates), pinned=cat.pinned,
        timings={"setup": t_setup, "profile": t_profile, "search": result.seconds, "backend_run": run_s,
                 "compare": cmp_s},
        outputs={k: v.to_json() for k, v in result.verdict.outputs.items()},
        worst_input_set=result.verdict.worst_set,
    )
    paths = write_artifacts(output_dir, cat, constraints, extra_report)
    if json_out is not None:
        write_json(json_out, constraints.model_dump_json(indent=2) + "\n")
    if junit is not None:
        suite = Suite()
        suite.add_outputs(cat.path.name, constraints.outputs, result.seconds)
        suite.write(junit)
    order = {n: i for i, n in enumerate(cat.candidates)}
    ordered = sorted(result.fp32, key=order.__getitem__)
    if result.stop_reason:
        log.warning("search stopped early (%s): reporting the best passing set found so far", result.stop_reason)
    say = human_output(json_out)
    say(f"FP32 nodes ({len(ordered)}): {' '.join(ordered) if ordered else '(none)'}")
    say(
        f"{'PASSED' if result.passed else 'FAILED'}; {'1-minimal' if result.minimal else 'not proven minimal'}; "
        f"{result.evaluations['total']} evaluations ({result.evaluations['new']} new, {result.evaluations['cached']} cached); "
        f"artifacts in {paths['constraints'].parent}"
    )
    raise typer.Exit(0 if result.passed else 1)




def _profile(job) -> list[dict]:
    from bisector.sensitivity import compute_scores

    if job.backend.name != "emulate":
        raise UsageError("--scores profile needs --backend emulate; run `bisector profile` and pass its profile.json")
    return compute_scores(job.catalog, job.backend, job.feeds_list, job.tolerance)


def _write_profile_artifacts(job, output_dir: Path, fp32: frozenset[str], nodes: list[dict] | None) -> str:
    """profile.json + profile.png next to the other artifacts; returns the report section that shows them."""
    import numpy as np

    from bisector.artifacts.plot import render_profile_png
    from bisector.compare import compare_outputs
    from bisector.fp16.plan import Plan
    from bisector.sensitivity import write_profile

    nodes = nodes if nodes is not None else _profile(job)
    plan = Plan(frozenset(fp32), job.catalog.candidates)
    errors: dict[str, list] = {}
    for feeds, golden in zip(job.feeds_list, job.golden.outputs):
        results = compare_outputs(job.backend.run(plan, feeds, list(golden)), golden, job.tolerance, keep_diff=True)
        for name, r in results.items():
            if r.absdiff is not None:
                errors.setdefault(name, []).append(r.absdiff.ravel())
    merged = {k: np.concatenate(v) for k, v in errors.items()}
    write_profile(Path(output_dir) / "profile.json", nodes, {"model": str(job.catalog.path), "fp32_nodes": sorted(fp32)})
    render_profile_png(nodes, fp32, Path(output_dir) / "profile.png", merged,
                       tolerance={k: job.tolerance.atol.get(k) for k in merged})
    top = ", ".join(f"`{n['name']}` ({n['score']:.3g})" for n in nodes[:5])
    return ("## FP16 sensitivity\n\nPer-node score (local FP16 error in units of the tolerance; see `bisector profile`)"
            f", final FP32 nodes highlighted; below, each output's error histogram for the final plan. Top: {top}.\n\n"
            "![profile](profile.png)\n")
