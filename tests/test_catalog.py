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
