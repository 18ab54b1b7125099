"""`bisector run`: evaluate one configuration against golden — or, with Polygraphy's runners (`--onnxrt`, `--trt`),
run and compare them as `polygraphy run` does."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector.app.options import (BackendChoice, Cache, Comparison, Inputs, PolyLogging, Runners, Tolerances,
                                  TrtBuilder)
from bisector.cli.options import (ConstraintsIn, Fp32Nodes, JsonOut, Model, Verbose, command, human_output,
                                  setup_logging, write_json)

MarkAll = Annotated[bool, typer.Option("--mark-all", help="Compare every intermediate tensor, with a first-divergence "
                                       "trace (emulate only).")]
SaveOutputs = Annotated[Optional[Path], typer.Option("--save-outputs", "--save-results",
                                                     help="Save the outputs as Polygraphy RunResults JSON: one runner "
                                                     "each (onnxrt-runner-N0-… = FP32 golden, trt-runner-N0-… = the "
                                                     "plan), with their provenance.", rich_help_panel="Output")]
Fp16Opt = Annotated[Optional[bool], typer.Option("--fp16", help="FP16 for the layers not kept FP32 (with --trt: as "
                                                 "in TensorRT, without it the --trt runner builds FP32; without "
                                                 "runners FP16 is the default).", rich_help_panel="Runners (Polygraphy)",
                                                 show_default=False)]


@command(Inputs, Tolerances, BackendChoice, Cache, Runners, Comparison, TrtBuilder, PolyLogging)
def run(model: Model, fp16: Fp16Opt = None, fp32: Fp32Nodes = None, constraints: ConstraintsIn = None,
        mark_all: MarkAll = False, save_outputs: SaveOutputs = None, json_out: JsonOut = None,
        verbose: Verbose = False, *, opts) -> None:
    """Evaluate one configuration against golden and print a Polygraphy-style comparison per output.

    With `--onnxrt` and/or `--trt` it is Polygraphy's `run`: `--onnxrt` runs the FP32 reference, `--trt` the
    reduced-precision runner on --backend (FP32 unless --fp16/--bf16); with both they are compared."""
    from bisector.cli.argv import current_argv

    setup_logging(verbose)
    opts[PolyLogging].apply()
    runners: Runners = opts[Runners]
    started = time.perf_counter()
    if runners.gen_script is not None:
        _gen_script(runners.gen_script)
        return
    from bisector.app import api

    api.check_model(Path(model), runners.model_type)
    if runners.onnxrt or runners.trt:
        _polyrun(model, fp16, fp32, constraints, save_outputs, json_out, opts, started, current_argv())
    _evaluate(model, fp16, fp32, constraints, mark_all, save_outputs, json_out, opts)


def _evaluate(model, fp16, fp32, constraints, mark_all, save_outputs, json_out, opts) -> None:
    from bisector.app import api

    runners: Runners = opts[Runners]
    given = {f.metadata["flags"][0] for f in dataclasses.fields(Comparison)
             if f.name != "fail_fast" and getattr(opts[Comparison], f.name) != getattr(Comparison(), f.name)}
    if given:
        from bisector.errors import UsageError

        raise UsageError(f"{', '.join(sorted(given))}: Polygraphy comparison option(s) of the --trt/--onnxrt "
                         f"runners; add --trt (and --onnxrt, or --load-outputs, to compare against)")
    wanted = list(fp32 or [])
    if runners.layer_precisions or runners.trt_npps or runners.bf16:
        from bisector.errors import UsageError

        if runners.bf16:
            raise UsageError("--bf16 applies to the --trt runner: add --trt (and --onnxrt to compare)")
        wanted += sorted(api.fp32_from_flags(model, [], None, runners, "fp16"))
    r = api.evaluate(model, wanted, constraints=constraints, mark_all=mark_all or runners.trt_outputs == ["*"],
                     save_outputs=save_outputs, inputs=opts[Inputs], tolerances=opts[Tolerances],
                     backend=opts[BackendChoice], cache=opts[Cache])
    say = human_output(json_out)
    report: dict = {"passed": r.passed, "outputs": {}}
    for i, comparisons in enumerate(r.comparisons):
        say(f"Input set {i}: {len(r.plan.fp32)} FP32 node(s), {len(r.plan.fp16)} FP16 node(s)")
        for c in comparisons.values():
            say(api.format_comparison(c))
            prev = report["outputs"].get(c.name)
            if prev is None or (prev["passed"] and not c.passed):
                report["outputs"][c.name] = c.to_json()
        if r.first_divergence:
            say(r.first_divergence[i])
    if json_out is not None:
        write_json(json_out, json.dumps(report, indent=2) + "\n")
    say("PASSED" if r.passed else "FAILED")
    raise typer.Exit(0 if r.passed else 1)


def _polyrun(model, fp16, fp32, constraints, save_outputs, json_out, opts, started, argv) -> None:
    from bisector.app import api

    runners: Runners = opts[Runners]
    precision = "bf16" if runners.bf16 else ("fp16" if fp16 else None)
    r = api.polyrun(model, fp32 or [], constraints=constraints, precision=precision, runners=runners,
                comparison=opts[Comparison], trt_builder=opts[TrtBuilder], save_outputs=save_outputs,
                inputs=opts[Inputs], tolerances=opts[Tolerances], backend=opts[BackendChoice], cache=opts[Cache])
    say = human_output(json_out)
    shown = "bisector " + " ".join(argv) if argv else "bisector run"
    say(f"[I] RUNNING | Command: {shown}")
    for line in r.report:
        say(line)
    runtime = time.perf_counter() - started
    say(f"[{'I' if r.passed else 'E'}] {'PASSED' if r.passed else 'FAILED'} | Runtime: {runtime:.3f}s | "
        f"Command: {shown}")
    if json_out is not None:
        doc = {"passed": r.passed, "runners": [{"name": x.name, "precision": x.precision, **x.provenance}
                                              for x in r.runners],
               "comparisons": [{"runner": p.runner, "reference": p.reference, "passed": p.passed,
                                "iterations": [{k: c.to_json() for k, c in it.items()} for it in p.iterations]}
                               for p in r.pairs],
               "invalid": r.invalid, "no_effect": r.no_effect}
        write_json(json_out, json.dumps(doc, indent=2, default=str) + "\n")
    raise typer.Exit(0 if r.passed else 1)


def _gen_script(path: Path) -> None:
    """Polygraphy's --gen-script: a Python script that reproduces this run, written instead of running."""
    from bisector.app import api
    from bisector.cli.argv import current_argv

    api.gen_script(path, current_argv())
    typer.echo(f"[I] Writing script to: {path}")
