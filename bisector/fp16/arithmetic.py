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
  4 x the storage rules' on a real recogniser), FP16 LeakyRelu with its slope in FP16 (`half_slope`), and FP16
  Elu, Selu and HardSigmoid as ORT-CUDA's half kernels compute them (`split_activation`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper

from bisector.fp16.casts import round_trip, rounded_name

MODES = ("storage", "gpu")


def rules_tag(mode: str) -> str:
    # the gpu mode's recurrent nodes (bisector.fp16.recurrent) came in the sixteenth round: gpu-mode caches from
    # before are stale
    # and its LeakyRelu slope, Elu, Selu and HardSigmoid in half precision in the twenty-second
    return "fp16-storage-v1" if mode == "storage" else \
        "fp16-storage-v1+gpu-bias-epilogue-v1+gpu-recurrent-v1+gpu-activations-v1"


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


def _half(value: float) -> float:
    return float(np.float16(value))


def _attr(node: onnx.NodeProto, name: str, default: float) -> float:
    return next((a.f for a in node.attribute if a.name == name), default)


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
    alpha = _attr(node, "alpha", 0.01)
    half = _half(alpha)
    if half == alpha:
        return None
    out = onnx.NodeProto()
    out.CopyFrom(node)
    kept = [a for a in out.attribute if a.name != "alpha"]
    del out.attribute[:]
    out.attribute.extend(kept)
    out.attribute.append(helper.make_attribute("alpha", half))
    return out


def split_activation(node: onnx.NodeProto, out_name: str) -> list[onnx.NodeProto] | None:
    """For an FP16 Elu, Selu or HardSigmoid: nodes computing `out_name` (before the caller's output rounding) as
    ORT-CUDA's half kernels do, measured bit for bit on an H100 (2^20 FP16 inputs each; docs/verification.md,
    "Twenty-second round"), where the storage rule (FP32 math, one rounding) matched 81-93 %:

    - Elu: ``x > 0 ? x : RN16(alpha16 * RN16(RN16(exp(x)) - 1))`` — exp rounded to half, the subtraction and the
      product in half (100 % for alpha 1, 0.5 and 0.3);
    - Selu: ``x > 0 ? RN16(gamma16 * x) : RN16(RN16(gamma16 * alpha16) * RN16(RN16(exp(x)) - 1))`` (100 %);
    - HardSigmoid: ``clip(RN16(alpha16 * x + beta16), 0, 1)``, one rounding of the fused multiply-add (100 % for
      (0.2, 0.5) and (1/6, 0.5)). Here the sum is an FP32 one, so where it is not exact in FP32 (products under
      1/8 beside beta 0.5) it is rounded twice and a half-way case could differ (none did in 2^16 inputs on the
      H100: `scripts/device/act_emulated.py`).

    Products of two FP16 values are exact in FP32 and the caller rounds the output, so the rest is bit for bit.
    None: another op."""
    op = node.op_type
    if op not in ("Elu", "Selu", "HardSigmoid") or not node.input or not node.input[0]:
        return None
    x = node.input[0]
    tag = f"{out_name}__{op.lower()}"
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: float) -> str:
        full = f"{tag}_{name}"
        nodes.append(helper.make_node("Constant", [], [full], value=helper.make_tensor(full, onnx.TensorProto.FLOAT,
                                                                                          [], [value])))
        return full

    def op_(kind: str, inputs: list[str], name: str, **attrs) -> str:
        full = f"{tag}_{name}"
        nodes.append(helper.make_node(kind, inputs, [full], **attrs))
        return full

    def rnd(t: str) -> str:
        nodes.extend(round_trip(t))
        return rounded_name(t)

    if op == "HardSigmoid":
        alpha, beta = _half(_attr(node, "alpha", 0.2)), _half(_attr(node, "beta", 0.5))
        fma = op_("Add", [op_("Mul", [x, const("alpha", alpha)], "ax"), const("beta", beta)], "axb")
        nodes.append(helper.make_node("Clip", [fma, const("zero", 0.0), const("one", 1.0)], [out_name]))
        return nodes
    em1 = rnd(op_("Sub", [rnd(op_("Exp", [x], "exp")), const("one", 1.0)], "em1"))  # RN16(RN16(exp(x)) - 1)
    if op == "Elu":
        neg = op_("Mul", [em1, const("alpha", _half(_attr(node, "alpha", 1.0)))], "neg")
        pos = x
    else:  # Selu: ONNX's defaults are float32 values
        alpha, gamma = _half(_attr(node, "alpha", 1.67326319217681884765625)), \
            _half(_attr(node, "gamma", 1.05070102214813232421875))
        neg = op_("Mul", [em1, const("ga", _half(gamma * alpha))], "neg")
        pos = op_("Mul", [x, const("gamma", gamma)], "pos")
    nodes.append(helper.make_node("Where", [op_("Greater", [x, const("zero", 0.0)], "gt"), pos, neg], [out_name]))
    return nodes
