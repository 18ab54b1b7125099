"""`--fp16-arithmetic gpu` computes an FP16 LSTM step by step in half precision (bisector.fp16.recurrent)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.app.job import open_job
from bisector.fp16.arithmetic import rules_tag
from bisector.fp16.recurrent import split_recurrent, supported


def _half_ops(half):
    """(round, sigmoid, tanh) of gpu mode's recurrent model: sigmoid and tanh from operations each rounded by `half`
    (None: FP32 throughout)."""
    rd = half or (lambda a: np.asarray(a, np.float32))

    def sig(v):
        return rd(1.0 / rd(1.0 + rd(np.exp(rd(-v)))))

    def tanh(v):
        return rd(2.0 * sig(rd(2.0 * v)) - 1.0)

    return rd, sig, tanh


def lstm_reference(x, w, r, b, direction, half=None):
    """ONNX's LSTM (zero initial states) in numpy, each operation rounded by `half` (None: FP32)."""
    rd, sig, tanh = _half_ops(half)
    steps, batch, _ = x.shape
    hidden = r.shape[-1]
    ys, hs, cs = [], [], []
    for d, way in enumerate(["forward", "reverse"] if direction == "bidirectional" else [direction]):
        proj = rd(np.einsum("tbi,gi->tbg", x, w[d]).astype(np.float32))
        bias = rd(b[d][:4 * hidden] + b[d][4 * hidden:]) if b is not None else np.zeros(4 * hidden, np.float32)
        h = np.zeros((batch, hidden), np.float32)
        c = np.zeros((batch, hidden), np.float32)
        y = np.zeros((steps, batch, hidden), np.float32)
        for t in (range(steps) if way == "forward" else range(steps - 1, -1, -1)):
            g = rd(rd(proj[t] + rd((h @ r[d].T).astype(np.float32))) + bias)
            i, o, f, gg = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            i, o, f, gg = sig(i), sig(o), sig(f), tanh(gg)
            c = rd(rd(f * c) + rd(i * gg))
            h = rd(o * tanh(c))
            y[t] = h
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return np.stack(ys, 1), np.stack(hs), np.stack(cs)


def _half(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _lstm_case(direction: str, bias: bool, states: bool, seed: int = 0, steps: int = 6, batch: int = 2,
               inputs: int = 5, hidden: int = 4):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    feeds = {"X": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
             "W": (rng.standard_normal((dirs, 4 * hidden, inputs)) * 0.5).astype(np.float32),
             "R": (rng.standard_normal((dirs, 4 * hidden, hidden)) * 0.5).astype(np.float32)}
    if bias:
        feeds["B"] = (rng.standard_normal((dirs, 8 * hidden)) * 0.5).astype(np.float32)
    if states:
        feeds["h0"] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
        feeds["c0"] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    names = ["X", "W", "R", "B" if bias else "", "", "h0" if states else "", "c0" if states else ""]
    node = helper.make_node("LSTM", names, ["Y", "Yh", "Yc"], name="lstm", hidden_size=hidden, direction=direction)
    return node, feeds


def _run(nodes, feeds, opset):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in feeds],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("Y", "Yh", "Yc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("opset", [12, 17])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias,states", [(True, True), (False, False), (True, False)])
def test_the_decomposition_without_rounding_is_onnx_lstm(opset, direction, bias, states):
    """The step-by-step nodes are ONNX's LSTM (gate order, directions, biases, initial states), at ORT's own
    graph optimisations (ORT_ENABLE_ALL once turned a reversed Gather into an empty Slice)."""
    node, feeds = _lstm_case(direction, bias, states)
    want = _run([node], feeds, opset)
    got = _run(split_recurrent(node, opset, rounding=False), feeds, opset)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_decomposition_rounds_as_the_half_precision_reference(direction, bias):
    node, feeds = _lstm_case(direction, bias, states=False, seed=3)
    got = _run(split_recurrent(node, 13), feeds, 13)
    want = lstm_reference(feeds["X"], feeds["W"], feeds["R"], feeds.get("B"), direction, _half)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    plain = _run([node], feeds, 13)[0]
    assert np.abs(got[0] - plain).max() > 1e-4  # it does round: half precision is not FP32


