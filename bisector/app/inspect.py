"""`inspect`: what the catalog sees in a model, before any search — as plain data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bisector.model.catalog import Catalog

SCHEMA_VERSION = 1


def inspect(model: str | Path) -> dict[str, Any]:
    """Candidates, pinned nodes (with reasons), the op histogram, graph inputs and outputs with shapes and
    dtypes, and the TensorRT layer name each node will have."""
    return describe(Catalog.load(Path(model)), _file_nodes(Path(model)))


def describe(cat, file_nodes: list[tuple[str, str, str]] | None = None) -> dict[str, Any]:
    """Everything `inspect` shows, as plain data. `file_nodes`: (name, op, first output) of each node as stored
    in the file, to tell names the model gave from names the catalog assigned, and to list the Constant nodes
    whose large values the catalog holds as initializers (`weights.detach`) where the file has them."""
    import onnx

    graph = cat.model.graph
    inits = {i.name for i in graph.initializer}
    # Large Constant weights are initializer stubs in the catalog: in the file, they are nodes.
    moved = [f[1] == "Constant" and f[2] in cat.weight_arrays for f in file_nodes] if file_nodes is not None else []
    given_names = [f[0] for f, m in zip(file_nodes, moved) if not m] if file_nodes is not None else None
    nodes = []
    for i, node in enumerate(graph.node):
        given = given_names[i] if given_names is not None and i < len(given_names) else node.name
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
    if any(moved):  # back in file order, indexes as in the file; a Constant node makes no TensorRT layer
        kept = iter(nodes)
        nodes = [{"index": i, "name": f[0] or f"node_of_{f[2]}", "op": "Constant", "domain": "ai.onnx",
                  "status": "skipped", "reason": None, "name_source": "model" if f[0] else "assigned",
                  "tensorrt_layer": None} if m else {**next(kept), "index": i}
                 for i, (f, m) in enumerate(zip(file_nodes, moved))]
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
        "nodes_total": len(nodes), "candidates": list(cat.candidates), "pinned": dict(cat.pinned),
        # If candidates lowered as one unit: their branches compute FP32 on emulate/ort-cuda (job.warn_unsplit_branches)
        "unsplit_branches": dict(cat.unsplit_branches),
        # recurrent candidates: emulated with FP32 math inside under the storage rules; `gpu_stepwise`: whether
        # --fp16-arithmetic gpu computes them step by step in half precision, as ORT-CUDA does (job.warn_recurrent)
        "recurrent": _recurrent(cat),
        "inputs": [io(vi) for vi in graph.input if vi.name not in inits],
        "outputs": [io(vi) for vi in graph.output],
        "op_histogram": histogram, "nodes": nodes,
        "notes": [
            "skipped: Constant, Shape and Cast nodes, ConstantOfShape nodes of a constant shape (weights, as Constants "
            "are) and nodes without a floating-point tensor; never FP16 candidates.",
            "tensorrt_layer: the name TensorRT's ONNX parser gives the node's layer; one node may become several "
            "layers whose names start with it. null where TensorRT's name cannot be known (a duplicate node name).",
        ],
    }


def _file_nodes(path: Path) -> list[tuple[str, str, str]] | None:
    from bisector.model.catalog import read_graph

    try:  # without the weights' bytes: a 604 MB model's inspect held them twice more (1.27 GB peak)
        return [(n.name, n.op_type, n.output[0] if n.output else "") for n in read_graph(path).graph.node]
    except Exception:
        return None


def trt_network(model: str | Path) -> dict[str, Any]:
    """The network as TensorRT's ONNX parser would build it (layer names predicted from its naming; no TensorRT):
    what Polygraphy's `inspect model --display-as=trt` shows."""
    from bisector.backends.trt_layers import predict_layers

    cat = Catalog.load(Path(model))
    doc = describe(cat)
    layers = [{"name": layer.name, "op": layer.op_type, "metadata": layer.metadata, "node": layer.owner,
               "inputs": list(layer.inputs), "outputs": list(layer.outputs), "pinned": cat.pinned.get(layer.owner)}
              for layer in predict_layers(cat)]
    return {"name": cat.model.graph.name, "inputs": doc["inputs"], "outputs": doc["outputs"], "layers": layers}


def inspect_data(path: str | Path) -> dict[str, Any]:
    """What a Polygraphy inputs file (a list of feed dicts), an .npz input set (--save-inputs x.npz) or a
    RunResults file holds: per iteration and runner, each array's dtype, shape and stats; runners with their
    precision (provenance)."""
    import json

    import numpy as np

    from bisector.errors import UsageError
    from bisector.model.polyjson import (decode_array, iteration_outputs, run_results_runners, runner_precision,
                                         runner_provenance)

    def describe(name: str, a: np.ndarray) -> dict[str, Any]:
        stats = ({"mean": float(np.mean(a)), "min": float(np.min(a)), "max": float(np.max(a))}
                 if a.size and a.dtype.kind in "fiub" else {})
        return {"name": name, "dtype": str(a.dtype), "shape": list(a.shape), **stats}

    if Path(path).suffix == ".npz":  # one input set, as --save-inputs writes it and --load-inputs reads it
        if not Path(path).exists():
            raise UsageError(f"file not found: {path}")
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {"kind": "inputs", "iterations": [[describe(k, npz[k]) for k in npz.files]]}
        except Exception as exc:
            raise UsageError(f"{path}: not a readable .npz ({exc})") from None
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None

    def describe_array(name: str, obj: dict) -> dict[str, Any]:
        return describe(name, decode_array(obj, f"{path}:{name}"))

    if isinstance(data, list):
        if not all(isinstance(feeds, dict) for feeds in data):
            raise UsageError(f"{path}: expected a Polygraphy input list [{{name: ndarray}}, ...]")
        return {"kind": "inputs", "iterations": [[describe_array(k, v) for k, v in feeds.items()] for feeds in data]}
    if isinstance(data, dict) and data.get("polygraphy_class") == "RunResults":
        provenance = runner_provenance(data)
        return {"kind": "outputs", "runners": [
            {"name": name, "precision": runner_precision(name, provenance),
             "iterations": [[describe_array(k, v) for k, v in iteration_outputs(it, f"{path}:{name}[{i}]").items()]
                            for i, it in enumerate(iterations)]}
            for name, iterations in run_results_runners(data, path)]}
    raise UsageError(f"{path}: neither Polygraphy inputs (a list) nor RunResults")


def _recurrent(cat: Catalog) -> dict[str, dict[str, Any]]:
    from bisector.fp16.recurrent import stepwise_missing

    gpu_missing = set(stepwise_missing(cat.nodes, cat.candidates, cat.opset, gpu=True))
    return {n: {"op": cat.nodes[n].op_type, "gpu_stepwise": n not in gpu_missing}
            for n in stepwise_missing(cat.nodes, cat.candidates, cat.opset, gpu=False)}
