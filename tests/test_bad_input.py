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
    assert "--val-range" in r.stderr and "itself holds" not in r.stderr
    assert not (tmp_path / "o" / "constraints.json").exists()
    # loaded inputs that hold NaN themselves: the message names them, not --val-range
    np.savez(tmp_path / "nan_in.npz", x=np.array([1.0, np.nan, 4.0, np.inf], np.float32))
    r = run_cli("precision", model, *BASE, "--load-inputs", tmp_path / "nan_in.npz", "-o", tmp_path / "o2",
                "--cache-dir", tmp_path)
    _assert_usage_error(r, "itself holds NaN or Inf in 'x'")
    assert "--val-range" not in r.stderr


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


# ---- issue 12 "Trust at the seams": every bad input that ended in exit 3 "internal error" -------------------------
# Each case builds its adversarial input in tmp_path and names what the one-line message must mention. The command
# runs in-process through `main()` (the one exception boundary), so the exit code is the user's exit code.


def _model(path, nodes, inputs, outputs, inits=(), opset=17, ir=8):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir), path)
    return path


def _chain(path, names=("n0", "n1", "n2", "n3"), tensors=None, opset=17, ir=8, shape=(2, 4), weights_as_inputs=False):
    """MatMul -> Add -> Relu -> Sub over a 4x4 weight: every node a candidate, names and tensor names chosen."""
    from onnx import numpy_helper

    tensors = list(tensors or [f"t{i}" for i in range(len(names) - 1)]) + ["y"]
    ops = ["MatMul", "Add", "Relu", "Sub"]
    w = numpy_helper.from_array(np.linspace(0.1, 1.7, 16, dtype=np.float32).reshape(4, 4), "W")
    b = numpy_helper.from_array(np.linspace(0.3, 0.9, 4, dtype=np.float32), "b")
    nodes, prev = [], "x"
    for i, name in enumerate(names):
        op = ops[i % 4]
        ins = [prev, "W"] if op == "MatMul" else [prev, "b"] if op in ("Add", "Sub") else [prev]
        nodes.append(helper.make_node(op, ins, [tensors[i]], name=name))
        prev = tensors[i]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    if weights_as_inputs:  # IR 3 style: every initializer is also a graph input
        inputs += [helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 4]),
                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])]
    return _model(path, nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], [w, b],
                  opset, ir)


def _int_model(tmp_path):
    return _model(tmp_path / "int.onnx", [helper.make_node("Add", ["x", "x"], ["y"], name="add")],
                  [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.INT64, [4])])


def _dynamic_model(tmp_path):
    return _model(tmp_path / "dyn.onnx", [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])])


def _corrupt_journal(tmp_path):
    cache = tmp_path / "cj"
    assert main_cli("precision", SEED, *BASE, "--val-range", "x:[1,2]", "-o", tmp_path / "first",
                    "--cache-dir", cache) == 0
    import sqlite3

    db = sqlite3.connect(str(cache / "journal.sqlite"))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with open(cache / "journal.sqlite", "r+b") as f:  # a damaged b-tree page (page 2 onwards)
        f.seek(4096)
        f.write(b"\xde\xad" * 2048)
    return ["precision", SEED, *BASE, "--val-range", "x:[1,2]", "-o", tmp_path / "o", "--cache-dir", cache]


def _golden_of(tmp_path, arrays):
    from bisector.model.polyjson import run_results_to_json

    f = tmp_path / "golden.json"
    f.write_text(run_results_to_json("onnxrt-runner-N0-elsewhere", [arrays], [0.0]))
    return f


def _constraints_with(tmp_path, **changes):
    base = tmp_path / "base"
    assert main_cli("precision", SEED, *BASE, "--val-range", "x:[1,2]", "-o", base, "--cache-dir", tmp_path / "c") == 0
    doc = json.loads((base / "constraints.json").read_text())
    doc.update(changes)
    f = tmp_path / "c.json"
    f.write_text(json.dumps(doc))
    return f


