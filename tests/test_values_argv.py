"""Polygraphy-style flag values and the multi-value argv pre-parse."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisector.cli.argv import expand_multi_value_flags
from bisector.errors import UsageError
from bisector.values import (parse_error_stat, parse_input_shapes, parse_tolerance, parse_val_range, split_name)


def test_multi_value_flags_expand_and_stop_at_next_flag():
    argv = "precision m.onnx --fp16 --atol 1e-3 out0:1e-2 --val-range x:[1,2] y:[0,1] --fp32 Add Sub -o d".split()
    assert expand_multi_value_flags(argv) == [
        "precision", "m.onnx", "--fp16", "--atol", "1e-3", "--atol", "out0:1e-2", "--val-range", "x:[1,2]",
        "--val-range", "y:[0,1]", "--fp32", "Add", "--fp32", "Sub", "-o", "d"]


def test_repeating_a_flag_appends_and_single_value_flags_are_untouched():
    assert expand_multi_value_flags(["--fp32", "A", "--fp32", "B", "C", "--seed", "3"]) == [
        "--fp32", "A", "--fp32", "B", "--fp32", "C", "--seed", "3"]
    assert expand_multi_value_flags(["--", "--fp32", "a", "b"]) == ["--", "--fp32", "a", "b"]


@given(st.lists(st.text(alphabet="abc:[]0123456789.,-", min_size=1, max_size=6), max_size=8))
@settings(max_examples=200, deadline=None)
def test_expand_never_loses_or_reorders_values(tokens):
    argv = ["--atol", *tokens]
    out = expand_multi_value_flags(argv)
    assert [t for t in out if t != "--atol"] == [t for t in argv if t != "--atol"]


def test_split_name_uses_last_colon_outside_brackets():
    assert split_name("a:b:1e-2") == ("a:b", "1e-2")
    assert split_name("x:[1,2]") == ("x", "[1,2]")
    assert split_name("[0,1]") == (None, "[0,1]")
    assert split_name("1e-3") == (None, "1e-3")


def test_tolerances_default_and_per_output():
    tol = parse_tolerance(["1e-3", "out0:1e-2", "ns:out:0.5"], 1e-5, "--atol")
    assert tol.default == 1e-3 and tol.get("out0") == 1e-2 and tol.get("ns:out") == 0.5 and tol.get("z") == 1e-3
    assert parse_tolerance(None, 1e-5, "--atol").default == 1e-5


@pytest.mark.parametrize("bad", ["abc", "x:abc", "-1", "nan", ":1e-3"])
def test_bad_tolerances_are_usage_errors(bad):
    with pytest.raises(UsageError):
        parse_tolerance([bad], 1e-5, "--atol")


def test_val_range_and_shapes():
    assert parse_val_range(["x:[1,2]", "[0,1]"]) == {"x": (1.0, 2.0), None: (0.0, 1.0)}
    assert parse_val_range(["x:[-1,1]"]) == {"x": (-1.0, 1.0)}
    assert parse_input_shapes(["x:[1,3,224,224]", "y:[1]"]) == {"x": (1, 3, 224, 224), "y": (1,)}


@pytest.mark.parametrize("bad", ["x:[1]", "x:[2,1]", "x:[a,b]", "x:1,2", "x:[1,2,3]", "x:[nan,1]", "x:[1,inf]"])
def test_bad_val_ranges(bad):
    with pytest.raises(UsageError):
        parse_val_range([bad])


@pytest.mark.parametrize("bad", ["[1,2]", "x:[1.5]", "x:[-1]", "x:abc", "x:[True]"])
def test_bad_shapes(bad):
    with pytest.raises(UsageError):
        parse_input_shapes([bad])


def test_error_stats():
    s = parse_error_stat(["median", "y:max"])
    assert s.default == "median" and s.get("y") == "max"
    with pytest.raises(UsageError):
        parse_error_stat(["average"])


@given(st.text(max_size=30))
@settings(max_examples=300, deadline=None)
def test_parsers_raise_only_usage_errors(text):
    for parse in (lambda t: parse_val_range([t]), lambda t: parse_input_shapes([t]),
                  lambda t: parse_tolerance([t], 1e-5, "--atol"), lambda t: parse_error_stat([t])):
        try:
            parse(text)
        except UsageError:
            pass
