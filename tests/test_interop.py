"""Polygraphy interop both ways: its saved inputs/outputs load here, ours load in Polygraphy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from .conftest import SEED, main_cli

polygraphy_bin = Path(sys.executable).parent / "polygraphy"


def test_polygraphy_files_load_in_bisector(tmp_path, cache_dir):
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    r = subprocess.run([str(polygraphy_bin), "run", str(SEED), "--onnxrt", "--val-range", "x:[1,2]",
                        "--save-inputs", str(inp), "--save-outputs", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    o = tmp_path / "o"
    code = main_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--load-inputs", inp, "--load-outputs", out,
                    "-o", o, "--cache-dir", cache_dir)
    assert code == 0
    c = json.loads((o / "constraints.json").read_text())
    assert c["golden"]["source"] == "file" and c["fp32_nodes"] == ["Add", "Sub"]
    assert c["golden"]["runner"].startswith("onnxrt-runner-N0-")  # which runner of the file was golden


def test_bisector_files_load_in_polygraphy(tmp_path, cache_dir):
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    code = main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--fp32", "Add", "Sub", "--atol", "1e-1",
                    "--iterations", "2", "--save-inputs", inp, "--save-outputs", out, "--cache-dir", cache_dir)
    assert code == 0
    feeds = load_json(str(inp))
    assert len(feeds) == 2 and feeds[0]["x"].shape == (1, 1, 256, 256) and 1 <= feeds[0]["x"].min()
    results = RunResults.load(str(out))
    # one runner each, named as Polygraphy names them: the FP32 reference (golden), then the plan's outputs
    (golden, golden_its), (runner, iterations) = results[0], results[1]
    assert golden.startswith("onnxrt-runner-N0-") and runner.startswith("trt-runner-N0-") and len(iterations) == 2
    np.testing.assert_allclose(np.asarray(golden_its[0]["y"]), _seed_ref(feeds[0]["x"]), rtol=1e-6)
    y = np.asarray(iterations[0]["y"])
    np.testing.assert_allclose(y, _seed_ref(feeds[0]["x"]), atol=1e-2)
    # and Polygraphy itself can run with our inputs
    r = subprocess.run([str(polygraphy_bin), "run", str(SEED), "--onnxrt", "--load-inputs", str(inp)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _seed_ref(x):
    anti = np.fliplr(np.eye(256, dtype=np.float32))
    return ((x @ anti) + 65504 - 65504) @ anti


def test_npz_inputs_round_trip(tmp_path, cache_dir):
    npz = tmp_path / "in.npz"
    assert main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--fp32", "Add", "Sub", "--atol", "1e-1",
                    "--save-inputs", npz, "--cache-dir", cache_dir) == 0
    assert main_cli("run", SEED, "--fp16", "--load-inputs", npz, "--fp32", "Add", "Sub", "--atol", "1e-1",
                    "--cache-dir", cache_dir) == 0
    with np.load(npz) as d:
        assert d["x"].shape == (1, 1, 256, 256)
