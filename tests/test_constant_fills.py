"""ConstantOfShape nodes of a constant shape are weights (`Catalog.fills`, `graph.constant_fills`): not candidates,
held once by the executor, and written to the mixed model as an FP16 fill where an FP16 node reads them."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisector.backends.emulate.backend import EmulateBackend
from bisector.backends.emulate.executor import NodeExecutor
from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog


def _model() -> onnx.ModelProto:
    """Conv weights and a bias from constant shapes (values FP16 cannot hold exactly, one beyond its range), a fill
    read by an FP32-able and an FP16-able node alike, a fill from a shape the input decides, and a fill that is
    a graph output."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("w_shape", [8, 4, 3, 3]), ("b_shape", [1, 8, 1, 1]), ("o_shape", [2]))]
    nodes = [
        helper.make_node("ConstantOfShape", ["w_shape"], ["w"], name="make_w",
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0123])),
        helper.make_node("ConstantOfShape", ["b_shape"], ["b"], name="make_b",
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.1])),
        helper.make_node("ConstantOfShape", ["b_shape"], ["big"], name="make_big",
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1e5])),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "b"], ["cb"], name="bias"),
        helper.make_node("Mul", ["cb", "b"], ["m"], name="scale"),  # reads b too: FP16 copy and FP32 original
        helper.make_node("Div", ["m", "big"], ["d"], name="shrink"),  # 1e5: clamped to 65504 as a weight in FP16
        helper.make_node("Shape", ["d"], ["s"], name="shape_of"),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], name="make_ones",  # from a computed shape: a node
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0 / 3])),
        helper.make_node("Add", ["d", "ones"], ["y"], name="plus"),
        helper.make_node("ConstantOfShape", ["o_shape"], ["z"], name="make_z",  # a graph output: stays a node
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.3])),
    ]
    graph = helper.make_graph(nodes, "fills", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_fills_of_constant_shapes_are_weights_and_the_others_stay_candidates():
    cat = Catalog.from_model(_model())
    assert cat.fills == {"w", "b", "big"}
    assert {"w", "b", "big"} <= cat.weights
    assert not {"make_w", "make_b", "make_big"} & set(cat.candidates) and not set(cat.pinned) & {"make_w", "make_b"}
    assert {"make_ones", "make_z", "conv", "bias", "scale", "shrink", "plus"} <= set(cat.candidates)
    w = cat.value("w")
    assert w.shape == (8, 4, 3, 3) and w.dtype == np.float32 and np.all(w == np.float32(0.0123))
    assert cat.value("w") is w and not w.flags.writeable  # computed once, shared, read-only
    assert set(cat.weight_values()) >= {"w", "b", "big"}


def test_emulation_and_the_mixed_model_agree_bit_for_bit_on_every_plan_over_fills():
    """Fused blocks, node by node and the mixed ONNX run by ONNX Runtime give the same bits for plans over the
    candidates (every subset of the four that read fills, the rest FP16); the mixed model keeps each FP16 read
    of a fill a ConstantOfShape (no initializer of the fill's size), and drops a fill nobody reads in FP32."""
    cat = Catalog.from_model(_model())
    be = EmulateBackend()
    be.open(cat)
    feeds = {"x": np.random.default_rng(0).uniform(-2, 2, (1, 4, 6, 6)).astype(np.float32)}
    readers = ["conv", "bias", "scale", "shrink"]
    differs = 0
    all_fp16 = None
    for k in range(len(readers) + 1):
        for fp32 in itertools.combinations(readers, k):
            plan = Plan(frozenset(fp32), cat.candidates)
            fused, single = be.run(plan, feeds), be.run_all(plan, feeds)
            mixed_model = build_mixed_model(cat, plan)
            onnx.checker.check_model(mixed_model)
            mixed = NodeExecutor(Catalog.from_model(mixed_model)).run_reference(feeds)
            for out in cat.output_names:
                assert np.array_equal(fused[out], single[out], equal_nan=True), (fp32, out)
                assert np.array_equal(mixed[out], single[out], equal_nan=True), (fp32, out)
            assert all(i.name not in ("w", "b", "big") and np.prod(i.dims) < 64 for i in mixed_model.graph.initializer)
            if not fp32:
                all_fp16 = mixed_model
            differs += not np.array_equal(fused["y"], be.run(Plan(frozenset(cat.candidates), cat.candidates),
                                                             feeds)["y"])
    assert differs  # FP16 changes the output: the plans above are not all the same computation
    fills16 = [n for n in all_fp16.graph.node if n.op_type == "ConstantOfShape" and n.output[0].endswith("__fp16")]
    values = {n.name: numpy_helper.to_array(n.attribute[0].t) for n in fills16}
    assert set(values) == {"make_w__fp16", "make_b__fp16", "make_big__fp16"}
    assert all(v.dtype == np.float16 and v.shape == (1,) for v in values.values())
    assert values["make_w__fp16"][0] == np.float16(0.0123) and values["make_b__fp16"][0] == np.float16(0.1)
    assert float(values["make_big__fp16"][0]) == 65504.0  # a weight beyond FP16's range is clamped, not inf
    # every reader of w is FP16 in that plan: the FP32 fill is gone
    assert "make_w" not in {n.name for n in all_fp16.graph.node}


def test_a_journal_from_a_catalog_with_other_candidates_is_not_resumed(tmp_path):
    """A journal stores each plan as its FP32 nodes, whose meaning depends on which nodes are candidates (a fill
    was one before this round): the journal's key says which, so such a journal starts afresh. (The cache
    directory is given as a str, as a script would.)"""
    import dataclasses

    from bisector.app.job import open_job

    path = tmp_path / "fills.onnx"
    onnx.save(_model(), path)
    job = open_job(path, cache_dir=str(tmp_path / "cache"), atol=1e-3, rtol=1e-3)
    try:
        key = job.journal().key
        assert job.journal().key == key  # the same job: the same journal
        other = dataclasses.replace(job.catalog, candidates=job.catalog.candidates + ("make_w",))
        job.catalog = other
        assert job.journal().key != key
    finally:
        job.close()


def test_ort_cudas_switch_model_and_per_plan_models_read_fills_alike(monkeypatch):
    """ort-cuda writes each FP16 node's form with `fp16_form` (the switch model) or the whole mixed model (per
    plan): both read an FP16 fill as a ConstantOfShape of its FP16 value and give the same outputs (CPU
    stand-in; `plus` and `make_ones` stay FP32: the CPU has no FP16 Add kernel, and ONNX Runtime's own casts
    around it drop its FP16 storage, which is the stand-in's limit, not the writers')."""
    from bisector.backends.ort_cuda import CPU_EP, OrtCudaBackend

    cat = Catalog.from_model(_model())
    feeds = {"x": np.random.default_rng(1).uniform(-2, 2, (1, 4, 6, 6)).astype(np.float32)}
    per_plan = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", switch=False)
    monkeypatch.setenv("BISECTOR_ORT_CUDA_SWITCH", "1")
    switch = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable")
    for b in (per_plan, switch):
        b.open(cat)
    readers = ["conv", "bias", "scale", "shrink"]
    for k in range(len(readers) + 1):
        plan = Plan(frozenset(readers[k:]) | {"plus", "make_ones", "make_z"}, cat.candidates)
        a, b = per_plan.run(plan, feeds), switch.run(plan, feeds)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_a_large_fill_lives_in_a_page_file_with_the_right_values(monkeypatch):
    """A fill from FILL_PAGES_FROM bytes is written to a page file a slice at a time and read through a map (its
    pages given back like an external-data weight's); a smaller one, or any where no page file can be written,
    is an ordinary read-only array. Values equal np.full either way, also across slice boundaries."""
    import tempfile

    from bisector.model import catalog as catalog_module
    from bisector.model import pages

    monkeypatch.setattr(pages, "CONVERT_SLICE_BYTES", 400)  # 100 values a slice: 3 slices, the last partial
    monkeypatch.setattr(catalog_module, "FILL_PAGES_FROM", 1000)
    cat = Catalog.from_model(_model())
    w = cat.value("w")  # 288 float32: 1152 bytes, over the lowered threshold
    b = cat.value("b")  # 8 float32: under it
    assert np.array_equal(w, np.full((8, 4, 3, 3), np.float32(0.0123))) and not w.flags.writeable
    assert pages.file_backed(w) == (not pages.in_ram(tempfile.gettempdir()))
    assert not pages.file_backed(b) and not b.flags.writeable
    monkeypatch.setenv(pages.ENV, "0")  # no page file: in memory, same values
    cat = Catalog.from_model(_model())
    assert not pages.file_backed(cat.value("w")) and np.array_equal(cat.value("w"), w)
