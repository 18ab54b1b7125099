"""`bisector precision`: the search."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bisector.app.options import BackendChoice, Cache, Inputs, Search, Tolerances
from bisector.cli.options import Fp16, JsonOut, JunitOut, Model, Verbose, command, human_output, setup_logging, write_json

Progress = Annotated[bool, typer.Option("--progress/--no-progress", rich_help_panel="Output",
                                        help="Live progress on stderr when it is a terminal (plain lines otherwise).")]
Plot = Annotated[bool, typer.Option("--plot/--no-plot", rich_help_panel="Output",
                                    help="Also write profile.json/profile.png (per-node sensitivity, final FP32 nodes, "
                                         "output error histograms; emulate). Costs a sensitivity profile.")]
Mixed = Annotated[bool, typer.Option("--mixed/--no-mixed", rich_help_panel="Output",
                                     help="Write model.mixed.onnx (default). Its cost grows with the weights: on a "
                                          "3-evaluation search a fifth of the time at 226 MB of weights, two "
                                          "thirds at 1.27 GB.")]
OutputDir = Annotated[Path, typer.Option("-o", "--output-dir", help="Where to write the artifacts.", rich_help_panel="Output")]


@command(Inputs, Tolerances, BackendChoice, Search, Cache)
def precision(model: Model, fp16: Fp16 = True, output_dir: OutputDir = Path("bisector_out"), plot: Plot = False,
              mixed: Mixed = True, progress: Progress = True, json_out: JsonOut = None, junit: JunitOut = None,
              verbose: Verbose = False, *, opts) -> None:
    """Search the minimal set of nodes to keep in FP32 and write constraints.json, add_constraints.py,
    model.mixed.onnx, layer-precision strings and report.md."""
    from bisector.app import api
    from bisector.cli.progress import SearchProgress

    from bisector.cli.options import refuse_outputs_onto

    setup_logging(verbose)
    refuse_outputs_onto(model, json=json_out, junit=junit, save_inputs=opts[Inputs].save_inputs)  # before the search
    s = opts[Search]
    display = SearchProgress(live=None if progress else False, max_evals=s.max_evals, time_limit=s.time_limit)
    r = api.precision(model, output_dir=output_dir, plot=plot, mixed=mixed, progress=display, inputs=opts[Inputs],
                      tolerances=opts[Tolerances], backend=opts[BackendChoice], cache=opts[Cache], search=s)
    c = r.constraints
    if json_out is not None:
        write_json(json_out, c.model_dump_json(indent=2) + "\n")
    if junit is not None:
        suite = api.Suite()
        suite.add_outputs(Path(model).name, r.verdict.outputs, c.timings.get("search", 0.0))
        suite.write(junit)
    say = human_output(json_out)
    names = ' '.join(api.one_line(n) for n in r.fp32_nodes)  # one name never looks like two
    say(f"FP32 nodes ({len(r.fp32_nodes)}): {names or '(none)'}")
    headroom = "" if c.headroom is None else f"; headroom {c.headroom:.0%} of the tolerance"
    nbn = c.node_by_node or {}
    if nbn.get("extended"):  # the warning scrolled away as well
        headroom += "; extended to pass node by node too (report.md)"
    elif nbn and not nbn.get("passed"):
        headroom += "; fails with every node run alone: at the edge of the tolerance (report.md)"
    held = c.held_out or {}
    if held.get("grown"):
        headroom += f"; searched on {held.get('searched_input_sets')} input sets (--grow-inputs)"
    if held.get("passed") is False:
        headroom += (f"; fails on {held.get('failed_sets')} of {held.get('input_sets')} held-out input set(s): fitted "
                     "to the searched inputs (report.md)")
    elif held.get("grown") and held.get("passed") is None:
        headroom += "; not judged on held-out inputs after it grew (report.md)"
    if c.unjudged_branches:  # the warning at the start scrolled away: the verdict's scope goes with it
        headroom += f"; FP16 inside the branches of {len(c.unjudged_branches)} If node(s) not judged (report.md)"
    say(f"{'PASSED' if r.passed else 'FAILED'}; {'1-minimal' if r.minimal else 'not proven minimal'}; "
        f"{c.evaluations.total} evaluations ({c.evaluations.new} new, {c.evaluations.cached} cached){headroom}; "
        f"artifacts in {output_dir}")
    raise typer.Exit(0 if r.passed else 1)
