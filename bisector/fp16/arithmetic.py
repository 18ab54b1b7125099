"""FP16 arithmetic rules (issue 19): where a real FP16 GPU kernel rounds *inside* a layer, beyond DESIGN §4's
storage rules (FP16 tensors between layers, FP32 math inside).

Measured op by op on an H100 with ONNX Runtime's CUDA provider (scripts/device/ops_table.py, docs/verification.md
"Issue 19"): MatMul, Add/Mul, Sigmoid/Tanh/Exp, Softmax, LayerNormalization and ReduceMean in FP16 give the
cast-pair result bit for bit in >= 99.5 % of elements (FP32 math inside, one rounding at the output). Conv and
Gemm **with a bias** do not: the kernel rounds the FP32 accumulator to FP16 and then adds the FP16 bias in FP16
(a second rounding) — 99.7 % (Conv) and 99.9 % (Gemm) of elements match that, against 73 % and 69 % for the
storage-only emulation. Linear Resize differs too, by a rule not yet identified (not modelled).

Modes:
- ``storage`` (default): DESIGN §4 only; the tests/data test vectors encode it, and it is what TensorRT's fused
  bias epilogue (FP32) does.
- ``gpu``: storage rules plus the bias epilogue of ORT-CUDA/cuDNN/cuBLAS FP16 Conv and Gemm, FP16 LSTM, GRU
  and RNN nodes computed step by step in half precision (bisector.fp16.recurrent: the GPU's LSTM error was
  4 x the storage rules' on a real recogniser), and FP16 LeakyRelu with its slope in FP16 (`half_slope`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper

MODES = ("storage", "gpu")


def rules_tag(mode: str) -> str:
    # the gpu mode's recurrent nodes (bisector.fp16.recurrent) came in the sixteenth round: gpu-mode caches from
    # before are stale
    # and its LeakyRelu slope in FP16 in the twenty-second
    return "fp16-storage-v1" if mode == "storage" else \
        "fp16-storage-v1+gpu-bias-epilogue-v1+gpu-recurrent-v1+gpu-leakyrelu-slope-v1"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        from bisector.errors import UsageError

        raise UsageError(f"--fp16-arithmetic {mode!r}: choose one of {', '.join(MODES)}")
    return mode


def split_bias_epilogue(node: onnx.NodeProto, out_name: str, rank_of: Callable[[str], int | None]) -> list[onnx.NodeProto] | None:
    """For an FP16 Conv(x, W, B) or Gemm(A, B, C) (beta = 1): the nodes computing `out_name` as the GPU does:
    the product without bias, rounded to FP16, plus the bias (the caller rounds `out_name` itself). None when the
    node has no bias or another form (the storage rule then applies)."""
    ins = list(node.input)
    if node.op_type == "Conv" and len(ins) >= 3 and ins[2]:
        rank = rank_of(ins[1])
        if rank is None:
            return None
        bias_shape = [-1] + [1] * (rank - 2)
    elif node.op_type == "Gemm" and len(ins) >= 3 and ins[2]:
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        if beta != 1.0:
            return None
        bias_shape = None
    else:
        return None
    core = onnx.NodeProto()
    core.CopyFrom(node)
    del core.input[2:]
    acc, half, rounded = f"{out_name}__acc", f"{out_name}__acc16", f"{out_name}__acc_rounded"
    core.output[0] = acc
    nodes = [core, helper.make_node("Cast", [acc], [half], to=onnx.TensorProto.FLOAT16),
             helper.make_node("Cast", [half], [rounded], to=onnx.TensorProto.FLOAT)]
    bias = ins[2]
    if bias_shape is not None:
        shape_name = f"{out_name}__bias_shape"
        nodes.append(helper.make_node("Constant", [], [shape_name],
                                      value=onnx.numpy_helper.from_array(np.array(bias_shape, np.int64), shape_name)))
        nodes.append(helper.make_node("Reshape", [bias, shape_name], [f"{out_name}__bias_b"]))
        bias = f"{out_name}__bias_b"
    nodes.append(helper.make_node("Add", [rounded, bias], [out_name]))
    return nodes


def half_slope(node: onnx.NodeProto) -> onnx.NodeProto | None:
    """For an FP16 LeakyRelu: the node with its `alpha` rounded to FP16, as ORT-CUDA's half kernel computes
    `x > 0 ? x : (half)alpha * x` (measured on an H100: 100 % of 2^20 elements bit-equal for alpha 0.2 and 0.01,
    against 83-84 % for the storage rule; docs/verification.md, "Twenty-second round"). The product of two FP16
    values is exact in FP32, so the emulation's FP32 multiply and its output rounding give the GPU's correctly
    rounded half product bit for bit. The slope's error is one sign and size on every negative value of every
    such node, where rounding errors are not: openWakeWord's embedding (19 LeakyRelu) passed at 0.88 x its
    tolerance on the emulator and failed at 4.8 x on the GPU. None: not a LeakyRelu, or a slope FP16 holds."""
    if node.op_type != "LeakyRelu":
        return None
    alpha = next((a.f for a in node.attribute if a.name == "alpha"), 0.01)
    half = float(np.float16(alpha))
    if half == alpha:
        return None
    out = onnx.NodeProto()
    out.CopyFrom(node)
    kept = [a for a in out.attribute if a.name != "alpha"]
    del out.attribute[:]
    out.attribute.extend(kept)
    out.attribute.append(helper.make_attribute("alpha", half))
    return out