@pytest.mark.parametrize("change", ["sequence_lens", "peepholes", "clip", "layout", "activations", "opset",
                                    "input_forget", "other op"])
def test_forms_it_does_not_handle_keep_the_storage_rule(change):
    node, _ = _lstm_case("forward", True, True)
    opset = 13
    if change == "sequence_lens":
        node.input[4] = "lens"
    elif change == "peepholes":
        node.input.append("P")
    elif change == "clip":
        node.attribute.append(helper.make_attribute("clip", 3.0))
    elif change == "layout":
        node.attribute.append(helper.make_attribute("layout", 1))
    elif change == "activations":
        node.attribute.append(helper.make_attribute("activations", ["Relu", "Tanh", "Tanh"]))
    elif change == "input_forget":
        node.attribute.append(helper.make_attribute("input_forget", 1))
    elif change == "opset":
        opset = 10
    else:
        node.op_type = "Gemm"
    assert not supported(node, opset) and split_recurrent(node, opset) is None
    plain, _ = _lstm_case("forward", True, True)
    plain.attribute.append(helper.make_attribute("activations", ["Sigmoid", "Tanh", "Tanh"]))  # spelled out: fine
    assert supported(plain, 13)


def _lstm_model(tmp_path, hidden=8, steps=12):
    """x -> Tanh -> LSTM (weights as initializers) -> Y -> Sigmoid: the LSTM is a candidate of its own."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, 6)) * 0.5).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, hidden)) * 0.5).astype(np.float32), "R")
    b = numpy_helper.from_array((rng.standard_normal((1, 8 * hidden)) * 0.5).astype(np.float32), "B")
    nodes = [helper.make_node("Tanh", ["x"], ["t"], name="pre"),
             helper.make_node("LSTM", ["t", "W", "R", "B"], ["y", "", ""], name="rnn", hidden_size=hidden),
             helper.make_node("Sigmoid", ["y"], ["out"], name="post")]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, 6])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [steps, 1, 1, hidden])],
                              initializer=[w, r, b])
    path = tmp_path / "lstm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    return path, (onnx.numpy_helper.to_array(w), onnx.numpy_helper.to_array(r), onnx.numpy_helper.to_array(b))


def test_gpu_mode_emulates_the_lstm_step_by_step_and_storage_mode_does_not(tmp_path):
    path, (w, r, b) = _lstm_model(tmp_path)
    outs = {}
    for mode in ("storage", "gpu"):
        job = open_job(path, atol=["1e-3"], rtol=["1e-3"], no_cache=True, fp16_arithmetic=mode,
                       val_range=["x:[-1,1]"])
        assert "rnn" in job.catalog.candidates
        plan = job.plan(["pre", "post"])  # only the LSTM in FP16
        feeds = job.feeds_list[0]
        outs[mode] = job.backend.run(plan, feeds, ["out"])["out"]
        t = np.tanh(feeds["x"]).astype(np.float32)
        assert job.backend.describe()["rules"] == rules_tag(mode)
        job.close()
    y16 = lstm_reference(_half(t), _half(w), _half(r), _half(b), "forward", _half)[0]
    # the GPU model: FP16 input and weights, half-precision steps, the output rounded (already FP16), then FP32 Sigmoid
    np.testing.assert_allclose(outs["gpu"], 1 / (1 + np.exp(-y16)), rtol=0, atol=2e-7)
    y32 = lstm_reference(_half(t), _half(w), _half(r), _half(b), "forward")[0]
    np.testing.assert_allclose(outs["storage"], 1 / (1 + np.exp(-_half(y32))), rtol=0, atol=2e-7)
    assert np.abs(outs["gpu"] - outs["storage"]).max() > 1e-4


def test_a_search_in_gpu_mode_through_an_lstm(tmp_path):
    """End to end: the default command's search with the LSTM step model passes and is 1-minimal."""
    import bisector

    path, _ = _lstm_model(tmp_path)
    result = bisector.precision(path, atol=2e-3, rtol=2e-3, fp16_arithmetic="gpu", val_range={"x": (-1, 1)},
                                output_dir=tmp_path / "out", no_cache=True, plot=False)
    assert result.passed and result.minimal
    assert result.constraints.backend["rules"] == rules_tag("gpu")


