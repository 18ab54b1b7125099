"""What each ONNX operator's inputs are: data that an FP16 layer stores in FP16, or parameters that it never rounds.

DESIGN §4: shapes, indices, scales, bounds and counts are parameters. Integer-typed parameters are safe anyway
(only float tensors are ever rounded); this table matters for the float-typed ones (Resize scales, Clip bounds,
Range, thresholds) and for telling shape computations apart from data (catalog pinning).
"""

from __future__ import annotations

from functools import lru_cache

import onnx
from onnx import defs

# Which input slots of each operator are parameters, grouped by slots.
_PARAMETER_SLOTS: dict[tuple[int, ...], str] = {
    (0,): "ConstantOfShape",
    (1,): "Reshape Expand Upsample TopK Tile Squeeze Unsqueeze Split Gather GatherElements GatherND ScatterND "
          "ScatterElements Scatter OneHot CumSum Trilu CenterCropPad Compress ReverseSequence "
          "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp "
          "ReduceSumSquare",
    (2,): "RoiAlign",
    (0, 1, 2): "Range",
    (1, 2): "Clip Dropout DFT",
    (1, 3): "Pad",
    (1, 2, 3): "Resize Col2Im STFT",
    (1, 2, 3, 4): "Slice",
    (2, 3, 4): "NonMaxSuppression",
}
PARAMETER_INPUTS: dict[str, frozenset[int]] = {
    op: frozenset(slots) for slots, ops in _PARAMETER_SLOTS.items() for op in ops.split()
}

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
def op_schema(op_type: str, domain: str, opset: int | None):
    """The ONNX schema of an operator at an opset (None: the latest); for ONNX Runtime's own domains
    (com.microsoft, ...) ONNX Runtime's schema; unknown or custom operators: None."""
    try:
        if opset is None:
            return defs.get_schema(op_type, domain=domain)
        return defs.get_schema(op_type, opset, domain=domain)
    except Exception:  # not an ONNX operator: ONNX Runtime's contrib operators, or a custom one
        return _runtime_schema(op_type, domain, opset)


def is_runtime_domain(domain: str) -> bool:
    """A domain whose operators ONNX Runtime defines (contrib operators), not the ONNX standard."""
    return domain not in ("", "ai.onnx", "ai.onnx.ml") and domain in _runtime_schemas()


@lru_cache(maxsize=None)
def _runtime_schemas() -> dict[str, dict[str, list]]:
    """ONNX Runtime's registered operator schemas of the domains ONNX does not define, by domain and name (its
    contrib operators: DynamicQuantizeLSTM takes float32 only, and a mixed model feeding it FP16 does not load)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        schemas = C.get_all_operator_schema()
    except Exception:  # an ONNX Runtime build without the schema registry: no schema to consult
        return {}
    out: dict[str, dict[str, list]] = {}
    for s in schemas:
        if s.domain not in ("", "ai.onnx", "ai.onnx.ml"):
            out.setdefault(s.domain, {}).setdefault(s.name, []).append(s)
    return out


class _Formal:
    """A formal input/output of an ONNX Runtime schema, spelled as onnx.defs spells it."""

    def __init__(self, p) -> None:
        self.name, self.type_str = p.name, p.typeStr


class _RuntimeSchema:
    """ONNX Runtime's schema of a contrib operator with the attributes bisector reads from onnx.defs' OpSchema."""

    def __init__(self, s) -> None:
        self.name, self.domain, self.since_version = s.name, s.domain, s.since_version
        self.type_constraints = list(s.type_constraints)  # type_param_str, allowed_type_strs: as onnx.defs'
        self.inputs = [_Formal(p) for p in s.inputs]
        self.outputs = [_Formal(p) for p in s.outputs]


def _runtime_schema(op_type: str, domain: str, opset: int | None):
    versions = _runtime_schemas().get(domain, {}).get(op_type)
    if not versions:
        return None
    fitting = [s for s in versions if opset is None or s.since_version <= opset] or versions
    return _RuntimeSchema(max(fitting, key=lambda s: s.since_version))


def _schema_input_is_fixed_float(op_type: str, index: int, domain: str, opset: int | None) -> bool:
    """An input typed `tensor(float)` regardless of the node's data type is a parameter (e.g. Resize scales)."""
    schema = op_schema(op_type, domain, opset)
    if schema is None or not schema.inputs:
        return False
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    return formal.type_str == "tensor(float)"


def supports_fp16(op_type: str, domain: str, opset: int | None) -> bool:
    """Does the ONNX schema let this operator compute in FP16 at all? (Unknown/custom ops: assume yes.)"""
    schema = op_schema(op_type, domain, opset)
    if schema is None:
        return True
    return any("tensor(float16)" in c.allowed_type_strs for c in schema.type_constraints) or not schema.type_constraints


def with_default_opset(model: onnx.ModelProto) -> list:
    """The model's opset imports, plus the default domain (opset 13, for the Casts bisector adds) where a model
    imports only other domains (an ai.onnx.ml-only tree ensemble: its mixed model failed the checker)."""
    imports = list(model.opset_import)
    if not any(i.domain in ("", "ai.onnx") for i in imports):
        imports.append(onnx.helper.make_opsetid("", 13))
    return imports


def model_opset(model: onnx.ModelProto, domain: str = "") -> int | None:
    for imp in model.opset_import:
        if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
            return int(imp.version)
    return None

