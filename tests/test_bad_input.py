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
