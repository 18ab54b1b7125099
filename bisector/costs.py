"""Estimated FP32 cost per node (the ``costs`` hint of the search strategies).

    node_costs(model) -> {node name: cost}

Keeping a node in FP32 costs roughly what it computes, so a node's cost is an operation count from its op type
and its tensor sizes (shapes from ``onnx.shape_inference``):

- MatMul / Gemm / MatMulInteger / FusedMatMul: multiply-accumulates, (batch ·) M · K · N;
- Conv / ConvTranspose: output elements × (input channels / group) × kernel area;
- Attention-like and reductions (Softmax, LayerNormalization, Reduce*, pooling): input elements (times the
  kernel area for pooling);
- everything else (elementwise, data movement, ...): output elements (input elements when the output shape is
  unknown).

Fallback: a tensor whose shape (or a dimension of it) is unknown counts as ``UNKNOWN_ELEMENTS`` elements per
unknown dimension product — 1 for an unknown dimension inside a known rank, ``UNKNOWN_ELEMENTS`` for a tensor of
unknown rank — and every node costs at least 1, so no node is free. Costs are relative (only ratios matter to
the strategies).

Node names follow the catalog's rule: the node's name, or ``node_of_<first output>`` for an unnamed node (with
``_1``, ``_2``, ... appended to repeated names, in graph order), so they match the candidates' names.
"""

from __future__ import annotations

import math

import onnx
from onnx import shape_inference

from bisector.model.graph import unique_node_names, weightless_copy

__all__ = ["node_costs", "UNKNOWN_ELEMENTS"]

UNKNOWN_ELEMENTS = 1024.0  # elements assumed for a tensor of unknown shape

_MATMUL = {"MatMul", "MatMulInteger", "FusedMatMul", "QLinearMatMul"}
_CONV = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"}
_POOL = {"MaxPool", "AveragePool", "LpPool"}
_BY_INPUT = {"Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization", "BatchNormalization",
             "GroupNormalization", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
             "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "GlobalAveragePool", "GlobalMaxPool",
             "CumSum", "TopK", "ArgMax", "ArgMin"}


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | None] | None]:
    try:
        # without the weight bytes: inference serialises its model and parses the result (2 more copies of
        # every weight: 1.27 GB of weights peaked the search at 8 GB)
        inferred = shape_inference.infer_shapes(weightless_copy(model))
    except Exception:  # a model shape inference cannot handle: fall back to what the model declares
        inferred = model
    g = inferred.graph
    out: dict[str, list[int | None] | None] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if t is None or not t.HasField("shape"):
            out.setdefault(vi.name, None)
            continue
        out[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]
    for init in g.initializer:
        out[init.name] = list(init.dims)
    return out


def _elements(shape: list[int | None] | None) -> float:
    if shape is None:
        return UNKNOWN_ELEMENTS
    return float(math.prod(d if d is not None else 1 for d in shape)) if shape else 1.0


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _cost(node: onnx.NodeProto, shapes: dict[str, list[int | None] | None]) -> float:
    def shape(i: int, outputs: bool = False) -> list[int | None] | None:
        names = node.output if outputs else node.input
        return shapes.get(names[i]) if i < len(names) and names[i] else None

    op = node.op_type
    out = shape(0, outputs=True)
    if op in _MATMUL:
        a, b = shape(0), shape(1)
        if a and b and out:
            k = a[-1] if a[-1] is not None else (b[-2] if len(b) >= 2 else None)
            return max(1.0, _elements(out) * (k or 1))
        return max(1.0, _elements(out) * 64)  # unknown inner dimension: a guess
    if op == "Gemm":
        a = shape(0)
        if a and len(a) == 2 and out:
            k = a[0] if _attr(node, "transA", 0) else a[1]
            return max(1.0, _elements(out) * (k or 1))
        return max(1.0, _elements(out) * 64)
    if op in _CONV:
        w = shape(1)
        if w and out and len(w) >= 3:
            per_output = float(math.prod(d or 1 for d in w[1:]))  # (C_in / group) · kernel area
            if op == "ConvTranspose":
                x = shape(0)
                return max(1.0, _elements(x) * float(math.prod(d or 1 for d in w[1:])))
            return max(1.0, _elements(out) * per_output)
        return max(1.0, _elements(out) * 9)
    if op in _POOL:
        kernel = _attr(node, "kernel_shape", [1])
        return max(1.0, _elements(out) * float(math.prod(kernel)))
    if op in _BY_INPUT:
        return max(1.0, _elements(shape(0)))
    if out is None and node.input:
        return max(1.0, _elements(shape(0)))
    return max(1.0, _elements(out))


def node_costs(model: onnx.ModelProto) -> dict[str, float]:
    """Estimated FP32 cost of every top-level node of ``model``, by node name (see the module docstring)."""
    shapes = _shapes(model)
    nodes = list(model.graph.node)
    return {name: _cost(node, shapes) for name, node in zip(unique_node_names(nodes), nodes)}
