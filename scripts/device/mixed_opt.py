"""Device: a search's model.mixed.onnx run on ORT's CUDA and CPU providers under each graph optimisation level, its
excess against the FP32 CPU output (one uniform [0, 1) input, dynamic dimensions 1). Twenty-second round: says
whether ORT's graph optimiser or the GPU's FP16 kernels make a mixed plan differ.

    python3 mixed_opt.py MIXED.onnx ORIGINAL.onnx ATOL RTOL
"""
import sys
import numpy as np, onnxruntime as ort
mixed, orig, atol, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
cpu = ort.InferenceSession(orig, providers=["CPUExecutionProvider"])
name = cpu.get_inputs()[0].name
shape = [d if isinstance(d, int) else 1 for d in cpu.get_inputs()[0].shape]
x = np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)
gold = cpu.run(None, {name: x})[0]
def excess(out):
    d = np.abs(out.astype(np.float64) - gold)
    return float(np.max(np.minimum(d / atol, d / (rtol * np.abs(gold) + 1e-30))))
for prov in ("CUDAExecutionProvider", "CPUExecutionProvider"):
    for lvl in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        o = ort.SessionOptions(); o.graph_optimization_level = getattr(ort.GraphOptimizationLevel, lvl)
        s = ort.InferenceSession(mixed, o, providers=[prov])
        print(prov, lvl, "excess", round(excess(s.run(None, {name: x})[0]), 3))
