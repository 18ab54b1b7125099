"""The TensorRT backends against a recording fake of the TensorRT API (no TensorRT, no GPU).

What this proves: the calls bisector makes for each path (10.x weak typing, 10.x --strongly-typed, 11.x, RTX),
node -> layer mapping, timing-cache reuse, build failure vs accuracy, the inference plumbing. What it cannot
prove: that real TensorRT accepts these calls and computes FP16 the way we expect (tests/test_tensorrt_real.py).
"""

from __future__ import annotations

import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.backends.tensorrt import TensorRTBackend, TensorRTRTXBackend, plan_hash
from bisector.backends.trt_layers import match_layers
from bisector.model.catalog import Catalog
from bisector.errors import AccuracyFailure, BackendFailure, BuildFailure, UsageError
from bisector.fp16.plan import Plan

try:
    from tests.fake_tensorrt import make_fake_cudart, make_fake_tensorrt
except ImportError:  # pragma: no cover - rootdir-style import
    from fake_tensorrt import make_fake_cudart, make_fake_tensorrt  # type: ignore[no-redef]


def _model(batch: int | str = 1) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])
    inits = [numpy_helper.from_array(np.full((4,), 3.0, np.float32), "c"),
             numpy_helper.from_array(np.full((4,), 0.5, np.float32), "d")]
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "d"], ["m"], name="mul"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture
def catalog() -> Catalog:
    return Catalog.from_model(_model())


FEEDS = {"x": np.array([[1.0, -2.0, 3.0, -7.0]], np.float32)}


def _backend(trt, **kw):
    return TensorRTBackend(module=trt, cudart=make_fake_cudart(), **kw)


def _calls(trt, name):
    return [c for c in trt.calls if c[0] == name]


def _plan(cat, *fp32):
    return Plan(frozenset(fp32), cat.candidates)


# ---- not installed ------------------------------------------------------------------------------------------
def test_missing_tensorrt_is_a_usage_error_naming_the_package(catalog):
    import importlib

    stub = importlib.import_module("tensorrt")  # the stubs' empty namespace package (or nothing)
    assert not hasattr(stub, "Builder"), "a real TensorRT is installed; this test is for machines without it"
    with pytest.raises(UsageError, match=r"pip install 'bisector\[tensorrt\]'") as err:
        TensorRTBackend().open(catalog)
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="TensorRT is not installed"):
        TensorRTBackend().describe()


def test_missing_tensorrt_rtx_is_a_usage_error_naming_the_package(catalog):
    with pytest.raises(UsageError, match="tensorrt-rtx") as err:
        TensorRTRTXBackend().open(catalog)
    assert err.value.exit_code == 2


def test_missing_cuda_python_is_a_usage_error(catalog, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cuda(name, *a, **k):
        if name.startswith("cuda"):
            raise ImportError("No module named 'cuda'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(UsageError, match="cuda-python"):
        TensorRTBackend(module=make_fake_tensorrt()).open(catalog)


def test_old_tensorrt_is_refused(catalog):
    with pytest.raises(UsageError, match="TensorRT 10 or newer"):
        _backend(make_fake_tensorrt("8.6.1")).open(catalog)


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="precision-constraints"):
        TensorRTBackend(precision_constraints="none")
    with pytest.raises(UsageError, match="0..5"):
        TensorRTBackend(builder_optimization_level=9)


# ---- 10.x weak typing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("constraints,flag", [("obey", "OBEY_PRECISION_CONSTRAINTS"),
                                              ("prefer", "PREFER_PRECISION_CONSTRAINTS")])
