"""model.mixed.onnx where onnx.checker rejects it: a model ONNX Runtime runs may fail the checker itself (its mixed
copy is then written unchecked, and report.md says so); a mixed model that fails where the model passes is
bisector's fault (no mixed model, the other artifacts written, report.md says so). Either way the search's answer
is not lost."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bisector.app.precision import precision  # noqa: E402


def _shapeless_output_model(path: Path) -> Path:
    """x -> MatMul -> Tanh -> y, y declared with a type and no shape: ORT runs it, onnx.checker refuses it."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Tanh", ["h"], ["y"], name="t")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx.load(path))
    return path


def test_a_model_that_fails_the_checker_gets_its_mixed_model_unchecked(tmp_path, caplog):
    model = _shapeless_output_model(tmp_path / "shapeless.onnx")
    out = tmp_path / "out"
    r = precision(model, output_dir=out, atol=1e-2, rtol=1e-2, no_cache=True)
    assert r.passed
    assert {p.name for p in out.iterdir()} >= {"constraints.json", "add_constraints.py", "model.mixed.onnx",
                                                "layer_precisions.json", "report.md"}
    assert "written unchecked" in (out / "report.md").read_text()
    assert any("fails onnx.checker" in m for m in caplog.messages)
    sess = ort.InferenceSession(str(out / "model.mixed.onnx"), providers=["CPUExecutionProvider"])  # it runs
    assert sess.run(None, {"x": np.ones((4, 8), np.float32)})[0].shape == (4, 8)


def test_a_mixed_model_that_fails_where_the_model_passes_is_left_out_and_said(tmp_path, monkeypatch, caplog):
    from bisector.artifacts import write

    real = write.build_mixed_detached

    def broken(catalog, plan, rounded=None):  # a node reading a tensor nothing writes: what a bug would make
        model, values = real(catalog, plan, rounded)
        model.graph.node[0].input[0] = "nowhere"
        return model, values

    monkeypatch.setattr(write, "build_mixed_detached", broken)
    model = Path(__file__).resolve().parent.parent / "fixtures" / "planted.onnx"
    out = tmp_path / "out"
    (out).mkdir()
    (out / "model.mixed.onnx").write_bytes(b"stale")  # an earlier run's: must not stay beside this run's set
    r = precision(model, output_dir=out, atol=1e-1, no_cache=True)
    assert r.passed and r.fp32_nodes
    names = {p.name for p in out.iterdir()}
    assert "model.mixed.onnx" not in names
    assert {"constraints.json", "add_constraints.py", "layer_precisions.json", "report.md"} <= names
    assert "was not written" in (out / "report.md").read_text()
    assert any("a bisector bug" in m for m in caplog.messages)


def test_convert_writes_the_mixed_copy_of_a_model_that_fails_the_checker(tmp_path, caplog):
    from bisector.app.convert import convert

    model = _shapeless_output_model(tmp_path / "shapeless.onnx")
    out = convert(model, tmp_path / "mixed.onnx", fp16=True, fp32=["t"])
    assert any("mixed.onnx is written unchecked" in m for m in caplog.messages)
    mixed = onnx.load(out)
    assert any(n.op_type == "Cast" for n in mixed.graph.node)  # MatMul FP16: its output cast back for Tanh
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones((4, 8), np.float32)})[0].shape == (4, 8)


@pytest.mark.parametrize("bug", [False, True], ids=["model-fails", "mixed-fails"])
def test_the_external_data_path_with_a_prewritten_file(tmp_path, monkeypatch, bug):
    """The same two paths where the mixed model is .onnx + .onnx.data and its data file was begun during the
    search (artifacts.prewrite): unchecked, it loads with its weights; left out, neither file nor a temporary
    remains."""
    from bisector.artifacts import data_file, write
    from bisector.model import weights as weight_store

    monkeypatch.setattr(weight_store, "DETACH_MIN_BYTES", 64)
    monkeypatch.setattr(data_file, "EXTERNAL_DATA_FROM_BYTES", 0)
    if bug:
        real = write.build_mixed_detached

        def broken(catalog, plan, rounded=None):
            model, values = real(catalog, plan, rounded)
            model.graph.node[0].input[0] = "nowhere"
            return model, values

        monkeypatch.setattr(write, "build_mixed_detached", broken)
        model = Path(__file__).resolve().parent.parent / "fixtures" / "exported" / "cnn.onnx"
    else:
        model = _shapeless_output_model(tmp_path / "shapeless.onnx")
    out = tmp_path / "out"
    r = precision(model, output_dir=out, atol=1e-1, rtol=1e-1, no_cache=True)
    assert r.passed
    names = sorted(p.name for p in out.iterdir())
    assert "constraints.json" in names and not any(n.endswith(".tmp") for n in names), names
    if bug:
        assert "model.mixed.onnx" not in names and "model.mixed.onnx.data" not in names
    else:
        assert {"model.mixed.onnx", "model.mixed.onnx.data"} <= set(names)
        sess = ort.InferenceSession(str(out / "model.mixed.onnx"), providers=["CPUExecutionProvider"])
        assert sess.run(None, {"x": np.ones((4, 8), np.float32)})[0].shape == (4, 8)
