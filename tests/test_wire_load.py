"""Loading a model without parsing its large weights' bytes (bisector.model.wire): the same model and weights
as onnx.load gives, and the plain parse wherever the file is anything unusual."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.errors import UsageError
from bisector.model import pages, weights, wire
from bisector.model.catalog import Catalog


def _read(path):
    return wire.read_without_weights(path, weights.NUMPY_TYPES, weights.DETACH_MIN_BYTES)


def _model(inits, extra_nodes=()):
    """y = x + every float initializer's first element (so every initializer is read), plus others."""
    nodes, last = [], "x"
    for i, t in enumerate(inits):
        if t.data_type != TensorProto.FLOAT:
            continue
        nodes.append(helper.make_node("ReduceMax", [t.name], [f"m{i}"], keepdims=0, name=f"max{i}"))
        nodes.append(helper.make_node("Add", [last, f"m{i}"], [f"a{i}"], name=f"add{i}"))
        last = f"a{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"], name="out"))
    graph = helper.make_graph([*nodes, *extra_nodes], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _inits(rng):
    return [numpy_helper.from_array(rng.standard_normal((64, 33)).astype(np.float32), "big f32 ü/1"),
            numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "small"),
            numpy_helper.from_array(rng.standard_normal((40, 40)).astype(np.float16), "half"),
            numpy_helper.from_array(rng.integers(-9, 9, 1000).astype(np.int64), "ints"),
            numpy_helper.from_array(rng.random(5000) < 0.5, "mask"),
            numpy_helper.from_array(rng.standard_normal(600), "doubles"),
            numpy_helper.from_array(rng.standard_normal((3, 1000)).astype(np.float32), "second big")]


def test_the_model_and_weights_are_what_onnx_load_gives(tmp_path, monkeypatch):
    model = _model(_inits(np.random.default_rng(0)))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    light, raw = _read(path)
    parsed = onnx.ModelProto.FromString(light)
    full = onnx.load(path)
    big = {i for i, t in enumerate(full.graph.initializer) if len(t.raw_data) >= weights.DETACH_MIN_BYTES}
    assert set(raw) == big and big  # every large numeric initializer, nothing else
    for i, t in enumerate(full.graph.initializer):
        if i in raw:
            data = path.read_bytes()[raw[i].offset:raw[i].offset + raw[i].length]
            assert data == t.raw_data
            t.ClearField("raw_data")
    assert parsed == full  # every other byte as written

    monkeypatch.setenv(pages.ENV, "1")
    a = Catalog.load(path)
    monkeypatch.setenv(pages.ENV, "0")
    b = Catalog.load(path)
    assert a.model == b.model
    for t in onnx.load(path).graph.initializer:
        va, vb = a.value(t.name), b.value(t.name)
        assert va.dtype == vb.dtype and va.shape == vb.shape and va.tobytes() == vb.tobytes()
        np.testing.assert_array_equal(va, numpy_helper.to_array(t))


def test_a_length_written_longer_than_needed_is_read(tmp_path):
    """Protobuf allows a length varint padded with 0x80 bytes; the rewritten length is minimal."""
    model = _model(_inits(np.random.default_rng(1))[:1])
    data = model.SerializeToString()
    # ModelProto.graph is field 7, wire type 2: tag 0x3A; re-emit its length padded to 5 bytes
    tag = data.index(b"\x3a")
    n, after = wire._read_varint(data, tag + 1, len(data))
    padded = bytearray()
    for i in range(5):
        padded.append(((n >> (7 * i)) & 0x7F) | (0x80 if i < 4 else 0))
    path = tmp_path / "padded.onnx"
    path.write_bytes(data[:tag + 1] + bytes(padded) + data[after:])
    assert onnx.load(path) == model  # still a valid file
    light, raw = _read(path)
    assert len(raw) == 1
    cat = Catalog.load(path)
    np.testing.assert_array_equal(cat.value("big f32 ü/1"), numpy_helper.to_array(model.graph.initializer[0]))


@pytest.mark.parametrize("case", ["truncated", "garbage", "two graphs", "repeated raw_data", "segment", "empty",
                                  "external", "nothing large", "bfloat16"])
