"""`bisector inspect`: what the catalog sees in a model, before any search."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bisector.app import api
from bisector.cli.options import raw_stream, safe_table, JsonOut, Verbose, setup_logging, write_json


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
    api.check_model(model, None, command="inspect model")
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
    """Polygraphy's `inspect model --display-as=trt` layout."""
    net = api.trt_network(model)
    say = typer.echo
    say("[I] ==== TensorRT Network (predicted from the ONNX parser's naming; no TensorRT used) ====")
    say(f"    Name: {net['name']} | Explicit Batch Network")
    for kind, title in (("inputs", "Network Input(s)"), ("outputs", "Network Output(s)")):
        say("")
        say(f"    ---- {len(net[kind])} {title} ----")
        for x in net[kind]:
            say(f"    {{{x['name']} [dtype={x['dtype']}, shape={tuple(x['shape'] or ())}]}}")
    say("")
    say(f"    ---- {len(net['layers'])} Layer(s) ----")
    if mode in ("layers", "attrs", "full") or "layers" in show or "attrs" in show:
        for i, layer in enumerate(net["layers"]):
            pinned = f" (pinned FP32: {layer['pinned']})" if layer["pinned"] else ""
            say(f"    Layer {i:<4} | {layer['name']} [Op: {layer['op']}] {layer['metadata']}{pinned}")
            say(f"        {{{', '.join(layer['inputs'])}}}")
            say(f"         -> {{{', '.join(layer['outputs'])}}}")


def _print_data(path: Path) -> None:
    """Polygraphy's `inspect data`: what an inputs or outputs file holds."""
    doc = api.inspect_data(path)

    def line(a: dict) -> str:
        stats = (f" | Stats: mean={a['mean']:.5g}, min={a['min']:.5g}, max={a['max']:.5g}" if "mean" in a else "")
        return f"        {a['name']} [dtype={a['dtype']}, shape={tuple(a['shape'])}]{stats}"

    if doc["kind"] == "inputs":
        typer.echo(f"[I] ==== Data ({len(doc['iterations'])} iteration(s)) ====")
        for i, arrays in enumerate(doc["iterations"]):
            typer.echo(f"    Iteration {i}:")
            for a in arrays:
                typer.echo(line(a))
    else:
        typer.echo(f"[I] ==== Run Results ({len(doc['runners'])} runner(s)) ====")
        for r in doc["runners"]:
            typer.echo(f"    ---- {r['name']} ({len(r['iterations'])} iteration(s); precision: {r['precision']}) ----")
            for i, arrays in enumerate(r["iterations"]):
                for a in arrays:
                    typer.echo(line({**a, "name": f"[{i}] {a['name']}"}))


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(file=raw_stream(sys.stdout), markup=False, highlight=False)
    if not console.is_terminal:
        console = Console(file=raw_stream(sys.stdout), width=160, markup=False, highlight=False)
    from rich.text import Text

    from bisector.cli.options import plain

    console.print(Text.assemble((plain(str(doc['model'])), "bold"), f"  opset {doc['opset']}, IR {doc['ir_version']}"
                  + (f", from {doc['producer']}" if doc["producer"] else "")
                  + f": {doc['nodes_total']} nodes, {len(doc['candidates'])} candidates, {len(doc['pinned'])} pinned"))

    t = safe_table(title="Graph inputs and outputs")
    for col in ("kind", "name", "dtype", "shape"):
        t.add_column(col)
    for kind in ("inputs", "outputs"):
        for x in doc[kind]:
            t.add_row(kind[:-1], x["name"], x["dtype"], "dynamic" if x["shape"] is None else str(x["shape"]))
    console.print(t)

    t = safe_table(title="Op histogram")
    for col, just in (("op", "left"), ("nodes", "right"), ("candidates", "right"), ("pinned", "right"), ("skipped", "right")):
        t.add_column(col, justify=just)
    for h in doc["op_histogram"]:
        t.add_row(h["op"], str(h["count"]), str(h["candidates"]), str(h["pinned"]), str(h["skipped"]))
    console.print(t)

    if doc["pinned"]:
        t = safe_table(title="Pinned nodes (kept FP32, not searched)")
        for col in ("node", "op", "reason"):
            t.add_column(col)
        ops = {n["name"]: n["op"] for n in doc["nodes"]}
        for name, reason in doc["pinned"].items():
            t.add_row(name, ops.get(name, "?"), reason)
        console.print(t)
    else:
        console.print("Pinned nodes: none")
    if doc.get("unsplit_branches"):
        console.print("If nodes searched as one unit (their branches compute FP32 on emulate and ort-cuda; FP16 "
                      "inside them is judged only by --backend tensorrt): "
                      + ", ".join(f"{api.one_line(n)} ({k} nodes inside)" for n, k in doc["unsplit_branches"].items()),
                      markup=False, highlight=False, soft_wrap=True)
    if doc.get("recurrent"):
        console.print("Recurrent nodes (emulated with FP32 math inside; ORT-CUDA computes each step in half precision, "
                      "as --fp16-arithmetic gpu does for the forms marked 'gpu: step by step'): "
                      + ", ".join(f"{api.one_line(n)} ({r['op']}; gpu: {'step by step' if r['gpu_stepwise'] else 'not modelled'})"
                                  for n, r in doc["recurrent"].items()),
                      markup=False, highlight=False, soft_wrap=True)

    t = safe_table(title=f"Candidates in topological order ({len(doc['candidates'])})")
    for col, just in (("#", "right"), ("node", "left"), ("op", "left"), ("TensorRT layer", "left"), ("name from", "left")):
        t.add_column(col, justify=just)
    for k, n in enumerate(x for x in doc["nodes"] if x["status"] == "candidate"):
        t.add_row(str(k), n["name"], n["op"], n["tensorrt_layer"] or "(unknown)", n["name_source"])
    console.print(t)
