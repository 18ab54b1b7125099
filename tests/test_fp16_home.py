"""The FP16 rules have one home (bisector.fp16): change a rule there and the emulation, the sensitivity profile and
the mixed-precision ONNX all follow. Plus the structural promises of that refactor: one graph layer, no private
imports across modules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisector.backends.emulate.backend import EmulateBackend
from bisector.backends.emulate.executor import NodeExecutor
from bisector.compare import Tolerance
from bisector.fp16 import rules
from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.plan import Plan
from bisector.fp16.points import Read, rounding_points
from bisector.model.catalog import Catalog
from bisector.sensitivity import compute_scores
from bisector.values import PerOutput

BISECTOR = Path(__file__).resolve().parents[1] / "bisector"


def _model() -> onnx.ModelProto:
    """y = Relu(x @ W + b), W an initializer with an out-of-range value, b a Constant with a tiny one."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (8, 8)).astype(np.float32)
    w[0, 0] = 1e5
    b = rng.uniform(-1, 1, (8,)).astype(np.float32)
    b[1] = 1e-9
    nodes = [
        helper.make_node("Constant", [], ["b"], value=onnx.numpy_helper.from_array(b), name="bias"),
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                          initializer=[onnx.numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _three_ways(cat: Catalog, feeds) -> tuple[np.ndarray, np.ndarray, float]:
    """(emulated y, mixed ONNX y run in ORT node by node, profile score of `mm`) for the all-FP16 plan."""
    plan = Plan.all_fp16(cat.candidates)
    be = EmulateBackend()
    be.open(cat)
    emulated = be.run(plan, feeds)["y"]
    mixed = NodeExecutor(Catalog.from_model(build_mixed_model(cat, plan))).run_reference(feeds)["y"]
    tol = Tolerance(atol=PerOutput(1e-3), rtol=PerOutput(1e-3), stat=PerOutput("elemwise"))
    scores = {r["name"]: r["local"] for r in compute_scores(cat, be, [feeds], tol)}
    return emulated, np.asarray(mixed, np.float32), scores["mm"]


def test_a_changed_weight_rule_reaches_emulation_profile_and_mixed_model(monkeypatch):
    cat = Catalog.from_model(_model())
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (4, 8)).astype(np.float32)}
    emulated, mixed, score = _three_ways(cat, feeds)
    np.testing.assert_allclose(emulated, mixed, rtol=1e-6, atol=1e-6)

    # the weight rule, changed in its one home: flush instead of clamp (65504 -> 0) and halve the rest
    original = rules.round_weight

    def flushing(a):
        a = np.asarray(a, np.float32)
        return original(np.where(np.abs(a) > rules.FP16_MAX, 0, a) * 0.5)

    monkeypatch.setattr(rules, "round_weight", flushing)
    emulated2, mixed2, score2 = _three_ways(Catalog.from_model(_model()), feeds)
    assert not np.allclose(emulated2, emulated)  # the emulation followed
    np.testing.assert_allclose(emulated2, mixed2, rtol=1e-6, atol=1e-6)  # and the mixed model with it
    assert score2 != score  # and the profile


def test_rounding_points_follow_design_rules():
    cat = Catalog.from_model(_model())
    points = rounding_points(cat, Plan(frozenset({"relu"}), cat.candidates))
    assert points.read("mm", 0, "x") is Read.ROUND  # graph input into an FP16 node
    assert points.read("mm", 1, "W") is Read.WEIGHT  # initializer
    assert points.read("add", 1, "b") is Read.WEIGHT  # Constant output: a weight too
    assert points.read("add", 0, "m") is Read.EXACT  # stored FP16 by its FP16 producer
    assert points.read("relu", 0, "a") is Read.EXACT  # an FP32 reader
    assert points.stores("add") and not points.stores("relu")
    assert points.rounds_output("add") and not rounding_points(cat, {"relu"}).rounds_output("relu")  # exact op


def test_no_module_walks_subgraphs_or_imports_private_helpers():
    for path in BISECTOR.rglob("*.py"):
        text = path.read_text()
        rel = path.relative_to(BISECTOR).as_posix()
        if rel != "model/graph.py":
            assert "AttributeProto.GRAPH" not in text and ".graphs" not in text, f"{rel} walks subgraphs itself"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bisector"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{rel} imports {private} from {node.module}"


@pytest.mark.parametrize("weight,expected", [(1e5, 65504.0), (-1e9, -65504.0), (1e-9, 2.0**-24), (0.0, 0.0)])
def test_weight_rule(weight, expected):
    assert float(rules.round_weight(np.array([weight], np.float32))[0]) == expected
