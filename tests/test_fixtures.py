"""The committed fixtures are exactly what the generators produce (deterministic, regenerable)."""

from __future__ import annotations

import importlib.util
import json

from .conftest import FIXTURES, PLANTED, main_cli, planted_spec


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generate_reproduces_committed_fixtures(tmp_path):
    _load(FIXTURES / "generate.py").main(tmp_path)
    for name in ("needs_constraints.onnx", "planted.onnx", "planted.json"):
        assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes(), name


def test_constructs_reproduce_committed_fixtures(tmp_path):
    _load(FIXTURES / "constructs.py").main(tmp_path)
    committed = sorted(p.name for p in (FIXTURES / "constructs").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (FIXTURES / "constructs" / name).read_bytes(), name


def test_planted_set_is_the_unique_minimal_answer(tmp_path):
    """Under planted.json's flags: the planted set passes, and removing any planted node from *all-FP32* fails,
    so (for a monotone oracle) every passing set contains the planted set: it is the unique minimal answer."""
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    spec = planted_spec()
    job = open_job(PLANTED, no_cache=True, **options_from_flags(spec["args"]))
    oracle = job.oracle()
    planted = frozenset(spec["fp32_nodes"])
    everything = frozenset(job.catalog.candidates)
    assert len(everything) >= 100 and planted <= everything
    assert oracle.passes(planted)
    for node in planted:
        assert not oracle.passes(everything - {node}), node
        assert not oracle.passes(planted - {node}), node
    ops = {job.catalog.nodes[n].op_type for n in everything}
    assert {"Conv", "MatMul", "Gemm", "Add", "Mul", "Softmax", "Exp", "ReduceMean", "Sqrt", "Div"} <= ops
    job.close()


def test_every_one_minimal_strategy_finds_the_planted_set(tmp_path, cache_dir):
    spec = planted_spec()
    evals = {}
    for strategy in ("auto", "greedy", "ddmin"):
        out = tmp_path / strategy
        assert main_cli("precision", PLANTED, "--fp16", *spec["args"], "--strategy", strategy, "--no-plot",
                        "-o", out, "--cache-dir", cache_dir, "--no-resume") == 0
        c = json.loads((out / "constraints.json").read_text())
        assert c["fp32_nodes"] == sorted(spec["fp32_nodes"]) and c["minimal"]
        evals[strategy] = c["evaluations"]["new"]
    assert evals["auto"] < min(evals["greedy"], evals["ddmin"])


def test_profile_scores_reduce_auto_evaluations_on_planted(tmp_path, cache_dir):
    spec = planted_spec()
    counts = {}
    for label, extra in (("plain", []), ("scored", ["--scores", "profile"])):
        out = tmp_path / label
        assert main_cli("precision", PLANTED, "--fp16", *spec["args"], *extra, "--no-plot", "-o", out,
                        "--cache-dir", cache_dir, "--no-resume") == 0
        c = json.loads((out / "constraints.json").read_text())
        assert c["fp32_nodes"] == sorted(spec["fp32_nodes"])
        counts[label] = c["evaluations"]["total"]
    assert counts["scored"] < counts["plain"]
