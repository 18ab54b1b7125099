"""`bisector verify`: one evaluation of a recorded constraint set — the cheap nightly check.

Flags not given default to what constraints.json recorded (tolerances, generated-input settings), so
`bisector verify model.onnx --constraints constraints.json` re-checks exactly what the search promised.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector.cli.options import (
    Atol,
    BackendOpt,
    CacheDir,
    ErrorQuantile,
    ErrorStat,
    Fp16,
    InputShapes,
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
    SaveTimingCache,
    StronglyTyped,
    TacticSources,
    ValRange,
    Verbose,
    human_output,
    job_options,
    setup_logging,
    write_json,
)

log = logging.getLogger("bisector")


def verify(
    model: Model,
    constraints: Annotated[Path, typer.Option("--constraints", help="The constraints.json to check.")],
    check_minimal: Annotated[bool, typer.Option("--check-minimal", help="Also try each single removal; a passing removal means the set is not minimal (exit 1).")] = False,
    fp16: Fp16 = True,
    atol: Atol = None,
    rtol: Rtol = None,
    check_error_stat: ErrorStat = None,
    error_quantile: ErrorQuantile = 0.99,
    val_range: ValRange = None,
    input_shapes: InputShapes = None,
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for generated inputs (default: the recorded one)."),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="Generated input sets (default: the recorded number)."),
    load_inputs: LoadInputs = None,
    load_outputs: LoadOutputs = None,
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
    junit: JunitOut = None,
    verbose: Verbose = False,
) -> None:
    """Check a recorded FP32 set: exit 0 if it still passes, 1 if it fails or names nodes the model lost."""
    from bisector.artifacts.constraints import Constraints
    from bisector.artifacts.junit import Suite
    from bisector.app.job import build_job

    setup_logging(verbose)
    recorded = Constraints.read(constraints)
    tol = recorded.tolerances
    atol = atol or _tolerance_tokens(tol.get("atol"))
    rtol = rtol or _tolerance_tokens(tol.get("rtol"))
    check_error_stat = check_error_stat or _tolerance_tokens(tol.get("check_error_stat"))
    inputs = recorded.inputs
    if not load_inputs and inputs.get("source") == "generated":
        val_range = val_range or [f"{k}:{v}" if k != "*" else str(v) for k, v in inputs.get("val_range", {}).items()]
        input_shapes = input_shapes or [f"{k}:{v}" for k, v in inputs.get("shapes", {}).items()]
        seed = recorded.inputs.get("seed", 1) if seed is None else seed
        iterations = recorded.inputs.get("iterations", 1) if iterations is None else iterations
    job = build_job(job_options(locals(), save_inputs=None))
    cat = job.catalog
    if recorded.model_sha256 != cat.sha256:
        log.warning("the model changed since the search (sha256 %s... -> %s...)", recorded.model_sha256[:12], cat.sha256[:12])
    missing = cat.unknown(recorded.fp32_nodes)
    kept = frozenset(n for n in recorded.fp32_nodes if n in cat.candidates)
    oracle = job.oracle()
    verdict = oracle.evaluate(kept)
    removable: list[str] = []
    if check_minimal and verdict.passed:
        order = {n: i for i, n in enumerate(cat.candidates)}
        for n in sorted(kept, key=order.__getitem__):
            if oracle.evaluate(kept - {n}).passed:
                removable.append(n)
    job.close()

    failing = {k: r for k, r in verdict.outputs.items() if not r.passed}
    say = human_output(json_out)
    for name, r in verdict.outputs.items():
        state = "pass" if r.passed else "FAIL"
        say(f"{state} {name}: {r.stat} error needs abs {r.required_abs:.4g} / rel {r.required_rel:.4g} "
                   f"(tolerance abs {r.atol:g} / rel {r.rtol:g})" + (f"; {r.reason}" if r.reason else ""))
    if missing:
        say(f"FAIL: {len(missing)} recorded FP32 node(s) no longer exist in the model (renamed or removed): "
                   f"{', '.join(missing)}. Re-run `bisector precision` to refresh constraints.json.")
    if removable:
        say(f"NOT MINIMAL: the set still passes without {', '.join(removable)}")
    passed = verdict.passed and not missing and not removable
    summary = {
        "passed": passed, "model": str(model), "constraints": str(constraints), "fp32_nodes": sorted(kept),
        "missing_nodes": missing, "not_minimal_without": removable, "worst_input_set": verdict.worst_set,
        "failing_outputs": sorted(failing), "outputs": {k: r.to_json() for k, r in verdict.outputs.items()},
        "evaluations": oracle.total,
    }
    if json_out is not None:
        write_json(json_out, json.dumps(summary, indent=2) + "\n")
    if junit is not None:
        suite = Suite()
        suite.add_outputs(cat.path.name, summary["outputs"])
        if missing:
            from bisector.artifacts.junit import Case

            suite.cases.append(Case(cat.path.name, "constraints-nodes", False, f"nodes missing from the model: {missing}"))
        suite.write(junit)
    say("VERIFIED" if passed else "FAILED")
    raise typer.Exit(0 if passed else 1)


def _tolerance_tokens(entry) -> list[str]:
    """Recorded {"default": v, "per_output": {...}} back into flag tokens."""
    if not entry:
        return []
    tokens = [str(entry["default"])] if "default" in entry else []
    tokens += [f"{k}:{v}" for k, v in entry.get("per_output", {}).items()]
    return tokens
