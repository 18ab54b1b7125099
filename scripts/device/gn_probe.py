"""Device (twenty-seventh round): torch's GroupNorm pattern in FP16 on ORT-CUDA, op by op, against the emulator's
storage rule. A VAE decoder's last GroupNorm erred more on the GPU than the emulation said when its
InstanceNormalization or its per-channel Mul alone ran FP16 (docs/verification.md, "Twenty-seventh round").

Per op (InstanceNormalization on (1, G, n), Mul and Add by a (C, 1, 1) weight on (1, C, H, W)), one random input:
the op in FP16 on ORT-CUDA (Casts around it, weights FP16), and the storage rule (inputs and weights rounded to
FP16, the op in FP32 on the CPU, output rounded); prints how many elements differ, the largest difference in FP16
ulps of the output, and the same for candidate rules (InstanceNormalization's statistics in FP16). One JSON line
per op.

    python3 gn_probe.py [--c 16 --hw 512 --groups 8]
"""
import argparse
import json

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def session(nodes, inputs, output, inits, cuda):
    g = helper.make_graph(nodes, "probe", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    prov = [("CUDAExecutionProvider", {"use_tf32": 0})] if cuda else ["CPUExecutionProvider"]
    return ort.InferenceSession(m.SerializeToString(), providers=prov)


def half_op(op, x, weights, attrs, cuda=True):
    """op with its data input and weights in FP16, output cast back to FP32 (what an FP16 node of the mixed model
    runs on ORT-CUDA)."""
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16)]
    ins = ["xh"]
    inits = []
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w.astype(np.float16), f"w{i}"))
        ins.append(f"w{i}")
    nodes += [helper.make_node(op, ins, ["yh"], **attrs), helper.make_node("Cast", ["yh"], ["y"], to=TensorProto.FLOAT)]
    s = session(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], "y", inits, cuda)
    return s.run(None, {"x": x})[0]


def fp32_op(op, x, weights, attrs):
    inits = [numpy_helper.from_array(w.astype(np.float32), f"w{i}") for i, w in enumerate(weights)]
    nodes = [helper.make_node(op, ["x"] + [f"w{i}" for i in range(len(weights))], ["y"], **attrs)]
    s = session(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], "y", inits, False)
    return s.run(None, {"x": x})[0]


def r16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def compare(gpu, rule):
    ulp = np.abs(np.spacing(np.abs(gpu).astype(np.float16)).astype(np.float32))
    diff = np.abs(gpu - rule)
    return {"differ": int(np.count_nonzero(diff)), "of": int(diff.size),
            "max_ulps": float(np.max(diff / np.maximum(ulp, np.float32(2 ** -24))))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--c", type=int, default=16)
    ap.add_argument("--hw", type=int, default=512)
    ap.add_argument("--groups", type=int, default=8)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x4 = rng.standard_normal((1, a.c, a.hw, a.hw)).astype(np.float32) * 3 + 0.5
    gamma = (1 + rng.standard_normal((a.c, 1, 1)) * 0.1).astype(np.float32)
    beta = (rng.standard_normal((a.c, 1, 1)) * 0.1).astype(np.float32)
    for op, x, w, attrs in (("Mul", x4, [gamma], {}), ("Add", x4, [beta], {})):
        gpu = half_op(op, x, w, attrs)
        rule = r16(fp32_op(op, r16(x), [r16(v) for v in w], attrs))
        print(json.dumps({"op": op, "shape": list(x.shape), "storage rule": compare(gpu, rule)}), flush=True)
    xg = x4.reshape(1, a.groups, -1)
    scale, bias = np.ones(a.groups, np.float32), np.zeros(a.groups, np.float32)
    attrs = {"epsilon": 1e-6}
    gpu = half_op("InstanceNormalization", xg, [scale, bias], attrs)
    rule = r16(fp32_op("InstanceNormalization", r16(xg), [scale, bias], attrs))
    xh = r16(xg).astype(np.float64)
    mean = xh.mean(-1, keepdims=True)
    var = ((xh - mean) ** 2).mean(-1, keepdims=True)
    rows = {"storage rule": compare(gpu, rule)}
    # candidates: statistics rounded to FP16; the normalised value computed in FP16 steps
    m16, v16 = r16(mean), r16(var)
    rows["mean, var rounded to FP16"] = compare(gpu, r16((r16(xg) - m16) / np.sqrt(v16 + np.float32(1e-6))))
    rows["x - mean in FP16, then / sqrt(var)"] = compare(
        gpu, r16(r16(r16(xg) - m16) / r16(np.sqrt(v16 + np.float32(1e-6)))))
    rows["gpu vs FP32 on the CPU (no rounding)"] = compare(gpu, fp32_op("InstanceNormalization", xg, [scale, bias], attrs))
    print(json.dumps({"op": "InstanceNormalization", "shape": list(xg.shape), **rows}), flush=True)


if __name__ == "__main__":
    main()
