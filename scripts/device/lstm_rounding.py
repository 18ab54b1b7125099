"""Device: where ORT-CUDA's FP16 LSTM rounds. One LSTM node in FP16 (inputs, weights, states FP16) on the CUDA
provider, against a numpy LSTM computed in FP32 with FP16 rounding at chosen points each step ('xw': the input
projection X·W^T, 'hr': the recurrent product H·R^T, 'c': the cell state, 'h': the hidden state). Prints, per
variant, the share of output elements equal in FP16 and the largest / mean difference. One JSON object.

    python3 lstm_rounding.py INPUTS.npz REF.py [GPU_OUT.npz]    INPUTS: X, W, R, B, h0, c0 (FP32; a bidirectional LSTM's)
"""
import importlib.util
import itertools
import json
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def main() -> None:
    d = dict(np.load(sys.argv[1]))
    spec = importlib.util.spec_from_file_location("lstm_ref", sys.argv[2])
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    half = {k: v.astype(np.float16) for k, v in d.items()}
    hidden = d["R"].shape[-1]
    direction = "bidirectional" if d["W"].shape[0] == 2 else "forward"
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "Yh", "Yc"], hidden_size=hidden,
                            direction=direction)
    vi = [helper.make_tensor_value_info(k, TensorProto.FLOAT16, None) for k in ["X", "W", "R", "B", "h0", "c0"]]
    out = [helper.make_tensor_value_info(k, TensorProto.FLOAT16, None) for k in ["Y", "Yh", "Yc"]]
    model = helper.make_model(helper.make_graph([node], "lstm", vi, out), opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    s = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    gpu = [o.astype(np.float32) for o in s.run(None, half)]
    if len(sys.argv) > 3:  # the GPU's outputs, for more variants elsewhere
        np.savez(sys.argv[3], Y=gpu[0], Yh=gpu[1], Yc=gpu[2])
    f32 = {k: v.astype(np.float32) for k, v in half.items()}  # the FP16 inputs, widened
    rows = {"providers": s.get_providers()}
    points = ["xw", "hr", "c", "h"]
    for n in range(len(points) + 1):
        for rounds in itertools.combinations(points, n):
            y, yh, yc = ref.lstm(f32["X"], f32["W"], f32["R"], f32["B"], f32["h0"], f32["c0"], direction, 0, rounds)
            y16 = y.astype(np.float16).astype(np.float32)
            diff = np.abs(y16 - gpu[0])
            rows["+".join(rounds) or "none"] = {"equal": round(float(np.mean(diff == 0)), 4),
                                                "max": float(diff.max()), "mean": float(diff.mean()),
                                                "yc_max": float(np.abs(yc.astype(np.float16).astype(np.float32)
                                                                       - gpu[2]).max())}
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
