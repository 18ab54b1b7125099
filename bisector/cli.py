"""The `bisector` command line. Parses flags (Polygraphy spellings) and hands them to `session`/`search`.

Exit codes (DESIGN §9): 0 success, 1 accuracy failure, 2 usage/input/environment error, 3 backend failure.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from . import __version__
from .argv import expand_multi_value_flags
from .errors import BisectorError, UsageError

log = logging.getLogger("bisector")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the minimal set of ONNX nodes that must stay FP32 in an FP16 build. "
    "Exit codes: 0 success, 1 accuracy failure, 2 usage/input/environment error, 3 backend failure.",
)

# ---- options shared by commands (Polygraphy spellings; multi-value flags take space-separated values) ----------
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
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Write a machine-readable summary here.")]


def _job_options(model, val_range, input_shapes, seed, iterations, load_inputs, save_inputs, load_outputs,
                 atol, rtol, check_error_stat, error_quantile, backend, cache_dir, no_cache, backend_options=None):
    from .session import JobOptions

    return JobOptions(
        model=model, val_range=val_range or [], input_shapes=input_shapes or [], seed=seed, iterations=iterations,
        load_inputs=load_inputs or [], save_inputs=save_inputs, load_outputs=load_outputs, atol=atol or [],
        rtol=rtol or [], check_error_stat=check_error_stat or [], error_quantile=error_quantile, backend=backend,
        backend_options=backend_options or {}, cache_dir=cache_dir, no_cache=no_cache,
    )


def _strategy_help() -> str:
    try:
        from .search import available_strategies

        names = ", ".join(sorted(available_strategies()))
    except Exception:  # help text must never fail
        names = "?"
    return f"Search strategy plugin (entry-point group bisector.strategies). Installed: {names}."


# ---- precision --------------------------------------------------------------------------------------------------
@app.command()
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
    strategy: Annotated[str, typer.Option("--strategy", help=_strategy_help())] = "greedy",
    direction: Annotated[Optional[str], typer.Option("--direction", help="bisect/linear: forward (FP32 prefix) or reverse (suffix).")] = None,
    backend: BackendOpt = "emulate",
    output_dir: Annotated[Path, typer.Option("-o", "--output-dir", help="Where to write the artifacts.")] = Path("bisector_out"),
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    json_out: JsonOut = None,
    verbose: Verbose = False,
) -> None:
    """Search the minimal set of nodes to keep in FP32 and write constraints.json, add_constraints.py,
    model.mixed.onnx, layer-precision strings and report.md."""
    from .artifacts.constraints import Constraints, Evaluations, Golden
    from .artifacts.io import ensure_dir, write_text_atomic
    from .artifacts.write import write_artifacts
    from .search import run_search
    from .session import build_job

    _logging(verbose)
    if direction not in (None, "forward", "reverse"):
        raise UsageError(f"--direction {direction!r}: choose forward or reverse")
    ensure_dir(output_dir)  # fail on an unwritable -o before hours of search
    t0 = time.perf_counter()
    job = build_job(_job_options(model, val_range, input_shapes, seed, iterations, load_inputs, save_inputs,
                                 load_outputs, atol, rtol, check_error_stat, error_quantile, backend, cache_dir, no_cache))
    t_setup = time.perf_counter() - t0
    cat = job.catalog
    log.info("%s: %d candidates, %d pinned; golden %s", cat.path.name, len(cat.candidates), len(cat.pinned), job.golden.source)
    oracle = job.oracle(on_verdict=lambda v: log.info(
        "eval %d: %d FP32 -> %s", len(oracle.history), len(v.fp32), "pass" if v.passed else "fail"))
    result = run_search(oracle, strategy, {"direction": direction})
    job.close()
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
    order = {n: i for i, n in enumerate(cat.candidates)}
    ordered = sorted(result.fp32, key=order.__getitem__)
    typer.echo(f"FP32 nodes ({len(ordered)}): {' '.join(ordered) if ordered else '(none)'}")
    typer.echo(
        f"{'PASSED' if result.passed else 'FAILED'}; {'1-minimal' if result.minimal else 'not proven minimal'}; "
        f"{result.evaluations['total']} evaluations ({result.evaluations['new']} new, {result.evaluations['cached']} cached); "
        f"artifacts in {paths['constraints'].parent}"
    )
    raise typer.Exit(0 if result.passed else 1)


# ---- run ----------------------------------------------------------------------------------------------------------
@app.command()
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
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    json_out: JsonOut = None,
    verbose: Verbose = False,
) -> None:
    """Evaluate one configuration against golden and print a Polygraphy-style comparison per output."""
    from .artifacts.constraints import Constraints
    from .artifacts.io import write_text_atomic
    from .plan import Plan
    from .polyjson import run_results_to_json
    from .report_text import format_comparison, first_divergence
    from .session import build_job

    _logging(verbose)
    if mark_all and backend != "emulate":
        raise UsageError("--mark-all needs --backend emulate (other backends expose only graph outputs)")
    job = build_job(_job_options(model, val_range, input_shapes, seed, iterations, load_inputs, save_inputs,
                                 load_outputs, atol, rtol, check_error_stat, error_quantile, backend, cache_dir, no_cache))
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

    from .compare import compare_outputs

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
        typer.echo(f"Input set {i}: {len(plan.fp32)} FP32 node(s), {len(plan.fp16)} FP16 node(s)")
        for name in ordered:
            typer.echo(format_comparison(results[name]))
        if mark_all:
            typer.echo(first_divergence(cat, results))
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
        write_text_atomic(json_out, json.dumps(report, indent=2) + "\n")
    typer.echo("PASSED" if report["passed"] else "FAILED")
    raise typer.Exit(0 if report["passed"] else 1)


def _topological(cat, results) -> list[str]:
    order = [t for n in cat.model.graph.node for t in n.output if t in results]
    return order + [k for k in results if k not in order]


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="[bisector] %(levelname)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("bisector").setLevel(logging.DEBUG if verbose else logging.INFO)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: Polygraphy-style argv, documented exit codes, no traceback unless --verbose.

    Flag errors are click's (exit 2, its usage message); ours are BisectorError with their own exit code.
    """
    args = expand_multi_value_flags(list(sys.argv[1:] if argv is None else argv))
    verbose = "--verbose" in args or "-v" in args
    try:
        app(args=args, prog_name="bisector")  # standalone: click handles its own usage errors and exits
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BisectorError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        typer.echo(f"bisector: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("bisector: interrupted", err=True)
        return 130
    except Exception as exc:  # a bug: say so plainly, traceback on request
        if verbose:
            import traceback

            traceback.print_exc()
        typer.echo(f"bisector: internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback)", err=True)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
