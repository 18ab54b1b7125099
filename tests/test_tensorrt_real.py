"""Real TensorRT / TensorRT-RTX runs. They skip, with the reason, where the library is absent (every machine of
this project so far: TensorRT wheels cannot be installed here). `pytest.importorskip("tensorrt")` would not
skip: the tensorrt-stubs package makes `import tensorrt` succeed as an empty namespace package.
"""

from __future__ import annotations

import numpy as np
import pytest

from bisector.backends.trt_import import tensorrt_rtx_version, tensorrt_version
from bisector.model.catalog import Catalog
from bisector.errors import BackendFailure, BuildFailure
from bisector.fp16.plan import Plan

try:
    from tests.test_tensorrt_backend import FEEDS, _model
except ImportError:  # pragma: no cover
    from test_tensorrt_backend import FEEDS, _model  # type: ignore[no-redef]

TRT = tensorrt_version()
RTX = tensorrt_rtx_version()
needs_trt = pytest.mark.skipif(TRT is None, reason="TensorRT is not installed (only tensorrt-stubs, or nothing)")
needs_rtx = pytest.mark.skipif(RTX is None, reason="TensorRT-RTX (tensorrt_rtx) is not installed")
pytestmark = pytest.mark.tensorrt


def _overflow_model():
    """y = (x + 65504) - 65504: FP16 storage of the sum overflows or loses x entirely."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    big = numpy_helper.from_array(np.full((4,), 65504.0, np.float32), "big")
    nodes = [helper.make_node("Add", ["x", "big"], ["s"], name="add"),
             helper.make_node("Sub", ["s", "big"], ["y"], name="sub")]
    g = helper.make_graph(nodes, "overflow", [x], [y], [big])
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@needs_trt
@pytest.mark.parametrize("strongly_typed", [False, True])
def test_tensorrt_plans_change_the_numbers(strongly_typed, tmp_path):
    from bisector.backends.tensorrt import TensorRTBackend
    from bisector.backends.trt_import import parse_version

    if strongly_typed and parse_version(TRT or "0")[:2] < (10, 12):
        pytest.skip("--strongly-typed needs TensorRT >= 10.12")
    cat = Catalog.from_model(_overflow_model())
    be = TensorRTBackend(strongly_typed=strongly_typed, save_timing_cache=tmp_path / "t.cache")
    be.open(cat)
    try:
        feeds = {"x": np.array([[1.0, 1.5, 2.0, 1.25]], np.float32)}
        fp32 = be.run(Plan.all_fp32(cat.candidates), feeds)["y"]
        fp16 = be.run(Plan.all_fp16(cat.candidates), feeds)["y"]
        np.testing.assert_allclose(fp32, feeds["x"], atol=1e-2)
        assert np.abs(fp16 - feeds["x"]).max() >= 1.0  # DESIGN §4: the FP16 build loses x
    finally:
        be.close()
    assert (tmp_path / "t.cache").stat().st_size > 0


@needs_trt
def test_tensorrt_weak_path_maps_every_candidate():
    from bisector.backends.tensorrt import TensorRTBackend

    cat = Catalog.from_model(_model())
    be = TensorRTBackend()
    be.open(cat)
    try:
        if be.path == "weak":
            assert be.unmapped_candidates() == []
        out = be.run(Plan.all_fp16(cat.candidates), FEEDS)
        assert out["y"].dtype == np.float32
    finally:
        be.close()


@needs_rtx
def test_tensorrt_rtx_builds_and_runs_or_says_why():
    from bisector.backends.tensorrt import TensorRTRTXBackend

    cat = Catalog.from_model(_overflow_model())
    be = TensorRTRTXBackend()
    be.open(cat)
    try:
        out = be.run(Plan.all_fp32(cat.candidates), {"x": np.ones((1, 4), np.float32)})
        np.testing.assert_allclose(out["y"], 1.0, atol=1e-2)
    except BuildFailure:
        raise  # a build failure is a real failure of our strong-typing path
    except BackendFailure as exc:  # RTX refuses to *run* on compute capability 9.0 (H100/H200): DESIGN §7
        pytest.skip(f"TensorRT-RTX built but could not run here: {exc}")
    finally:
        be.close()
