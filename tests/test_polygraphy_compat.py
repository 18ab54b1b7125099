"""Issue 18: Polygraphy's data loader, runners, files and flags, checked against the real polygraphy package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from .conftest import SEED, main_cli

polygraphy_bin = Path(sys.executable).parent / "polygraphy"


def _multi_input_model(path: Path) -> Path:
    nodes = [helper.make_node("Identity", [i], [f"o{i}"], name=f"id_{i}") for i in "abcd"]
    ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
           helper.make_tensor_value_info("b", TensorProto.INT64, ["n", 4]),
           helper.make_tensor_value_info("c", TensorProto.FLOAT16, [5]),
           helper.make_tensor_value_info("d", TensorProto.BOOL, [3])]
    outs = [helper.make_tensor_value_info(f"o{i}", t, None) for i, t in
            zip("abcd", (TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT16, TensorProto.BOOL))]
    onnx.save(helper.make_model(helper.make_graph(nodes, "multi", ins, outs),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("val_range,poly_range", [(None, None), ({None: (-3.0, 7.0)}, (-3, 7)),
                                                  ({"a": (1.0, 2.0), "b": (0.0, 100.0)}, {"a": (1, 2), "b": (0, 100)})])
def test_generated_inputs_are_polygraphys_array_for_array(tmp_path, val_range, poly_range):
    from polygraphy.common import TensorMetadata
    from polygraphy.comparator import DataLoader

    from bisector.model.catalog import Catalog
    from bisector.model.inputs import generate_inputs

    cat = Catalog.load(_multi_input_model(tmp_path / "multi.onnx"))
    ours = generate_inputs(cat, val_range or {}, {"b": (2, 4)}, seed=5, iterations=3)
    meta = TensorMetadata().add("a", np.float32, (2, 3)).add("b", np.int64, (2, 4)).add("c", np.float16, (5,)) \
        .add("d", bool, (3,))
    theirs = list(DataLoader(seed=5, iterations=3, val_range=poly_range, input_metadata=meta))
    assert len(theirs) == 3
    for mine, poly in zip(ours, theirs):
        assert list(mine) == list(poly)
        for k in poly:
            assert mine[k].dtype == poly[k].dtype and np.array_equal(mine[k], poly[k]), k


def test_seed_model_inputs_match_polygraphy_run(tmp_path):
    """What `polygraphy run --onnxrt --save-inputs` generates is what bisector generates, for --seed, --val-range
    and --iterations."""
    from polygraphy.json import load_json

    theirs, ours = tmp_path / "theirs.json", tmp_path / "ours.json"
    r = subprocess.run([str(polygraphy_bin), "run", str(SEED), "--onnxrt", "--val-range", "x:[1,2]", "--seed", "7",
                        "--iterations", "2", "--save-inputs", str(theirs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert main_cli("run", SEED, "--onnxrt", "--val-range", "x:[1,2]", "--seed", "7", "--iterations", "2",
                    "--save-inputs", ours) == 0
    a, b = load_json(str(theirs)), load_json(str(ours))
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert np.array_equal(x["x"], y["x"])


def test_integer_inputs_warn_about_the_default_range(tmp_path, caplog):
    from bisector.model.catalog import Catalog
    from bisector.model.inputs import generate_inputs

    cat = Catalog.load(_multi_input_model(tmp_path / "multi.onnx"))
    generate_inputs(cat, {}, {"b": (2, 4)})
    assert "integer input b gets values in the default range [0, 1]" in caplog.text


def test_data_loader_script(tmp_path, cache_dir):
    script = tmp_path / "data.py"
    script.write_text("import numpy as np\n"
                      "def load_data():\n"
                      "    for i in range(2):\n"
                      "        yield {'x': np.full((1, 1, 256, 256), 1.0 + i / 4, dtype=np.float32)}\n"
                      "def other():\n"
                      "    return [{'x': np.ones((1, 1, 256, 256), dtype=np.float32)}]\n")
    saved = tmp_path / "in.json"
    assert main_cli("run", SEED, "--onnxrt", "--data-loader-script", script, "--save-inputs", saved) == 0
    from polygraphy.json import load_json

    feeds = load_json(str(saved))
    assert len(feeds) == 2 and float(feeds[1]["x"][0, 0, 0, 0]) == 1.25
    assert main_cli("run", SEED, "--onnxrt", "--data-loader-script", f"{script}:other", "--save-inputs", saved) == 0
    assert len(load_json(str(saved))) == 1
    assert main_cli("run", SEED, "--onnxrt", "--data-loader-script", f"{script}:missing") == 2


def test_onnxrt_alone_saves_fp32_golden_that_polygraphy_compares(tmp_path):
    """Ours in Polygraphy: `polygraphy run --onnxrt --load-outputs` on outputs bisector saved passes."""
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    assert main_cli("run", SEED, "--onnxrt", "--val-range", "x:[1,2]", "--save-inputs", inp, "--save-outputs", out) == 0
    doc = json.loads(out.read_text())
    assert doc["lst"][0][0].startswith("onnxrt-runner-N0-")
    assert doc["bisector"]["runners"][doc["lst"][0][0]]["precision"] == "fp32"
    r = subprocess.run([str(polygraphy_bin), "run", str(SEED), "--onnxrt", "--load-inputs", str(inp),
                        "--load-outputs", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout + r.stderr


def test_trt_and_onnxrt_save_both_runners_readable_by_polygraphy(tmp_path):
    from polygraphy.comparator import RunResults

    out = tmp_path / "out.json"
    assert main_cli("run", SEED, "--trt", "--fp16", "--onnxrt", "--val-range", "x:[1,2]", "--save-outputs", out) == 1
    results = RunResults.load(str(out))
    names = [name for name, _ in results]
    assert names[0].startswith("onnxrt-runner-N0-") and names[1].startswith("trt-runner-N0-")
    # Loaded as golden, the FP32 reference runner is picked, so the all-FP16 plan still fails.
    assert main_cli("run", SEED, "--trt", "--fp16", "--val-range", "x:[1,2]", "--load-outputs", out) == 1
    # and with the FP32 layers the seed needs, it passes against the same file
    assert main_cli("run", SEED, "--trt", "--fp16", "--val-range", "x:[1,2]", "--load-outputs", out,
                    "--layer-precisions", "Add:float32", "Sub:float32", "--check-error-stat", "median") == 0


def test_polygraphy_golden_makes_a_correct_set_pass(tmp_path):
    """Polygraphy's saved golden in bisector: the right FP32 set passes, the all-FP16 build fails."""
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    r = subprocess.run([str(polygraphy_bin), "run", str(SEED), "--onnxrt", "--val-range", "x:[1,2]",
                        "--save-inputs", str(inp), "--save-outputs", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    common = ["--load-outputs", out, "--check-error-stat", "median", "--val-range", "x:[1,2]"]
    assert main_cli("run", SEED, "--trt", "--fp16", "--layer-precisions", "Add:float32", "Sub:float32", *common) == 0
    assert main_cli("run", SEED, "--trt", "--fp16", *common) == 1
    # generated inputs equal Polygraphy's, so even without --load-inputs the golden lines up


def test_reduced_precision_golden_is_refused(tmp_path, cache_dir, capsys):
    """Issue 12 item 4: outputs saved from a reduced-precision run never become golden unnoticed."""
    out = tmp_path / "out.json"
    assert main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--save-outputs", out, "--cache-dir",
                    cache_dir) == 1
    doc = json.loads(out.read_text())
    trt = [n for n, _ in doc["lst"] if n.startswith("trt-runner")][0]
    assert doc["bisector"]["runners"][trt]["precision"] == "fp16"
    # the file's FP32 runner is golden: the all-FP16 plan still FAILS
    assert main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--load-outputs", out, "--cache-dir",
                    cache_dir) == 1
    # the reduced-precision runner, named, is refused ...
    capsys.readouterr()
    assert main_cli("run", SEED, "--trt", "--fp16", "--val-range", "x:[1,2]", "--load-outputs", out,
                    "--golden-runner", trt) == 2
    assert "reduced precision (fp16)" in capsys.readouterr().err
    # ... unless explicitly allowed
    assert main_cli("run", SEED, "--trt", "--fp16", "--val-range", "x:[1,2]", "--load-outputs", out,
                    "--golden-runner", trt, "--allow-reduced-golden") == 0
    # a file from before provenance (a bisector-<backend> runner holding FP16 outputs) is refused too
    doc["lst"] = [[("bisector-emulate"), doc["lst"][1][1]]]
    del doc["bisector"]
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(doc))
    assert main_cli("precision", SEED, "--fp16", "--val-range", "x:[1,2]", "--load-outputs", legacy, "-o",
                    tmp_path / "o", "--cache-dir", cache_dir) == 2
    assert "no FP32 reference runner" in capsys.readouterr().err


