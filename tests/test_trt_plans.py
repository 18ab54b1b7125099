"""Precision artifacts carry pinned nodes, empty sets give flags the tools accept, and user precision inputs
(Polygraphy `--layer-precisions`, `--trt-npps` scripts) come back as plans.

Issue 12 items 5 and 11, issue 18 items 2, 4 and 11.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.artifacts.add_constraints import add_constraints_for, layer_precision_strings
from bisector.artifacts.constraints import Constraints, Evaluations, Golden
from bisector.artifacts.write import write_artifacts
from bisector.backends.trt_layers import layer_precisions_to_plan
from bisector.backends.trt_recording import recording_network, run_postprocess_script, split_script_arg
from bisector.errors import UsageError
from bisector.model.catalog import Catalog

try:
    from tests.conftest import SEED
    from tests.fake_tensorrt import make_fake_tensorrt
    from tests.test_trt_layers import CASES, _backend_marks, _script_marks
except ImportError:  # pragma: no cover - rootdir-style import
    from conftest import SEED  # type: ignore[no-redef]
    from fake_tensorrt import make_fake_tensorrt  # type: ignore[no-redef]
    from test_trt_layers import CASES, _backend_marks, _script_marks  # type: ignore[no-redef]

POLYGRAPHY = Path(sys.executable).with_name("polygraphy")


def _pinned_model() -> onnx.ModelProto:
    """relu (candidate) -> Loop doubling a float state 3 times (pinned: control flow) -> Reshape whose shape is
    float arithmetic on Shape(x) (shape_mul: pinned, shape computation) -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Mul", ["h_in", "two"], ["h_out"], name="body_double")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.array([1.0, 1.0], np.float32), "ones")]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Loop", ["trips", "true", "r"], ["looped"], name="loop", body=body),
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Cast", ["shp"], ["shp_f"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("ReduceProd", ["shp_f"], ["count_f"], name="shape_mul", keepdims=1),
        helper.make_node("Cast", ["count_f"], ["count"], name="to_int", to=TensorProto.INT64),
        helper.make_node("Reshape", ["looped", "count"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(nodes, "pinned", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture
def pinned_cat() -> Catalog:
    cat = Catalog.from_model(_pinned_model())
    assert set(cat.pinned) == {"loop", "shape_mul"}, cat.pinned
    assert "relu" in cat.candidates and "reshape" in cat.candidates
    return cat


def _constraints(cat: Catalog, fp32: list[str]) -> Constraints:
    return Constraints(tool_version="t", model=str(cat.path), model_sha256=cat.sha256, backend={"backend": "emulate"},
                       tolerances={}, inputs={}, fp32_nodes=fp32, passed=True, minimal=True,
                       evaluations=Evaluations(total=1, new=1, cached=0), golden=Golden(source="computed"),
                       strategy="auto", candidates=len(cat.candidates), pinned=cat.pinned)


# ---- pinned float nodes in every precision artifact (issue 12 item 5) -------------------------------------
def test_pinned_nodes_are_in_every_precision_artifact(tmp_path, monkeypatch, pinned_cat):
    cat = pinned_cat
    paths = write_artifacts(tmp_path / "out", cat, _constraints(cat, ["relu"]))
    text = paths["add_constraints"].read_text()
    values = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(text).body if isinstance(n, ast.Assign)}
    assert values["FP32_NODES"] == ["relu"]
    assert values["PINNED_NODES"] == {n: cat.pinned[n] for n in ("loop", "shape_mul")}
    assert values["SUBGRAPH_OWNERS"] == {"body_cond": "loop", "body_double": "loop"}

    lp = json.loads(paths["layer_precisions"].read_text())
    assert lp["fp32_nodes"] == ["relu"]
    assert lp["pinned"] == {n: cat.pinned[n] for n in ("loop", "shape_mul")}
    assert lp["layer_precisions"] == {"loop": "float32", "relu": "float32", "shape_mul": "float32"}
    assert lp["polygraphy_args"][-3:] == ["loop:float32", "relu:float32", "shape_mul:float32"]
    assert lp["polygraphy"].endswith("--layer-precisions loop:float32 relu:float32 shape_mul:float32")
    assert lp["trtexec_layer_precisions"] == "--layerPrecisions=loop:fp32,relu:fp32,shape_mul:fp32"
    assert lp["trtexec_layer_output_types"] == "--layerOutputTypes=loop:fp32,relu:fp32,shape_mul:fp32"
    assert any("pinned" in n and "'loop'" in n and "'shape_mul'" in n for n in lp["notes"])

    # the script and the backend both mark the pinned layers on a TensorRT 10 network
    script = _script_marks(tmp_path, monkeypatch, make_fake_tensorrt(), cat, ["relu"])
    assert set(script) == {"relu", "loop", "shape_mul"}
    assert set(_backend_marks(make_fake_tensorrt(), cat, frozenset({"relu"}))) == {"relu", "loop", "shape_mul"}
    assert set(_backend_marks(make_fake_tensorrt(), cat, frozenset())) == {"loop", "shape_mul"}
    # and the script reads back as the plan it was written from (pinned nodes are not plan members)
    assert run_postprocess_script(paths["add_constraints"], cat) == {"relu"}


def test_pinned_node_without_a_layer_is_fine(tmp_path, monkeypatch, pinned_cat):
    """The parser folds static shape math while parsing: no layer, computed in FP32 on the host."""
    trt = make_fake_tensorrt(no_layer={"shape_mul"})
    assert set(_script_marks(tmp_path, monkeypatch, trt, pinned_cat, ["relu"])) == {"relu", "loop"}
    assert set(_backend_marks(make_fake_tensorrt(no_layer={"shape_mul"}), pinned_cat, frozenset())) == {"loop"}


# ---- empty sets give flags the tools accept (issue 12 item 11, issue 18 item 11) ---------------------------
def _polygraphy_precisions(model: Path, args: list[str]) -> dict[str, str] | None:
    """What Polygraphy's own argument parsing makes of our flags (`--gen-script` needs no TensorRT)."""
    r = subprocess.run([str(POLYGRAPHY), "run", str(model), "--trt", "--onnxrt", *args, "--gen-script=-"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    m = re.search(r"SetLayerPrecisions\(\w+, layer_precisions=(\{.*\})\)\n", r.stdout)
    if m is None:
        return None
    return ast.literal_eval(re.sub(r"trt\.(\w+)", r"'\1'", m.group(1)))


def test_empty_set_omits_the_flags():
    s = layer_precision_strings([])
    assert s["polygraphy"] == "--fp16" and s["polygraphy_args"] == ["--fp16"]
    assert s["trtexec"] == "--fp16"
    assert s["trtexec_layer_precisions"] == "" and s["trtexec_layer_output_types"] == ""
    assert s["layer_precisions"] == {} and s["pinned"] == {}
    assert "--layerPrecisions" not in s["trtexec"] and "--layer-precisions" not in s["polygraphy"]
    assert any("omitted" in n and "empty spec" in n for n in s["notes"])


@pytest.mark.skipif(not POLYGRAPHY.exists(), reason="the polygraphy CLI is not installed next to this Python")
def test_polygraphy_accepts_our_flags_and_reads_back_our_set(tmp_path):
    assert _polygraphy_precisions(SEED, layer_precision_strings([])["polygraphy_args"]) is None
    r = subprocess.run([str(POLYGRAPHY), "run", str(SEED), "--trt", "--layer-precisions", "--gen-script=-"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "expected at least one argument" in r.stderr  # why the flag is omitted
    cat = Catalog.from_model(CASES["weird"][0])
    model = tmp_path / "weird.onnx"
    onnx.save(cat.model, model)
    fp32 = ["it's", 'say "hi"', "ünïcødé ✓", "pipe | name"]
    s = layer_precision_strings(fp32)
    got = _polygraphy_precisions(model, s["polygraphy_args"])
    assert got == {n: "float32" for n in fp32}
    assert layer_precisions_to_plan(cat, got) == set(fp32)


# ---- --layer-precisions -> plan (issue 18 item 2) -----------------------------------------------------------
def test_layer_precisions_to_plan():
    cat = Catalog.load(SEED)
    assert layer_precisions_to_plan(cat, {"Add": "float32", "Sub": "float32"}) == {"Add", "Sub"}
    assert layer_precisions_to_plan(cat, {"Add": "float32", "Sub": "float16", "Sub_4": "float16"}) == {"Add"}
    assert layer_precisions_to_plan(cat, {"Add_7": "float32"}) == {"Add"}  # a further layer of node Add
    assert layer_precisions_to_plan(cat, {}) == frozenset()
    with pytest.raises(UsageError, match=r"names no layer.*'Mul_9'.*'nope'") as err:
        layer_precisions_to_plan(cat, {"Add": "float32", "Mul_9": "float32", "nope": "float16"})
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="Add:int8"):
        layer_precisions_to_plan(cat, {"Add": "int8"})


def test_layer_precisions_json_round_trips(tmp_path, pinned_cat):
    paths = write_artifacts(tmp_path, pinned_cat, _constraints(pinned_cat, ["relu", "reshape"]))
    lp = json.loads(paths["layer_precisions"].read_text())
    assert layer_precisions_to_plan(pinned_cat, lp["layer_precisions"]) == {"relu", "reshape"}


def test_siblings_by_layer_name():
    cat = Catalog.from_model(CASES["siblings"][0])
    assert layer_precisions_to_plan(cat, {"Add_1": "float32"}) == {"Add_1"}
    assert layer_precisions_to_plan(cat, {"Add_1_2": "float32"}) == {"Add_1"}
    assert layer_precisions_to_plan(cat, {"Add_0": "float32"}) == {"Add"}


# ---- --trt-npps scripts -> plan (issue 18 item 4) ------------------------------------------------------------
USER_SCRIPT = '''\
import tensorrt as trt

KEEP = {keep!r}


def postprocess(network):
    for layer in network:
        if layer.name in KEEP:
            layer.precision = trt.float32
            for i in range(layer.num_outputs):
                layer.set_output_type(i, trt.float32)


def only_outputs(network):
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.name in KEEP and layer.type == trt.LayerType.ELEMENTWISE:
            layer.set_output_type(0, trt.float32)


class AsClass:
    def __call__(self, network):
        network[1].precision = trt.DataType.FLOAT


def half_everything(network):
    for layer in network:
        layer.precision = trt.float16
'''


def _user_script(tmp_path: Path, keep: list[str]) -> Path:
    path = tmp_path / "user_npps.py"
    path.write_text(USER_SCRIPT.format(keep=keep))
    return path


def test_user_script_marking_add_and_sub(tmp_path):
    cat = Catalog.load(SEED)
    before = sys.modules.get("tensorrt")
    assert run_postprocess_script(_user_script(tmp_path, ["Add", "Sub"]), cat) == {"Add", "Sub"}
    assert run_postprocess_script(_user_script(tmp_path, ["Add"]), cat) == {"Add"}
    path = _user_script(tmp_path, ["Sub"])
    assert run_postprocess_script(f"{path}:only_outputs", cat) == {"Sub"}
    assert run_postprocess_script(f"{path}:AsClass", cat) == {"Add"}  # network[1] is node Add's layer
    assert run_postprocess_script(f"{path}:half_everything", cat) == frozenset()
    assert sys.modules.get("tensorrt") is before  # the stand-in is gone again


@pytest.mark.parametrize("case", ["simple", "siblings", "weird"])
def test_generated_script_round_trips_to_its_plan(tmp_path, case):
    cat = Catalog.from_model(CASES[case][0])
    plans = [frozenset(), frozenset(cat.candidates)] + [frozenset([c]) for c in cat.candidates]
    for i, fp32 in enumerate(plans):
        path = tmp_path / f"p{i}" / "add_constraints.py"
        path.parent.mkdir()
        path.write_text(add_constraints_for(cat, sorted(fp32)), encoding="utf-8")
        assert run_postprocess_script(path, cat) == fp32


def test_script_errors_are_usage_errors(tmp_path):
    cat = Catalog.load(SEED)
    path = _user_script(tmp_path, [])
    with pytest.raises(UsageError, match="not found"):
        run_postprocess_script(tmp_path / "missing.py", cat)
    with pytest.raises(UsageError, match=r"has no `nothing_here`.*postprocess"):
        run_postprocess_script(f"{path}:nothing_here", cat)
    bad = tmp_path / "bad.py"
    bad.write_text("import tensorrt as trt\ndef postprocess(network):\n    trt.Builder(None)\n")
    with pytest.raises(UsageError, match=r"bad\.py:postprocess failed.*no `tensorrt\.Builder`"):
        run_postprocess_script(bad, cat)
    other = tmp_path / "other.py"  # our script for another model: its FP32 node matches no layer here
    other.write_text(add_constraints_for(Catalog.from_model(CASES["simple"][0]), ["mul"]))
    with pytest.raises(UsageError, match="match no layer.*'mul'"):
        run_postprocess_script(other, cat)


def test_script_argument_parsing(tmp_path):
    assert split_script_arg("a/b.py") == (Path("a/b.py"), "postprocess")
    assert split_script_arg("a/b.py:fix") == (Path("a/b.py"), "fix")
    odd = tmp_path / "with:colon.py"
    odd.write_text("")
    assert split_script_arg(str(odd)) == (odd, "postprocess")


def test_recording_network_looks_like_a_parsed_one():
    cat = Catalog.from_model(CASES["simple"][0])
    net = recording_network(cat)
    assert [l.name for l in net] == ["add", "mul", "relu"] and len(net) == 3
    assert net.get_layer(0).metadata == "[ONNX Layer: add]"
    assert net.num_inputs == 1 and net.get_input(0).name == "x" and net.get_output(0).name == "y"
    layer = net[1]
    assert layer.get_output(0).dtype.name == "FLOAT" and layer.type.name == "ELEMENTWISE"
    assert not layer.precision_is_set
