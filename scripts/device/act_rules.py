"""Device (twenty-second round): candidate half-precision rules for HardSigmoid, Elu and Selu against ORT-CUDA's FP16
kernels, 2^20 FP16 inputs each: the share of bit-equal outputs per rule (the ones at 100 % are what
`--fp16-arithmetic gpu` emulates: bisector.fp16.arithmetic.split_activation).

    python3 act_rules.py
"""
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as T
rng = np.random.default_rng(0)
x = (rng.standard_normal(1 << 20) * 4).astype(np.float16)
xf = x.astype(np.float32); xd = x.astype(np.float64)
def h(v): return np.asarray(v, np.float64).astype(np.float16).astype(np.float64)  # RN16 of an exact (float64) value
def run(op, attrs, dtype, xv):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", dtype, [xv.size])], [helper.make_tensor_value_info("y", dtype, [xv.size])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
    return s.run(None, {"x": xv})[0].astype(np.float64)
def eq(a, b): return round(float(np.mean((a == b) | (np.isnan(a) & np.isnan(b)))), 5)
e16 = h(np.exp(xd))  # exp in float, rounded to half
a16 = lambda v: float(np.float16(v))
# HardSigmoid
for al, be in ((0.2, 0.5), (1 / 6, 0.5)):
    g = run("HardSigmoid", {"alpha": al, "beta": be}, T.FLOAT16, x)
    two = np.clip(h(h(a16(al) * xd) + a16(be)), 0, 1)
    fma = np.clip(h(a16(al) * xd + a16(be)), 0, 1)
    f32 = np.clip(h((np.float32(al) * xf + np.float32(be)).astype(np.float64)), 0, 1)
    print("HardSigmoid", al, be, "two roundings", eq(g, two), "fma", eq(g, fma), "fp32 math", eq(g, f32))
# Elu
for al in (1.0, 0.5, 0.3):
    g = run("Elu", {"alpha": al}, T.FLOAT16, x)
    v1 = np.where(xd > 0, xd, h(a16(al) * h(e16 - 1)))
    v2 = np.where(xd > 0, xd, h(a16(al) * (np.exp(xd) - 1)))
    v3 = np.where(xd > 0, xd, h(al * np.expm1(xd)))
    print("Elu", al, "exp16, -1 in half, *alpha16", eq(g, v1), "float expm1 then *alpha16", eq(g, v2), "fp32 math", eq(g, v3))
# Selu (defaults)
alpha, gamma = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
g = run("Selu", {}, T.FLOAT16, x)
pos = h(a16(gamma) * xd)
for name, neg in (("g16*a16*(e16-1) left to right", h(h(a16(gamma) * a16(alpha)) * h(e16 - 1))),
                  ("g16*(a16*(e16-1))", h(a16(gamma) * h(a16(alpha) * h(e16 - 1)))),
                  ("fp32 math", h(gamma * alpha * np.expm1(xd)))):
    v = np.where(xd > 0, pos, neg)
    print("Selu", name, eq(g, v), "positives only", eq(g[xd > 0], pos[xd > 0]))