def test_golden_of_another_model_is_exit_2_naming_the_output(tmp_path, capsys):
    from bisector.model.polyjson import run_results_many

    out = tmp_path / "other.json"
    out.write_text(run_results_many([("onnxrt-runner-N0-x", [{"y": np.zeros((1, 1, 8, 8), np.float32)}], [0.0],
                                      {"precision": "fp32"})]))
    assert main_cli("run", SEED, "--trt", "--fp16", "--load-outputs", out) == 2
    err = capsys.readouterr().err
    assert "output 'y' has shape [1, 1, 8, 8]" in err


def test_abbreviations_and_aliases_like_argparse(tmp_path, capsys):
    from bisector.cli.argv import expand_abbreviations

    assert expand_abbreviations(["run", "m.onnx", "--abs", "1e-4", "--rel=1e-3", "--trt-npps", "s.py"]) == \
        ["run", "m.onnx", "--abs-tol", "1e-4", "--rel-tol=1e-3", "--trt-npps", "s.py"]
    assert expand_abbreviations(["run", "m.onnx", "--fp", "x"]) == ["run", "m.onnx", "--fp", "x"]  # ambiguous
    assert main_cli("run", SEED, "--trt", "--fp16", "--onnxrt", "--val-range", "x:[1,2]", "--layer-prec",
                    "Add:float32", "Sub:float32", "--abs", "1e-2") == 0


