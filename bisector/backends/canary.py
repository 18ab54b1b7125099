"""The canary: before any search, prove that the backend really stores FP16 (DESIGN §4).

An oracle that silently computes in FP32 approves every plan, and the user would ship a build that overflows.
Two checks on a tiny built-in model, run through the same backend class the search uses:
  1. 65505.5 through one FP16 node must read back 65504 (round-to-nearest FP16 storage);
  2. the seed pattern (x + 65504 - 65504) all-FP16 must fail against FP32, and pass all-FP32.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from bisector.backends.base import Backend
from bisector.model.catalog import Catalog
from bisector.compare import Tolerance, compare_outputs
from bisector.errors import BackendFailure
from bisector.fp16.plan import Plan
from bisector.values import PerOutput


def canary_model() -> onnx.ModelProto:
    big = helper.make_tensor("big", TensorProto.FLOAT, [1], [65504.0])
    nodes = [
        helper.make_node("Identity", ["x"], ["stored"], name="canary_store"),
        helper.make_node("Add", ["x", "big"], ["add_out"], name="canary_add"),
        helper.make_node("Sub", ["add_out", "big"], ["sub_out"], name="canary_sub"),
    ]
    graph = helper.make_graph(
        nodes, "bisector_canary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("stored", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("sub_out", TensorProto.FLOAT, [4])],
        initializer=[big],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def run_canary(make_backend: Callable[[], Backend]) -> None:
    catalog = Catalog.from_model(canary_model())
    backend = make_backend()
    backend.open(catalog)
    try:
        x = np.array([65505.5, 1.25, 1.5, 1.75], dtype=np.float32)
        feeds = {"x": x}
        fp16 = backend.run(Plan.all_fp16(catalog.candidates), feeds)
        fp32 = backend.run(Plan.all_fp32(catalog.candidates), feeds)
    finally:
        backend.close()
    stored = np.asarray(fp16["stored"], dtype=np.float32)
    if stored[0] != 65504.0:
        raise BackendFailure(
            f"canary failed: backend {backend.name!r} read 65505.5 back from an FP16 tensor as {stored[0]!r}, "
            "not 65504. It is not storing FP16, so its verdicts would approve every plan. Refusing to search."
        )
    tol = Tolerance(atol=PerOutput(1e-1), rtol=PerOutput(1e-1))
    golden = {"sub_out": np.array([65505.5, 1.25, 1.5, 1.75], dtype=np.float32) + 65504 - 65504}
    if all(r.passed for r in compare_outputs({"sub_out": fp16["sub_out"]}, golden, tol).values()):
        raise BackendFailure(
            f"canary failed: backend {backend.name!r} computed x + 65504 - 65504 all-FP16 without the FP16 "
            "cancellation. It is computing in FP32; its verdicts would approve every plan. Refusing to search."
        )
    if not all(r.passed for r in compare_outputs({"sub_out": fp32["sub_out"]}, golden, tol).values()):
        raise BackendFailure(f"canary failed: backend {backend.name!r} is wrong even with every node FP32.")
