"""What each ONNX operator's inputs are: data that an FP16 layer stores in FP16, or parameters that it never rounds.

DESIGN §4: shapes, indices, scales, bounds and counts are parameters. Integer-typed parameters are safe anyway
(only float tensors are ever rounded); this table matters for the float-typed ones (Resize scales, Clip bounds,
Range, thresholds) and for telling shape computations apart from data (catalog pinning).
"""

from __future__ import annotations

from functools import lru_cache

import onnx
from onnx import defs

_REDUCE_OPS = (
    "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp "
    "ReduceSumSquare"
).split()

PARAMETER_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Pad": frozenset({1, 3}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "Range": frozenset({0, 1, 2}),
    "TopK": frozenset({1}),
    "Clip": frozenset({1, 2}),
    "Tile": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Split": frozenset({1}),
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "GatherND": frozenset({1}),
    "ScatterND": frozenset({1}),
    "ScatterElements": frozenset({1}),
    "Scatter": frozenset({1}),
    "OneHot": frozenset({1}),
    "CumSum": frozenset({1}),
    "Dropout": frozenset({1, 2}),
    "NonMaxSuppression": frozenset({2, 3, 4}),
    "Trilu": frozenset({1}),
    "RoiAlign": frozenset({2}),
    "CenterCropPad": frozenset({1}),
    "Col2Im": frozenset({1, 2, 3}),
    "DFT": frozenset({1, 2}),
    "STFT": frozenset({1, 2, 3}),
    "Compress": frozenset({1}),
    "ReverseSequence": frozenset({1}),
    **{op: frozenset({1}) for op in _REDUCE_OPS},
}

# Ops whose float outputs are copies, selections or sign changes of their float data inputs (or integers), so an
# FP16 node of this kind, whose inputs are FP16 already, produces values FP16 holds exactly: storing them in FP16
# changes nothing and the emulation skips that rounding (an exact no-op, a measurable saving).
PRESERVES_FP16 = frozenset(
    "Relu Identity Reshape Transpose Flatten Squeeze Unsqueeze Slice Gather GatherElements GatherND Concat Split "
    "Tile Expand MaxPool GlobalMaxPool ReduceMax ReduceMin Max Min Neg Abs Sign Floor Ceil Round Where "
    "DepthToSpace SpaceToDepth TopK Dropout".split()
)

# Nodes that are never candidates: they compute nothing an FP16 layer would store (DESIGN §2).
NEVER_CANDIDATES = frozenset({"Constant", "Shape", "Size", "Cast", "CastLike"})

# Control flow whose subgraphs the emulation cannot split: handled as one unit (If) or pinned (Loop, Scan).
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})


def is_parameter_input(op_type: str, index: int, domain: str = "", opset: int | None = None) -> bool:
    """True when input `index` of `op_type` is a parameter (shape, index, scale, bound), never rounded."""
    if index in PARAMETER_INPUTS.get(op_type, ()):
        return True
    return _schema_input_is_fixed_float(op_type, index, domain, opset)


@lru_cache(maxsize=None)
def _schema(op_type: str, domain: str, opset: int | None):
    try:
        if opset is None:
            return defs.get_schema(op_type, domain=domain)
        return defs.get_schema(op_type, opset, domain=domain)
    except Exception:  # unknown or custom operator: no schema to consult
        return None


def _schema_input_is_fixed_float(op_type: str, index: int, domain: str, opset: int | None) -> bool:
    """An input typed `tensor(float)` regardless of the node's data type is a parameter (e.g. Resize scales)."""
    schema = _schema(op_type, domain, opset)
    if schema is None or not schema.inputs:
        return False
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    return formal.type_str == "tensor(float)"


def supports_fp16(op_type: str, domain: str, opset: int | None) -> bool:
    """Does the ONNX schema let this operator compute in FP16 at all? (Unknown/custom ops: assume yes.)"""
    schema = _schema(op_type, domain, opset)
    if schema is None:
        return True
    return any("tensor(float16)" in c.allowed_type_strs for c in schema.type_constraints) or not schema.type_constraints


def model_opset(model: onnx.ModelProto, domain: str = "") -> int | None:
    for imp in model.opset_import:
        if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
            return int(imp.version)
    return None


op_schema = _schema  # the public name (fp16.mixed reads parameter types from it)