def _constraints_with_inputs(tmp_path, **changes):
    f = _constraints_with(tmp_path)
    doc = json.loads(f.read_text())
    doc["inputs"].update(changes)
    f.write_text(json.dumps(doc))
    return f


BAD_INPUTS = {
    # id: (builder(tmp_path) -> argv, fragments the message must contain)
    "load-inputs-directory": (lambda t: ["precision", SEED, *BASE, "--load-inputs", t, "--cache-dir", t / "c"],
                              ["Is a directory"]),
    "cache-dir-dev-null": (lambda t: ["precision", SEED, *BASE, "--cache-dir", "/dev/null", "-o", t / "o"],
                           ["--cache-dir /dev/null"]),
    "negative-seed": (lambda t: ["precision", SEED, *BASE, "--seed", "-3", "--cache-dir", t / "c"], ["--seed"]),
    "profile-no-float-candidate": (lambda t: ["profile", _int_model(t), "--cache-dir", t / "c", "-o", t / "o"],
                                   ["no candidate"]),
    "huge-input-shapes": (lambda t: ["precision", _dynamic_model(t), *BASE, "--input-shapes",
                                     "x:[100000,100000,100000]", "--cache-dir", t / "c"], ["--input-shapes", "memory"]),
    "huge-iterations": (lambda t: ["precision", SEED, *BASE, "--iterations", str(10**9), "--cache-dir", t / "c"],
                        ["--iterations"]),
    "corrupt-journal-page": (_corrupt_journal, ["journal.sqlite", "damaged", "--no-resume"]),
    "fp16-name-collision": (lambda t: ["precision", _chain(t / "c.onnx", tensors=["t0", "t0__fp16", "t2"]), *BASE,
                                       "--cache-dir", t / "c"], ["t0__fp16"]),
    "golden-of-another-shape": (lambda t: ["precision", SEED, *BASE, "--load-outputs",
                                           _golden_of(t, {"y": np.ones((3, 3), np.float32)}), "--cache-dir", t / "c"],
                                ["--load-outputs", "shape"]),
    "golden-of-another-dtype": (lambda t: ["precision", SEED, *BASE, "--load-outputs",
                                           _golden_of(t, {"y": np.ones((1, 1, 256, 256), np.int64)}),
                                           "--cache-dir", t / "c"], ["--load-outputs", "dtype"]),
    "save-inputs-onto-model": (lambda t: ["precision", _chain(t / "m.onnx"), *BASE, "--save-inputs", t / "m.onnx",
                                          "--cache-dir", t / "c"], ["m.onnx", "input model"]),
    "json-onto-model": (lambda t: ["precision", _chain(t / "m.onnx"), *BASE, "--json", t / "m.onnx",
                                   "-o", t / "o", "--cache-dir", t / "c"], ["m.onnx", "input model"]),
    "junit-onto-model-via-symlink": (lambda t: (_chain(t / "m.onnx"), os.symlink(t / "m.onnx", t / "link.xml"),
                                                ["precision", t / "m.onnx", *BASE, "--junit", t / "link.xml", "-o",
                                                 t / "o", "--cache-dir", t / "c"])[-1], ["input model"]),
    "convert-onto-model": (lambda t: ["convert", _chain(t / "m.onnx"), "--fp16", "-o", t / "m.onnx"],
                           ["m.onnx", "input model"]),
    "constraints-newer-schema": (lambda t: ["verify", SEED, *BASE, "--val-range", "x:[1,2]", "--constraints",
                                            _constraints_with(t, schema_version=99), "--cache-dir", t / "c"],
                                 ["schema_version 99", "newer"]),
    "constraints-unknown-schema": (lambda t: ["verify", SEED, *BASE, "--constraints",
                                              _constraints_with(t, schema_version="one"), "--cache-dir", t / "c"],
                                   ["schema_version"]),
    "constraints-wrong-field": (lambda t: ["verify", SEED, *BASE, "--constraints",
                                           _constraints_with(t, fp32_nodes=5), "--cache-dir", t / "c"], ["fp32_nodes"]),
    "model-name-too-long": (lambda t: ["precision", t / ("L" * 300 + ".onnx"), *BASE, "--cache-dir", t / "c"],
                            ["File name too long"]),
    "save-outputs-directory": (lambda t: ["run", SEED, *BASE, "--save-outputs", t, "--cache-dir", t / "c"],
                               ["Is a directory"]),
    # the Search group's budget checks sat after a `return` (unreachable): these searched and exited 0
    "max-evals-negative": (lambda t: ["precision", SEED, *BASE, "--max-evals", "-1", "--cache-dir", t / "c",
                                      "-o", t / "o"], ["--max-evals -1"]),
    "max-evals-zero": (lambda t: ["precision", SEED, *BASE, "--max-evals", "0", "--cache-dir", t / "c",
                                  "-o", t / "o"], ["--max-evals 0"]),
    "time-limit-negative": (lambda t: ["precision", SEED, *BASE, "--time-limit", "-5", "--cache-dir", t / "c",
                                       "-o", t / "o"], ["--time-limit -5"]),
    "time-limit-nan": (lambda t: ["precision", SEED, *BASE, "--time-limit", "nan", "--cache-dir", t / "c",
                                  "-o", t / "o"], ["--time-limit nan"]),
    # zero-size outputs: every plan passed vacuously ("PASSED; 1-minimal; headroom 100%" with nothing compared)
    "all-outputs-empty": (lambda t: ["precision", _dynamic_model(t), *BASE, "--input-shapes", "x:[2,0,3]",
                                     "--cache-dir", t / "c", "-o", t / "o"], ["0 values", "nothing to judge"]),
    "all-outputs-empty-verify": (lambda t: ["verify", _dynamic_model(t), *BASE, "--input-shapes", "x:[2,0,3]",
                                            "--constraints", _constraints_with(t), "--cache-dir", t / "c"],
                                 ["nothing to judge"]),
    "constraints-nested-too-deep": (lambda t: (t.joinpath("deep.json").write_text("[" * 100000 + "]" * 100000),
                                               ["verify", SEED, "--constraints", t / "deep.json",
                                                "--cache-dir", t / "c"])[-1], ["deep.json", "not JSON"]),
    "scores-nested-too-deep": (lambda t: (t.joinpath("deep.json").write_text("[" * 100000 + "]" * 100000),
                                          ["precision", SEED, *BASE, "--scores", t / "deep.json", "-o", t / "o",
                                           "--cache-dir", t / "c"])[-1], ["deep.json", "not a readable profile"]),
    "constraints-recorded-seed-not-a-number": (
        lambda t: ["verify", SEED, "--constraints", _constraints_with_inputs(t, seed="abc"), "--cache-dir", t / "c"],
        ["recorded inputs are malformed"]),
    "confirm-on-unknown": (lambda t: ["precision", SEED, *BASE, "--confirm-on", "magic", "--cache-dir", t / "c",
                                      "-o", t / "o"], ["--confirm-on 'magic'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_matrix_is_exit_2_with_one_line_naming_it(tmp_path, capsys, case):
    build, fragments = BAD_INPUTS[case]
    argv = build(tmp_path)
    capsys.readouterr()
    code = main_cli(*argv)
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("bisector: error: ") and "internal error" not in err and "Traceback" not in err, err
    for f in fragments:
        assert f in last, (f, last)


def test_input_model_survives_every_output_flag_aimed_at_it(tmp_path):
    model = _chain(tmp_path / "m.onnx")
    before = model.read_bytes()
    for flag in (["--save-inputs", model], ["--json", model], ["--junit", model], ["-o", tmp_path, "--plot"]):
        main_cli("precision", model, *BASE, *flag, "--cache-dir", tmp_path / "c")
        assert model.read_bytes() == before, flag


@pytest.mark.parametrize("case", ["plot-no-float-candidate", "opset-7", "ten-thousand-character-names",
                                  "non-utf8-file-name", "rich-markup-names"])
def test_inputs_that_crashed_now_work(tmp_path, capsys, case):
    """Not errors at all: these models are fine, and crashed in the artifact writers or printers."""
    out = tmp_path / "o"
    tight = ["--fp16", "--atol", "1e-7", "--rtol", "1e-7", "--cache-dir", tmp_path / "c", "--no-progress"]
    if case == "plot-no-float-candidate":
        argv = ["precision", _int_model(tmp_path), *tight, "-o", out, "--plot"]
    elif case == "opset-7":  # IR 3: initializers must be graph inputs; the mixed model's FP16 copies were not
        argv = ["precision", _chain(tmp_path / "m7.onnx", opset=7, ir=3, weights_as_inputs=True), "--fp16", "--atol", "1e-2",
                "--cache-dir", tmp_path / "c", "-o", out]
    elif case == "ten-thousand-character-names":
        argv = ["precision", _chain(tmp_path / "long.onnx", names=[c * 10000 for c in "NMOP"],
                                    tensors=[c * 10000 for c in "abc"]), *tight, "-o", out, "--junit", out / "j.xml"]
    elif case == "non-utf8-file-name":
        raw = os.fsdecode(bytes(tmp_path / "caf") + b"\xe9.onnx")
        _chain(tmp_path / "plain.onnx")
        os.rename(tmp_path / "plain.onnx", raw)
        argv = ["precision", raw, *tight, "-o", out, "--json", tmp_path / "s.json", "--junit", tmp_path / "j.xml"]
    else:
        argv = ["inspect", _chain(tmp_path / "r.onnx", names=["a[/]", "[bold]b", "c[/red]", "[link=x]d"])]
    if case == "non-utf8-file-name":  # a subprocess: pytest's own log capture cannot carry the surrogates
        r = run_cli(*argv)
        code, captured = r.returncode, type("Captured", (), {"out": r.stdout, "err": r.stderr})
    else:
        code = main_cli(*argv)
        captured = capsys.readouterr()
    assert code in (0, 1) and "internal error" not in captured.err, (code, captured.err[-2000:])
    if case == "opset-7":
        mixed = onnx.load(out / "model.mixed.onnx")
        onnx.checker.check_model(mixed)
        assert any(i.name.endswith("__fp16") for i in mixed.graph.initializer)  # an FP16 weight copy exists
        import onnxruntime as ort

        session = ort.InferenceSession(str(out / "model.mixed.onnx"), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["x"]  # no weight left behind as a required input
    if case == "non-utf8-file-name":
        c = json.loads((out / "constraints.json").read_text(encoding="utf-8"))
        assert c["model"].endswith("caf\\xe9.onnx")
        (out / "report.md").read_text(encoding="utf-8")  # valid UTF-8
        json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    if case == "rich-markup-names":
        for name in ("a[/]", "[bold]b", "c[/red]", "[link=x]d"):
            assert name in captured.out


def test_batch_keeps_going_after_an_environment_error_in_one_model(tmp_path):
    """A directory given as --load-inputs to one model (an OSError deep in loading) was an internal error of the
    whole batch; now that model is ERROR (input), exit 2, and the next model still runs."""
    config = tmp_path / "nightly.toml"
    config.write_text(f"""
[defaults]
args = ["--fp16", "--atol", "1e-1", "--cache-dir", "{tmp_path / 'c'}"]
output_dir = "{tmp_path / 'out'}"

[[model]]
name = "bad-inputs"
path = "{SEED}"
args = ["--load-inputs", "{tmp_path}"]

[[model]]
name = "good"
path = "{SEED}"
args = ["--val-range", "x:[1,2]"]
""")
    js = tmp_path / "batch.json"
    assert main_cli("batch", config, "--json", js) == 2
    models = {m["name"]: m for m in json.loads(js.read_text())["models"]}
    assert models["bad-inputs"]["exit_code"] == 2 and "Is a directory" in models["bad-inputs"]["error"]
    assert models["good"]["exit_code"] == 0


# ---- Polygraphy JSON files that are not what they claim: structure checked, never an internal error -----------------
_RUNNER = "onnxrt-runner-N0"
MALFORMED_JSON = {
    "inputs-plain-list-value": ("--load-inputs", [{"x": [1, 2, 3]}]),
    "inputs-number-value": ("--load-inputs", [{"x": 5}]),
    "inputs-nested-too-deep": ("--load-inputs", "[" * 100000 + "]" * 100000),
    "inputs-5000-digit-number": ("--load-inputs", '[{"x": ' + "9" * 5000 + "}]"),
    "results-lst-of-ints": ("--load-outputs", {"polygraphy_class": "RunResults", "lst": [5]}),
    "results-lst-a-string": ("--load-outputs", {"polygraphy_class": "RunResults", "lst": _RUNNER}),
    "results-pair-too-short": ("--load-outputs", {"polygraphy_class": "RunResults", "lst": [[_RUNNER]]}),
    "results-iterations-int": ("--load-outputs", {"polygraphy_class": "RunResults", "lst": [[_RUNNER, 5]]}),
    "results-runner-name-int": ("--load-outputs", {"polygraphy_class": "RunResults", "lst": [[5, []]]}),
    "results-outputs-a-list": ("--load-outputs", {"polygraphy_class": "RunResults",
                                                  "lst": [[_RUNNER, [{"outputs": [1, 2]}]]]}),
    "results-output-an-int": ("--load-outputs", {"polygraphy_class": "RunResults",
                                                 "lst": [[_RUNNER, [{"outputs": {"y": 5}}]]]}),
    "results-provenance-a-list": ("--load-outputs", {"polygraphy_class": "RunResults", "lst": [[_RUNNER, []]],
                                                     "bisector": {"runners": [1]}}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_JSON))
def test_malformed_polygraphy_json_is_exit_2(tmp_path, capsys, case):
    flag, doc = MALFORMED_JSON[case]
    f = tmp_path / "f.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    for argv in (["precision", SEED, *BASE, flag, f, "--cache-dir", tmp_path / "c", "-o", tmp_path / "o"],
                 ["inspect", "data", f]):
        capsys.readouterr()
        code = main_cli(*argv)
        err = capsys.readouterr().err
        if argv[0] == "inspect" and case == "results-provenance-a-list":
            assert code == 0, err  # an odd provenance block is ignored; the runner itself is fine
            continue
        assert code == 2, (argv[0], code, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("bisector: error: ") and "internal error" not in err and "f.json" in last, err


def test_verify_of_a_set_found_with_a_data_loader_script_does_not_judge_generated_inputs(tmp_path, capsys):
    """verify fell back to generated [0, 1] inputs when the constraints recorded a data loader script, and said
    VERIFIED about inputs the set was never found with."""
    script = tmp_path / "loader.py"
    script.write_text("import numpy as np\n\ndef load_data():\n"
                      "    yield {'x': np.random.RandomState(0).uniform(1, 2, (1, 1, 256, 256)).astype(np.float32)}\n")
    out, cache = tmp_path / "o", tmp_path / "c"
    assert main_cli("precision", SEED, *BASE, "--data-loader-script", script, "-o", out, "--cache-dir", cache) == 0
    capsys.readouterr()
    assert main_cli("verify", SEED, "--constraints", out / "constraints.json", "--cache-dir", cache) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("bisector: error: ") and "--data-loader-script" in last and "loader.py" in last, last
    assert main_cli("verify", SEED, "--constraints", out / "constraints.json", "--data-loader-script", script,
                    "--cache-dir", cache) == 0


@pytest.mark.parametrize("body,fragment", [("import sys\nsys.exit(3)\n", "importing it failed: SystemExit: 3"),
                                           ("def load_data():\n    raise SystemExit(0)\n", "failed: SystemExit: 0")],
                         ids=["exit-3-at-import", "exit-0-in-load-data"])
def test_data_loader_script_that_calls_sys_exit_is_exit_2(tmp_path, capsys, body, fragment):
    """SystemExit is no Exception: the first ended the command with a bare exit 3, the second with exit 0 and no
    search at all."""
    script = tmp_path / "loader.py"
    script.write_text(body)
    code = main_cli("precision", SEED, *BASE, "--data-loader-script", script, "-o", tmp_path / "o",
                    "--cache-dir", tmp_path / "c")
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("bisector: error: ") and fragment in last, (code, last)
    assert not (tmp_path / "o" / "constraints.json").exists()


@pytest.mark.parametrize("body,fragment", [("import sys\nsys.exit(0)\n", "importing"),
                                           ("def postprocess(network):\n    raise SystemExit(0)\n", "postprocess failed")],
                         ids=["exit-0-at-import", "exit-0-in-postprocess"])
def test_network_postprocess_script_that_calls_sys_exit_is_exit_2(tmp_path, capsys, body, fragment):
    """`run --trt --onnxrt --trt-npps s.py` exited 0, no comparison made, when the script called sys.exit(0)."""
    script = tmp_path / "npps.py"
    script.write_text(body)
    code = main_cli("run", SEED, "--trt", "--fp16", "--onnxrt", "--trt-npps", script)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("bisector: error: ") and fragment in last and "SystemExit" in last, (code, last)


def test_a_seed_whose_last_input_set_passes_2_to_the_32(tmp_path):
    """Input set i is generated from seed + i (Polygraphy's data loader): the last must stay below 2**32."""
    r = run_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--seed",
                str(2**32 - 1), "--iterations", "2", "-o", tmp_path / "o", "--no-cache")
    assert r.returncode == 2 and "--iterations 2" in r.stderr and "internal error" not in r.stderr, r.stderr


# -- flag lists for scripts (options_from_flags) and API keywords of the wrong type ----------------------------


@pytest.mark.parametrize(("flags", "want"), [
    (["--seed", "3"], {"seed": 3}),
    (["--iterations", "2"], {"iterations": 2}),
    (["--margin", "0.9"], {"margin": 0.9}),
    (["--max-evals", "10"], {"max_evals": 10}),
    (["--time-limit", "60"], {"time_limit": 60.0}),
    (["--workers", "2"], {"workers": 2}),
    (["--atol", "1e-3", "--seed", "7"], {"atol": ["1e-3"], "seed": 7}),
])
def test_flag_lists_give_the_options_the_cli_gives(flags, want):
    """A script's Polygraphy-style flag list gives typed options, as the CLI's parser does: `--seed 3` used to
    arrive as the text '3' and end in "--seed '3': must be an integer" (`--workers 2`: a TypeError)."""
    from bisector.app.options import options_from_flags, split_options

    got = options_from_flags(flags)
    assert got == want
    split_options(got)  # the option groups accept them


@pytest.mark.parametrize("flags", [["--seed", "x"], ["--workers", "two"], ["--margin", "most"]])
def test_flag_lists_with_a_bad_number_say_which_flag(flags):
    from bisector.app.options import options_from_flags

    with pytest.raises(UsageError, match=flags[0]):
        options_from_flags(flags)


@pytest.mark.parametrize("value", ["2", 2.5, True])
def test_workers_of_the_wrong_type_is_a_usage_error(value):
    """`workers="2"` through the API compared a string with 1 (TypeError, an internal error)."""
    from bisector.app.options import Search

    with pytest.raises(UsageError, match="--workers"):
        Search(workers=value)
