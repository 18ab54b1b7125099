"""`--fp16-arithmetic gpu` computes FP16 LeakyRelu, Elu, Selu and HardSigmoid as ORT-CUDA's half kernels do
(bisector.fp16.arithmetic.half_slope and split_activation; each rule measured bit-equal on an H100,
docs/verification.md, "Twenty-second round")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisector.app.job import open_job
from bisector.fp16.arithmetic import half_slope, rules_tag, split_activation


def _model(tmp_path, alpha, op="LeakyRelu", attrs=None):
    attrs = attrs if attrs is not None else ({} if alpha is None else {"alpha": alpha})
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="pre"),
             helper.make_node(op, ["a"], ["b"], name="leaky", **attrs),
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


def _h(v):
    """RN16 of an exact (float64) value."""
    return np.asarray(v, np.float64).astype(np.float16).astype(np.float64)


def _gpu_rule(op, attrs, a):
    """The rules measured on the H100 (docs/verification.md), in float64 with explicit roundings."""
    a = a.astype(np.float64)
    with np.errstate(over="ignore"):
        em1 = _h(_h(np.exp(a)) - 1)
    if op == "Elu":
        return np.where(a > 0, a, _h(_h(attrs.get("alpha", 1.0)) * em1))
    if op == "Selu":
        al, ga = _h(attrs.get("alpha", 1.67326319217681884765625)), _h(attrs.get("gamma", 1.05070102214813232421875))
        return np.where(a > 0, _h(ga * a), _h(_h(ga * al) * em1))
    al, be = _h(attrs.get("alpha", 0.2)), _h(attrs.get("beta", 0.5))
    return np.clip(_h(al * a + be), 0, 1)


@pytest.mark.parametrize("op, attrs", [("Elu", {}), ("Elu", {"alpha": 0.3}), ("Selu", {}),
                                       ("Selu", {"alpha": 1.5, "gamma": 1.2}), ("HardSigmoid", {}),
                                       ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5})])
def test_gpu_mode_computes_elu_selu_and_hardsigmoid_as_the_half_kernels(tmp_path, op, attrs):
    path = _model(tmp_path, None, op, attrs)
    outs = {}
    for mode in ("storage", "gpu"):
        job = open_job(path, atol=["1e-3"], rtol=["1e-3"], no_cache=True, fp16_arithmetic=mode,
                       val_range=["x:[-4,4]"])
        feeds = job.feeds_list[0]
        outs[mode] = job.backend.run(job.plan(["pre", "post"]), feeds, ["y"])["y"].astype(np.float64)
        a = _half(feeds["x"] * np.float32(3.0))
        job.close()
    want = _gpu_rule(op, attrs, a)
    # Exp in FP32 (ONNX Runtime's) before its rounding to half, and HardSigmoid's FP32 sum, can round a half-way
    # case the other way: at most one element in a thousand, by one FP16 step
    off = outs["gpu"] != want
    assert off.mean() <= 1e-3
    step = np.abs(np.spacing(want[off].astype(np.float16))).astype(np.float64)
    assert np.all(np.abs(outs["gpu"][off] - want[off]) <= step)
    assert (outs["storage"] != want).mean() > 0.02  # the storage rule is not it (81-93 % bit-equal on the GPU)


def test_other_ops_are_not_split():
    assert split_activation(helper.make_node("Relu", ["x"], ["y"]), "y") is None
    assert split_activation(helper.make_node("LeakyRelu", ["x"], ["y"]), "y") is None
    nodes = split_activation(helper.make_node("Elu", ["x"], ["y"], name="e"), "y")
    assert nodes is not None and nodes[-1].output[0] == "y"
    assert len({o for n in nodes for o in n.output}) == sum(len(n.output) for n in nodes)  # names do not collide
