"""`bisector profile`: a per-node FP16 sensitivity score for every candidate, without a search."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from bisector.app.options import Cache, Inputs, Tolerances
from bisector.cli.options import (raw_stream, safe_table, ConstraintsIn, Fp16, Fp32Nodes, JsonOut, Model, Verbose, command, setup_logging,
                                  write_json)
from bisector.errors import UsageError

Top = Annotated[int, typer.Option("--top", help="Rows of the table printed (all are in profile.json).")]
Threads = Annotated[int, typer.Option("--threads", help="ORT threads per node session where sessions keep pools of "
                                      "their own (BISECTOR_SHARED_POOL=0; 1 is fastest for small nodes; 0 = ORT's "
                                      "default). By default the command's sessions share one pool of the usable "
                                      "cores, and this is not used.")]
Png = Annotated[bool, typer.Option("--png/--no-png", help="Write profile.png.", rich_help_panel="Output")]
OutputDir = Annotated[Path, typer.Option("-o", "--output-dir", help="Where to write profile.json and profile.png.",
                                         rich_help_panel="Output")]


@command(Inputs, Tolerances, Cache)
def profile(model: Model, fp16: Fp16 = True, fp32: Fp32Nodes = None, constraints: ConstraintsIn = None, top: Top = 15,
            threads: Threads = 1, png: Png = True, output_dir: OutputDir = Path("bisector_out"),
            json_out: JsonOut = None, verbose: Verbose = False, *, opts) -> None:
    """Score every candidate node's FP16 sensitivity without a search (one run per node and per consumer edge) and
    write profile.json (sorted, highest first; use it as `precision --scores`) and profile.png.

    A node's score is the larger of its local error (it alone runs FP16 on golden FP32 inputs) and the error
    of its consumers running FP32 on its FP16 output, in units of the tolerance (> 1: that tensor alone would
    fail the check). Needs the emulate backend."""
    from bisector.app import api

    setup_logging(verbose)
    if top < 0:
        raise UsageError(f"--top {top}: must be 0 or more")
    r = api.profile(model, fp32 or [], constraints=constraints, output_dir=output_dir, png=png, threads=threads,
                    inputs=opts[Inputs], tolerances=opts[Tolerances], cache=opts[Cache])
    if json_out is not None:
        write_json(json_out, json.dumps(api.profile_document(r.nodes, r.meta), indent=2, allow_nan=False) + "\n")
    if json_out is None or str(json_out) != "-":
        _print_table(r.nodes, r.highlight, top)
        t = r.meta["timings"]
        typer.echo(f"profile: {len(r.nodes)} candidates scored in {t['reference'] + t['scores']:.2f}s "
                   f"(reference {t['reference']:.2f}s, scores {t['scores']:.2f}s); "
                   + ", ".join(str(p) for p in r.files.values()))


def _print_table(nodes: list[dict], highlight: frozenset[str], top: int) -> None:
    from rich.console import Console

    table = safe_table(title=f"FP16 sensitivity, top {min(top, len(nodes))} of {len(nodes)} (score > 1: fails on its own)")
    for col, just in (("rank", "right"), ("node", "left"), ("FP32", "center"), ("op", "left"), ("score", "right"), ("local", "right"),
                      ("downstream (via)", "left"), ("overflow", "right"), ("underflow", "right"), ("NaN", "right")):
        table.add_column(col, justify=just)
    for r in nodes[:top]:
        style = "bold red" if r["score"] > 1 else None
        via = f"{r['downstream']:.3g}" + (f" ({r['via']})" if r["via"] else "")
        table.add_row(str(r["rank"]), r["name"], "yes" if r["name"] in highlight else "", r["op"], f"{r['score']:.3g}", f"{r['local']:.3g}", via,
                      str(r["overflow"]), str(r["underflow"]), str(r["nan"]), style=style)
    console = Console(file=raw_stream(sys.stdout), markup=False, highlight=False)
    if not console.is_terminal:
        console = Console(file=raw_stream(sys.stdout), width=160, markup=False, highlight=False)
    console.print(table)
