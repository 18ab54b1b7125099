"""Outputs whose tolerance no FP16 value meets (bisector.search.unreachable) and how the search uses them."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import bisector
from bisector.compare import Tolerance, elementwise_ok
from bisector.model.catalog import Catalog
from bisector.values import PerOutput
from bisector.search import driver
from bisector.search.unreachable import fp32_for_output, unreachable_outputs

FINITE_FP16 = (lambda a: a[np.isfinite(a)].astype(np.float32))(np.arange(65536, dtype=np.uint16).view(np.float16))


def _brute_force(g: float, atol: float, rtol: float, m: float) -> tuple[bool, bool]:
    """(no FP16 value passes, a bracketing FP16 neighbour fails), by trying every finite FP16 value."""
    ok = elementwise_ok(FINITE_FP16, np.full(FINITE_FP16.shape, g, np.float32), atol, rtol, m)
    below = FINITE_FP16[FINITE_FP16 <= g]
    above = FINITE_FP16[FINITE_FP16 >= g]
    lo = np.float32(below.max()) if below.size else np.float32(-np.inf)
    hi = np.float32(above.min()) if above.size else np.float32(np.inf)
    pair = elementwise_ok(np.array([lo, hi], np.float32), np.array([g, g], np.float32), atol, rtol, m)
    return not ok.any(), not pair.all()


@pytest.mark.parametrize("atol,rtol,margin", [(1e-4, 1e-4, 0.9), (1e-3, 0.0, 1.0), (0.0, 1e-3, 1.0),
                                              (1e-7, 1e-7, 1.0), (5e-2, 5e-2, 0.5)])
def test_unreachable_elements_are_those_no_fp16_value_meets(atol, rtol, margin):
    rng = np.random.default_rng(7)
    golden = np.concatenate([
        rng.uniform(-2, 2, 60), rng.uniform(-1e-5, 1e-5, 20), rng.uniform(6.0e4, 7.0e4, 10),
        FINITE_FP16[rng.integers(0, FINITE_FP16.size, 10)],  # FP16 values themselves: always reachable
        [0.99987, -0.99987, 65504.0, 65519.0, 65521.0, 0.0],
    ]).astype(np.float32)
    tol = Tolerance(atol=PerOutput(atol), rtol=PerOutput(rtol), margin=margin)
    found = unreachable_outputs([{"y": golden.reshape(2, -1)}], tol)
    expected = [_brute_force(float(g), atol, rtol, margin) for g in golden]
    none = sum(e[0] for e in expected)
    coarse = sum(e[1] for e in expected)
    if not none and not coarse:
        assert found == {}
        return
    u = found["y"]
    assert (u.elements, u.total) == (none, golden.size)
    assert u.coarse == pytest.approx(coarse / golden.size)
    if none:
        first = golden[[e[0] for e in expected].index(True)]
        g, lo, hi, allowed = u.example
        assert g == pytest.approx(float(first)) and lo <= g <= hi
        assert allowed == pytest.approx(max(atol, rtol * abs(g)) * margin)


def test_only_elementwise_float32_outputs_and_finite_values_count():
    tol = Tolerance(atol=PerOutput(1e-5), rtol=PerOutput(1e-5), stat=PerOutput("elemwise", {"m": "mean"}))
    golden = [{"y": np.array([0.1234567, np.nan, np.inf], np.float32), "m": np.array([0.1234567], np.float32),
               "h": np.array([0.1234567], np.float16), "i": np.array([3], np.int64)}]
    found = unreachable_outputs(golden, tol)
    assert set(found) == {"y"}
    assert (found["y"].elements, found["y"].total) == (1, 3)


def _chain_model(tail: str = "copies", scale: float = 0.5) -> onnx.ModelProto:
    """x -> MatMul -> Tanh -> MatMul -> Softmax -> [Reshape -> Cast -> Identity | Concat with a second branch] -> y.
    A small `scale` keeps the logits small: FP16 upstream then costs the output little, its own storage a lot."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.normal(0, scale, (16, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (8, 4)).astype(np.float32), "w2")
    shape = numpy_helper.from_array(np.array([2, 2], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
             helper.make_node("Tanh", ["h1"], ["t"], name="tanh"),
             helper.make_node("MatMul", ["t", "w2"], ["h2"], name="mm2"),
             helper.make_node("Softmax", ["h2"], ["p"], name="softmax", axis=-1)]
    if tail == "copies":
        nodes += [helper.make_node("Reshape", ["p", "shape"], ["r"], name="reshape"),
                  helper.make_node("Cast", ["r"], ["c"], name="cast", to=TensorProto.FLOAT),
                  helper.make_node("Identity", ["c"], ["y"], name="identity")]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    else:
        nodes += [helper.make_node("Concat", ["p", "h2"], ["y"], name="concat", axis=-1)]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [out], initializer=[w1, w2, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_walk_goes_back_through_copies_to_the_node_that_computes(tmp_path):
    onnx.save(_chain_model("copies"), tmp_path / "copies.onnx")
    cat = Catalog.load(tmp_path / "copies.onnx")
    # the Cast is no candidate (it never rounds) but passes its input's values on: the walk goes through it
    assert fp32_for_output(cat, "y") == ["identity", "reshape", "softmax"]
    assert fp32_for_output(cat, "h1") == ["mm1"]
    onnx.save(_chain_model("concat"), tmp_path / "concat.onnx")
    # Concat joins two inputs: which one an element came from is not followed; the Concat itself is required
    assert fp32_for_output(Catalog.load(tmp_path / "concat.onnx"), "y") == ["concat"]
    assert fp32_for_output(cat, "x") == []  # a graph input: nothing computes it


def test_the_search_keeps_the_nodes_of_an_unreachable_output_fp32_from_the_start(tmp_path, monkeypatch, caplog):
    path = tmp_path / "chain.onnx"
    onnx.save(_chain_model("copies", scale=1e-2), path)
    # probabilities near 0.25, where FP16's spacing is 1.2e-4: most have no FP16 value within 3e-5
    opts = dict(val_range={"x": (-1, 1)}, atol=3e-5, rtol=3e-5, no_cache=True)
    chain = {"identity", "reshape", "softmax"}
    with caplog.at_level(logging.WARNING, logger="bisector"):
        kept = bisector.precision(path, output_dir=tmp_path / "kept", **opts)
    assert "no FP16 value within the tolerance" in caplog.text and "keeps 'identity', 'reshape', 'softmax'" in caplog.text
    assert kept.passed and kept.minimal and chain <= set(kept.fp32_nodes)
    c = json.loads((tmp_path / "kept" / "constraints.json").read_text())
    entry = c["fp16_unreachable"]["y"]
    assert entry["kept_from_start"] and entry["nodes"] == ["identity", "reshape", "softmax"] and entry["elements"] >= 1
    assert "Outputs finer than FP16" in (tmp_path / "kept" / "report.md").read_text()

    # a backend that may not store FP16 values at the outputs: the nodes are named, the search is the plain one
    monkeypatch.setattr(driver, "_STORES_FP16", ())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bisector"):
        plain = bisector.precision(path, output_dir=tmp_path / "plain", **opts)
    assert "must stay FP32 wherever this output is stored in FP16" in caplog.text
    c = json.loads((tmp_path / "plain" / "constraints.json").read_text())
    assert not c["fp16_unreachable"]["y"]["kept_from_start"]
    # the same answer; keeping them from the start spares the evaluations that isolate them
    assert set(plain.fp32_nodes) == set(kept.fp32_nodes) == chain
    assert kept.constraints.evaluations.new < plain.constraints.evaluations.new


def test_reachable_tolerances_change_nothing(tmp_path, caplog):
    path = tmp_path / "chain.onnx"
    onnx.save(_chain_model("copies"), path)
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = bisector.precision(path, output_dir=tmp_path / "o", val_range={"x": (-1, 1)}, atol=1e-2, rtol=1e-2,
                               no_cache=True)
    assert r.passed and "FP16 value within" not in caplog.text
    assert json.loads((tmp_path / "o" / "constraints.json").read_text())["fp16_unreachable"] == {}


def test_an_output_no_candidate_computes_is_left_out(tmp_path, caplog):
    """A float output made by a Cast from integers (no candidate: FP16 never reaches it) with values FP16 lacks
    (2049) is not reported; the Softmax output beside it is."""
    nodes = [helper.make_node("Cast", ["i"], ["ci"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Softmax", ["x"], ["p"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("i", TensorProto.INT64, [3]),
                                             helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("ci", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("p", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "two.onnx")
    cat = Catalog.load(tmp_path / "two.onnx")
    oracle = SimpleNamespace(backend=SimpleNamespace(catalog=cat, name="emulate"), candidates=tuple(cat.candidates),
                             tolerance=Tolerance(atol=PerOutput(1e-6), rtol=PerOutput(1e-6)),
                             golden=[{"ci": np.array([2049.0, 2051.0, 1.0], np.float32),
                                      "p": np.array([0.1, 0.2, 0.3, 0.4], np.float32)}])
    with caplog.at_level(logging.WARNING, logger="bisector"):
        found = driver._unreachable(oracle)
    assert set(found) == {"p"} and found["p"].nodes == ["softmax"] and found["p"].kept
    assert "'ci'" not in caplog.text and "output 'p'" in caplog.text
    oracle.backend.name = "tensorrt"  # may not store FP16 values at the outputs: named, not kept
    assert not driver._unreachable(oracle)["p"].kept
    oracle.backend = SimpleNamespace(name="emulate")  # no model to walk: nothing said
    assert driver._unreachable(oracle) == {}
