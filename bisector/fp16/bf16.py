"""BF16 instead of FP16: the strongly typed mixed model of a plan, retyped (`debug precision --bf16`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from bisector.model.catalog import Catalog


def to_bf16(model, catalog: "Catalog"):
    """The FP16 mixed model retyped to BF16: FP16 tensors and Casts become BF16, and weights are converted again
    from the exact FP32 originals (round to nearest even; BF16 has FP32's range, so nothing clamps)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    from bisector.model.graph import constant_value, subgraphs

    FP16, BF16 = TensorProto.FLOAT16, TensorProto.BFLOAT16
    originals = {i.name: i for i in catalog.model.graph.initializer}
    constants = {n.output[0]: n for n in catalog.model.graph.node if n.op_type == "Constant"}

    def original(name: str):
        for suffix in ("__fp16_param", "__fp16"):
            if name.endswith(suffix):
                src = name[: -len(suffix)]
                if src in originals:
                    return np.asarray(catalog.value(src))
                if src in constants:
                    return constant_value(constants[src])
        return None

    def bf16_tensor(name: str, values) -> onnx.TensorProto:
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        rounded = np.where(np.isnan(values), np.uint16(0x7FC0), rounded)
        t = onnx.helper.make_tensor(name, BF16, list(np.shape(values)), rounded.tobytes(), raw=True)
        return t

    def retype_graph(graph) -> None:
        for i, init in enumerate(graph.initializer):
            if init.data_type == FP16:
                src = original(init.name)
                values = src if src is not None else numpy_helper.to_array(init).astype(np.float32)
                graph.initializer[i].CopyFrom(bf16_tensor(init.name, values.astype(np.float32)))
        for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
            if vi.type.tensor_type.elem_type == FP16:
                vi.type.tensor_type.elem_type = BF16
        for node in graph.node:
            for a in node.attribute:
                if node.op_type in ("Cast", "EyeLike", "RandomNormal", "RandomUniform") and a.name in ("to", "dtype") \
                        and a.i == FP16:
                    a.i = BF16
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FP16:
                    src = numpy_helper.to_array(a.t).astype(np.float32)
                    a.t.CopyFrom(bf16_tensor(a.t.name, src))
            for g in subgraphs(node):
                retype_graph(g)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    retype_graph(out.graph)
    return out
