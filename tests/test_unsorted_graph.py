"""Models whose nodes are not in topological order: ONNX Runtime and TensorRT's parser sort them, so such files
ship (onnxconverter-common's FP16 conversion with keep_io_types appends the input Casts after their readers:
@imgly/background-removal-data's IS-Net model ended in "internal error: KeyError: 'graph_input_cast_0'")."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.model.catalog import Catalog
from bisector.model.graph import sort_topologically

from .conftest import FIXTURES, run_cli


def _out_of_order_model(branch_in_order: bool = False) -> onnx.ModelProto:
    """x -> Cast(FP16) -> Cast(FP32) -> Mul(w) -> Tanh -> If(then: Add(one), Sigmoid) -> y, the main graph listing
    readers before their producers (the If reads Tanh's output from its branches), as keep_io_types conversions
    do; the then-branch too unless `branch_in_order` (ONNX Runtime sorts a main graph, not a subgraph)."""
    w = numpy_helper.from_array(np.full((4,), 1.7, np.float32), "w")
    one = numpy_helper.from_array(np.ones((4,), np.float32), "one")
    then_nodes = [helper.make_node("Sigmoid", ["t_in"], ["t_out"], name="then_sigmoid"),  # reads the Add's output
                  helper.make_node("Add", ["th", "one"], ["t_in"], name="then_add")]
    then_g = helper.make_graph(
        then_nodes[::-1] if branch_in_order else then_nodes,
        "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [1, 4])])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["th"], ["e_out"], name="else_neg")],
        "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [1, 4])])
    nodes = [
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),  # reads th
        helper.make_node("Tanh", ["m"], ["th"], name="tanh"),
        helper.make_node("Mul", ["xc32", "w"], ["m"], name="mul"),
        helper.make_node("Cast", ["xc16"], ["xc32"], name="cast_back", to=TensorProto.FLOAT),
        helper.make_node("Cast", ["x"], ["xc16"], name="graph_input_cast0", to=TensorProto.FLOAT16),
    ]
    g = helper.make_graph(nodes, "unsorted",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, one])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sort_is_stable_and_a_sorted_graph_is_left_alone():
    m = _out_of_order_model()
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(m)
    assert sort_topologically(m.graph) == 2  # the main graph and the then-branch
    assert [n.name for n in m.graph.node] == ["graph_input_cast0", "cast_back", "mul", "tanh", "branch"]
    then_g = next(a.g for a in m.graph.node[-1].attribute if a.name == "then_branch")
    assert [n.name for n in then_g.node] == ["then_add", "then_sigmoid"]
    onnx.checker.check_model(m)
    before = m.SerializeToString()
    assert sort_topologically(m.graph) == 0 and m.SerializeToString() == before
    # a graph already in order keeps its order even where another order would do (ties go by file position)
    planted = onnx.load(str(FIXTURES / "planted.onnx"))
    names = [n.name for n in planted.graph.node]
    assert sort_topologically(planted.graph) == 0 and [n.name for n in planted.graph.node] == names


def test_a_cycle_is_a_usage_error_naming_the_model(tmp_path):
    m = _out_of_order_model()
    m.graph.node[2].input[0] = "th"  # mul reads tanh's output, tanh reads mul's: a cycle
    path = tmp_path / "cycle.onnx"
    onnx.save(m, str(path))
    r = run_cli("precision", str(path), "--fp16", "--atol", "1e-3", "-o", str(tmp_path / "out"))
    assert r.returncode == 2, (r.stdout + r.stderr)
    assert "has a cycle" in (r.stdout + r.stderr) and "cycle.onnx" in (r.stdout + r.stderr) and "Traceback" not in (r.stdout + r.stderr)


@pytest.mark.parametrize("cond", [True, False])
def test_an_unsorted_model_searches_and_its_mixed_model_is_valid(tmp_path, cond):
    m = _out_of_order_model(branch_in_order=True)
    path = tmp_path / "unsorted.onnx"
    onnx.save(m, str(path))
    x = np.array([[0.3, -1.2, 2.5, 0.01]], np.float32)
    # ONNX Runtime runs the file as it is (it sorts), which is why such files exist
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x, "cond": np.array(cond)})
    cat = Catalog.load(path)
    assert {"mul", "tanh", "branch"} <= set(cat.candidates)
    np.savez(tmp_path / "in.npz", x=x, cond=np.array(cond))
    out = tmp_path / "out"
    r = run_cli("precision", str(path), "--fp16", "--atol", "1e-9", "--rtol", "0", "--load-inputs",
                str(tmp_path / "in.npz"), "-o", str(out))
    assert r.returncode in (0, 1), (r.stdout + r.stderr)  # judged, either way; no internal error
    assert "internal error" not in (r.stdout + r.stderr) and "not in topological order" in (r.stdout + r.stderr)
    verdict = json.loads((out / "constraints.json").read_text())
    mixed = onnx.load(str(out / "model.mixed.onnx"))
    onnx.checker.check_model(mixed)  # written in valid order
    ort.InferenceSession(mixed.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "cond": np.array(cond)})
    assert set(verdict["fp32_nodes"]) <= set(cat.candidates)
