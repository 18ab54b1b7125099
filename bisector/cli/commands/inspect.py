"""`bisector inspect`: what the catalog sees in a model, before any search."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bisector.cli.options import JsonOut, Model, Verbose, setup_logging

SCHEMA_VERSION = 1


def inspect(model: Model, json_out: JsonOut = None, verbose: Verbose = False) -> None:
    """List candidates and pinned nodes (with reasons), the op histogram, graph inputs and outputs with shapes
    and dtypes, and the TensorRT layer name each node will have. `--json FILE` (or `--json -` for stdout
    only) writes the same as JSON."""
    from bisector.files import write_text_atomic
    from bisector.model.catalog import Catalog

    setup_logging(verbose)
    cat = Catalog.load(model)
    doc = describe(cat, _original_names(Path(model)))
    machine = json_out is not None and str(json_out) == "-"
    if json_out is not None:
        text = json.dumps(doc, indent=2) + "\n"
        if machine:
            sys.stdout.write(text)
        else:
            write_text_atomic(json_out, text)
    if not machine:
        _print(doc)


def describe(cat, original_names: list[str] | None = None) -> dict[str, Any]:
    """Everything `inspect` shows, as plain data. `original_names`: node names as stored in the file (by
    position), to tell names the model gave from names the catalog assigned."""
    import onnx

    graph = cat.model.graph
    inits = {i.name for i in graph.initializer}
    nodes = []
    for i, node in enumerate(graph.node):
        given = original_names[i] if original_names is not None and i < len(original_names) else node.name
        if given == node.name:
            source, layer = "model", node.name
        elif not given:
            # TensorRT's ONNX parser names a layer after its node, and an unnamed node `node_of_<first output>`:
            # the catalog assigns the same name, so it is the layer name too (unless it had to be made unique).
            source = "assigned"
            layer = node.name if node.output and node.name == f"node_of_{node.output[0]}" else None
        else:
            source, layer = "renamed (duplicate name in the model)", None
        status = "candidate" if node.name in cat.candidates else ("pinned" if node.name in cat.pinned else "skipped")
        nodes.append({"index": i, "name": node.name, "op": node.op_type, "domain": node.domain or "ai.onnx",
                      "status": status, "reason": cat.pinned.get(node.name), "name_source": source,
                      "tensorrt_layer": layer})
    by_op: dict[str, Counter] = {}
    for n in nodes:
        by_op.setdefault(n["op"], Counter())[n["status"]] += 1
    histogram = [{"op": op, "count": sum(c.values()), "candidates": c["candidate"], "pinned": c["pinned"],
                  "skipped": c["skipped"]} for op, c in sorted(by_op.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))]

    def io(vi) -> dict[str, Any]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim] \
            if t.HasField("shape") else None
        return {"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?",
                "shape": dims}

    return {
        "schema_version": SCHEMA_VERSION,
        "model": str(cat.path), "model_sha256": cat.sha256, "opset": cat.opset, "ir_version": cat.model.ir_version,
        "producer": " ".join(p for p in (cat.model.producer_name, cat.model.producer_version) if p) or None,
        "nodes_total": len(graph.node), "candidates": list(cat.candidates), "pinned": dict(cat.pinned),
        "inputs": [io(vi) for vi in graph.input if vi.name not in inits],
        "outputs": [io(vi) for vi in graph.output],
        "op_histogram": histogram, "nodes": nodes,
        "notes": [
            "skipped: Constant, Shape and Cast nodes and nodes without a floating-point tensor; never FP16 candidates.",
            "tensorrt_layer: the name TensorRT's ONNX parser gives the node's layer; one node may become several "
            "layers whose names start with it. null where TensorRT's name cannot be known (a duplicate node name).",
        ],
    }


def _original_names(path: Path) -> list[str] | None:
    import onnx

    try:
        return [n.name for n in onnx.load(str(path), load_external_data=False).graph.node]
    except Exception:
        return None


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
