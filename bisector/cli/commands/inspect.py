"""`bisector inspect`: what the catalog sees in a model, before any search."""

from __future__ import annotations

import json
import sys
from typing import Any

from bisector.app import api
from bisector.cli.options import JsonOut, Model, Verbose, setup_logging, write_json


def inspect(model: Model, json_out: JsonOut = None, verbose: Verbose = False) -> None:
    """List candidates and pinned nodes (with reasons), the op histogram, graph inputs and outputs with shapes
    and dtypes, and the TensorRT layer name each node will have. `--json FILE` (or `--json -` for stdout
    only) writes the same as JSON."""
    setup_logging(verbose)
    doc = api.inspect(model)
    if json_out is not None:
        write_json(json_out, json.dumps(doc, indent=2) + "\n")
    if json_out is None or str(json_out) != "-":
        _print(doc)


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, markup=False, highlight=False)
    if not console.is_terminal:
        console = Console(file=sys.stdout, width=160, markup=False, highlight=False)
    from rich.text import Text

    console.print(Text.assemble((str(doc['model']), "bold"), f"  opset {doc['opset']}, IR {doc['ir_version']}"
                  + (f", from {doc['producer']}" if doc["producer"] else "")
                  + f": {doc['nodes_total']} nodes, {len(doc['candidates'])} candidates, {len(doc['pinned'])} pinned"))

    t = Table(title="Graph inputs and outputs")
    for col in ("kind", "name", "dtype", "shape"):
        t.add_column(col)
    for kind in ("inputs", "outputs"):
        for x in doc[kind]:
            t.add_row(kind[:-1], x["name"], x["dtype"], "dynamic" if x["shape"] is None else str(x["shape"]))
    console.print(t)

    t = Table(title="Op histogram")
    for col, just in (("op", "left"), ("nodes", "right"), ("candidates", "right"), ("pinned", "right"), ("skipped", "right")):
        t.add_column(col, justify=just)
    for h in doc["op_histogram"]:
        t.add_row(h["op"], str(h["count"]), str(h["candidates"]), str(h["pinned"]), str(h["skipped"]))
    console.print(t)

    if doc["pinned"]:
        t = Table(title="Pinned nodes (kept FP32, not searched)")
        for col in ("node", "op", "reason"):
            t.add_column(col)
        ops = {n["name"]: n["op"] for n in doc["nodes"]}
        for name, reason in doc["pinned"].items():
            t.add_row(name, ops.get(name, "?"), reason)
        console.print(t)
    else:
        console.print("Pinned nodes: none")

    t = Table(title=f"Candidates in topological order ({len(doc['candidates'])})")
    for col, just in (("#", "right"), ("node", "left"), ("op", "left"), ("TensorRT layer", "left"), ("name from", "left")):
        t.add_column(col, justify=just)
    for k, n in enumerate(x for x in doc["nodes"] if x["status"] == "candidate"):
        t.add_row(str(k), n["name"], n["op"], n["tensorrt_layer"] or "(unknown)", n["name_source"])
    console.print(t)
