"""`bisector run`: evaluate one configuration against golden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances
from bisector.cli.options import (ConstraintsIn, Fp16, Fp32Nodes, JsonOut, Model, Verbose, command, human_output,
                                  setup_logging, write_json)

MarkAll = Annotated[bool, typer.Option("--mark-all", help="Compare every intermediate tensor, with a first-divergence "
                                       "trace (emulate only).")]
SaveOutputs = Annotated[Optional[Path], typer.Option("--save-outputs", help="Save this configuration's outputs as "
                                                     "Polygraphy RunResults JSON.", rich_help_panel="Output")]


@command(Inputs, Tolerances, BackendChoice, Cache)
def run(model: Model, fp16: Fp16 = True, fp32: Fp32Nodes = None, constraints: ConstraintsIn = None,
        mark_all: MarkAll = False, save_outputs: SaveOutputs = None, json_out: JsonOut = None,
        verbose: Verbose = False, *, opts) -> None:
    """Evaluate one configuration against golden and print a Polygraphy-style comparison per output."""
    from bisector.app import api

    setup_logging(verbose)
    r = api.evaluate(model, fp32 or [], constraints=constraints, mark_all=mark_all, save_outputs=save_outputs,
                     inputs=opts[Inputs], tolerances=opts[Tolerances], backend=opts[BackendChoice], cache=opts[Cache])
    say = human_output(json_out)
    report: dict = {"passed": r.passed, "outputs": {}}
    for i, comparisons in enumerate(r.comparisons):
        say(f"Input set {i}: {len(r.plan.fp32)} FP32 node(s), {len(r.plan.fp16)} FP16 node(s)")
        for c in comparisons.values():
            say(api.format_comparison(c))
            prev = report["outputs"].get(c.name)
            if prev is None or (prev["passed"] and not c.passed):
                report["outputs"][c.name] = c.to_json()
        if mark_all:
            say(r.first_divergence[i])
    if json_out is not None:
        write_json(json_out, json.dumps(report, indent=2) + "\n")
    say("PASSED" if r.passed else "FAILED")
    raise typer.Exit(0 if r.passed else 1)
