"""End-to-end behaviour of `bisector precision` and `bisector run`, as a user sees it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from .conftest import PLANTED, SEED, main_cli, planted_spec, run_cli

SEED_ARGS = ["--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]"]


def test_precision_on_seed_finds_add_and_sub(tmp_path, cache_dir):
    out = tmp_path / "out"
    r = run_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir)
    assert r.returncode == 0, r.stderr
    assert "Add Sub" in r.stdout
    c = json.loads((out / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["Add", "Sub"] and c["passed"] and c["minimal"]
    assert c["golden"]["source"] == "computed"
    assert c["evaluations"]["total"] == c["evaluations"]["new"] + c["evaluations"]["cached"] > 0
    for name in ("add_constraints.py", "model.mixed.onnx", "layer_precisions.json", "report.md"):
        assert (out / name).stat().st_size > 0
    assert "Traceback" not in r.stderr


def test_second_search_reads_golden_from_cache(tmp_path, cache_dir, monkeypatch):
    assert main_cli("precision", SEED, *SEED_ARGS, "-o", tmp_path / "a", "--cache-dir", cache_dir) == 0
    from bisector.model import golden

    def no_reference_runs(*a, **k):
        raise AssertionError("golden must come from the cache")

    monkeypatch.setattr(golden, "run_reference_model", no_reference_runs)
    assert main_cli("precision", SEED, *SEED_ARGS, "-o", tmp_path / "b", "--cache-dir", cache_dir) == 0
    c = json.loads((tmp_path / "b" / "constraints.json").read_text())
    assert c["golden"] == {"source": "cache", "reference_runs": 0, "runner": None}  # runner: only for --load-outputs


@pytest.mark.parametrize("tamper", ["scaled", "nan", "other-shape"])
def test_tampered_golden_cache_is_recomputed_not_trusted(tmp_path, cache_dir, capsys, tamper):
    """An edited or bit-rotted golden cache entry was the reference of the next search: scaled values searched
    against the wrong golden, a NaN was exit 2 blaming the model, another shape exit 1 'nothing passes'."""
    assert main_cli("precision", SEED, *SEED_ARGS, "--held-out", "0", "-o", tmp_path / "a", "--cache-dir", cache_dir) == 0
    (entry,) = (cache_dir / "golden").glob("*.npz")  # the search's alone (--held-out 0: no held-out inputs')
    with np.load(entry) as data:
        arrays = dict(data)
    y = arrays["0/y"]
    arrays["0/y"] = {"scaled": y * 1.001, "nan": np.where(np.arange(y.size).reshape(y.shape) == 0, np.nan, y),
                     "other-shape": np.ones((2, 2), np.float32)}[tamper].astype(np.float32)
    np.savez(entry, **arrays)
    capsys.readouterr()
    assert main_cli("precision", SEED, *SEED_ARGS, "--held-out", "0", "-o", tmp_path / "b", "--cache-dir", cache_dir) == 0
    assert "ignoring unreadable golden cache" in capsys.readouterr().err
    a, b = (json.loads((tmp_path / d / "constraints.json").read_text()) for d in "ab")
    assert b["golden"]["source"] == "computed" and b["outputs"] == a["outputs"]
    assert main_cli("precision", SEED, *SEED_ARGS, "--held-out", "0", "-o", tmp_path / "c", "--cache-dir", cache_dir) == 0
    assert json.loads((tmp_path / "c" / "constraints.json").read_text())["golden"]["source"] == "cache"  # rewritten


def test_run_seed_all_fp16_reproduces_tensorrt_numbers(tmp_path, cache_dir):
    js = tmp_path / "run.json"
    r = run_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--mark-all", "--check-error-stat", "median",
                "--json", js, "--cache-dir", cache_dir)
    assert r.returncode == 1, r.stderr
    rep = json.loads(js.read_text())
    assert rep["passed"] is False
    assert rep["outputs"]["add_out"]["actual"]["min"] == rep["outputs"]["add_out"]["actual"]["max"] == 65504
    assert rep["outputs"]["sub_out"]["actual"]["max"] == rep["outputs"]["sub_out"]["actual"]["min"] == 0
    assert rep["outputs"]["y"]["abs"]["median"] == pytest.approx(1.5, abs=0.01)
    assert "First divergence" in r.stdout and "MatMul_0" in r.stdout.split("First divergence")[1].splitlines()[1]


def test_run_first_divergence_names_add_at_loose_tolerance(cache_dir):
    r = run_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--mark-all", "--atol", "1e-1",
                "--cache-dir", cache_dir)
    assert r.returncode == 1
    first = r.stdout.split("First divergence")[1].splitlines()[1]
    assert "node Add " in first


def test_run_with_fp32_add_sub_passes(cache_dir):
    assert main_cli("run", SEED, "--fp16", "--val-range", "x:[1,2]", "--fp32", "Add", "Sub", "--atol", "1e-1",
                    "--cache-dir", cache_dir) == 0


def test_run_with_constraints_file(tmp_path, cache_dir):
    main_cli("precision", SEED, *SEED_ARGS, "-o", tmp_path / "o", "--cache-dir", cache_dir)
    assert main_cli("run", SEED, *SEED_ARGS, "--constraints", tmp_path / "o" / "constraints.json",
                    "--cache-dir", cache_dir) == 0


@pytest.mark.parametrize("strategy", ["greedy", None])
def test_planted_model_gives_exactly_the_planted_set(tmp_path, cache_dir, strategy):
    spec = planted_spec()
    extra = ["--strategy", strategy] if strategy else []
    out = tmp_path / "o"
    assert main_cli("precision", PLANTED, "--fp16", *spec["args"], *extra, "-o", out, "--cache-dir", cache_dir) == 0
    c = json.loads((out / "constraints.json").read_text())
    assert c["fp32_nodes"] == sorted(spec["fp32_nodes"])
    assert c["minimal"] is True


def test_mixed_artifact_is_valid_and_really_fp16(tmp_path, cache_dir):
    out = tmp_path / "o"
    main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir)
    m = onnx.load(out / "model.mixed.onnx")
    onnx.checker.check_model(m, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info}
    types.update({i.name: i.data_type for i in m.graph.initializer})
    by_name = {n.name: n for n in m.graph.node}
    # MatMul_0 and MatMul_1 are FP16: their data inputs and outputs are FP16 tensors; Add/Sub stay FP32.
    for node in ("MatMul_0", "MatMul_1"):
        assert all(types.get(t) == onnx.TensorProto.FLOAT16 for t in by_name[node].input)
        assert all(types.get(t, onnx.TensorProto.FLOAT16) == onnx.TensorProto.FLOAT16 for t in by_name[node].output)
    assert all(types.get(t, 1) == onnx.TensorProto.FLOAT for t in by_name["Add"].input)
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.full((1, 1, 256, 256), 1.5, np.float32)})[0]
    assert y.dtype == np.float32 and np.allclose(y, 1.5, atol=1e-2)
