"""One node -> layer rule: the `tensorrt` backend and the generated add_constraints.py mark the same layers.

Both run on the same fake networks (tests/fake_tensorrt.py names layers like onnx-tensorrt): with and without
`[ONNX Layer: ...]` metadata, sibling nodes `Add` / `Add_1`, one node split into several layers with helper
layers between them, and names with quotes, newlines, unicode and " | ".
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.artifacts.add_constraints import add_constraints_for
from bisector.backends.tensorrt import TensorRTBackend
from bisector.backends.trt_layers import match_layers, predict_layers
from bisector.errors import BackendFailure
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog

try:
    from tests.fake_tensorrt import make_fake_cudart, make_fake_tensorrt
    from tests.test_tensorrt_backend import _model
except ImportError:  # pragma: no cover - rootdir-style import
    from fake_tensorrt import make_fake_cudart, make_fake_tensorrt  # type: ignore[no-redef]
    from test_tensorrt_backend import _model  # type: ignore[no-redef]


def _chain(names: list[str], ops: list[str] | None = None) -> onnx.ModelProto:
    """x -> names[0] -> names[1] -> ... -> y, each an elementwise op with a weight."""
    ops = ops or ["Add"] * len(names)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    inits = [numpy_helper.from_array(np.full((4,), 2.0, np.float32), "w")]
    nodes, prev = [], "x"
    for i, (name, op) in enumerate(zip(names, ops)):
        out = "y" if i == len(names) - 1 else f"t{i}"
        nodes.append(helper.make_node(op, [prev, "w"], [out], name=name))
        prev = out
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


WEIRD = ["it's", 'say "hi"', "line\nbreak", "ünïcødé ✓", "pipe | name", "Relu_2"]
CASES = {
    "simple": (_model(), {}, {}),
    "split": (_model(), {"mul": 3}, {"mul": 1}),
    "siblings": (_chain(["Add", "Add_1", "Relu"], ["Add", "Add", "Mul"]), {}, {}),
    # Add makes Add, Add_0, Add_1: without metadata its third layer looks like node Add_1 (which becomes Add_1_2)
    "siblings_split": (_chain(["Add", "Add_1", "Relu"], ["Add", "Add", "Mul"]), {"Add": 3}, {}),
    "weird": (_chain(WEIRD + ["Relu"], ["Add", "Mul", "Sub", "Add", "Mul", "Add", "Mul"]),
              {"pipe | name": 2, "line\nbreak": 2, "Relu": 4}, {"Relu": 1}),
}


def _parsed(trt, cat: Catalog):
    net = trt.Builder(None).create_network(0)
    assert trt.OnnxParser(net, None).parse(cat.model.SerializeToString())
    return net


def _marks(net) -> dict[str, tuple]:
    """Layer name -> (precision, output types) for every layer something marked."""
    return {l.name: (l._precision, tuple(sorted(l._output_types.items())))
            for l in net.layers if l._precision is not None or l._output_types}


def _backend_marks(trt, cat: Catalog, fp32: frozenset[str]) -> dict[str, tuple]:
    be = TensorRTBackend(module=trt, cudart=make_fake_cudart())
    be.open(cat)
    assert be._weak is not None
    be._weak.apply(Plan(fp32, cat.candidates))
    return _marks(be._weak.network)


def _script(tmp_path, monkeypatch, trt, cat: Catalog, fp32):
    """The generated add_constraints.py imported the way Polygraphy's --trt-npps does, `tensorrt` = the fake."""
    from polygraphy import mod as polygraphy_mod

    folder = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    path = folder / "add_constraints.py"
    path.write_text(add_constraints_for(cat, sorted(fp32)), encoding="utf-8")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    return polygraphy_mod.import_from_script(str(path), "postprocess")


def _script_marks(tmp_path, monkeypatch, trt, cat: Catalog, fp32) -> dict[str, tuple]:
    net = _parsed(trt, cat)
    _script(tmp_path, monkeypatch, trt, cat, fp32)(network=net)
    return _marks(net)


def _plans(cat: Catalog) -> list[frozenset[str]]:
    return [frozenset(), frozenset(cat.candidates)] + [frozenset([c]) for c in cat.candidates]


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "names-only"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_backend_and_script_mark_the_same_layers(tmp_path, monkeypatch, case, metadata):
    model, per_node, helpers = CASES[case]
    cat = Catalog.from_model(model)
    for fp32 in _plans(cat):
        opts = dict(with_metadata=metadata, layers_per_node=per_node, helper_layers=helpers)
        backend = _backend_marks(make_fake_tensorrt(**opts), cat, fp32)
        script = _script_marks(tmp_path, monkeypatch, make_fake_tensorrt(**opts), cat, fp32)
        assert backend == script, (case, sorted(fp32))
        assert bool(backend) == bool(fp32)
        if metadata:  # the parser's own record is the truth: exactly the layers of the FP32 nodes
            net = _parsed(make_fake_tensorrt(**opts), cat)
            truth = {l.name for l in net.layers if l.metadata[len("[ONNX Layer: "):-1] in fp32}
            helpers_between = {l.name for l in net.layers if not l.metadata}
            assert truth <= set(backend) <= truth | helpers_between


