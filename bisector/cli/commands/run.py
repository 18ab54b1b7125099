"""`bisector run`: evaluate one configuration against golden."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

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
    write_json,
)
from bisector.errors import UsageError

log = logging.getLogger("bisector")


def run(
    model: Model,
    fp16: Fp16 = True,
    fp32: Annotated[Optional[list[str]], typer.Option("--fp32", help="Nodes to keep in FP32 (space-separated).")] = None,
    constraints: Annotated[Optional[Path], typer.Option("--constraints", help="Keep the fp32_nodes of a constraints.json in FP32.")] = None,
    mark_all: Annotated[bool, typer.Option("--mark-all", help="Compare every intermediate tensor, with a first-divergence trace (emulate only).")] = False,
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
    save_outputs: Annotated[Optional[Path], typer.Option("--save-outputs", help="Save this configuration's outputs as Polygraphy RunResults JSON.")] = None,
    backend: BackendOpt = "emulate",
    fp16_arithmetic: Fp16Arithmetic = "storage",
    precision_constraints: PrecisionConstraints = "obey",
    strongly_typed: StronglyTyped = False,
    load_timing_cache: LoadTimingCache = None,
    save_timing_cache: SaveTimingCache = None,
    builder_optimization_level: OptLevel = None,
    tactic_sources: TacticSources = None,
    save_engines: SaveEngines = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    json_out: JsonOut = None,
    verbose: Verbose = False,
) -> None:
    """Evaluate one configuration against golden and print a Polygraphy-style comparison per output."""
    from bisector.artifacts.constraints import Constraints
    from bisector.files import write_text_atomic
    from bisector.fp16.plan import Plan
    from bisector.model.polyjson import run_results_to_json
    from bisector.artifacts.report_text import first_divergence, format_comparison
    from bisector.app.job import build_job

    setup_logging(verbose)
    if mark_all and backend != "emulate":
        raise UsageError("--mark-all needs --backend emulate (other backends expose only graph outputs)")
    job = build_job(job_options(locals()))
    cat = job.catalog
    wanted = list(fp32 or [])
    if constraints is not None:
        wanted += Constraints.read(constraints).fp32_nodes
    unknown = cat.unknown(wanted)
    if unknown:
        raise UsageError(f"--fp32/--constraints name node(s) not in the model: {unknown}")
    pinned = [n for n in wanted if n in cat.pinned]
    if pinned:
        log.warning("already FP32 (pinned, not candidates): %s", pinned)
    plan = Plan(frozenset(n for n in wanted if n in cat.candidates), cat.candidates)

    from bisector.compare import compare_outputs

    say = human_output(json_out)
    report: dict[str, Any] = {"passed": True, "outputs": {}}
    all_outs, runtimes = [], []
    for i, (feeds, golden) in enumerate(zip(job.feeds_list, job.golden.outputs)):
        t0 = time.perf_counter()
        if mark_all:
            actual_all = job.backend.run_all(plan, feeds)
            reference = job.backend.reference(feeds)
            names = [t for n in cat.model.graph.node if n.op_type != "Constant" for t in n.output
                     if t and t not in golden and reference[t].dtype.kind in "fb"]
            expected = {**{t: reference[t] for t in names}, **golden}
            actual = {t: actual_all[t] for t in expected}
        else:
            actual = job.backend.run(plan, feeds, list(golden))
            expected = golden
        runtimes.append(time.perf_counter() - t0)
        all_outs.append({k: actual[k] for k in golden})
        results = compare_outputs(actual, expected, job.tolerance, keep_diff=True)
        graph_results = {k: results[k] for k in golden}
        ordered = _topological(cat, results) if mark_all else list(graph_results)
        say(f"Input set {i}: {len(plan.fp32)} FP32 node(s), {len(plan.fp16)} FP16 node(s)")
        for name in ordered:
            say(format_comparison(results[name]))
        if mark_all:
            say(first_divergence(cat, results))
        passed = all(r.passed for r in graph_results.values())
        report["passed"] = report["passed"] and passed
        for name, r in results.items():
            prev = report["outputs"].get(name)
            if prev is None or (prev["passed"] and not r.passed):
                report["outputs"][name] = r.to_json()
    job.close()
    if save_outputs is not None:
        write_text_atomic(save_outputs, run_results_to_json(f"bisector-{backend}", all_outs, runtimes))
    if json_out is not None:
        write_json(json_out, json.dumps(report, indent=2) + "\n")
    say("PASSED" if report["passed"] else "FAILED")
    raise typer.Exit(0 if report["passed"] else 1)


def _topological(cat, results) -> list[str]:
    order = [t for n in cat.model.graph.node for t in n.output if t in results]
    return order + [k for k in results if k not in order]


