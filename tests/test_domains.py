"""Models whose opset imports leave out the default domain, and ONNX-ML operators (found by running the onnx
wheel's backend node tests through `precision`: both ended in "internal error" at the mixed model's check)."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from bisector.model.catalog import Catalog

from .conftest import main_cli


def _save(tmp_path, nodes, opsets, name="m.onnx", inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=list(inits))
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=opsets, ir_version=8), path)
    return path


def test_a_model_importing_only_a_contrib_domain_gets_a_mixed_model_with_an_opset_for_its_casts(tmp_path):
    path = _save(tmp_path, [helper.make_node("Gelu", ["x"], ["y"], name="gelu", domain="com.microsoft")],
                 [helper.make_opsetid("com.microsoft", 1)])
    assert main_cli("precision", path, "--fp16", "--atol", "1e-2", "-o", tmp_path / "o", "--no-cache") == 0
    mixed = onnx.load(tmp_path / "o" / "model.mixed.onnx")
    assert {(i.domain, i.version) for i in mixed.opset_import} == {("com.microsoft", 1), ("", 13)}
    assert [n.op_type for n in mixed.graph.node] == ["Cast", "Gelu", "Cast"]  # Gelu judged FP16: it passes 1e-2
    onnx.checker.check_model(mixed)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    y = ort.InferenceSession(mixed.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert y.dtype == np.float32 and np.allclose(y, x * 0.5 * (1 + np.vectorize(math.erf)(x / np.sqrt(2))), atol=1e-2)


def test_onnx_ml_operators_are_pinned_fp32(tmp_path):
    scaler = helper.make_node("Scaler", ["x"], ["s"], name="scale", domain="ai.onnx.ml", offset=[0.5], scale=[2.0])
    relu = helper.make_node("Relu", ["s"], ["y"], name="relu")
    path = _save(tmp_path, [scaler, relu], [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    cat = Catalog.load(path)
    assert cat.pinned["scale"].startswith("ONNX-ML operator (Scaler)") and cat.candidates == ("relu",)
    assert main_cli("precision", path, "--fp16", "-o", tmp_path / "o", "--no-cache") == 0
    c = json.loads((tmp_path / "o" / "constraints.json").read_text())
    assert "scale" in c["pinned"]
    onnx.checker.check_model(onnx.load(tmp_path / "o" / "model.mixed.onnx"), full_check=True)


def _scan_without_body_shapes(tmp_path):
    from onnx import numpy_helper

    def vi(n):  # element type only: ORT infers the shapes from the outer graph, where the whole model declares them
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, None)

    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"], name="body_add"),
                              helper.make_node("Identity", ["s_out"], ["y_t"], name="body_id")],
                             "body", [vi("s_in"), vi("x_t")], [vi("s_out"), vi("y_t")])
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"], name="double"),
             helper.make_node("Scan", ["init", "x2"], ["final", "ys"], name="scan", num_scan_inputs=1, body=body),
             helper.make_node("Tanh", ["ys"], ["y"], name="squash")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
                          initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                                       numpy_helper.from_array(np.zeros(3, np.float32), "init")])
    path = tmp_path / "scan.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_scan_whose_body_declares_no_shapes_runs_on_its_own_with_its_inputs_shapes(tmp_path):
    """ORT builds such a Scan alone but fails its first run ("Subgraph must have the shape set for all outputs"):
    the whole model declares the shapes, a one-node session did not. The executor builds it again with them."""
    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.fp16.plan import Plan

    path = _scan_without_body_shapes(tmp_path)
    assert main_cli("precision", path, "--fp16", "--atol", "1e-2", "-o", tmp_path / "o", "--no-cache") == 0
    cat = Catalog.load(path)
    be = EmulateBackend()
    be.open(cat)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    fp32 = be.run(Plan(frozenset(cat.candidates), cat.candidates), {"x": x})["y"]
    np.testing.assert_allclose(fp32, np.tanh(np.cumsum(2 * x, axis=0)), rtol=1e-6)
    assert ("node", "scan") in be.executor._shaped
    # another shape (what a part of a batch feeds) builds a session of its own instead of failing
    x5 = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    out = be.executor.run_node(cat.nodes["scan"], [np.zeros(3, np.float32), 2 * x5])
    np.testing.assert_allclose(out[1], np.cumsum(2 * x5, axis=0), rtol=1e-6)


def test_an_operator_ort_runs_as_its_onnx_function_builds_on_its_own(tmp_path):
    """Opset 27's CausalConvWithState has no ORT kernel: ORT expands the function that defines it, which needs
    the inputs' shapes declared (the onnx wheel's own node test model)."""
    import pytest

    try:
        from onnx.backend.test.case.node import collect_testcases
    except ImportError:  # pragma: no cover - an onnx without its test cases
        pytest.skip("onnx's backend test cases are not installed")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = next((c for c in collect_testcases() if c.name == "test_causal_conv_with_state_basic"), None)
    if case is None:
        pytest.skip("this onnx has no CausalConvWithState test case")
    path = tmp_path / "ccws.onnx"
    path.write_bytes(case.model.SerializeToString())
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        pytest.skip("this ONNX Runtime cannot load opset 27")
    assert main_cli("precision", path, "--fp16", "-o", tmp_path / "o", "--no-cache") == 0


def test_an_input_with_a_fixed_empty_dimension_is_fed_empty_not_one(tmp_path, caplog):
    """dim_value 0 is a fixed dimension (ORT accepts only 0 there; Polygraphy's data loader calls only negative or
    named dimensions dynamic). Read as dynamic, bisector fed 1 and ORT refused the golden run (46 of the onnx
    wheel's node tests, e.g. CastLike's empty `like` input)."""
    from bisector.model.inputs import input_metas, resolve_shapes

    g = helper.make_graph([helper.make_node("CastLike", ["x", "like"], ["c"], name="castlike"),
                           helper.make_node("Tanh", ["c"], ["y"], name="tanh")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("like", TensorProto.FLOAT, [0])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "empty_dim.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    cat = Catalog.load(path)
    assert resolve_shapes(input_metas(cat), {})["like"] == (0,)
    assert "dynamic" not in caplog.text
    assert main_cli("precision", path, "--fp16", "--atol", "1e-2", "-o", tmp_path / "o", "--no-cache") == 0
    assert main_cli("precision", path, "--fp16", "--input-shapes", "like:[1]", "-o", tmp_path / "o2", "--no-cache") == 2


def test_a_contrib_operator_without_an_fp16_type_is_pinned_and_the_mixed_model_loads(tmp_path):
    """DynamicQuantizeLSTM (com.microsoft) takes float32 only: ONNX has no schema for it, ONNX Runtime has. It was
    a candidate, judged FP16, and the mixed model fed it FP16 (an int8 BiLSTM diacritizer from PyPI: ORT refused
    to load model.mixed.onnx, "Type 'tensor(float16)' of input parameter ... is invalid")."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    hidden, size = 4, 3
    inits = [numpy_helper.from_array(rng.integers(-20, 20, (1, size, 4 * hidden), dtype=np.int8), "W"),
             numpy_helper.from_array(rng.integers(-20, 20, (1, hidden, 4 * hidden), dtype=np.int8), "R"),
             numpy_helper.from_array(np.zeros((1, 8 * hidden), np.float32), "B"),
             numpy_helper.from_array(np.full((1,), 0.02, np.float32), "ws"),
             numpy_helper.from_array(np.zeros((1,), np.int8), "wz"),
             numpy_helper.from_array(np.full((1,), 0.02, np.float32), "rs"),
             numpy_helper.from_array(np.zeros((1,), np.int8), "rz")]
    nodes = [helper.make_node("Relu", ["x"], ["xr"], name="relu"),
             helper.make_node("Unsqueeze", ["xr", "axes"], ["xs"], name="unsq"),
             helper.make_node("DynamicQuantizeLSTM", ["xs", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"],
                              ["h"], name="lstm", domain="com.microsoft", hidden_size=hidden),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="reshape")]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "axes"),
              numpy_helper.from_array(np.array([2, hidden], np.int64), "shape")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, hidden])], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=8), path)
    cat = Catalog.load(path)
    assert cat.pinned["lstm"] == "DynamicQuantizeLSTM has no FP16 type in ONNX Runtime's com.microsoft schema"
    assert "lstm" not in cat.candidates and "relu" in cat.candidates
    assert main_cli("precision", path, "--fp16", "--atol", "1", "-o", tmp_path / "o", "--no-cache") == 0
    assert "lstm" in json.loads((tmp_path / "o" / "constraints.json").read_text())["pinned"]
    mixed = tmp_path / "o" / "model.mixed.onnx"
    x = np.linspace(-1, 1, 2 * size, dtype=np.float32).reshape(2, size)
    sess = ort.InferenceSession(str(mixed), providers=["CPUExecutionProvider"])  # failed to load before
    assert sess.run(None, {"x": x})[0].shape == (2, hidden)