def test_layer_precisions_unknown_name_is_exit_2(capsys):
    assert main_cli("run", SEED, "--trt", "--fp16", "--onnxrt", "--layer-precisions", "Nope:float32") == 2
    assert "'Nope'" in capsys.readouterr().err


def test_trt_only_flags_reported_once_as_no_effect(capsys):
    assert main_cli("run", SEED, "--trt", "--onnxrt", "--tactic-sources", "CUBLAS", "--builder-optimization-level",
                    "3", "--sparse-weights", "--pool-limit", "workspace:1G", "--json", "-") == 0
    cap = capsys.readouterr()
    assert cap.err.count("no effect on --backend emulate") == 1
    doc = json.loads(cap.out)
    assert doc["no_effect"]["--tactic-sources"] == ["CUBLAS"] and doc["no_effect"]["--sparse-weights"] is True


def test_compare_func_indices():
    from bisector.compare import indices_match

    assert indices_match(np.array([0, 1, 2]), np.array([0, 1, 2]))[0]
    assert not indices_match(np.array([1, 0, 2]), np.array([0, 1, 2]))[0]
    assert indices_match(np.array([1, 0, 2]), np.array([0, 1, 2]), 1)[0]
    assert not indices_match(np.array([0, 1, 2]), np.array([1, 2, 0]), 1)[0]
    assert indices_match(np.array([0, 1, 2]), np.array([1, 2, 0]), 2)[0]


def test_engines_and_network_scripts_need_tensorrt(tmp_path, capsys):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x")
    for argv in (["run", engine, "--trt"], ["run", SEED, "--model-type", "engine", "--trt"],
                 ["convert", SEED, "-o", tmp_path / "m.engine"], ["inspect", "model", engine],
                 ["run", tmp_path / "net.py", "--trt"]):
        assert main_cli(*argv) == 2, argv
        err = capsys.readouterr().err
        assert "needs TensorRT" in err and "Instead:" in err, err


def test_bf16_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from bisector.fp16.rules import round_activation_bf16, round_weight_bf16

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1e3, 50000), rng.normal(0, 1e-3, 50000),
                        [1.00390625, 1.01171875, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 1e-40, 0.0, -0.0]]
                       ).astype(np.float32)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(round_activation_bf16(x), want)
    w = round_weight_bf16(np.array([3.40e38, -3.40e38, 1e-45, 1.00390625], dtype=np.float32))
    assert np.isfinite(w[:2]).all() and w[2] > 0 and w[3] == 1.0