def test_recurrent_nodes_judged_with_too_little_error_are_named(tmp_path, caplog):
    """storage mode: the LSTM is named, with the way out; gpu mode: nothing to say; a GRU: named in either mode,
    without advice that does not apply to it."""
    import logging

    path, _ = _lstm_model(tmp_path)
    for mode, said in (("storage", True), ("gpu", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bisector"):
            open_job(path, atol=["1e-3"], no_cache=True, fp16_arithmetic=mode).close()
        text = " ".join(r.getMessage() for r in caplog.records if "Recurrent" in r.getMessage())
        assert bool(text) is said
        if said:
            assert "rnn (LSTM)" in text and "--fp16-arithmetic gpu" in text and "--confirm-on" in text
    model = onnx.load(str(path))
    rnn = model.graph.node[1]
    rnn.op_type = "GRU"
    del rnn.output[2]  # GRU has no cell state
    hidden = 8
    w = numpy_helper.from_array(np.full((1, 3 * hidden, 6), 0.1, np.float32), "W")
    r = numpy_helper.from_array(np.full((1, 3 * hidden, hidden), 0.1, np.float32), "R")
    b = numpy_helper.from_array(np.zeros((1, 6 * hidden), np.float32), "B")
    del model.graph.initializer[:]
    model.graph.initializer.extend([w, r, b])
    onnx.save(model, str(tmp_path / "gru.onnx"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bisector"):
        open_job(tmp_path / "gru.onnx", atol=["1e-3"], no_cache=True, fp16_arithmetic="gpu").close()
    text = " ".join(r.getMessage() for r in caplog.records if "Recurrent" in r.getMessage())
    assert "rnn (GRU)" in text and "--fp16-arithmetic gpu computes" not in text


def test_two_unnamed_lstms_with_odd_output_names_in_one_session(tmp_path):
    """The decomposition names its tensors after the LSTM's output (unique), not its node name (may be empty or
    repeated): two unnamed LSTMs in one block run, each as the half-precision reference says."""
    rng = np.random.default_rng(11)
    hidden, steps = 4, 5
    inits, nodes = [], []
    src = "x"
    for k, out in enumerate(["y/1", "y é 2"]):
        size = 3 if k == 0 else hidden
        for name, shape in ((f"W{k}", (1, 4 * hidden, size)), (f"R{k}", (1, 4 * hidden, hidden))):
            inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name))
        nodes.append(helper.make_node("LSTM", [src, f"W{k}", f"R{k}"], [out], hidden_size=hidden))
        inits.append(numpy_helper.from_array(np.array([steps, 1, hidden], np.int64), f"shape{k}"))
        nodes.append(helper.make_node("Reshape", [out, f"shape{k}"], [f"r{k}"], name=f"reshape{k}"))
        src = f"r{k}"
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, 3])],
                              [helper.make_tensor_value_info(src, TensorProto.FLOAT, [steps, 1, hidden])],
                              initializer=inits)
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    job = open_job(path, atol=["1e-3"], no_cache=True, fp16_arithmetic="gpu", val_range=["x:[-1,1]"])
    lstms = [c for c in job.catalog.candidates if job.catalog.nodes[c].op_type == "LSTM"]
    assert len(lstms) == 2
    feeds = job.feeds_list[0]
    got = job.backend.run(job.plan([c for c in job.catalog.candidates if c not in lstms]), feeds, [src])[src]
    job.close()
    w = {i.name: numpy_helper.to_array(i) for i in inits}
    h = _half(feeds["x"])
    for k in range(2):
        h = lstm_reference(h, _half(w[f"W{k}"]), _half(w[f"R{k}"]), None, "forward", _half)[0].reshape(steps, 1, hidden)
    np.testing.assert_array_equal(got, h)


