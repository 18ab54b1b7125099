"""Polygraphy-compatibility audit: verdicts, files and flags that differed from the real polygraphy package."""

from __future__ import annotations

import numpy as np
import pytest

from bisector.compare import Tolerance, compare_output
from bisector.values import PerOutput


def polygraphy_passes(actual: np.ndarray, golden: np.ndarray, **kw) -> bool:
    """Polygraphy's own verdict (SimpleCompareFunc, golden second as `--load-outputs` puts it)."""
    from polygraphy.comparator import CompareFunc, IterationResult

    func = CompareFunc.simple(**kw)
    out = func(IterationResult({"y": actual}, runner_name="a"), IterationResult({"y": golden}, runner_name="b"))
    return bool(out["y"])


def bisector_passes(actual: np.ndarray, golden: np.ndarray, atol=1e-5, rtol=1e-5, check_error_stat="elemwise"):
    tol = Tolerance(atol=PerOutput(atol), rtol=PerOutput(rtol), stat=PerOutput(check_error_stat))
    return compare_output("y", actual, golden, tol)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("stat", ["elemwise", "max", "mean", "median"])
def test_integer_outputs_compare_exactly_as_polygraphy(dtype, stat):
    """Integers were cast to float32: above 2**24 different values compared equal, so an exact check
    (--atol 0 --rtol 0) passed where Polygraphy fails; and a zero integer golden got the float epsilon."""
    golden = np.array([1, 2**25 + 1, 7, 2**30], dtype)
    actual = np.array([1, 2**25, 7, 2**30], dtype)
    for a, g, kw in ((actual, golden, {"atol": 0.0, "rtol": 0.0}), (golden, golden, {"atol": 0.0, "rtol": 0.0}),
                     (np.array([0, 2], dtype), np.array([0, 0], dtype), {"atol": 0.0, "rtol": 1e30}),
                     (np.array([0, 0], dtype), np.array([0, 0], dtype), {"atol": 0.0, "rtol": 0.0})):
        want = polygraphy_passes(a, g, check_error_stat=stat, **kw)
        got = bisector_passes(a, g, check_error_stat=stat, **kw)
        assert got.passed == want, (a, g, kw, stat)
    c = bisector_passes(actual, golden, atol=0.0, rtol=0.0)
    assert c.required_abs == 1.0 and c.mismatches == 1


def _identity_model(path, values: np.ndarray):
    import onnx
    from onnx import helper, numpy_helper

    x = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(values.dtype), list(values.shape))
    y = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(values.dtype), list(values.shape))
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_onnxrt_against_loaded_outputs_divides_by_the_loaded_like_polygraphy(tmp_path):
    """`run --onnxrt --load-outputs F`: Polygraphy compares the live run with F, reldiff relative to F; bisector
    took its live onnxrt run as the reference, so a golden zero (rel = x / eps) passed an --rtol it fails."""
    import subprocess
    import sys

    from polygraphy.comparator import IterationResult, RunResults
    from polygraphy.json import save_json

    from .conftest import main_cli

    live = np.array([0.5, 1.0, 2.0, 3.0], np.float32)
    model = _identity_model(tmp_path / "m.onnx", live)
    save_json([{"x": live}], str(tmp_path / "in.json"))
    golden = RunResults()
    golden.append(("onnxrt-runner-N0-gold", [IterationResult({"y": np.array([0.0, 1.0, 2.0, 3.0], np.float32)},
                                                            runner_name="onnxrt-runner-N0-gold")]))
    golden.save(str(tmp_path / "gold.json"))
    common = [model, "--onnxrt", "--load-inputs", tmp_path / "in.json", "--load-outputs", tmp_path / "gold.json",
              "--atol", "0", "--rtol", "1"]
    poly = subprocess.run([str(__import__("pathlib").Path(sys.executable).parent / "polygraphy"), "run",
                           *map(str, common)], capture_output=True, text=True)
    assert poly.returncode == 1, poly.stdout + poly.stderr
    assert main_cli("run", *common, "--cache-dir", tmp_path / "cache") == 1
    # --trt --onnxrt --load-outputs: trt vs onnxrt, then onnxrt vs the file (Polygraphy's chain)
    assert main_cli("run", *common, "--trt", "--cache-dir", tmp_path / "cache") == 1


