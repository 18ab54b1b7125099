"""Bad input: one clear message, exit 2, no traceback (DESIGN §9)."""

from __future__ import annotations

import os

import pytest

from .conftest import SEED, run_cli

BASE = ["--fp16", "--atol", "1e-1"]


def _assert_usage_error(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    for f in fragments:
        assert f in r.stderr, r.stderr


def test_missing_model(tmp_path):
    _assert_usage_error(run_cli("precision", tmp_path / "nope.onnx", *BASE), "not found")


def test_not_an_onnx_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not protobuf \x00\xff\x12")
    _assert_usage_error(run_cli("precision", bad, *BASE), "not a readable ONNX model")


def test_empty_model_file(tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _assert_usage_error(run_cli("precision", empty, *BASE), "empty")


def test_directory_instead_of_model(tmp_path):
    _assert_usage_error(run_cli("precision", tmp_path, *BASE), "directory")


def test_unknown_input_in_val_range(tmp_path):
    _assert_usage_error(run_cli("precision", SEED, *BASE, "--val-range", "nope:[1,2]", "--cache-dir", tmp_path), "nope")


def test_unknown_input_in_input_shapes(tmp_path):
    _assert_usage_error(run_cli("precision", SEED, *BASE, "--input-shapes", "nope:[1,2]", "--cache-dir", tmp_path), "nope")


@pytest.mark.parametrize("flag", [["--val-range", "x:[2,1]"], ["--val-range", "x:1-2"], ["--atol", "abc"],
                                  ["--rtol", "-1"], ["--input-shapes", "x:[1,a]"], ["--check-error-stat", "avg"]])
def test_malformed_values(tmp_path, flag):
    _assert_usage_error(run_cli("precision", SEED, "--fp16", *flag, "--cache-dir", tmp_path), flag[0])


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_dir_non_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    _assert_usage_error(run_cli("precision", SEED, *BASE, "-o", ro / "out", "--cache-dir", tmp_path), "out")


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    _assert_usage_error(run_cli("precision", SEED, *BASE, "-o", blocker / "out", "--cache-dir", tmp_path), "output directory")


def test_unknown_fp32_node_in_run(tmp_path):
    _assert_usage_error(run_cli("run", SEED, *BASE, "--fp32", "Nope", "--cache-dir", tmp_path), "Nope")


def test_unknown_strategy(tmp_path):
    _assert_usage_error(run_cli("precision", SEED, *BASE, "--strategy", "magic", "--cache-dir", tmp_path), "magic")


def test_unknown_output_in_tolerance(tmp_path):
    _assert_usage_error(run_cli("precision", SEED, "--fp16", "--atol", "nope:1", "--cache-dir", tmp_path), "nope")


def test_verbose_shows_traceback(tmp_path):
    r = run_cli("precision", tmp_path / "nope.onnx", *BASE, "--verbose")
    assert r.returncode == 2 and "Traceback" in r.stderr


# ---- issue 8: the rest of the matrix ---------------------------------------------------------------------------
import errno  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from .conftest import main_cli  # noqa: E402


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("arrays,fragment", [
    ({"nope": np.ones((1, 1, 256, 256), np.float32)}, "unknown input"),
    ({"x": np.ones((256, 256), np.float32)}, "rank"),
    ({"x": np.ones((1, 1, 256, 256), np.float64)}, "dtype"),
    ({"x": np.ones((1, 1, 256, 255), np.float32)}, "shape"),
], ids=["unknown-name", "wrong-rank", "wrong-dtype", "wrong-shape"])
def test_bad_loaded_inputs(tmp_path, arrays, fragment):
    f = _npz(tmp_path / "in.npz", **arrays)
    _assert_usage_error(run_cli("precision", SEED, *BASE, "--load-inputs", f, "--cache-dir", tmp_path), fragment)


@pytest.mark.parametrize("flag", [["--input-shapes", "x:[1,2"], ["--input-shapes", "x:[-1,2]"], ["--val-range", "x:[a,b]"],
                                  ["--val-range", "x:[1,inf]"], ["--atol", "x:"], ["--rtol", "nan"]])
def test_more_malformed_values(tmp_path, flag):
    _assert_usage_error(run_cli("precision", SEED, "--fp16", *flag, "--cache-dir", tmp_path), flag[0])


def test_nan_in_golden_outputs(tmp_path):
    graph = helper.make_graph([helper.make_node("Sqrt", ["x"], ["y"], name="sqrt")], "nan",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = tmp_path / "nan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    r = run_cli("precision", model, *BASE, "--val-range", "x:[-2,-1]", "-o", tmp_path / "o", "--cache-dir", tmp_path)
    _assert_usage_error(r, "NaN")
    assert not (tmp_path / "o" / "constraints.json").exists()


def test_all_fp16_already_passing_reports_an_empty_set(tmp_path):
    out = tmp_path / "o"
    assert main_cli("precision", SEED, "--fp16", "--atol", "1e9", "--val-range", "x:[1,2]", "-o", out,
                    "--cache-dir", tmp_path / "c") == 0
    c = json.loads((out / "constraints.json").read_text())
    assert c["fp32_nodes"] == [] and c["passed"] and c["minimal"]
    onnx.checker.check_model(onnx.load(out / "model.mixed.onnx"))


def test_nothing_passes_even_all_fp32(tmp_path):
    from bisector.model.polyjson import run_results_to_json

    wrong = tmp_path / "golden.json"
    # An FP32 reference runner's golden that does not fit (other inputs or another model): a reduced-precision
    # or unnamed runner would be refused before any search (test_polygraphy_compat).
    wrong.write_text(run_results_to_json("onnxrt-runner-N0-elsewhere",
                                         [{"y": np.full((1, 1, 256, 256), 1e3, np.float32)}], [0.0]))
    r = run_cli("precision", SEED, *BASE, "--val-range", "x:[1,2]", "--load-outputs", wrong, "-o", tmp_path / "o",
                "--cache-dir", tmp_path / "c")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "nothing passes, not even with every candidate FP32" in r.stderr and "y" in r.stderr
    assert "same inputs" in r.stderr and "same model" in r.stderr and "FP32 runner" in r.stderr


def test_disk_full_while_writing_artifacts_leaves_nothing_half_written(tmp_path, monkeypatch, capsys):
    from bisector import files as artifacts_io

    out = tmp_path / "o"
    assert main_cli("precision", SEED, *BASE, "--val-range", "x:[1,2]", "-o", out, "--cache-dir", tmp_path / "c") == 0
    old_report = (out / "report.md").read_bytes()
    real = artifacts_io._write

    def full_disk(f, data, path):
        if path.name == "model.mixed.onnx":
            real(f, data[: len(data) // 2], path)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data, path)

    monkeypatch.setattr(artifacts_io, "_write", full_disk)
    code = main_cli("precision", SEED, *BASE, "--val-range", "x:[1,2]", "-o", out, "--cache-dir", tmp_path / "c")
    err = capsys.readouterr().err
    assert code == 2 and "disk is full" in err and "Traceback" not in err
    assert not (out / "constraints.json").exists()  # the stale one is gone: no "complete" marker over a partial set
    assert not list(out.glob(".*.tmp"))  # no temporary left behind
    assert (out / "report.md").read_bytes() == old_report  # untouched, not half-replaced
    onnx.checker.check_model(onnx.load(out / "model.mixed.onnx"))  # the previous complete file, not half of a new one


# ---- the flag parsers, fuzzed with structure (test_values_argv.py fuzzes free text) ------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bisector.errors import UsageError  # noqa: E402
from bisector.values import parse_error_stat, parse_input_shapes, parse_tolerance, parse_val_range  # noqa: E402

_atoms = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["", "a", "None", "True", "[", "]", "()", "1e999", "-0", "0x10", "1_0"]))
_lists = st.lists(_atoms, max_size=5).map(lambda xs: "[" + ",".join(xs) + "]")
_names = st.sampled_from(["", "x", "a:b", "x y", "[x]", "名"])
_tokens = st.one_of(st.tuples(_names, _lists).map(lambda t: f"{t[0]}:{t[1]}" if t[0] else t[1]), _lists, _atoms,
                    st.tuples(_names, _atoms).map(lambda t: f"{t[0]}:{t[1]}"))


@given(st.lists(_tokens, max_size=4))
@settings(max_examples=300, deadline=None)
def test_structured_flag_values_parse_or_raise_usage_errors(tokens):
    for parse in (parse_val_range, parse_input_shapes, lambda t: parse_tolerance(t, 1e-5, "--atol"), parse_error_stat):
        try:
            parse(tokens)
        except UsageError as exc:
            assert str(exc)


@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_:.]{0,8}", fullmatch=True),
                       st.lists(st.integers(0, 4096), max_size=5), max_size=4))
@settings(max_examples=200, deadline=None)
def test_input_shapes_round_trip(shapes):
    tokens = [f"{k}:{list(v)}".replace(" ", "") for k, v in shapes.items()]
    assert parse_input_shapes(tokens) == {k: tuple(v) for k, v in shapes.items()}


@pytest.mark.parametrize("backend,fragment", [("tensorrt", "pip install 'bisector[tensorrt]'"),
                                              ("tensorrt-rtx", "tensorrt-rtx")])
def test_missing_tensorrt_is_exit_2_naming_the_package(tmp_path, backend, fragment):
    from bisector.backends.trt_import import tensorrt_rtx_version, tensorrt_version

    if (tensorrt_version() if backend == "tensorrt" else tensorrt_rtx_version()):
        pytest.skip(f"a real {backend} is installed here")
    out = tmp_path / "out"
    r = run_cli("precision", SEED, *BASE, "--backend", backend, "-o", out, "--cache-dir", tmp_path)
    _assert_usage_error(r, fragment)
    assert not (out / "constraints.json").exists()
