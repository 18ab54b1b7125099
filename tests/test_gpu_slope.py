"""`--fp16-arithmetic gpu` computes an FP16 LeakyRelu with its slope in FP16, as ORT-CUDA's half kernel does
(bisector.fp16.arithmetic.half_slope; measured bit-equal on an H100, docs/verification.md)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisector.app.job import open_job
from bisector.fp16.arithmetic import half_slope, rules_tag


def _model(tmp_path, alpha):
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="pre"),
             helper.make_node("LeakyRelu", ["a"], ["b"], name="leaky", **({} if alpha is None else {"alpha": alpha})),
             helper.make_node("Identity", ["b"], ["y"], name="post")]
    k = onnx.numpy_helper.from_array(np.array(3.0, np.float32), "k")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])], [k])
    path = tmp_path / "leaky.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _half(v):
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("alpha", [0.2, 0.01, None])  # None: the default slope, 0.01
def test_gpu_mode_rounds_the_slope_and_storage_mode_does_not(tmp_path, alpha):
    path = _model(tmp_path, alpha)
    outs = {}
    for mode in ("storage", "gpu"):
        job = open_job(path, atol=["1e-3"], rtol=["1e-3"], no_cache=True, fp16_arithmetic=mode,
                       val_range=["x:[-4,4]"])
        plan = job.plan(["pre", "post"])  # only the LeakyRelu in FP16
        feeds = job.feeds_list[0]
        outs[mode] = job.backend.run(plan, feeds, ["y"])["y"]
        a = _half(feeds["x"] * np.float32(3.0))  # its FP16 input
        assert job.backend.describe()["rules"] == rules_tag(mode)
        job.close()
    slope = 0.01 if alpha is None else alpha
    neg = a < 0
    # ORT-CUDA's half kernel: x > 0 ? x : (half)alpha * x, one correctly rounded half product
    gpu = np.where(neg, _half(a * _half(slope)), a)
    storage = np.where(neg, _half(a * np.float32(slope)), a)
    np.testing.assert_array_equal(outs["gpu"], gpu)
    np.testing.assert_array_equal(outs["storage"], storage)
    assert (outs["gpu"] != outs["storage"]).sum() > 0.05 * neg.sum()  # a bias on every negative value, not noise


def test_only_a_leakyrelu_whose_slope_fp16_cannot_hold_changes():
    assert half_slope(helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.25)) is None  # exact in FP16
    assert half_slope(helper.make_node("Relu", ["x"], ["y"])) is None
    node = helper.make_node("LeakyRelu", ["x"], ["y"], name="n", alpha=0.2)
    new = half_slope(node)
    assert new is not None and new.name == "n" and list(new.input) == ["x"]
    (a,) = [a for a in new.attribute if a.name == "alpha"]
    assert a.f == float(np.float16(0.2)) != 0.2 and node.attribute[0].f == pytest.approx(0.2)  # the original kept
