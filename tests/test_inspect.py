"""`bisector inspect`: candidates, pinned nodes with reasons, op histogram, I/O, TensorRT layer names."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .conftest import FIXTURES, PLANTED, SEED, run_cli


def _model_with_shape_path_and_unnamed_nodes(path):
    """x -> Relu (unnamed) -> Reshape(shape from Shape->Gather->Concat) ; duplicate-named Abs nodes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),  # unnamed: TensorRT calls it node_of_r
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "idx"], ["g"], name="gather_dim", axis=0),
        helper.make_node("Cast", ["g"], ["gf"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["gf", "two"], ["gm"], name="shape_math"),
        helper.make_node("Cast", ["gm"], ["gi"], name="to_int", to=TensorProto.INT64),
        helper.make_node("Concat", ["minus1", "gi"], ["shp"], name="concat_shape", axis=0),
        helper.make_node("Reshape", ["r", "shp"], ["rr"], name="reshape"),
        helper.make_node("Abs", ["rr"], ["a1"], name="dup"),
        helper.make_node("Abs", ["a1"], ["y"], name="dup"),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "idx"),
             numpy_helper.from_array(np.array(1.0, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_inspect_seed_lists_candidates_and_exits_0():
    r = run_cli("inspect", SEED)
    assert r.returncode == 0, r.stderr
    for name in ("MatMul_0", "Add", "Sub", "MatMul_1"):
        assert name in r.stdout
    assert "Op histogram" in r.stdout and "float32" in r.stdout and "[1, 1, 256, 256]" in r.stdout


def test_inspect_json_pinned_reasons_and_layer_names(tmp_path):
    model = _model_with_shape_path_and_unnamed_nodes(tmp_path / "m.onnx")
    js = tmp_path / "inspect.json"
    r = run_cli("inspect", model, "--json", js)
    assert r.returncode == 0, r.stderr
    doc = json.loads(js.read_text())
    assert "shape_math" in doc["pinned"] and "shape" in doc["pinned"]["shape_math"]
    assert "Pinned nodes" in r.stdout and "shape_math" in r.stdout
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["node_of_r"]["status"] == "candidate"
    assert nodes["node_of_r"]["tensorrt_layer"] == "node_of_r" and nodes["node_of_r"]["name_source"] == "assigned"
    assert nodes["reshape"]["tensorrt_layer"] == "reshape"
    dups = [n for n in doc["nodes"] if n["op"] == "Abs"]
    assert dups[0]["tensorrt_layer"] == "dup" and dups[1]["tensorrt_layer"] is None
    assert nodes["shape"]["status"] == "skipped" and nodes["to_float"]["status"] == "skipped"
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, "n"]}]
    assert doc["outputs"][0]["name"] == "y"
    hist = {h["op"]: h for h in doc["op_histogram"]}
    assert hist["Abs"]["count"] == 2 and hist["Abs"]["candidates"] == 2 and hist["Mul"]["pinned"] == 1


def test_inspect_json_to_stdout_only(tmp_path):
    r = run_cli("inspect", PLANTED, "--json", "-")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert len(doc["candidates"]) == 102 and doc["pinned"] == {}


def test_inspect_bad_model_exit_2(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    r = run_cli("inspect", bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert run_cli("inspect", tmp_path / "missing.onnx").returncode == 2


def test_inspect_lists_the_files_nodes_when_weights_are_constant_nodes(tmp_path):
    """The catalog holds large Constant-node weights as initializers (`weights.detach`); inspect still shows the
    file: every node in file order, names as the model gives them (not "renamed"), the Constants as skipped."""
    from bisector.app.inspect import inspect

    from .test_weights import _weights_as_constant_nodes

    as_nodes, consts = _weights_as_constant_nodes(onnx.load(str(FIXTURES / "exported" / "cnn.onnx")))
    unnamed = next(n for n in as_nodes.graph.node if n.op_type == "Constant")
    unnamed.name = ""  # an unnamed large Constant too
    onnx.save(as_nodes, tmp_path / "c.onnx")
    doc = inspect(tmp_path / "c.onnx")
    assert doc["nodes_total"] == len(as_nodes.graph.node)
    assert [n["op"] for n in doc["nodes"]] == [n.op_type for n in as_nodes.graph.node]
    assert [n["index"] for n in doc["nodes"]] == list(range(len(as_nodes.graph.node)))
    assert all(n["name_source"] == "model" for n in doc["nodes"] if n["name"] != f"node_of_{unnamed.output[0]}")
    assert {n["name"] for n in doc["nodes"] if n["op"] != "Constant"} == {
        n.name for n in as_nodes.graph.node if n.op_type != "Constant"}
    assert all(n["status"] == "skipped" for n in doc["nodes"] if n["op"] == "Constant")
    const_row = next(r for r in doc["op_histogram"] if r["op"] == "Constant")
    assert const_row["count"] == len(consts)


def test_inspect_lists_the_files_nodes_read_without_their_weights(tmp_path, monkeypatch):
    """The file's nodes come from its protobuf read without the large initializers' bytes (`read_graph`): the
    same rows as from a whole parse, an unnamed node included."""
    from bisector.app.inspect import inspect
    from bisector.model import pages

    model = onnx.load(str(FIXTURES / "exported" / "cnn.onnx"))
    model.graph.node[1].name = ""
    onnx.save(model, tmp_path / "m.onnx")
    docs = []
    for switch in ("1", "0"):  # "0": onnx.load, as before
        monkeypatch.setenv(pages.ENV, switch)
        docs.append(inspect(tmp_path / "m.onnx"))
    assert docs[0]["nodes"] == docs[1]["nodes"]
    assert [n["op"] for n in docs[0]["nodes"]] == [n.op_type for n in model.graph.node]