def test_the_decompositions_of_two_unnamed_lstms_do_not_collide():
    """Directly, without the catalog's unique names: both decompositions in one graph."""
    first, feeds = _lstm_case("forward", True, False, seed=5)
    second = onnx.NodeProto()
    second.CopyFrom(first)
    first.name = second.name = ""
    second.input[0] = "x2"
    second.output[:] = ["Y2", "", ""]
    rng = np.random.default_rng(2)
    feeds["x2"] = rng.standard_normal(feeds["X"].shape).astype(np.float32)
    nodes = split_recurrent(first, 13) + split_recurrent(second, 13)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in feeds],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("Y", "Y2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    y, y2 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want2 = lstm_reference(feeds["x2"], feeds["W"], feeds["R"], feeds["B"], "forward", _half)[0]
    np.testing.assert_array_equal(y2, want2)


def _gru_reference(x, w, r, b, direction, half=None):
    """ONNX's GRU with linear_before_reset, each operation rounded by `half` (None: FP32)."""
    rd, sig, tanh = _half_ops(half)
    steps, batch, _ = x.shape
    hidden = r.shape[-1]

    def blk(a, k, n=1):
        return a[..., k * hidden:(k + n) * hidden]

    ys, hs = [], []
    for d, way in enumerate(["forward", "reverse"] if direction == "bidirectional" else [direction]):
        wb, rb = b[d][:3 * hidden], b[d][3 * hidden:]
        proj = rd(np.einsum("tbi,gi->tbg", x, w[d]).astype(np.float32))
        h = np.zeros((batch, hidden), np.float32)
        y = np.zeros((steps, batch, hidden), np.float32)
        for t in (range(steps) if way == "forward" else range(steps - 1, -1, -1)):
            zr = rd(rd(blk(proj[t], 0, 2) + rd(h @ blk(r[d].T, 0, 2))) + rd(blk(wb, 0, 2) + blk(rb, 0, 2)))
            z, re = sig(blk(zr, 0)), sig(blk(zr, 1))
            n = tanh(rd(rd(blk(proj[t], 2) + blk(wb, 2)) + rd(re * rd(rd(h @ blk(r[d].T, 2)) + blk(rb, 2)))))
            h = rd(rd(rd(1.0 - z) * n) + rd(z * h))
            y[t] = h
        ys.append(y)
        hs.append(h)
    return np.stack(ys, 1), np.stack(hs)


def _node_case(op, direction, bias, states, before_reset=0, seed=0, steps=6, batch=2, inputs=5, hidden=4):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gates = {"GRU": 3, "RNN": 1}[op]
    feeds = {"X": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
             "W": (rng.standard_normal((dirs, gates * hidden, inputs)) * 0.5).astype(np.float32),
             "R": (rng.standard_normal((dirs, gates * hidden, hidden)) * 0.5).astype(np.float32)}
    if bias:
        feeds["B"] = (rng.standard_normal((dirs, 2 * gates * hidden)) * 0.5).astype(np.float32)
    if states:
        feeds["h0"] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    extra = {"linear_before_reset": before_reset} if op == "GRU" else {}
    node = helper.make_node(op, ["X", "W", "R", "B" if bias else "", "", "h0" if states else ""], ["Y", "Yh"],
                            hidden_size=hidden, direction=direction, **extra)
    return node, feeds


def _run2(nodes, feeds, opset):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in feeds],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("Y", "Yh")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("op,before_reset", [("GRU", 1), ("RNN", 0)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias,states", [(True, True), (False, False)])
def test_gru_and_rnn_decompositions_without_rounding_are_onnx(op, before_reset, direction, bias, states):
    node, feeds = _node_case(op, direction, bias, states, before_reset)
    want = _run2([node], feeds, 14)
    got = _run2(split_recurrent(node, 14, rounding=False), feeds, 14)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_decomposition_rounds_as_the_half_precision_reference(direction):
    node, feeds = _node_case("GRU", direction, True, False, 1, seed=4)
    got = _run2(split_recurrent(node, 14), feeds, 14)
    want = _gru_reference(feeds["X"], feeds["W"], feeds["R"], feeds["B"], direction, _half)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert np.abs(got[0] - _run2([node], feeds, 14)[0]).max() > 1e-4


def test_a_gru_without_linear_before_reset_keeps_the_storage_rule():
    """ORT-CUDA computed that form exactly as the storage rules say (scripts/device/recurrent_rounding.py)."""
    node, _ = _node_case("GRU", "forward", True, False, 0)
    assert not supported(node, 14) and split_recurrent(node, 14) is None
    node, _ = _node_case("GRU", "forward", True, False, 1)
    assert supported(node, 14) and split_recurrent(node, 14)


def test_a_cudnn_form_gru_is_named_in_storage_mode_with_the_way_out(tmp_path, caplog):
    import logging

    path, _ = _lstm_model(tmp_path)
    model = onnx.load(str(path))
    rnn = model.graph.node[1]
    rnn.op_type = "GRU"
    del rnn.output[2]
    rnn.attribute.append(helper.make_attribute("linear_before_reset", 1))
    hidden = 8
    del model.graph.initializer[:]
    model.graph.initializer.extend([numpy_helper.from_array(np.full(s, 0.1, np.float32), n) for n, s in (
        ("W", (1, 3 * hidden, 6)), ("R", (1, 3 * hidden, hidden)), ("B", (1, 6 * hidden)))])
    onnx.save(model, str(tmp_path / "gru1.onnx"))
    for mode, said in (("storage", True), ("gpu", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bisector"):
            open_job(tmp_path / "gru1.onnx", atol=["1e-3"], no_cache=True, fp16_arithmetic=mode).close()
        text = " ".join(r.getMessage() for r in caplog.records if "Recurrent" in r.getMessage())
        assert ("rnn (GRU)" in text and "--fp16-arithmetic gpu computes" in text) is said and bool(text) is said


def test_report_names_an_lstm_left_fp16_under_the_storage_rules(tmp_path):
    """report.md (what a nightly job's reader sees, not the log) names an FP16 LSTM judged with FP32 math inside;
    in gpu mode, which computes it step by step, it does not."""
    import bisector

    path, _ = _lstm_model(tmp_path)
    for mode, said in (("storage", True), ("gpu", False)):
        out = tmp_path / f"out_{mode}"
        result = bisector.precision(path, atol=0.5, rtol=0.5, fp16_arithmetic=mode, val_range={"x": (-1, 1)},
                                    output_dir=out, no_cache=True, plot=False)
        assert result.passed and "rnn" not in result.fp32_nodes  # a loose tolerance: the LSTM stays FP16
        report = (out / "report.md").read_text()
        assert ("Recurrent nodes in FP16 judged with FP32 math inside:** `rnn` (LSTM)" in report) is said, report


def test_inspect_lists_recurrent_nodes_and_whether_gpu_mode_computes_them_step_by_step(tmp_path):
    import json

    from typer.testing import CliRunner

    from bisector.cli.main import app

    path, _ = _lstm_model(tmp_path)
    model = onnx.load(str(path))
    model.graph.node[1].attribute.append(helper.make_attribute("clip", 5.0))  # a form gpu mode does not handle
    onnx.save(model, str(tmp_path / "clipped.onnx"))
    doc = bisector_inspect(path)
    assert doc["recurrent"] == {"rnn": {"op": "LSTM", "gpu_stepwise": True}}
    assert bisector_inspect(tmp_path / "clipped.onnx")["recurrent"] == {"rnn": {"op": "LSTM", "gpu_stepwise": False}}
    run = CliRunner().invoke(app, ["inspect", str(tmp_path / "clipped.onnx")])
    assert run.exit_code == 0 and "rnn (LSTM; gpu: not modelled)" in run.output
    run = CliRunner().invoke(app, ["inspect", str(path), "--json", str(tmp_path / "i.json")])
    assert json.loads((tmp_path / "i.json").read_text())["recurrent"]["rnn"]["gpu_stepwise"] is True


def bisector_inspect(path):
    import bisector

    return bisector.inspect(path)