def test_weak_typing_calls(catalog, constraints, flag):
    trt = make_fake_tensorrt("10.13.0.35")
    be = _backend(trt, precision_constraints=constraints)
    be.open(catalog)
    out = be.run(_plan(catalog, "mul"), FEEDS)
    assert _calls(trt, "builder.create_network") == [("builder.create_network", 0)]
    assert _calls(trt, "parser.parse")  # parsed once, at open
    assert [c for c in trt.calls if c[0] in ("config.set_flag",)] == [("config.set_flag", "FP16"),
                                                                      ("config.set_flag", flag)]
    assert _calls(trt, "layer.precision") == [("layer.precision", "mul", trt.float32)]
    assert _calls(trt, "layer.set_output_type") == [("layer.set_output_type", "mul", 0, trt.float32)]
    ref = ort.InferenceSession(catalog.model.SerializeToString()).run(None, FEEDS)[0]
    np.testing.assert_array_equal(out["y"], ref)
    assert out["y"].dtype == np.float32
    d = be.describe()
    assert d["backend"] == "tensorrt" and d["tensorrt"] == "10.13.0.35" and d["path"] == "weak"
    assert d["precision_constraints"] == constraints


def test_weak_typing_moves_marks_between_plans(catalog):
    trt = make_fake_tensorrt()
    be = _backend(trt)
    be.open(catalog)
    be.run(_plan(catalog, "mul", "relu"), FEEDS)
    be.run(_plan(catalog, "add"), FEEDS)
    be.run(_plan(catalog), FEEDS)
    builds = _calls(trt, "builder.build_serialized_network")
    assert [b[2] for b in builds] == [["mul", "relu"], ["add"], []]
    assert len(_calls(trt, "parser.parse")) == 1


def test_same_plan_reuses_the_engine(catalog):
    trt = make_fake_tensorrt()
    be = _backend(trt)
    be.open(catalog)
    be.run(_plan(catalog, "mul"), FEEDS)
    be.run(_plan(catalog, "mul"), {"x": FEEDS["x"] * 2})
    assert len(_calls(trt, "builder.build_serialized_network")) == 1
    assert len(_calls(trt, "context.execute_async_v3")) == 2


@pytest.mark.parametrize("metadata", [True, False])
def test_one_node_several_layers(catalog, metadata):
    trt = make_fake_tensorrt(layers_per_node={"mul": 3}, helper_layers={"mul": 1}, with_metadata=metadata)
    be = _backend(trt)
    be.open(catalog)
    names = [l.name for l in be._weak.network.layers]
    # onnx-tensorrt naming: first layer = node name, then <node>_<k> from one global counter; helpers ONNXTRT_*
    assert names == ["add", "mul", "ONNXTRT_Helper", "mul_0", "ONNXTRT_Helper_1", "mul_2", "relu"]
    be.run(_plan(catalog, "mul"), FEEDS)
    marked = _calls(trt, "builder.build_serialized_network")[0][2]
    assert marked == sorted(["mul", "ONNXTRT_Helper", "mul_0", "ONNXTRT_Helper_1", "mul_2"])


def test_node_without_layer_is_a_backend_failure_listing_it(catalog):
    trt = make_fake_tensorrt(no_layer={"mul"})
    be = _backend(trt)
    be.open(catalog)
    assert be.unmapped_candidates() == ["mul"]
    with pytest.raises(BackendFailure, match=r"\['mul'\]") as err:
        be.run(_plan(catalog, "mul", "add"), FEEDS)
    assert not isinstance(err.value, BuildFailure)
    be.run(_plan(catalog, "add"), FEEDS)  # plans without it still run


def test_mapping_rules():
    L = lambda name, meta="": types.SimpleNamespace(name=name, metadata=meta)  # noqa: E731
    layers = [L("Conv"), L("Conv_0", "[ONNX Layer: Conv]"), L("(Unnamed Layer* 2) [Shuffle]"),
              L("Conv_3", "[ONNX Layer: Conv | Local Function: F]"),
              L("Shape_1", "[ONNX Layer: Shape_1]"),  # a non-candidate whose name looks like a suffix of Shape
              L("Conv_1"),  # a real node named Conv_1 (exact name beats suffix)
              L("inner_add", "[ONNX Layer: inner_add]")]
    net = types.SimpleNamespace(num_layers=len(layers), get_layer=lambda i: layers[i])
    got = match_layers(net, ["Conv", "Conv_1", "Shape", "Shape_1", "If"], {"inner_add": "If"})
    assert got == {"Conv": [0, 1, 2, 3], "Shape_1": [4], "Conv_1": [5], "If": [6]}


