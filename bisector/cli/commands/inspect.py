"""`bisector inspect`: what the catalog sees in a model, before any search."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bisector.app import api
from bisector.cli.options import JsonOut, Model, Verbose, setup_logging, write_json


def inspect(
    what: Annotated[str, typer.Argument(help="The ONNX model; or `model FILE` / `data FILE` as in Polygraphy.",
                                        show_default=False)],
    path: Annotated[Optional[Path], typer.Argument(help="With `model`/`data`: the file.", show_default=False)] = None,
    mode: Annotated[Optional[str], typer.Option("--mode", help="Polygraphy's (deprecated) detail level: none, basic, "
                                                "layers, attrs, full.")] = None,
    show: Annotated[Optional[list[str]], typer.Option("--show", help="Polygraphy's: layers, attrs, weights.")] = None,
    display_as: Annotated[Optional[str], typer.Option("--display-as", help="trt: list the layers as TensorRT's ONNX "
                                                      "parser names them.")] = None,
    json_out: JsonOut = None, verbose: Verbose = False,
) -> None:
    """List candidates and pinned nodes (with reasons), the op histogram, graph inputs and outputs with shapes
    and dtypes, and the TensorRT layer name each node will have. `--json FILE` (or `--json -` for stdout
    only) writes the same as JSON. Polygraphy's forms work too: `inspect model FILE [--display-as trt]`,
    `inspect data FILE` (inputs or outputs saved with --save-inputs/--save-outputs)."""
    from bisector.app.polyrun import check_model
    from bisector.errors import UsageError

    setup_logging(verbose)
    if what in ("model", "data") and path is not None:
        kind, model = what, path
    elif path is not None:
        raise UsageError(f"inspect {what} {path}: expected `inspect MODEL`, `inspect model FILE` or `inspect data FILE`")
    else:
        kind, model = "model", Path(what)
    if kind == "data":
        _print_data(model)
        return
    check_model(model, None, command="inspect model")
    if display_as not in (None, "onnx", "trt"):
        raise UsageError(f"--display-as {display_as!r}: choose onnx or trt")
    if mode not in (None, "none", "basic", "layers", "attrs", "full"):
        raise UsageError(f"--mode {mode!r}: choose none, basic, layers, attrs or full")
    doc = api.inspect(model)
    if json_out is not None:
        write_json(json_out, json.dumps(doc, indent=2) + "\n")
    if json_out is None or str(json_out) != "-":
        if display_as == "trt":
            _print_trt(model, mode, show or [])
        else:
            _print(doc)


def _print_trt(model: Path, mode: Optional[str], show: list[str]) -> None:
    """The network as TensorRT's ONNX parser would build it: Polygraphy's `inspect model --display-as=trt`."""
    from bisector.backends.trt_layers import predict_layers
    from bisector.model.catalog import Catalog

    cat = Catalog.load(model)
    layers = predict_layers(cat)
    doc = api.inspect(model)
    typer.echo(f"[I] ==== TensorRT Network (predicted from the ONNX parser's naming; no TensorRT used) ====")
    typer.echo(f"    Name: {cat.model.graph.name} | Explicit Batch Network")
    typer.echo("")
    typer.echo(f"    ---- {len(doc['inputs'])} Network Input(s) ----")
    for x in doc["inputs"]:
        typer.echo(f"    {{{x['name']} [dtype={x['dtype']}, shape={tuple(x['shape'] or ())}]}}")
    typer.echo("")
    typer.echo(f"    ---- {len(doc['outputs'])} Network Output(s) ----")
    for x in doc["outputs"]:
        typer.echo(f"    {{{x['name']} [dtype={x['dtype']}, shape={tuple(x['shape'] or ())}]}}")
    typer.echo("")
    typer.echo(f"    ---- {len(layers)} Layer(s) ----")
    detail = mode in ("layers", "attrs", "full") or "layers" in show or "attrs" in show
    if detail:
        for i, layer in enumerate(layers):
            pinned = " (pinned FP32: " + cat.pinned[layer.owner] + ")" if layer.owner in cat.pinned else ""
            typer.echo(f"    Layer {i:<4} | {layer.name} [Op: {layer.op_type}] {layer.metadata}{pinned}")
            typer.echo(f"        {{{', '.join(layer.inputs)}}}")
            typer.echo(f"         -> {{{', '.join(layer.outputs)}}}")


def _print_data(path: Path) -> None:
    """Polygraphy's `inspect data`: what an inputs or outputs file holds."""
    import json as _json

    import numpy as np

    from bisector.model.polyjson import decode_array
    from bisector.errors import UsageError

    try:
        data = _json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None

    def line(name: str, obj: dict) -> str:
        a = decode_array(obj, f"{path}:{name}")
        stats = (f" | Stats: mean={float(np.mean(a)):.5g}, min={float(np.min(a)):.5g}, max={float(np.max(a)):.5g}"
                 if a.size and a.dtype.kind in "fiub" else "")
        return f"        {name} [dtype={a.dtype}, shape={a.shape}]{stats}"

    if isinstance(data, list):
        typer.echo(f"[I] ==== Data ({len(data)} iteration(s)) ====")
        for i, feeds in enumerate(data):
            typer.echo(f"    Iteration {i}:")
            for k, v in feeds.items():
                typer.echo(line(k, v))
    elif isinstance(data, dict) and data.get("polygraphy_class") == "RunResults":
        provenance = (data.get("bisector") or {}).get("runners", {})
        typer.echo(f"[I] ==== Run Results ({len(data['lst'])} runner(s)) ====")
        from bisector.model.polyjson import runner_precision

        for name, iterations in data["lst"]:
            typer.echo(f"    ---- {name} ({len(iterations)} iteration(s); precision: "
                       f"{runner_precision(name, provenance)}) ----")
            for i, it in enumerate(iterations):
                for k, v in it.get("outputs", {}).items():
                    typer.echo(line(f"[{i}] {k}", v))
    else:
        raise UsageError(f"{path}: neither Polygraphy inputs (a list) nor RunResults")


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout)
    if not console.is_terminal:
        console = Console(file=sys.stdout, width=160)
    console.print(f"[bold]{doc['model']}[/bold]  opset {doc['opset']}, IR {doc['ir_version']}"
                  + (f", from {doc['producer']}" if doc["producer"] else "")
                  + f": {doc['nodes_total']} nodes, {len(doc['candidates'])} candidates, {len(doc['pinned'])} pinned")

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
