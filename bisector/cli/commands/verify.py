"""`bisector verify`: one evaluation of a recorded constraint set — the cheap nightly check.

Flags not given default to what constraints.json recorded (tolerances, generated-input settings), so
`bisector verify model.onnx --constraints constraints.json` re-checks exactly what the search promised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances
from bisector.cli.options import (Fp16, JsonOut, JunitOut, Model, Verbose, command, human_output, setup_logging,
                                  write_json)

CheckMinimal = Annotated[bool, typer.Option("--check-minimal", help="Also try each single removal; a passing removal "
                                            "means the set is not minimal (exit 1).")]
SecondOpinion = Annotated[bool, typer.Option("--second-opinion/--no-second-opinion", help="emulate: also judge "
                                             "the set with every node run alone, not through fused blocks (a "
                                             "failure there is a warning: the set sits at the edge).")]
Recorded = Annotated[Path, typer.Option("--constraints", help="The constraints.json to check.")]


@command(Inputs, Tolerances, BackendChoice, Cache)
def verify(model: Model, constraints: Recorded, check_minimal: CheckMinimal = False,
           second_opinion: SecondOpinion = True, fp16: Fp16 = True,
           json_out: JsonOut = None, junit: JunitOut = None, verbose: Verbose = False, *, opts) -> None:
    """Check a recorded FP32 set: exit 0 if it still passes, 1 if it fails or names nodes the model lost."""
    from bisector.app import api

    setup_logging(verbose)
    r = api.verify(model, constraints, check_minimal=check_minimal, second_opinion=second_opinion,
                   backend=opts[BackendChoice], cache=opts[Cache],
                   **_given(opts))
    say = human_output(json_out)
    for name, c in r.verdict.outputs.items():
        say(f"{'pass' if c.passed else 'FAIL'} {api.one_line(name)}: {c.stat} error needs abs {c.required_abs:.4g} / rel "
            f"{c.required_rel:.4g} (tolerance abs {c.atol:g} / rel {c.rtol:g}"
            # with headroom the bar is lower than the tolerance: say so, or a FAIL within tolerance reads as a bug
            + (f", times the margin {c.margin:g}: excess {c.excess:.3g} > {c.margin:g}" if not c.passed and c.margin < 1
               and c.excess <= 1 else (f"; margin {c.margin:g}" if c.margin < 1 else "")
               # the needed abs and rel above are each output-wide maxima, while an element fails only where it
               # exceeds both: how far the output is from passing is the excess, said here (a set 4.8x past its
               # tolerance read as 6.8x from "needs abs")
               + f"; {c.excess:.3g} × the tolerance")
            + ")" + (f"; {c.reason}" if c.reason else ""))
    if r.node_by_node is not None:
        nbn = r.node_by_node
        say(f"{'pass' if nbn.passed else 'EDGE'} node by node (every node of the FP16 cone run alone, not through "
            f"fused blocks): {nbn.excess:.3g} × the tolerance"
            + ("" if nbn.passed else f" on {', '.join(map(api.one_line, sorted(nbn.failing)))}: the verdict stands, "
               "but the set sits at the edge of the tolerance (another ONNX Runtime's fusions can turn it)"))
    if r.missing_nodes:
        say(f"FAIL: {len(r.missing_nodes)} recorded FP32 node(s) no longer exist in the model (renamed or removed): "
            f"{', '.join(r.missing_nodes)}. Re-run `bisector precision` to refresh constraints.json.")
    if r.not_minimal_without:
        say(f"NOT MINIMAL: the set still passes without {', '.join(r.not_minimal_without)}")
    if json_out is not None:
        summary = {
            "passed": r.passed, "model": str(model), "constraints": str(constraints), "fp32_nodes": r.fp32_nodes,
            "missing_nodes": r.missing_nodes, "not_minimal_without": r.not_minimal_without,
            "worst_input_set": r.verdict.worst_set, "failing_outputs": sorted(r.verdict.failing),
            "outputs": {k: c.to_json() for k, c in r.verdict.outputs.items()}, "evaluations": r.evaluations,
            "node_by_node": r.node_by_node_json(),
        }
        write_json(json_out, json.dumps(summary, indent=2) + "\n")
    if junit is not None:
        suite = api.Suite()
        suite.add_outputs(Path(model).name, r.verdict.outputs)
        if r.missing_nodes:
            suite.cases.append(api.Case(Path(model).name, "constraints-nodes", False,
                                    f"nodes missing from the model: {r.missing_nodes}"))
        suite.write(junit)
    say("VERIFIED" if r.passed else "FAILED")
    raise typer.Exit(0 if r.passed else 1)


def _given(opts) -> dict:
    """Only the input and tolerance flags the user gave: the rest defaults to what the constraints recorded."""
    import dataclasses

    out = {}
    for group in (Inputs, Tolerances):
        default = group()
        for f in dataclasses.fields(group):
            value = getattr(opts[group], f.name)
            if value != getattr(default, f.name):
                out[f.name] = value
    return out