def test_parse_failure_at_open_is_a_backend_failure(catalog):
    with pytest.raises(BackendFailure, match="ONNX parser rejected the model: In node 0"):
        _backend(make_fake_tensorrt(fail_parse=True)).open(catalog)


# ---- build options ----------------------------------------------------------------------------------------
def test_one_timing_cache_for_all_builds_loaded_and_saved(catalog, tmp_path):
    trt = make_fake_tensorrt()
    load, save = tmp_path / "in.cache", tmp_path / "out" / "out.cache"
    load.write_bytes(b"previous")
    be = _backend(trt, load_timing_cache=load, save_timing_cache=save)
    be.open(catalog)
    for fp32 in [(), ("add",), ("mul",), ("add", "relu")]:
        be.run(_plan(catalog, *fp32), FEEDS)
    created = _calls(trt, "config.create_timing_cache")
    assert len(created) == 1 and created[0][1] == b"previous"
    attached = _calls(trt, "config.set_timing_cache")
    assert len(attached) == 4 and {a[1] for a in attached} == {created[0][2]}
    be.close()
    assert save.read_bytes() == b"fake-timing-cache:previous"


def test_optimization_level_tactics_and_saved_engines(catalog, tmp_path):
    trt = make_fake_tensorrt()
    be = _backend(trt, builder_optimization_level=1, tactic_sources=["cublas", "CUDNN"], save_engines=tmp_path)
    be.open(catalog)
    plan = _plan(catalog, "relu")
    be.run(plan, FEEDS)
    assert ("config.builder_optimization_level", 1) in trt.calls
    assert ("config.set_tactic_sources", (1 << 0) | (1 << 2)) in trt.calls
    assert (tmp_path / f"{plan_hash(plan)}.engine").is_file()
    d = be.describe()
    assert d["builder_optimization_level"] == "1" and d["tactic_sources"] == "cublas,CUDNN"
    with pytest.raises(UsageError, match="unknown tactic source 'CUBLASX'"):
        _backend(make_fake_tensorrt(), tactic_sources=["CUBLASX"]).open(catalog)


def test_input_shapes_make_a_static_profile():
    cat = Catalog.from_model(_model("N"))
    trt = make_fake_tensorrt()
    be = _backend(trt, input_shapes={"x": [2, 4]})
    be.open(cat)
    out = be.run(_plan(cat), {"x": np.ones((2, 4), np.float32)})
    assert out["y"].shape == (2, 4)
    assert _calls(trt, "profile.set_shape") == [("profile.set_shape", "x", (2, 4), (2, 4), (2, 4))]
    assert ("context.set_input_shape", "x", (2, 4)) in trt.calls


def test_dynamic_input_without_shapes_uses_the_feeds():
    cat = Catalog.from_model(_model("N"))
    trt = make_fake_tensorrt()
    be = _backend(trt)
    be.open(cat)
    be.run(_plan(cat), {"x": np.ones((3, 4), np.float32)})
    assert _calls(trt, "profile.set_shape") == [("profile.set_shape", "x", (3, 4), (3, 4), (3, 4))]


def test_input_shapes_naming_no_input_is_a_usage_error(catalog):
    be = _backend(make_fake_tensorrt(), input_shapes={"nope": [1]})
    be.open(catalog)
    with pytest.raises(UsageError, match="nope"):
        be.run(_plan(catalog), FEEDS)


def test_build_failure_is_its_own_verdict(catalog):
    trt = make_fake_tensorrt(fail_build=lambda net, cfg: any(l._precision is not None for l in net.layers))
    be = _backend(trt)
    be.open(catalog)
    be.run(_plan(catalog), FEEDS)
    with pytest.raises(BuildFailure, match="could not find any implementation") as err:
        be.run(_plan(catalog, "mul"), FEEDS)
    assert isinstance(err.value, BackendFailure) and not isinstance(err.value, AccuracyFailure)
    assert err.value.exit_code == 3


