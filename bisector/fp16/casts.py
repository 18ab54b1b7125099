"""The Cast nodes that realise FP16 storage in an ONNX graph, and their one naming scheme.

For a float tensor `t`:
- `t__fp16`    its FP16 version (a Cast to FLOAT16, an FP16 producer's own output, or a converted weight);
- `t__rounded` its FP16 value read back as FP32 (the second Cast of a pair; a converted weight in the emulation);
- `t__raw`     a node's own FP32 result before it is stored in FP16.
A Cast node is named after the tensor it writes: `<output>__cast`.

Used by the emulation's per-node and per-block sessions, the sensitivity profile's batched session and the
mixed-precision writer alike.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16


def fp16_name(tensor: str) -> str:
    return f"{tensor}__fp16"


def rounded_name(tensor: str) -> str:
    return f"{tensor}__rounded"


def raw_name(tensor: str) -> str:
    return f"{tensor}__raw"


def cast(src: str, dst: str, to: int) -> onnx.NodeProto:
    """`dst = Cast(src, to)`, named after `dst` (built directly: helper.make_node costs 10x more, and a large
    model's mixed ONNX has tens of thousands of these)."""
    node = onnx.NodeProto(op_type="Cast", input=[src], output=[dst], name=f"{dst}__cast")
    node.attribute.append(onnx.AttributeProto(name="to", type=onnx.AttributeProto.INT, i=to))
    return node


def round_trip(tensor: str, src: str | None = None, dst: str | None = None, to: int = FLOAT16) -> list[onnx.NodeProto]:
    """The Cast pair that stores `tensor` in FP16 (or `to`: BFLOAT16) and reads it back: `src` (default `tensor`)
    -> `t__fp16` -> `dst` (default `t__rounded`). IEEE round-to-nearest; ORT keeps user-written pairs."""
    half = fp16_name(tensor)
    return [cast(src or tensor, half, to), cast(half, dst or rounded_name(tensor), FLOAT)]
