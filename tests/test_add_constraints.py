"""The add_constraints.py artifact, run against fake TensorRT 10 / 11 networks, and the precision strings."""

from __future__ import annotations

import ast
import sys

import pytest

from bisector.artifacts.add_constraints import layer_precision_strings, render_add_constraints

try:
    from tests.fake_tensorrt import make_fake_tensorrt
    from tests.test_tensorrt_backend import _model
except ImportError:  # pragma: no cover - rootdir-style import
    from fake_tensorrt import make_fake_tensorrt  # type: ignore[no-redef]
    from test_tensorrt_backend import _model  # type: ignore[no-redef]


def _network(trt):
    net = trt.Builder(None).create_network(0)
    assert trt.OnnxParser(net, None).parse(_model().SerializeToString())
    return net


def _load(tmp_path, monkeypatch, trt, fp32):
    """Import the generated script the way Polygraphy's --trt-npps does, with `tensorrt` = the fake."""
    from polygraphy import mod as polygraphy_mod

    path = tmp_path / "add_constraints.py"
    path.write_text(render_add_constraints(fp32, "my model.onnx", ["add", "mul", "relu"]))
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    return polygraphy_mod.import_from_script(str(path), "postprocess")  # Polygraphy's default callable name


@pytest.mark.parametrize("metadata", [True, False])
def test_marks_exactly_the_fp32_layers_on_tensorrt_10(tmp_path, monkeypatch, metadata):
    trt = make_fake_tensorrt("10.13.0.35", layers_per_node={"mul": 2}, with_metadata=metadata)
    net = _network(trt)
    postprocess = _load(tmp_path, monkeypatch, trt, ["relu", "mul"])
    postprocess(network=net)
    assert sorted(c[1] for c in trt.calls if c[0] == "layer.precision") == ["mul", "mul_0", "relu"]
    outs = sorted((c[1], c[2], c[3]) for c in trt.calls if c[0] == "layer.set_output_type")
    assert outs == [("mul", 0, trt.float32), ("mul_0", 0, trt.float32), ("relu", 0, trt.float32)]
    assert net.get_layer(0)._precision is None  # `add` untouched


def test_unmatched_node_is_an_error_listing_it(tmp_path, monkeypatch):
    trt = make_fake_tensorrt("10.13.0.35")
    postprocess = _load(tmp_path, monkeypatch, trt, ["relu", "gone_node"])
    with pytest.raises(RuntimeError, match="match no layer.*gone_node"):
        postprocess(network=_network(trt))


def test_refuses_on_tensorrt_11_pointing_at_the_mixed_model(tmp_path, monkeypatch):
    trt = make_fake_tensorrt("11.4.0.106")
    postprocess = _load(tmp_path, monkeypatch, trt, ["relu"])
    with pytest.raises(RuntimeError, match=r"model\.mixed\.onnx"):
        postprocess(network=_network(trt))
    assert not [c for c in trt.calls if c[0] == "layer.precision"]


def test_names_are_a_literal_list_never_code():
    nasty = ["a'b", 'c"""d', "e\nf", "__import__('os').system('x')", "g:h,i"]
    text = render_add_constraints(nasty, 'm"""odel', nasty)
    tree = ast.parse(text)
    assign = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FP32_NODES")
    assert ast.literal_eval(assign.value) == sorted(nasty)
    assert "exec(" not in text and "eval(" not in text
    assert "def postprocess(network):" in text


def test_layer_precision_strings():
    s = layer_precision_strings(["relu", "conv:1", "b,c", "topk"], float_outputs={"topk": [True, False]})
    assert s["polygraphy"] == ("--fp16 --precision-constraints obey --layer-precisions "
                               "b,c:float32 conv:1:float32 relu:float32 topk:float32")
    assert s["trtexec_layer_precisions"] == "--layerPrecisions=conv:1:fp32,relu:fp32,topk:fp32"
    assert s["trtexec_layer_output_types"] == "--layerOutputTypes=conv:1:fp32,relu:fp32"
    assert s["trtexec"].startswith("--fp16 --precisionConstraints=obey --layerPrecisions=")
    notes = "\n".join(s["notes"])
    assert "'b,c'" in notes and "'topk'" in notes and "first layer only" in notes


def test_layer_precision_strings_quote_for_the_shell():
    s = layer_precision_strings(["my layer"])
    assert s["polygraphy"].endswith("--layer-precisions 'my layer:float32'")
    assert s["trtexec"].endswith("'--layerPrecisions=my layer:fp32' '--layerOutputTypes=my layer:fp32'")