def test_bf16_runner_stores_bfloat16(capsys):
    """--bf16: every non-FP32 layer stores BF16: Add's 65505.5 becomes 65536 (FP16 would give 65504)."""
    assert main_cli("run", SEED, "--trt", "--bf16", "--onnxrt", "--val-range", "x:[1,2]", "--trt-outputs", "mark",
                    "all", "--onnx-outputs", "mark", "all", "--check-error-stat", "median") == 1
    out = capsys.readouterr().out
    assert "BF16 storage" in out and ": add_out | Stats: mean=65536," in out


def test_inspect_data_and_onnxrt_against_loaded(tmp_path, capsys):
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    assert main_cli("run", SEED, "--trt", "--fp16", "--onnxrt", "--val-range", "x:[1,2]", "--save-inputs", inp,
                    "--save-outputs", out) == 1
    capsys.readouterr()
    assert main_cli("inspect", "data", out) == 0
    text = capsys.readouterr().out
    assert "onnxrt-runner-N0-" in text and "precision: fp32" in text and "precision: fp16" in text
    assert main_cli("inspect", "data", inp) == 0
    assert "x [dtype=float32, shape=(1, 1, 256, 256)]" in capsys.readouterr().out
    # --onnxrt against loaded outputs (the file's FP32 runner is golden): identical, so it passes
    assert main_cli("run", SEED, "--onnxrt", "--load-inputs", inp, "--load-outputs", out) == 0


def test_inspect_data_reads_the_npz_input_set_that_save_inputs_writes(tmp_path, capsys):
    """--save-inputs x.npz writes one input set and --load-inputs reads it; `inspect data` said 'not valid JSON'
    (exit 2) for it (found on an encoder with int64 ids and a bool mask)."""
    inp = tmp_path / "in.npz"
    assert main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--save-inputs", inp) == 1
    capsys.readouterr()
    assert main_cli("inspect", "data", inp) == 0
    text = capsys.readouterr().out
    assert "1 iteration(s)" in text and "x [dtype=float32, shape=(1, 1, 256, 256)]" in text
    (tmp_path / "bad.npz").write_text("not a zip")
    assert main_cli("inspect", "data", tmp_path / "bad.npz") == 2
    assert "not a readable .npz" in capsys.readouterr().err


def test_quiet_and_excluded_outputs(capsys):
    assert main_cli("run", SEED, "--trt", "--fp16", "--onnxrt", "--val-range", "x:[1,2]", "--trt-outputs", "mark",
                    "all", "--onnx-outputs", "mark", "all", "--onnx-exclude-outputs", "add_out", "-q") == 1
    out = capsys.readouterr().out
    assert "Comparing Output: 'sub_out'" in out and "Comparing Output: 'add_out'" not in out


def test_gen_script_reruns_the_same_command(tmp_path):
    script = tmp_path / "compare.py"
    assert main_cli("run", SEED, "--trt", "--onnxrt", "--val-range", "x:[1,2]", f"--gen-script={script}") == 0
    text = script.read_text()
    assert "--gen-script" not in text.split("main(")[1]
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout


def test_load_outputs_takes_several_files_and_picks_the_reference(tmp_path):
    """Polygraphy's `--load-outputs A B`: runners from every file; the FP32 reference among them is golden."""
    from bisector.model.polyjson import run_results_many

    ref, other = tmp_path / "ref.json", tmp_path / "trt.json"
    assert main_cli("run", SEED, "--onnxrt", "--val-range", "x:[1,2]", "--save-outputs", ref) == 0
    other.write_text(run_results_many([("trt-runner-N0-x", [{"y": np.zeros((1, 1, 256, 256), np.float32)}], [0.0],
                                        {"precision": "fp16"})]))
    common = ["--val-range", "x:[1,2]", "--check-error-stat", "median"]
    assert main_cli("run", SEED, "--trt", "--fp16", "--layer-precisions", "Add:float32", "Sub:float32",
                    "--load-outputs", other, ref, *common) == 0
    assert main_cli("run", SEED, "--trt", "--fp16", "--load-outputs", other, ref, *common) == 1
