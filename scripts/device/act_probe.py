"""Device: single activation nodes in FP16 on ORT's CUDA provider against the storage rule (FP32 math, one rounding)
and, for LeakyRelu and HardSigmoid, against the slope (and offset) rounded to FP16 first: the share of 2^20
elements that are bit-equal. Twenty-second round: LeakyRelu's half kernel is `x > 0 ? x : (half)alpha * x`.

    python3 act_probe.py
"""
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as T
rng = np.random.default_rng(0)
x = (rng.standard_normal(1 << 20) * 4).astype(np.float16)
def run(op, attrs, dtype, xv):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", dtype, [xv.size])], [helper.make_tensor_value_info("y", dtype, [xv.size])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
    return s.run(None, {"x": xv})[0]
for op, attrs in [("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {"alpha": 0.01}), ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}),
                  ("Selu", {}), ("Elu", {"alpha": 1.0}), ("Celu", {"alpha": 1.0}), ("ThresholdedRelu", {"alpha": 1.1})]:
    gpu16 = run(op, attrs, T.FLOAT16, x).astype(np.float32)
    ref32 = run(op, attrs, T.FLOAT, x.astype(np.float32))   # FP32 on the GPU, then the storage rule:
    storage = ref32.astype(np.float16).astype(np.float32)
    alt = None
    if op == "LeakyRelu":
        a16 = np.float32(np.float16(attrs["alpha"]))
        alt = np.where(x > 0, x.astype(np.float32), (x.astype(np.float32) * a16)).astype(np.float16).astype(np.float32)
    if op == "HardSigmoid":
        a16, b16 = np.float32(np.float16(attrs["alpha"])), np.float32(np.float16(attrs["beta"]))
        xf = x.astype(np.float32)
        alt = np.clip((xf * a16).astype(np.float16).astype(np.float32) + b16, 0, 1).astype(np.float16).astype(np.float32)
    eq = float(np.mean(gpu16 == storage))
    print(op, attrs, "storage rule bit-equal", round(eq, 4), "alpha-in-FP16 rule", None if alt is None else round(float(np.mean(gpu16 == alt)), 4))
