"""The catalog on real-world constructs: names, candidates, pinned nodes and their reasons, tensor types."""

from __future__ import annotations

import pytest

from bisector.model.catalog import Catalog

from .conftest import FIXTURES

CONSTRUCTS = FIXTURES / "constructs"


def test_unnamed_and_duplicate_names_become_unique_and_stable():
    cat = Catalog.load(CONSTRUCTS / "names.onnx")
    assert cat.names == ["node_of_h", "dup", "dup_1", "dup_2", "node_of_y"]
    assert Catalog.load(CONSTRUCTS / "names.onnx").names == cat.names  # deterministic


def test_if_is_one_candidate_and_knows_its_outer_scope_reads():
    cat = Catalog.load(CONSTRUCTS / "if_branch.onnx")
    assert "if_node" in cat.candidates
    assert set(cat.outer_inputs["if_node"]) == {"h", "w_outer", "b_outer"}
    assert cat.node_inputs("if_node") == ["cond", "h", "w_outer", "b_outer"]


def test_loop_and_scan_are_pinned_with_a_reason():
    cat = Catalog.load(CONSTRUCTS / "loop_scan.onnx")
    assert cat.pinned["loop"].startswith("control flow (Loop)") and cat.pinned["scan"].startswith("control flow (Scan)")
    assert "loop" not in cat.candidates and "scan" not in cat.candidates


def test_casts_and_non_float_nodes_are_never_candidates():
    cat = Catalog.load(CONSTRUCTS / "casts.onnx")
    assert cat.candidates == ("mul3", "relu", "offset_add", "offset_sub", "add_out")
    assert not cat.is_float("b16") and not cat.is_float("e64")  # FP16 already, and double: never rounded


def test_shape_arithmetic_is_pinned_but_range_data_is_not_rounded_by_accident():
    cat = Catalog.load(CONSTRUCTS / "shape_4098.onnx")
    assert {"shape_mul", "shape_div", "width_minus_one"} <= set(cat.pinned)
    assert cat.pinned["range"] == "Range has no FP16 type in the ONNX schema"
    assert {"reshape", "expand", "slice", "pad", "resize"} <= set(cat.candidates)


@pytest.mark.parametrize("opset", range(11, 22))
def test_every_opset_from_11_to_21_loads(opset):
    cat = Catalog.load(CONSTRUCTS / f"opset_{opset}.onnx")
    assert cat.opset == opset and {"offset_add", "offset_sub", "clip", "mean"} <= set(cat.candidates)


def test_the_digest_of_a_model_with_external_data_is_its_files_whatever_the_threads_do(tmp_path, monkeypatch):
    """The digest hashes the model file on a second thread, then the external data files the model names. Those
    were read from `model` when that thread got to them, after the loading thread had rebound `model` to its
    detached copy (stubs, no locations) or before, as the threads happened to run: one file hashed two ways, and
    `verify` said the model had changed since the search (openWakeWord's melspectrogram saved with external
    data: 3 of 8 loads). Here the model file's hash is made slow, so the rebind always comes first."""
    import hashlib
    import time

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import bisector.model.catalog as catalog_mod
    from bisector.model.catalog import Catalog

    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    c = helper.make_node("Constant", [], ["c"], name="const",
                         value=numpy_helper.from_array(np.ones((64, 64), np.float32), "cv"))
    g = helper.make_graph([c, helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                           helper.make_node("Add", ["m", "c"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], initializer=[w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    files = sorted(p.name for p in tmp_path.iterdir() if p.name != "m.onnx")
    assert len(files) == 2  # the initializer's and the Constant's value
    expected = hashlib.sha256(b"".join((tmp_path / n).read_bytes() for n in ["m.onnx"] + files)).hexdigest()

    hash_files = catalog_mod._hash_files

    def slow(h, paths):
        time.sleep(0.2)
        return hash_files(h, paths)

    monkeypatch.setattr(catalog_mod, "_hash_files", slow)
    assert Catalog.load(path).sha256 == expected
