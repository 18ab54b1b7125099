"""`bisector profile`: a per-node FP16 sensitivity score for every candidate, without a search."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector.cli.options import (
    Atol,
    CacheDir,
    ErrorQuantile,
    ErrorStat,
    Fp16,
    InputShapes,
    Iterations,
    JsonOut,
    LoadInputs,
    LoadOutputs,
    Model,
    NoCache,
    Rtol,
    SaveInputs,
    Seed,
    ValRange,
    Verbose,
    job_options,
    setup_logging,
)
from bisector.errors import UsageError

log = logging.getLogger("bisector")


def profile(
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
    fp32: Annotated[Optional[list[str]], typer.Option("--fp32", help="Nodes of a plan to highlight and whose output errors to plot (space-separated).")] = None,
    constraints: Annotated[Optional[Path], typer.Option("--constraints", help="Highlight the fp32_nodes of a constraints.json and plot that plan's output errors (default plan: all FP16).")] = None,
    top: Annotated[int, typer.Option("--top", help="Rows of the table printed (all are in profile.json).")] = 15,
    threads: Annotated[int, typer.Option("--threads", help="ORT threads per node session (1 is fastest for small nodes; 0 = ORT's default).")] = 1,
    png: Annotated[bool, typer.Option("--png/--no-png", help="Write profile.png.")] = True,
    output_dir: Annotated[Path, typer.Option("-o", "--output-dir", help="Where to write profile.json and profile.png.")] = Path("bisector_out"),
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    json_out: JsonOut = None,
    verbose: Verbose = False,
) -> None:
    """Score every candidate node's FP16 sensitivity without a search (one run per node and per consumer edge) and
    write profile.json (sorted, highest first; use it as `precision --scores`) and profile.png.

    A node's score is the larger of its local error (it alone runs FP16 on golden FP32 inputs) and the error
    of its consumers running FP32 on its FP16 output, in units of the tolerance (> 1: that tensor alone would
    fail the check). Needs the emulate backend."""
    from bisector.artifacts.constraints import Constraints
    from bisector.files import ensure_dir, write_text_atomic
    from bisector.compare import compare_outputs
    from bisector.fp16.plan import Plan
    from bisector.sensitivity import compute_scores, profile_document, write_profile
    from bisector.app.job import build_job

    setup_logging(verbose)
    if top < 0:
        raise UsageError(f"--top {top}: must be 0 or more")
    if threads < 0:
        raise UsageError(f"--threads {threads}: must be 0 or more")
    ensure_dir(output_dir)
    t0 = time.perf_counter()
    job = build_job(job_options(locals(), backend="emulate", backend_options={"threads": threads}))
    try:
        cat = job.catalog
        wanted = list(fp32 or [])
        if constraints is not None:
            wanted += Constraints.read(constraints).fp32_nodes
        unknown = cat.unknown(wanted)
        if unknown:
            raise UsageError(f"--fp32/--constraints name node(s) not in the model: {unknown}")
        highlight = frozenset(n for n in wanted if n in cat.candidates)
        t1 = time.perf_counter()
        for feeds in job.feeds_list:
            job.backend.reference(feeds)  # FP32 reference, node by node (builds the per-node sessions)
        t2 = time.perf_counter()
        nodes = compute_scores(cat, job.backend, job.feeds_list, job.tolerance)
        t3 = time.perf_counter()
        plan = Plan(highlight, cat.candidates)
        errors: dict[str, list] = {}
        plan_outputs: dict[str, dict] = {}
        passed = True
        for feeds, golden in zip(job.feeds_list, job.golden.outputs):
            results = compare_outputs(job.backend.run(plan, feeds, list(golden)), golden, job.tolerance, keep_diff=True)
            for name, r in results.items():
                errors.setdefault(name, []).append(r.absdiff.ravel())
                passed &= r.passed
                if name not in plan_outputs or (plan_outputs[name]["passed"] and not r.passed):
                    plan_outputs[name] = r.to_json()
        t4 = time.perf_counter()
    finally:
        job.close()
    import numpy as np

    output_errors = {k: np.concatenate(v) for k, v in errors.items()}
    timings = {"setup": t1 - t0, "reference": t2 - t1, "scores": t3 - t2, "plan": t4 - t3}
    meta = {
        "model": str(model), "model_sha256": cat.sha256, "tolerances": job.tolerance.describe(),
        "inputs": job.inputs_info, "candidates": len(cat.candidates), "pinned": cat.pinned,
        "plan": {"fp32_nodes": sorted(highlight), "passed": bool(passed), "outputs": plan_outputs},
        "timings": timings,
    }
    out = Path(output_dir)
    json_path = write_profile(out / "profile.json", nodes, meta)
    png_path = None
    if png:
        from bisector.artifacts.plot import render_profile_png

        png_path = render_profile_png(
            nodes, highlight, out / "profile.png", output_errors,
            title=f"{cat.path.name}: FP16 sensitivity per node ({len(nodes)} candidates; "
                  f"{'plan with ' + str(len(highlight)) + ' FP32' if highlight else 'errors: all-FP16 plan'})",
            tolerance={k: job.tolerance.atol.get(k) for k in output_errors},
        )
    machine = json_out is not None and str(json_out) == "-"
    if json_out is not None:
        doc = json.dumps(profile_document(nodes, meta), indent=2, allow_nan=False) + "\n"
        if machine:
            sys.stdout.write(doc)
        else:
            write_text_atomic(json_out, doc)
    if not machine:
        _print_table(nodes, highlight, top)
        typer.echo(f"profile: {len(nodes)} candidates scored in {timings['reference'] + timings['scores']:.2f}s "
                   f"(reference {timings['reference']:.2f}s, scores {timings['scores']:.2f}s); "
                   f"{json_path}" + (f", {png_path}" if png_path else ""))


def _print_table(nodes: list[dict], highlight: frozenset[str], top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"FP16 sensitivity, top {min(top, len(nodes))} of {len(nodes)} (score > 1: fails on its own)")
    for col, just in (("rank", "right"), ("node", "left"), ("FP32", "center"), ("op", "left"), ("score", "right"), ("local", "right"),
                      ("downstream (via)", "left"), ("overflow", "right"), ("underflow", "right"), ("NaN", "right")):
        table.add_column(col, justify=just)
    for r in nodes[:top]:
        style = "bold red" if r["score"] > 1 else None
        via = f"{r['downstream']:.3g}" + (f" ({r['via']})" if r["via"] else "")
        table.add_row(str(r["rank"]), r["name"], "yes" if r["name"] in highlight else "", r["op"], f"{r['score']:.3g}", f"{r['local']:.3g}", via,
                      str(r["overflow"]), str(r["underflow"]), str(r["nan"]), style=style)
    console = Console(file=sys.stdout)
    if not console.is_terminal:
        console = Console(file=sys.stdout, width=160)
    console.print(table)
