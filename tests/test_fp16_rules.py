"""The weight rule's fast paths (ORT's Cast for the conversion, reductions instead of masks) give exactly the
values of the plain definition: clamp finite values to ±65504, lift nonzero values below 2^-24, round to nearest
even. Compared bit for bit on values chosen at every edge of the rule."""

from __future__ import annotations

import numpy as np
import pytest

from bisector.fp16 import fastcast, rules


def _definition(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32)
    finite = np.isfinite(a)
    clamped = np.where(finite, np.clip(a, -rules.FP16_MAX, rules.FP16_MAX), a)
    tiny = finite & (clamped != 0) & (np.abs(clamped) < rules.FP16_MIN_SUBNORMAL)
    lifted = np.where(tiny, np.copysign(np.float32(rules.FP16_MIN_SUBNORMAL), clamped), clamped)
    with np.errstate(over="ignore", invalid="ignore"):
        return lifted.astype(np.float16)


EDGES = [2.0**-25, -(2.0**-25), 0.75 * 2.0**-24, 2.0**-24, 1.5 * 2.0**-25, 6e-8, 65504.0, 65519.0, 65520.0,
         -65521.0, 1e30, np.nan, np.inf, -np.inf, -0.0, 0.0, 3e-8, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11]
RNG = np.random.default_rng(0)
CASES = [RNG.standard_normal(5000).astype(np.float32) * s for s in (1e-9, 1e-7, 1e-3, 1.0, 3e4, 1e5)]
CASES += [np.array(EDGES, np.float32), np.array([0.0], np.float32), np.zeros(0, np.float32),
          np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array(5.0, np.float32),
          RNG.standard_normal((64, 3, 3, 3)).astype(np.float32)]
CASES += [np.concatenate([c, [e]]).astype(np.float32) for c in CASES[:3] for e in (np.nan, 2.0**-26, 70000.0)]


@pytest.fixture(params=["ort", "numpy-below-threshold"])
def cast_path(request, monkeypatch):
    """Every case through ORT's Cast, and through the default split (small arrays by numpy)."""
    if request.param == "ort":
        monkeypatch.setattr(fastcast, "NUMPY_BELOW", 1)
    return request.param


@pytest.mark.parametrize("i", range(len(CASES)))
def test_weight_rule_is_the_definition_bit_for_bit(i, cast_path):
    a = CASES[i]
    got, want = rules.weight_rule(a), _definition(a)
    assert got.dtype == np.float16 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    back = rules.round_weight(a)
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("i", range(len(CASES)))
def test_ort_cast_is_numpys_cast(i, monkeypatch):
    monkeypatch.setattr(fastcast, "NUMPY_BELOW", 1)  # ORT's Cast on every case, the small edge cases too
    a = CASES[i]
    with np.errstate(over="ignore", invalid="ignore"):
        want = a.astype(np.float16)
    assert np.array_equal(fastcast.to_half(a).view(np.uint16), want.view(np.uint16))
    assert np.array_equal(fastcast.round_half(a).view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_numpy_fallback_when_ort_cannot_cast(monkeypatch):
    def broken(kind):
        raise RuntimeError("no Cast kernel")

    monkeypatch.setattr(fastcast, "_session", broken)
    a = CASES[3]
    assert np.array_equal(rules.weight_rule(a).view(np.uint16), _definition(a).view(np.uint16))
    assert np.array_equal(fastcast.round_half(a), a.astype(np.float16).astype(np.float32))



@pytest.mark.parametrize("order", ["C", "F"])
def test_weight_rule_checks_in_slices_at_every_boundary(order, cast_path, monkeypatch):
    """The range and underflow checks run over the converted bits in slices (rules.CHECK_SLICE): values that must
    be lifted or send the weight to the slow path are found in any slice, at its edges too, whatever the layout."""
    monkeypatch.setattr(rules, "CHECK_SLICE", 7)
    base = RNG.standard_normal((9, 13)).astype(np.float32)
    for at in (0, 6, 7, 8, 13, 63, 116):
        for edge in (2.0**-26, -(2.0**-25), 70000.0, np.nan, -np.inf, 0.0):
            a = np.array(base, order=order)
            a.flat[at] = edge
            a.flat[(at * 5 + 3) % a.size] = -3e-8  # a second lift elsewhere
            want = _definition(a)
            assert np.array_equal(rules.weight_rule(a).view(np.uint16), want.view(np.uint16)), (at, edge)
            assert np.array_equal(rules.round_weight(a).view(np.uint32),
                                  want.astype(np.float32).view(np.uint32)), (at, edge)


def _one_node(op: str, attrs: dict, extra: list, shape: tuple):
    """A one-node ONNX model `y = op(x, *extra)` (extra: int64 initializers), and its ORT session."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.asarray(v, np.int64), f"p{i}") for i, v in enumerate(extra)]
    node = helper.make_node(op, ["x"] + [f"p{i}" for i in range(len(extra))], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [onnx.ValueInfoProto(name="y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("op,attrs,extra,shape", [
    ("Identity", {}, [], (2, 3, 4)),
    ("Reshape", {}, [[6, 4]], (2, 3, 4)),
    ("Transpose", {"perm": [2, 0, 1]}, [], (2, 3, 4)),
    ("Flatten", {"axis": 2}, [], (2, 3, 4)),
    ("Squeeze", {}, [[0]], (1, 3, 8)),
    ("Unsqueeze", {}, [[0, 3]], (2, 3, 4)),
    ("Slice", {}, [[0, 1], [2, 3], [1, 2]], (2, 3, 4)),
    ("Gather", {"axis": 1}, [[2, 0, 2]], (2, 3, 4)),
    ("GatherElements", {"axis": 2}, [np.zeros((2, 3, 4), np.int64) + [[[3, 1, 0, 2]]]], (2, 3, 4)),
    ("GatherND", {}, [[[0, 1], [1, 2]]], (2, 3, 4)),
    ("Tile", {}, [[1, 2, 1]], (2, 3, 4)),
    ("Expand", {}, [[3, 2, 3, 4]], (2, 3, 4)),
    ("DepthToSpace", {"blocksize": 2}, [], (1, 8, 1, 3)),
    ("SpaceToDepth", {"blocksize": 2}, [], (1, 2, 2, 4)),
])
def test_ops_that_commute_with_rounding_give_the_same_bits_rounded_before_or_after(op, attrs, extra, shape):
    """`rules.ROUNDING_COMMUTES` (what `points.single_node_twins` rests on): for each op, rounding its input to
    FP16 first or its output after gives the same bits, at every edge of FP16 (overflow, subnormals, signed zero,
    NaN, ties). Every op of the set is here."""
    size = int(np.prod(shape))
    values = np.resize(np.array(EDGES + list(RNG.standard_normal(size) * 3e4), np.float32), size).reshape(shape)
    sess = _one_node(op, attrs, extra, shape)
    with np.errstate(over="ignore", invalid="ignore"):
        rnd = lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float32)  # noqa: E731
        before = sess.run(None, {"x": rnd(values)})[0]
        after = rnd(sess.run(None, {"x": values})[0])
    assert before.shape == after.shape and before.size
    assert np.array_equal(before.view(np.uint32), after.view(np.uint32))
    tested = {"Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather",
              "GatherElements", "GatherND", "Tile", "Expand", "DepthToSpace", "SpaceToDepth"}
    assert rules.ROUNDING_COMMUTES == tested and rules.commutes_with_rounding(op)
    assert not rules.commutes_with_rounding(op, "com.microsoft") and not rules.commutes_with_rounding("Relu")
