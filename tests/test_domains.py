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
