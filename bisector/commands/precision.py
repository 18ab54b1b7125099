"""`bisector precision`: the search."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import __version__
from ..cli_options import (
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
    PrecisionConstraints,
    Rtol,
    SaveEngines,
    SaveInputs,
    SaveTimingCache,
    Seed,
    StronglyTyped,
    TacticSources,
    ValRange,
    Verbose,
    backend_options,
    job_options,
    setup_logging,
    strategy_help,
)
from ..errors import UsageError

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
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Answer repeated plans from the journal of earlier runs with the same model, inputs, backend and tolerances.")] = True,
    max_evals: Annotated[Optional[int], typer.Option("--max-evals", help="Stop after this many new evaluations; report the best passing set so far (minimal: false).")] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="Stop after this many seconds; report the best passing set so far.")] = None,
    json_out: JsonOut = None,
    junit: JunitOut = None,
    verbose: Verbose = False,
) -> None:
    """Search the minimal set of nodes to keep in FP32 and write constraints.json, add_constraints.py,
    model.mixed.onnx, layer-precision strings and report.md."""
    from ..artifacts.constraints import Constraints, Evaluations, Golden
    from ..artifacts.io import ensure_dir, write_text_atomic
    from ..artifacts.write import write_artifacts
    from ..junit import Suite
    from ..oracle import Budget
    from ..search import run_search
    from ..session import build_job

    setup_logging(verbose)
    if direction not in (None, "forward", "reverse"):
        raise UsageError(f"--direction {direction!r}: choose forward or reverse")
    if max_evals is not None and max_evals < 1:
        raise UsageError(f"--max-evals {max_evals}: must be at least 1")
    if time_limit is not None and time_limit <= 0:
        raise UsageError(f"--time-limit {time_limit}: must be positive")
    ensure_dir(output_dir)  # fail on an unwritable -o before hours of search
    t0 = time.perf_counter()
    job = build_job(job_options(model, val_range, input_shapes, seed, iterations, load_inputs, save_inputs,
                                 load_outputs, atol, rtol, check_error_stat, error_quantile, backend, cache_dir, no_cache,
                                 backend_options(input_shapes, precision_constraints, strongly_typed, load_timing_cache,
                                                 save_timing_cache, builder_optimization_level, tactic_sources,
                                                 save_engines)))
    t_setup = time.perf_counter() - t0
    cat = job.catalog
    log.info("%s: %d candidates, %d pinned; golden %s", cat.path.name, len(cat.candidates), len(cat.pinned), job.golden.source)
    journal = job.journal(resume=resume)
    budget = Budget(max_evals=max_evals, time_limit=time_limit)
    oracle = job.oracle(budget=budget, journal=journal, on_verdict=lambda v: log.info(
        "eval %d: %d FP32 -> %s%s", len(oracle.history), len(v.fp32), "pass" if v.passed else "fail",
        " (journal)" if v.source == "journal" else ""))
    try:
        result = run_search(oracle, strategy, {"direction": direction})
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
        timings={"setup": t_setup, "search": result.seconds, "backend_run": run_s, "compare": cmp_s},
        outputs={k: v.to_json() for k, v in result.verdict.outputs.items()},
    )
    paths = write_artifacts(output_dir, cat, constraints)
    if json_out is not None:
        write_text_atomic(json_out, constraints.model_dump_json(indent=2) + "\n")
    if junit is not None:
        suite = Suite()
        suite.add_outputs(cat.path.name, constraints.outputs, result.seconds)
        suite.write(junit)
    order = {n: i for i, n in enumerate(cat.candidates)}
    ordered = sorted(result.fp32, key=order.__getitem__)
    if result.stop_reason:
        log.warning("search stopped early (%s): reporting the best passing set found so far", result.stop_reason)
    typer.echo(f"FP32 nodes ({len(ordered)}): {' '.join(ordered) if ordered else '(none)'}")
    typer.echo(
        f"{'PASSED' if result.passed else 'FAILED'}; {'1-minimal' if result.minimal else 'not proven minimal'}; "
        f"{result.evaluations['total']} evaluations ({result.evaluations['new']} new, {result.evaluations['cached']} cached); "
        f"artifacts in {paths['constraints'].parent}"
    )
    raise typer.Exit(0 if result.passed else 1)


