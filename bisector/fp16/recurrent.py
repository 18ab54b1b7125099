"""FP16 recurrent nodes as a GPU computes them (``--fp16-arithmetic gpu``): per time step, in half precision.

Why: the storage rules treat an LSTM like any layer — FP16 inputs, weights and outputs, FP32 math inside, one
rounding at the output. ORT-CUDA's FP16 LSTM (cuDNN) keeps its state in FP16 from step to step and computes its
gates in half precision (TensorRT's recurrent layers were not measured). Measured on an H100 with ONNX Runtime's CUDA provider (cuDNN; docs/verification.md, "Sixteenth
round"; scripts/device/lstm_rounding.py): on ddddocr's recogniser (a bidirectional LSTM, hidden size 512, 128
steps) the GPU's output differs from FP32 by 2.7e-4 on average (p99 1.2e-3, max 4.7e-3) where the storage rules
give 6.9e-5 (3.3e-4, 1.3e-3); with the LSTM alone in FP16 the model's excess was 0.97 on the GPU and 0.29
emulated. No choice of rounding points with FP32 math (the input projection, the recurrent product, the cell
state, the hidden state: 16 variants) matched more than 19% of the GPU's elements, and the GPU's error is already
there at the first step: its pointwise math is in half precision. The model below — products rounded to FP16,
every pointwise operation rounded to FP16, sigmoid and tanh evaluated from FP16 operations — gives 2.4e-4 (p99
1.1e-3, max 4.9e-3). It matches the GPU's error in size, not bit for bit (the GPU's activation approximations
are not documented).

GRU (its ``linear_before_reset`` form, cuDNN's) and RNN get the same treatment: products rounded, pointwise
operations in FP16, the state rounded each step. Measured on the H100 with random weights (bidirectional, 64 steps,
hidden 256; scripts/device/recurrent_rounding.py), mean / p99 / max error against FP32: GRU GPU 3.1e-4 / 1.1e-3 /
2.2e-3, this model 2.9e-4 / 1.0e-3 / 2.0e-3, storage rules 6.2e-5 / 2.4e-4 / 2.4e-4; RNN 5.0e-4 / 1.9e-3 / 4.4e-3,
4.1e-4 / 1.4e-3 / 2.7e-3, 9.3e-5 / 2.4e-4 / 2.4e-4; LSTM 2.0e-4 / 8.5e-4 / 1.9e-3, 1.9e-4 / 8.3e-4 / 2.1e-3,
2.7e-5 / 1.2e-4 / 2.4e-4. A GRU without ``linear_before_reset`` came out of ORT-CUDA bit for bit as the storage
rules say, and keeps them.

Built as ONNX nodes (a ``Loop`` per direction) that replace the node in the emulator's session. Only the common
form is handled: default activations, no clip, no peepholes, no ``sequence_lens``, ``input_forget`` 0, ``layout``
0 (ONNX Runtime runs no other layout), opset 11 or later; any other form keeps the storage rule. The nodes use only
operators whose signature did not change from opset 11 to today (no Unsqueeze, Split, Slice).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MIN_OPSET = 11
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}  # gate blocks in W and R, in ONNX's order (LSTM i o f c; GRU z r h)
_DEFAULT_ACTIVATIONS = {"LSTM": (b"Sigmoid", b"Tanh", b"Tanh"), "GRU": (b"Sigmoid", b"Tanh"), "RNN": (b"Tanh",)}


def supported(node: onnx.NodeProto, opset: int | None) -> bool:
    """Whether `split_recurrent` handles this node (else the storage rule applies to it)."""
    if node.op_type not in _GATES or (opset is not None and opset < MIN_OPSET):
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ins = list(node.input) + [""] * (8 - len(node.input))
    if ins[4] or (node.op_type == "LSTM" and ins[7]):  # sequence_lens, peepholes
        return False
    acts, default = attrs.get("activations"), _DEFAULT_ACTIVATIONS[node.op_type]
    if acts is not None and tuple(acts) not in (default, default * 2):
        return False
    if "clip" in attrs or attrs.get("input_forget", 0) or attrs.get("layout", 0):
        return False
    if node.op_type == "GRU" and not attrs.get("linear_before_reset", 0):
        # cuDNN's GRU is the linear_before_reset form; ORT-CUDA computed the other one exactly as the storage rule
        # says (measured: the same bits), so that one keeps it
        return False
    return attrs.get("direction", b"forward") in (b"forward", b"reverse", b"bidirectional") and "hidden_size" in attrs


def stepwise_missing(nodes: Mapping[str, onnx.NodeProto], candidates: Iterable[str], opset: int | None,
                     gpu: bool) -> list[str]:
    """The recurrent candidates the emulation computes with FP32 math inside (the storage rules; in gpu mode the
    forms `split_recurrent` does not handle), where ORT-CUDA's FP16 kernels compute each step in half precision:
    what the job's warning and report.md name."""
    return [n for n in candidates if nodes[n].op_type in _GATES and not (gpu and supported(nodes[n], opset))]