def test_polygraphy_flag_aliases(tmp_path):
    """Polygraphy's other spellings (argparse aliases) are accepted: --iters, --inputs, --load-input-data,
    --save-input-data, --execution-providers, --save/--load-tactic-replay; a prefix of two spellings of one
    option (--iter) is that option, as in argparse."""
    from polygraphy.json import load_json

    from .conftest import SEED, main_cli

    saved = tmp_path / "in.json"
    assert main_cli("run", SEED, "--onnxrt", "--iters", "2", "--inputs", "x:[1,1,256,256]", "--save-input-data",
                    saved) == 0
    assert len(load_json(str(saved))) == 2
    assert main_cli("run", SEED, "--onnxrt", "--iter", "3", "--save-inputs", saved) == 0
    assert len(load_json(str(saved))) == 3
    assert main_cli("run", SEED, "--onnxrt", "--load-input-data", saved, "--execution-providers", "cpu",
                    "--save-tactic-replay", tmp_path / "t.json") == 0


def test_quantile_report_line_names_the_quantile(capsys):
    from .conftest import SEED, main_cli

    assert main_cli("run", SEED, "--trt", "--onnxrt", "--val-range", "x:[1,2]", "--check-error-stat", "quantile",
                    "--error-quantile", "0.5") == 0
    assert "Minimum Required Tolerance: quantile error | [abs=0] OR [rel=0] (quantile=0.5)" in capsys.readouterr().out


def test_per_output_quantile_and_index_tolerance_are_refused_clearly(capsys):
    """Polygraphy takes `--error-quantile 0.95 out0:0.8` and `--index-tolerance 1 out0:2`; bisector takes one
    value for all outputs and says so (exit 2) instead of a click parse error about a stray argument."""
    from .conftest import SEED, main_cli

    common = ["run", SEED, "--trt", "--onnxrt", "--val-range", "x:[1,2]"]
    for flag, values in (("--error-quantile", ["0.95", "y:0.8"]), ("--error-quantile", ["y:0.8"]),
                         ("--index-tolerance", ["1", "y:2"])):
        capsys.readouterr()
        assert main_cli(*common, flag, *values) == 2
        assert "per-output values (NAME:VALUE) are not supported by bisector" in capsys.readouterr().err
    assert main_cli(*common, "--check-error-stat", "quantile", "--error-quantile", "0.5") == 0
    assert main_cli(*common, "--compare-func", "indices", "--index-tolerance", "1") in (0, 1)


@pytest.mark.parametrize("golden,actual,stat", [
    ([1.0, np.inf, -np.inf, 3.0], [1.0, np.inf, -np.inf, 3.0], "elemwise"),
    ([1.0, np.inf, -np.inf, 3.0], [1.0, np.inf, np.inf, 3.0], "elemwise"),
    ([1.0, np.inf, -np.inf, 3.0], [1.0, np.inf, np.inf, 3.0], "median"),
])
def test_infinities_compare_equal_as_polygraphy(tmp_path, golden, actual, stat):
    """--infinities-compare-equal was 'No such option'; now matching infinities compare equal, as in Polygraphy."""
    from polygraphy.comparator import IterationResult, RunResults
    from polygraphy.json import save_json

    from .conftest import main_cli

    g, a = np.array(golden, np.float32), np.array(actual, np.float32)
    model = _identity_model(tmp_path / "m.onnx", a)
    save_json([{"x": a}], str(tmp_path / "in.json"))
    results = RunResults()
    results.append(("onnxrt-runner-N0-gold", [IterationResult({"y": g}, runner_name="onnxrt-runner-N0-gold")]))
    results.save(str(tmp_path / "gold.json"))
    want = polygraphy_passes(a, g, check_error_stat=stat, infinities_compare_equal=True)
    common = ["run", model, "--trt", "--load-inputs", tmp_path / "in.json", "--load-outputs", tmp_path / "gold.json",
              "--check-error-stat", stat]
    assert main_cli(*common, "--infinities-compare-equal") == (0 if want else 1)
    assert main_cli(*common) == (0 if polygraphy_passes(a, g, check_error_stat=stat) else 1)


def test_runner_comparison_flags_without_runners_are_refused(capsys):
    """Without --trt/--onnxrt, `run` judges a plan against golden with the tolerances alone: a comparison flag of
    the runners (--compare-func, --validate, ...) would change nothing there, so it is exit 2, not ignored."""
    from .conftest import SEED, main_cli

    for flag in (["--compare-func", "indices"], ["--validate"], ["--infinities-compare-equal"]):
        capsys.readouterr()
        assert main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", *flag) == 2
        assert "add --trt" in capsys.readouterr().err