def test_sibling_named_like_a_suffix_is_not_claimed(tmp_path, monkeypatch):
    """Issue 11/6: nodes `Add` and `Add_1`; keeping `Add` FP32 must leave the layer of `Add_1` alone."""
    cat = Catalog.from_model(CASES["siblings"][0])
    for metadata in (True, False):
        trt = make_fake_tensorrt(with_metadata=metadata)
        assert [l.name for l in _parsed(trt, cat).layers] == ["Add", "Add_1", "Relu"]
        assert set(_script_marks(tmp_path, monkeypatch, trt, cat, {"Add"})) == {"Add"}
        assert set(_backend_marks(make_fake_tensorrt(with_metadata=metadata), cat, frozenset({"Add"}))) == {"Add"}


def test_split_node_with_metadata_keeps_its_suffixed_layers_apart_from_the_sibling(tmp_path, monkeypatch):
    """The parser's one counter makes node Add's third layer `Add_1` and node Add_1's layer `Add_1_2`: only the
    metadata can tell them apart (names alone attribute `Add_1` to the node of that name, in both paths)."""
    cat = Catalog.from_model(CASES["siblings_split"][0])
    trt = make_fake_tensorrt(layers_per_node={"Add": 3})
    assert [l.name for l in _parsed(trt, cat).layers] == ["Add", "Add_0", "Add_1", "Add_1_2", "Relu"]
    assert set(_script_marks(tmp_path, monkeypatch, trt, cat, {"Add_1"})) == {"Add_1_2"}
    trt = make_fake_tensorrt(layers_per_node={"Add": 3})
    assert set(_script_marks(tmp_path, monkeypatch, trt, cat, {"Add"})) == {"Add", "Add_0", "Add_1"}


def test_script_carries_the_rule_verbatim_and_only_literals(tmp_path):
    cat = Catalog.from_model(CASES["weird"][0])
    text = add_constraints_for(cat, ["it's"])
    assert inspect.getsource(match_layers) in text
    assert "exec(" not in text and "eval(" not in text
    import ast

    tree = ast.parse(text)
    values = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)}
    assert values["NODE_NAMES"] == cat.names and values["FP32_NODES"] == ["it's"]
    assert values["PINNED_NODES"] == {} and values["SUBGRAPH_OWNERS"] == {}
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [a.name for n in imports for a in n.names] == ["tensorrt"]  # self-contained


def test_unmatched_fp32_node_is_an_error_in_both(tmp_path, monkeypatch):
    cat = Catalog.from_model(_model())
    with pytest.raises(BackendFailure, match=r"\['mul'\]") as err:
        _backend_marks(make_fake_tensorrt(no_layer={"mul"}), cat, frozenset({"mul", "relu"}))
    assert err.value.exit_code == 3
    trt = make_fake_tensorrt(no_layer={"mul"})
    net = _parsed(trt, cat)
    with pytest.raises(RuntimeError, match="match no layer.*'mul'"):
        _script(tmp_path, monkeypatch, trt, cat, {"mul", "relu"})(network=net)
    assert not _marks(net)  # nothing half-marked


def test_metadata_with_properties_and_inner_nodes():
    class Net:
        def __init__(self, layers):
            self.layers = layers
            self.num_layers = len(layers)

        def get_layer(self, i):
            return self.layers[i]

    class L:
        def __init__(self, name, metadata=""):
            self.name, self.metadata = name, metadata

    net = Net([L("a | b", "[ONNX Layer: a | b | Local Function: F]"), L("x_9", "[ONNX Layer: a]"),
               L("body_add", "[ONNX Layer: body_add]"), L("body_add_3"), L("unrelated_7"), L("Conv_0x")])
    got = match_layers(net, ["a", "a | b", "loop", "Conv"], {"body_add": "loop"})
    assert got == {"a | b": [0], "a": [1], "loop": [2, 3]}


def test_predicted_layers_follow_the_parser_names():
    cat = Catalog.from_model(CASES["siblings"][0])
    assert [(p.name, p.metadata) for p in predict_layers(cat)] == [
        ("Add", "[ONNX Layer: Add]"), ("Add_1", "[ONNX Layer: Add_1]"), ("Relu", "[ONNX Layer: Relu]")]
    trt = make_fake_tensorrt()
    parsed = _parsed(trt, Catalog.from_model(CASES["weird"][0]))
    predicted = predict_layers(Catalog.from_model(CASES["weird"][0]))
    assert [(l.name, l.metadata) for l in parsed.layers] == [(p.name, p.metadata) for p in predicted]
