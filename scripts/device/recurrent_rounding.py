"""Device: FP16 GRU, RNN and LSTM on ORT-CUDA against bisector's emulations of them. Per operator (random weights
scaled 1/sqrt(fan-in), bidirectional, T = 64, batch 2, hidden 256, input 128; GRU in both linear_before_reset forms),
the error against FP32 (ONNX Runtime's CPU kernel on the same FP16-rounded inputs) of: the GPU, the storage rules
(the FP32 result rounded once) and gpu mode's step-by-step half-precision model (bisector.fp16.recurrent). One JSON
line per case.

    python3 recurrent_rounding.py [--steps 64] [--hidden 256]
"""
import argparse
import json

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from bisector.fp16.recurrent import split_recurrent


def _session(nodes, names, dtype, provider, outs=("Y", "Yh")):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, dtype, None) for k in names],
                              [helper.make_tensor_value_info(k, dtype, None) for k in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), providers=list(dict.fromkeys([provider, "CPUExecutionProvider"])))


def _stats(a, ref):
    e = np.abs(a.astype(np.float32) - ref)
    return {"mean": float(e.mean()), "p99": float(np.quantile(e, 0.99)), "max": float(e.max())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inputs", type=int, default=128)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for op, extra in (("GRU", {"linear_before_reset": 1}), ("GRU", {"linear_before_reset": 0}), ("RNN", {}),
                      ("LSTM", {})):
        gates = {"GRU": 3, "RNN": 1, "LSTM": 4}[op]
        h, i = a.hidden, a.inputs
        feeds = {"X": rng.standard_normal((a.steps, 2, i)),
                 "W": rng.standard_normal((2, gates * h, i)) / np.sqrt(i),
                 "R": rng.standard_normal((2, gates * h, h)) / np.sqrt(h),
                 "B": rng.standard_normal((2, 2 * gates * h)) * 0.1}
        feeds = {k: v.astype(np.float16) for k, v in feeds.items()}
        wide = {k: v.astype(np.float32) for k, v in feeds.items()}
        outs = ["Y", "Yh"] + (["Yc"] if op == "LSTM" else [])
        node = helper.make_node(op, ["X", "W", "R", "B"], outs, hidden_size=h, direction="bidirectional", **extra)
        row = {"op": op, **extra}
        ref = _session([node], wide, TensorProto.FLOAT, "CPUExecutionProvider", outs).run(["Y"], wide)[0]
        try:
            gpu_s = _session([node], feeds, TensorProto.FLOAT16, "CUDAExecutionProvider", outs)
            row["providers"] = gpu_s.get_providers()
            gpu = gpu_s.run(["Y"], feeds)[0]
            row["gpu"] = _stats(gpu, ref)
        except Exception as exc:  # noqa: BLE001 - a form the CUDA provider refuses: said in the row
            row["gpu_error"] = str(exc).splitlines()[0][:200]
            gpu = None
        row["storage"] = _stats(ref.astype(np.float16), ref)
        half = _session(split_recurrent(node, 14), wide, TensorProto.FLOAT, "CPUExecutionProvider", outs).run(["Y"], wide)[0]
        row["gpu mode"] = _stats(half, ref)
        if gpu is not None:
            row["gpu mode vs gpu"] = _stats(half, gpu.astype(np.float32))
            row["storage vs gpu"] = _stats(ref.astype(np.float16), gpu.astype(np.float32))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