def split_recurrent(node: onnx.NodeProto, opset: int | None, rounding: bool = True) -> list[onnx.NodeProto] | None:
    """Nodes computing `node`'s outputs (same names) as the GPU does, or None where `supported` says no.
    ``rounding=False`` leaves out every FP16 rounding (the decomposition alone: equal to ONNX's operator in FP32,
    what the tests check it against)."""
    if not supported(node, opset):
        return None
    kind = node.op_type
    gates = _GATES[kind]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    hidden = int(attrs["hidden_size"])
    direction = attrs.get("direction", b"forward").decode()
    ins = list(node.input) + [""] * (8 - len(node.input))
    x, w, r, b, _, h0 = ins[:6]
    c0 = ins[6] if kind == "LSTM" else ""
    outs = list(node.output) + [""] * (3 - len(node.output))
    if not any(outs):
        return None
    # a prefix no other tensor of the session uses: from an output's name (unique in the graph; node names need not
    # be, and two unnamed nodes in one block would collide)
    p = f"{next(o for o in outs if o)}__gpu16"
    nodes: list[onnx.NodeProto] = []
    names = iter(range(1 << 30))

    def tensor(tag: str) -> str:
        return f"{p}_{tag}_{next(names)}"

    def const(value: np.ndarray, tag: str) -> str:
        name = tensor(tag)
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        return name

    def op(kind_: str, inputs: list[str], into: list[onnx.NodeProto] | None = None, **kw) -> str:
        out = tensor(kind_.lower())
        (nodes if into is None else into).append(helper.make_node(kind_, inputs, [out], **kw))
        return out

    def rounded(t: str, into: list[onnx.NodeProto] | None = None) -> str:
        if not rounding:
            return t
        return op("Cast", [op("Cast", [t], into, to=TensorProto.FLOAT16)], into, to=TensorProto.FLOAT)

    def block(t: str, k: int, into: list[onnx.NodeProto] | None = None, count: int = 1) -> str:
        """Gate blocks k .. k+count-1 of the last axis."""
        return op("Gather", [t, gate_index[(k, count)]], into, axis=-1)

    shape_x = op("Shape", [x])
    steps = op("Gather", [shape_x, const(np.array(0, np.int64), "zero")], axis=0)  # T, a scalar
    batch = op("Gather", [shape_x, const(np.array(1, np.int64), "one")], axis=0)
    state_shape = op("Concat", [op("Reshape", [batch, const(np.array([1], np.int64), "to1")]),
                                const(np.array([hidden], np.int64), "hidden")], axis=0)
    keep = const(np.array(True), "true")
    last = op("Sub", [steps, const(np.array(1, np.int64), "one")])
    # T-1, ..., 0 as (T-1) - (0, ..., T-1): ORT (1.32 here) at ORT_ENABLE_ALL turns Gather(x, Range(T-1, -1, -1)) into a
    # Slice whose end -1 wraps to the last element, an empty result
    backwards = op("Sub", [last, op("Range", [const(np.array(0, np.int64), "zero"), steps,
                                              const(np.array(1, np.int64), "step")])])
    gate_index = {(k, n): const(np.arange(k * hidden, (k + n) * hidden, dtype=np.int64), f"gate{k}x{n}")
                  for k in range(gates) for n in range(1, gates - k + 1)}
    one, two = const(np.array(1.0, np.float32), "f1"), const(np.array(2.0, np.float32), "f2")
    zeros = const(np.zeros(2 * gates * hidden, np.float32), "nobias")

    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    ys, hs, cs = [], [], []
    for d, way in enumerate(dirs):
        pick = const(np.array(d, np.int64), f"dir{d}")
        w_t = op("Transpose", [op("Gather", [w, pick], axis=0)], perm=[1, 0])  # (I, G·H)
        r_t = op("Transpose", [op("Gather", [r, pick], axis=0)], perm=[1, 0])  # (H, G·H)
        projected = rounded(op("MatMul", [x, w_t]))  # (T, B, G·H): one product for every step
        halves = op("Reshape", [op("Gather", [b, pick], axis=0) if b else zeros,
                                const(np.array([2, gates * hidden], np.int64), "b2")])
        wb = op("Gather", [halves, const(np.array(0, np.int64), "wb")], axis=0)
        rb = op("Gather", [halves, const(np.array(1, np.int64), "rb")], axis=0)
        starts = []
        for given in ((h0, c0) if kind == "LSTM" else (h0,)):
            if given:
                starts.append(op("Gather", [given, pick], axis=0))
            else:
                starts.append(op("ConstantOfShape", [state_shape], value=numpy_helper.from_array(
                    np.zeros(1, np.float32))))
        body: list[onnx.NodeProto] = []
        it, cond, h_in, c_in = tensor("iter"), tensor("cond"), tensor("h_in"), tensor("c_in")
        t = it if way == "forward" else op("Sub", [last, it], body)
        step_in = op("Gather", [projected, t], body, axis=0)  # (B, G·H)

        def add(a: str, c: str) -> str:
            return rounded(op("Add", [a, c], body), body)

        def mul(a: str, c: str) -> str:
            return rounded(op("Mul", [a, c], body), body)

        def sigmoid(v: str) -> str:  # 1 / (1 + exp(-v)), each operation in FP16
            e = rounded(op("Exp", [rounded(op("Neg", [v], body), body)], body), body)
            return rounded(op("Div", [one, add(one, e)], body), body)

        def tanh(v: str) -> str:  # 2·sigmoid(2v) − 1
            return rounded(op("Sub", [mul(two, sigmoid(mul(two, v))), one], body), body)

        if kind == "LSTM":
            pre = add(add(step_in, rounded(op("MatMul", [h_in, r_t], body), body)), rounded(op("Add", [wb, rb])))
            i, o, f, g = (block(pre, k, body) for k in range(4))  # ONNX's order: i, o, f, c
            i, o, f, g = sigmoid(i), sigmoid(o), sigmoid(f), tanh(g)
            c_out = add(mul(f, c_in), mul(i, g))
            h_out = mul(o, tanh(c_out))
        elif kind == "GRU":  # ONNX's order: z, r, h
            bias_zr = rounded(op("Add", [block(wb, 0, count=2), block(rb, 0, count=2)]))
            r_zr = block(r_t, 0, count=2)  # (H, 2H)
            zr = add(add(block(step_in, 0, body, 2), rounded(op("MatMul", [h_in, r_zr], body), body)), bias_zr)
            z, reset = sigmoid(block(zr, 0, body)), sigmoid(block(zr, 1, body))
            r_h = block(r_t, 2)  # (H, H)
            # linear_before_reset (`supported`): r ⊙ (H·Rh^T + Rbh), as cuDNN computes it
            hh = mul(reset, add(rounded(op("MatMul", [h_in, r_h], body), body), block(rb, 2)))
            n = tanh(add(add(block(step_in, 2, body), block(wb, 2)), hh))
            h_out = add(mul(rounded(op("Sub", [one, z], body), body), n), mul(z, h_in))
            c_out = None
        else:  # RNN
            h_out = tanh(add(add(step_in, rounded(op("MatMul", [h_in, r_t], body), body)),
                             rounded(op("Add", [wb, rb]))))
            c_out = None
        carried = [h_in] + ([c_in] if c_out else [])
        cond_out = op("Identity", [cond], body)
        nexts = [op("Identity", [h_out], body)] + ([op("Identity", [c_out], body)] if c_out else [])
        y_t = op("Identity", [h_out], body)
        loop_body = helper.make_graph(
            body, f"{p}_step{d}",
            [helper.make_tensor_value_info(it, TensorProto.INT64, []),
             helper.make_tensor_value_info(cond, TensorProto.BOOL, [])]
            + [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in carried],
            [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, [])]
            + [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in nexts + [y_t]])
        finals = [tensor("h_last")] + ([tensor("c_last")] if c_out else [])
        per_step = tensor("ys")
        nodes.append(helper.make_node("Loop", [steps, keep, *starts], [*finals, per_step], body=loop_body))
        if way == "reverse":  # the steps came out last first
            per_step = op("Gather", [per_step, backwards], axis=0)
        ys.append(op("Reshape", [per_step, const(np.array([0, 1, -1, hidden], np.int64), "y4")]))
        hs.append(op("Reshape", [finals[0], const(np.array([1, -1, hidden], np.int64), "h3")]))
        if c_out:
            cs.append(op("Reshape", [finals[1], const(np.array([1, -1, hidden], np.int64), "c3")]))
    for name, parts, axis in ((outs[0], ys, 1), (outs[1], hs, 0), (outs[2], cs, 0)):
        if name and parts:
            nodes.append(helper.make_node("Concat", parts, [name], axis=axis) if len(parts) > 1
                         else helper.make_node("Identity", parts, [name]))
    return nodes