def test_half_outputs_come_back_float32(catalog):
    be = _backend(make_fake_tensorrt(half_outputs=True))
    be.open(catalog)
    out = be.run(_plan(catalog), FEEDS)
    assert out["y"].dtype == np.float32


def test_only_graph_outputs(catalog):
    be = _backend(make_fake_tensorrt())
    be.open(catalog)
    with pytest.raises(UsageError, match="graph outputs only"):
        be.run(_plan(catalog), FEEDS, outputs=["m"])


def test_device_memory_is_freed(catalog):
    cudart = make_fake_cudart()
    be = TensorRTBackend(module=make_fake_tensorrt(), cudart=cudart)
    be.open(catalog)
    be.run(_plan(catalog, "add"), FEEDS)
    assert cudart.buffers == {}
    kinds = [c[1] for c in cudart.log if c[0] == "cudaMemcpyAsync"]
    assert kinds == ["cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost"]


# ---- strong typing: 10.x --strongly-typed, 11.x, RTX ------------------------------------------------------
def _assert_strong(trt, catalog, be):
    be.open(catalog)
    out1 = be.run(_plan(catalog, "mul"), FEEDS)
    be.run(_plan(catalog, "add", "relu"), FEEDS)
    strong = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert _calls(trt, "builder.create_network") == [("builder.create_network", strong)] * 2
    parses = _calls(trt, "parser.parse")
    assert len(parses) == 2 and parses[0][1] != parses[1][1]  # one mixed model per plan
    assert not _calls(trt, "config.set_flag") and not _calls(trt, "layer.precision")
    assert not _calls(trt, "layer.set_output_type")
    assert len(_calls(trt, "config.create_timing_cache")) == 1
    assert out1["y"].dtype == np.float32 and out1["y"].shape == (1, 4)
    assert be.describe()["path"] == "strong"


def test_tensorrt_10_strongly_typed(catalog):
    trt = make_fake_tensorrt("10.13.0.35")
    _assert_strong(trt, catalog, _backend(trt, strongly_typed=True))


def test_tensorrt_10_before_10_12_refuses_strongly_typed(catalog):
    with pytest.raises(UsageError, match="10.12"):
        _backend(make_fake_tensorrt("10.8.0.43"), strongly_typed=True).open(catalog)


def test_tensorrt_11_is_strongly_typed(catalog):
    trt = make_fake_tensorrt("11.4.0.106")
    assert not hasattr(trt.BuilderFlag, "FP16")
    be = _backend(trt)
    _assert_strong(trt, catalog, be)
    assert "precision_constraints" not in be.describe()


def test_tensorrt_rtx(catalog):
    trt = make_fake_tensorrt("1.2.0.54", rtx=True)
    be = TensorRTRTXBackend(module=trt, cudart=make_fake_cudart())
    _assert_strong(trt, catalog, be)
    d = be.describe()
    assert d["backend"] == "tensorrt-rtx" and d["tensorrt_rtx"] == "1.2.0.54"


def test_strong_parse_failure_is_a_build_failure(catalog):
    be = _backend(make_fake_tensorrt("11.4.0.106", fail_parse=True))
    be.open(catalog)
    with pytest.raises(BuildFailure, match="mixed-precision model of this plan"):
        be.run(_plan(catalog, "mul"), FEEDS)


def test_fake_11_layers_refuse_precision():
    trt = make_fake_tensorrt("11.4.0.106")
    net = trt.Builder(None).create_network(0)
    trt.OnnxParser(net, None).parse(_model().SerializeToString())
    with pytest.raises(AttributeError):
        net.get_layer(0).precision = trt.float32
    assert not hasattr(net.get_layer(0), "set_output_type")
