"""ort-cuda's switch model (bisector/fp16/switch.py): one model for every plan, each candidate choosing FP16 or FP32
by a boolean input. Checked here on the CPU provider; GPU numbers in docs/verification.md ("Issue 14")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.plan import Plan
from bisector.fp16.switch import build_switch_model
from bisector.model.catalog import Catalog
from bisector.model.inputs import generate_inputs

from .conftest import FIXTURES, PLANTED

CONSTRUCTS = FIXTURES / "constructs"
MODELS = {
    "planted": (PLANTED, {}, {}),
    "cnn": (FIXTURES / "exported" / "cnn.onnx", {}, {}),
    "encoder": (FIXTURES / "exported" / "encoder.onnx", {"ids": (0, 999), "mask": (1, 1)},
                {"ids": (1, 32), "mask": (1, 32)}),
    "if_branch": (CONSTRUCTS / "if_branch.onnx", {}, {}),
    "loop_scan": (CONSTRUCTS / "loop_scan.onnx", {}, {}),
    "names": (CONSTRUCTS / "names.onnx", {}, {}),
    "masks_ints": (CONSTRUCTS / "masks_ints.onnx", {}, {}),
    "cnn_constant_weights": (None, {}, {}),  # the CNN with every weight a Constant node (paddle2onnx's export style)
}


def _model_path(name):
    path = MODELS[name][0]
    if path is not None:
        return path
    import tempfile

    from .test_weights import _weights_as_constant_nodes

    path = Path(tempfile.mkdtemp()) / "cnn_constant_weights.onnx"
    onnx.save(_weights_as_constant_nodes(onnx.load(str(FIXTURES / "exported" / "cnn.onnx")))[0], path)
    return path


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no fusions on either side
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _setup(name):
    _, ranges, shapes = MODELS[name]
    cat = Catalog.load(_model_path(name))
    feeds = generate_inputs(cat, ranges, shapes)[0]
    switch, flags = build_switch_model(cat)
    return cat, feeds, switch, flags


def _run_switch(sess, feeds, flags, fp16: frozenset) -> list:
    f = dict(feeds)
    f.update({flag: np.array(node in fp16) for node, flag in flags.items()})
    return sess.run(None, f)


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=np.asarray(x).dtype.kind == "f")
               for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_switch_model_is_valid_and_all_fp32_is_the_model(name):
    cat, feeds, switch, flags = _setup(name)
    onnx.checker.check_model(switch, full_check=True)
    assert set(flags) == set(cat.candidates) and len(set(flags.values())) == len(flags)
    original = _session(cat.full_model()).run(None, feeds)
    assert _same(_run_switch(_session(switch), feeds, flags, frozenset()), original)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_candidate_alone_in_fp16_computes_what_its_mixed_model_computes(name):
    """One FP16 node, its neighbours FP32: the plan's mixed model and the switch model with that one flag set
    run the same Casts and the same FP16 node, bit for bit (on the CPU provider, fusions off)."""
    cat, feeds, switch, flags = _setup(name)
    sess = _session(switch)
    cands = list(cat.candidates)
    step = max(1, len(cands) // 40)  # at most ~40 mixed sessions per model
    for node in cands[::step]:
        plan = Plan(frozenset(cands) - {node}, cat.candidates)
        mixed = _session(build_mixed_model(cat, plan)).run(None, feeds)
        assert _same(_run_switch(sess, feeds, flags, plan.fp16), mixed), node


def test_odd_node_names_get_plain_flag_inputs(tmp_path):
    from onnx import TensorProto, helper

    names = ["a b", "x/y:0", "ünï", "n" * 300, "bisector_fp16_0"]
    nodes, prev = [], "x"
    for i, n in enumerate(names):
        nodes.append(helper.make_node("Add", [prev, "c"], [f"t{i}"], name=n))
        prev = f"t{i}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                          initializer=[helper.make_tensor("c", TensorProto.FLOAT, [], [0.1])])
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    cat = Catalog.load(path)
    switch, flags = build_switch_model(cat)
    onnx.checker.check_model(switch, full_check=True)
    assert set(flags) == set(names) and all(f.startswith("bisector_fp16_") for f in flags.values())
    assert len({i.name for i in switch.graph.input}) == len(switch.graph.input)  # the node named like a flag
    # each candidate: its FP16 form (Cast to FP16, the node on FP16 with the constant converted once, Cast back)
    # beside the FP32 node, and a Where choosing by its flag
    wheres = [n for n in switch.graph.node if n.op_type == "Where"]
    assert sorted(w.input[0] for w in wheres) == sorted(flags.values())
    to = [a.i for n in switch.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    assert to.count(TensorProto.FLOAT16) == len(names) and to.count(TensorProto.FLOAT) == len(names)
    assert {i.name: i.data_type for i in switch.graph.initializer}["c__fp16"] == TensorProto.FLOAT16
    # the CPU provider has no FP16 Add: ORT computes it in FP32 and drops the Cast pair around it (DESIGN §4),
    # so running it here shows nothing; ort-cuda runs these kernels in FP16.
    x = np.full((1, 4), 1000.3, np.float32)
    assert _run_switch(_session(switch), {"x": x}, flags, frozenset(names))[0].shape == (1, 4)



@pytest.mark.parametrize("name", ["encoder", "cnn", "planted", "names"])
def test_fp16_readers_of_a_tensor_share_one_cast_and_compute_the_same(name):
    """Every FP16 form casts a graph tensor to FP16 the same way, so the switch model writes that Cast once (a
    kernel per extra reader saved on every run): plans of many FP16 nodes give the bits of the model in which
    every reader has its own Cast."""
    from onnx import TensorProto

    cat, feeds, switch, flags = _setup(name)
    onnx.checker.check_model(switch, full_check=True)
    unshared, unshared_flags = build_switch_model(cat, share_casts=False)
    assert unshared_flags == flags

    def casts_to_half(model):
        return [n.input[0] for n in model.graph.node if n.op_type == "Cast"
                and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute)]

    shared_casts, own_casts = casts_to_half(switch), casts_to_half(unshared)
    assert len(shared_casts) == len(set(shared_casts)) == len(set(own_casts))
    if name != "names":  # these models have tensors several candidates read
        assert len(own_casts) > len(shared_casts)
    a, b = _session(switch), _session(unshared)
    cands = list(cat.candidates)
    rng = np.random.default_rng(11)
    for p in (0.0, 0.3, 0.6, 0.9, 1.0):
        fp16 = frozenset(c for c in cands if rng.random() < p)
        assert _same(_run_switch(a, feeds, flags, fp16), _run_switch(b, feeds, flags, fp16)), p
