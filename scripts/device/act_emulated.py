"""Device (twenty-second round): the emulator's FP16 activation nodes (storage and gpu arithmetic) against ORT-CUDA's
half kernels, element for element: the share of bit-equal outputs. One node between an FP32 Mul and an FP32
Identity; the node alone in FP16; 2^16 inputs uniform in [-12, 12].

    python3 act_emulated.py DIR      (DIR: a scratch folder for the models)
"""
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T, helper

from bisector.app.job import open_job

CASES = [("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {}), ("Elu", {}), ("Elu", {"alpha": 0.3}), ("Selu", {}),
         ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5})]
N = 1 << 16


def gpu_half(op, attrs, x16):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT16, [N])],
                          [helper.make_tensor_value_info("y", T.FLOAT16, [N])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"]).run(None, {"x": x16})[0]


def main() -> None:
    d = Path(sys.argv[1])
    d.mkdir(parents=True, exist_ok=True)
    for op, attrs in CASES:
        nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="pre"), helper.make_node(op, ["a"], ["b"], name="act", **attrs),
                 helper.make_node("Identity", ["b"], ["y"], name="post")]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [N])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [N])],
                              [onnx.numpy_helper.from_array(np.array(3.0, np.float32), "k")])
        path = d / f"{op}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
        row = {}
        for mode in ("storage", "gpu"):
            job = open_job(path, atol=["1e-3"], rtol=["1e-3"], no_cache=True, fp16_arithmetic=mode, val_range=["x:[-4,4]"])
            feeds = job.feeds_list[0]
            emu = job.backend.run(job.plan(["pre", "post"]), feeds, ["y"])["y"]
            a16 = (feeds["x"] * np.float32(3.0)).astype(np.float16)
            gpu = gpu_half(op, attrs, a16).astype(np.float32)
            row[mode] = round(float(np.mean(emu == gpu)), 5)
            job.close()
        print(op, attrs, "bit-equal to ORT-CUDA: storage", row["storage"], "gpu", row["gpu"], flush=True)


if __name__ == "__main__":
    main()