def test_anything_unusual_is_left_to_the_plain_parse(tmp_path, case):
    rng = np.random.default_rng(2)
    model = _model(_inits(rng)[:1])
    data = model.SerializeToString()
    path = tmp_path / "m.onnx"
    if case == "truncated":
        data = data[: len(data) // 2]
    elif case == "garbage":
        data = bytes(rng.integers(0, 256, 5000, dtype=np.uint8))
    elif case == "two graphs":
        data = data + helper.make_model(helper.make_graph([], "h", [], [])).SerializeToString()
    elif case == "repeated raw_data":
        t = model.graph.initializer[0]
        extra = wire.varint(9 << 3 | 2) + wire.varint(len(t.raw_data)) + t.raw_data
        body = t.SerializeToString() + extra
        model.graph.ClearField("initializer")
        g = model.graph.SerializeToString() + wire.varint(5 << 3 | 2) + wire.varint(len(body)) + body
        m = helper.make_model(helper.make_graph([], "x", [], []), ir_version=8)
        m.ClearField("graph")
        data = m.SerializeToString() + wire.varint(7 << 3 | 2) + wire.varint(len(g)) + g
    elif case == "segment":
        model.graph.initializer[0].segment.begin = 0
        model.graph.initializer[0].segment.end = 1
        data = model.SerializeToString()
    elif case == "empty":
        data = b""
    elif case == "external":
        t = model.graph.initializer[0]
        t.data_location = TensorProto.EXTERNAL
        data = model.SerializeToString()
    elif case == "nothing large":
        data = _model(_inits(rng)[1:2]).SerializeToString()
    elif case == "bfloat16":
        t = helper.make_tensor("bf", TensorProto.BFLOAT16, [4096], vals=np.zeros(4096, np.uint16).tobytes(), raw=True)
        data = _model([t]).SerializeToString()
    path.write_bytes(data)
    assert _read(path) is None


def test_a_weight_whose_bytes_do_not_fit_its_dims_is_a_clear_error(tmp_path):
    t = numpy_helper.from_array(np.ones((32, 32), np.float32), "w")
    t.dims[:] = [32, 33]  # 1056 values declared, 1024 stored
    path = tmp_path / "bad.onnx"
    path.write_bytes(_model([t]).SerializeToString())
    assert _read(path) is not None
    with pytest.raises(UsageError, match="initializer 'w' holds 4096 bytes of data; its type and dims need 4224"):
        Catalog.load(path)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/status")
def test_loading_holds_one_tensor_at_a_time(tmp_path):
    """The process never holds the weights as parsed bytes: peak RSS while loading a 96 MB model stays far below
    what onnx.load alone takes (the bytes and the parsed protobuf)."""
    import subprocess
    import sys

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((1000, 1000)).astype(np.float32), f"w{i}") for i in range(24)]
    path = tmp_path / "big.onnx"
    onnx.save(_model(inits), path)
    # VmHWM, not ru_maxrss: the latter carries the forking parent's (pytest's) size across exec
    code = ("import sys\nfrom bisector.model.catalog import Catalog\n"
            "hwm = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
            "base = hwm()\nc = Catalog.load(sys.argv[1])\nprint(hwm() - base)")
    grown = {}
    for switch in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, pages.ENV: switch})
        grown[switch] = int(out.stdout.strip()) * 1024
    assert grown["0"] > 150e6, grown  # the plain parse: the bytes, the protobuf, the arrays
    if pages.in_ram(__import__("tempfile").gettempdir()):
        assert grown["1"] < 120e6  # no page file on a tmpfs: the arrays alone
    else:
        assert grown["1"] < 40e6, grown


def test_a_weight_whose_bytes_do_not_fit_its_dims_is_a_clear_error_on_the_plain_parse_too(tmp_path, monkeypatch):
    monkeypatch.setenv(pages.ENV, "0")
    t = numpy_helper.from_array(np.ones((32, 32), np.float32), "w")
    t.dims[:] = [32, 33]
    path = tmp_path / "bad.onnx"
    path.write_bytes(_model([t]).SerializeToString())
    with pytest.raises(UsageError, match="not a readable ONNX model \\(initializer 'w'"):
        Catalog.load(path)


def test_random_models_with_odd_names_load_as_onnx_load_gives(tmp_path, monkeypatch):
    """Thirty random models: initializer names with quotes, newlines, slashes, 10k characters; every numpy type;
    sizes either side of the 4 KiB line; doc strings and metadata around the graph."""
    rng = np.random.default_rng(11)
    dtypes = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
              np.uint32, np.uint64, np.bool_]
    odd = ['w"1', "w\n2", "a/b[0]:c", "é ü", "x" * 10_000, "", "w'3\\"]
    for case in range(30):
        inits = []
        for i in range(int(rng.integers(1, 8))):
            dtype = dtypes[int(rng.integers(len(dtypes)))]
            n = int(rng.choice([1, 100, 1023, 1024, 1025, 5000, 40_000]))
            a = (rng.standard_normal(n) * 50).astype(dtype) if dtype != np.bool_ else rng.random(n) < 0.5
            name = f"{odd[int(rng.integers(len(odd)))]}#{i}"
            inits.append(numpy_helper.from_array(a.reshape(-1, 1) if n % 2 else a, name))
        model = _model(inits)
        model.doc_string = "d" * int(rng.integers(0, 3000))
        onnx.helper.set_model_props(model, {"k": "v" * int(rng.integers(0, 100))})
        path = tmp_path / f"r{case}.onnx"
        onnx.save(model, path)
        monkeypatch.setenv(pages.ENV, "1")
        a = Catalog.load(path)
        monkeypatch.setenv(pages.ENV, "0")
        b = Catalog.load(path)
        assert a.model == b.model, case
        for t in model.graph.initializer:
            va, vb = a.value(t.name), b.value(t.name)
            assert va.dtype == vb.dtype and va.shape == vb.shape and va.tobytes() == vb.tobytes(), (case, t.name)
