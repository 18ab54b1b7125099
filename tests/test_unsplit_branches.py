"""If nodes are lowered as one unit: their branches compute FP32 in every plan on emulate and ort-cuda (and in
the mixed model). A verdict there does not cover FP16 inside the branches, which a TensorRT 10 build with
add_constraints.py runs in FP16, so bisector says so: a warning at the start, `unjudged_branches` in
constraints.json, a line in report.md, the summary line and `inspect`. (Silero VAD, a registry model, keeps all
of its 268 computing nodes inside one If: without this it read "PASSED, 0 FP32 nodes" with nothing said.)"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisector.app.job import unjudged_branches
from bisector.backends.tensorrt import TensorRTBackend
from bisector.model.catalog import Catalog

from .conftest import FIXTURES, main_cli

IF_BRANCH = FIXTURES / "constructs" / "if_branch.onnx"
ARGS = ["--fp16", "--val-range", "x:[0,1]", "--atol", "1e-2", "--rtol", "1e-2"]


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def if_model(then_nodes, else_nodes, name="if odd\tname") -> onnx.ModelProto:
    """x -> Relu -> If(cond from an input) -> y; the branches hold the given nodes, ending in `then_out`/`else_out`."""
    then_g = helper.make_graph(then_nodes, "then", [], [_vi("then_out", [1, 8])])
    else_g = helper.make_graph(else_nodes, "else", [], [_vi("else_out", [1, 8])])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("If", ["cond"], ["y"], name=name, then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1, 8]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [_vi("y", [1, 8])], [numpy_helper.from_array(np.full((1, 8), 0.5, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_catalog_counts_the_computing_nodes_inside_each_if():
    cat = Catalog.load(IF_BRANCH)
    assert cat.unsplit_branches == {"if_node": 3}  # then: two Adds; else: one Neg
    nested = helper.make_graph([helper.make_node("Mul", ["h", "w"], ["then_out"], name="inner_mul")], "n", [],
                               [_vi("then_out", [1, 8])])
    m = if_model([helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((1, 8), np.float32))),
                  helper.make_node("If", ["cond"], ["then_out"], name="nested", then_branch=nested,
                                   else_branch=nested)],
                 [helper.make_node("Identity", ["h"], ["else_out"], name="pass")])
    # the nested If and the Mul in both of its branches count; Constant and Identity compute nothing
    assert Catalog.from_model(m).unsplit_branches == {"if odd\tname": 3}


def test_an_if_that_only_selects_is_not_reported():
    m = if_model([helper.make_node("Identity", ["h"], ["then_out"], name="a")],
                 [helper.make_node("Identity", ["w"], ["else_out"], name="b")])
    assert Catalog.from_model(m).unsplit_branches == {}
    assert Catalog.load(FIXTURES / "constructs" / "loop_scan.onnx").unsplit_branches == {}  # pinned FP32, not lowered


def test_only_backends_that_build_the_branches_judge_them():
    cat = Catalog.load(IF_BRANCH)

    class Emulating:
        name = "emulate"

    assert unjudged_branches(cat, Emulating()) == {"if_node": 3}
    weak, strong = TensorRTBackend(), TensorRTBackend()
    weak.path, strong.path = "weak", "strong"  # strong typing builds the mixed model: its branches stay FP32
    assert unjudged_branches(cat, weak) == {} and unjudged_branches(cat, strong) == {"if_node": 3}


def test_a_search_says_that_fp16_inside_the_branches_was_not_judged(tmp_path, capsys):
    code = main_cli("precision", IF_BRANCH, *ARGS, "-o", tmp_path / "o", "--cache-dir", tmp_path / "c")
    out, err = capsys.readouterr()
    assert code == 0
    assert "FP16 inside If branches is not judged" in err and "if_node's branches (3 nodes)" in err
    c = json.loads((tmp_path / "o" / "constraints.json").read_text())
    assert c["unjudged_branches"] == {"if_node": 3}
    assert "Not judged: FP16 inside If branches" in (tmp_path / "o" / "report.md").read_text()
    assert "FP16 inside the branches of 1 If node(s) not judged" in out


def test_the_tensorrt_10_artifacts_keep_an_fp16_if_fp32_with_its_branches(tmp_path, monkeypatch):
    """The search lowers the If (all-FP16 passes at this tolerance), but no verdict computed its branches in FP16:
    add_constraints.py and the layer-precision flags keep it FP32 so that the engine is the plan judged."""
    name = "if odd\tname"
    model = tmp_path / "if.onnx"
    onnx.save(if_model([helper.make_node("Mul", ["h", "w"], ["then_out"], name="inner_mul")],
                       [helper.make_node("Neg", ["h"], ["else_out"], name="inner_neg")], name=name), model)
    code = main_cli("precision", model, "--fp16", "--atol", "1", "-o", tmp_path / "o", "--cache-dir", tmp_path / "c")
    assert code == 0
    c = json.loads((tmp_path / "o" / "constraints.json").read_text())
    assert c["fp32_nodes"] == [] and c["unjudged_branches"] == {name: 2}
    strings = json.loads((tmp_path / "o" / "layer_precisions.json").read_text())
    assert strings["layer_precisions"] == {name: "float32"} and "not judged" in strings["pinned"][name]
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # not installed here: the literals only
    namespace: dict = {}
    exec((tmp_path / "o" / "add_constraints.py").read_text(), namespace)
    assert not namespace["FP32_NODES"]
    assert "not judged" in namespace["PINNED_NODES"][name]
    assert namespace["SUBGRAPH_OWNERS"] == {"inner_mul": name, "inner_neg": name}  # branch layers follow it


def test_a_model_without_if_says_nothing(tmp_path, capsys):
    code = main_cli("precision", FIXTURES / "constructs" / "loop_scan.onnx", "--fp16", "--val-range", "x:[0,1]",
                    "--atol", "1e-2", "-o", tmp_path / "o", "--cache-dir", tmp_path / "c")
    assert code == 0 and "If branches" not in capsys.readouterr().err
    c = json.loads((tmp_path / "o" / "constraints.json").read_text())
    assert c["unjudged_branches"] == {} and "Not judged" not in (tmp_path / "o" / "report.md").read_text()
    pinned = json.loads((tmp_path / "o" / "layer_precisions.json").read_text())["pinned"]
    assert set(pinned) == {"loop", "scan"}  # the catalog's own pins, nothing more


def test_inspect_lists_the_ifs_searched_as_one_unit(tmp_path, capsys):
    assert main_cli("inspect", IF_BRANCH, "--json", tmp_path / "i.json") == 0
    assert "if_node (3 nodes inside)" in capsys.readouterr().out
    assert json.loads((tmp_path / "i.json").read_text())["unsplit_branches"] == {"if_node": 3}


def test_debug_precision_with_a_check_command_says_so_too(tmp_path, capsys, monkeypatch):
    """The check gets the candidate ONNX, whose If branches compute FP32 (no engine written without TensorRT)."""
    monkeypatch.chdir(tmp_path)
    code = main_cli("debug", "precision", IF_BRANCH, "--fp16", "-o", tmp_path / "o", "--no-cache",
                    "--check", sys.executable, "-c", "import sys; sys.exit(0)")
    out, err = capsys.readouterr()
    assert code == 0 and "FP16 inside If branches is not judged" in err
    assert "FP16 inside the branches of 1 If node(s) not judged" in out
    assert json.loads((tmp_path / "o" / "constraints.json").read_text())["unjudged_branches"] == {"if_node": 3}
