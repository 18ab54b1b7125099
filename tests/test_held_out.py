"""The final set judged on generated input sets the search did not use (bisector.app.held_out)."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.app import api
from bisector.model.catalog import Catalog
from bisector.model.inputs import generate_inputs

from .conftest import PLANTED, main_cli


def offset_model() -> onnx.ModelProto:
    """y = (x + 1000) - 1000 on one number in [0, 1]. With the Add in FP16, x + 1000 is stored with FP16's spacing
    of 0.5 there, so y is x rounded to the nearest half: within atol 0.1 of x only where x happens to lie near 0, 0.5
    or 1. An all-FP16 set passes on such an input and fails on most others: a set fitted to its input."""
    c = numpy_helper.from_array(np.array([1000.0], np.float32), "c")
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add_offset"),
             helper.make_node("Sub", ["a", "c"], ["y"], name="sub_offset")]
    g = helper.make_graph(nodes, "offset", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializer=[c])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _off_grid(x: float) -> float:
    return abs(x - round(x * 2) / 2)


@pytest.fixture
def offset(tmp_path):
    path = tmp_path / "offset.onnx"
    onnx.save(offset_model(), path)
    cat = Catalog.load(path)
    xs = [float(generate_inputs(cat, {}, None, seed=s)[0]["x"][0]) for s in range(1, 200)]
    # a seed whose input lies near the FP16 grid at 1000 (the all-FP16 set passes there) and whose next two do not
    seed = next(s for s in range(1, 197) if _off_grid(xs[s - 1]) < 0.05
                and min(_off_grid(xs[s]), _off_grid(xs[s + 1])) > 0.15)
    return path, seed


def test_a_set_that_holds_only_on_the_searched_input_is_said_to_be_fitted(offset, tmp_path, caplog, capsys):
    path, seed = offset
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(path, output_dir=tmp_path / "out", atol=0.1, rtol=0.0, seed=seed, held_out=1, no_cache=True)
    assert r.passed and r.fp32_nodes == []  # on its own input all FP16 passes: the search cannot tell
    held = r.constraints.held_out
    assert held["passed"] is False and held["failed_sets"] == 1 and held["input_sets"] == 1
    assert held["seeds"] == [seed + 1, seed + 1] and held["excess"] > 1.5
    assert "fitted to the inputs searched" in caplog.text
    assert "**Fitted to the searched inputs:**" in (tmp_path / "out" / "report.md").read_text()
    written = json.loads((tmp_path / "out" / "constraints.json").read_text())
    assert written["held_out"]["passed"] is False and written["timings"]["held_out"] > 0
    # the verdict and the exit code stay the search's; the line says it
    assert main_cli("precision", str(path), "--fp16", "--atol", "0.1", "--rtol", "0", "--seed", seed, "--held-out", 1,
                    "--no-cache", "-o", tmp_path / "cli") == 0
    assert "fails on 1 of 1 held-out input set(s): fitted" in capsys.readouterr().out


def test_searching_on_more_input_sets_gives_a_set_that_holds_on_the_next(offset, tmp_path):
    path, seed = offset
    r = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, iterations=2, held_out=3, no_cache=True)
    assert r.passed and "add_offset" in r.fp32_nodes
    held = r.constraints.held_out
    assert held["passed"] is True and held["seeds"] == [seed + 2, seed + 4]
    assert len(held["excess_per_set"]) == 3 and held["excess"] <= 1


def test_held_out_sets_are_judged_at_the_tolerance_not_the_margin(offset, monkeypatch):
    """--margin is headroom for other machines' kernels; the held-out check asks whether the tolerance holds."""
    import bisector.app.held_out as held_out

    seen = []
    real = held_out.judge

    def spy(backend, plan, feeds, golden, tolerance, **kw):
        seen.append(tolerance.margin)
        return real(backend, plan, feeds, golden, tolerance, **kw)

    monkeypatch.setattr(held_out, "judge", spy)
    path, seed = offset
    r = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, margin=0.5, held_out=2, no_cache=True)
    assert r.constraints.held_out is not None and seen == [1.0, 1.0]


def test_no_held_out_check_where_nothing_can_be_drawn_or_it_is_off(tmp_path):
    x = generate_inputs(Catalog.load(PLANTED), {None: (0.0, 1.0)}, None)[0]
    from bisector.model.polyjson import inputs_to_json

    (tmp_path / "x.json").write_text(inputs_to_json([x]))
    off = api.precision(PLANTED, output_dir=None, atol=1e-1, held_out=0, no_cache=True)
    loaded = api.precision(PLANTED, output_dir=None, atol=1e-1, load_inputs=[tmp_path / "x.json"], no_cache=True)
    on = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    assert off.constraints.held_out is None and loaded.constraints.held_out is None
    assert on.constraints.held_out["seeds"] == [2, 2] and on.constraints.held_out["input_sets"] == 1  # 44 evaluations
    assert off.fp32_nodes == on.fp32_nodes  # the check changes no set


@pytest.mark.parametrize("value", ["-1", "two"])
def test_a_bad_held_out_count_is_a_usage_error(value, capsys):
    assert main_cli("precision", str(PLANTED), "--fp16", "--atol", "1e-1", "--no-cache", "--held-out", value) == 2
    assert "--held-out" in capsys.readouterr().err


def test_held_out_seeds_past_numpy_limit_are_not_drawn(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(PLANTED, output_dir=None, atol=1e-1, seed=2**32 - 1, no_cache=True)
    assert r.passed and r.constraints.held_out is None
    assert "2**32" in caplog.text


def test_the_emulators_fp32_run_stands_for_the_golden_session_on_held_out_inputs():
    """On emulate the held-out golden is the emulator's own FP32 run (no second whole-model session); elsewhere
    ONNX Runtime's golden session. They agree to FP32 rounding: far below any FP16 tolerance."""
    from bisector.app.held_out import _golden
    from bisector.app.job import open_job

    job = open_job(PLANTED, no_cache=True, val_range=["x:[0,1]"])
    try:
        feeds = generate_inputs(job.catalog, {None: (0.0, 1.0)}, None, seed=7)[0]
        emulated = _golden(job, feeds, 7)
        job.backend.name = "tensorrt"  # any backend but emulate: ONNX Runtime's FP32 run
        session = _golden(job, feeds, 7)
    finally:
        job.close()
    assert emulated.keys() == session.keys() == set(job.catalog.output_names)
    for k in emulated:
        np.testing.assert_allclose(emulated[k], session[k], rtol=1e-5, atol=1e-6)


def test_batch_says_a_fitted_set_passed_but_does_not_call_it_a_regression(offset, tmp_path):
    path, seed = offset
    config = tmp_path / "nightly.toml"
    config.write_text(f"""
[defaults]
args = ["--fp16", "--no-cache", "--atol", "0.1", "--rtol", "0", "--held-out", "1"]
output_dir = "out"

[[model]]
name = "fitted"
path = "{path}"
args = ["--seed", "{seed}"]

[[model]]
name = "holds"
path = "{path}"
args = ["--seed", "{seed}", "--iterations", "2"]
""")
    js = tmp_path / "batch.json"
    assert main_cli("batch", config, "--json", js) == 0
    models = {m["name"]: m for m in json.loads(js.read_text())["models"]}
    assert models["fitted"]["status"] == "ok (fitted: fails on held-out inputs)"
    assert models["fitted"]["held_out_passed"] is False and models["fitted"]["exit_code"] == 0
    assert models["holds"]["status"] == "ok" and models["holds"]["held_out_passed"] is True


def test_by_default_only_a_long_enough_search_is_judged_on_held_out_inputs(offset, caplog):
    """The check costs two to three evaluations: by default only after AUTO_FROM_EVALUATIONS or more."""
    from bisector.app.held_out import AUTO_FROM_EVALUATIONS

    path, seed = offset
    with caplog.at_level(logging.DEBUG, logger="bisector"):
        short = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, no_cache=True)
    assert short.constraints.evaluations.total < AUTO_FROM_EVALUATIONS and short.constraints.held_out is None
    assert "--held-out 1 asks" in caplog.text
    planted = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    assert planted.constraints.evaluations.total >= AUTO_FROM_EVALUATIONS  # 44
    assert planted.constraints.held_out["input_sets"] == 1


def test_the_time_limit_bounds_the_held_out_sets(offset, monkeypatch, caplog):
    """--time-limit bounds the whole command: once spent, the held-out sets judged so far are the record."""
    import bisector.app.held_out as held_out

    real, calls = held_out.judge, []

    def slow(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(held_out, "judge", slow)
    monkeypatch.setattr(held_out.Budget, "spent", lambda self: len(calls) >= 1)
    path, seed = offset
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, held_out=3, no_cache=True)
    assert len(calls) == 1 and r.constraints.held_out["input_sets"] == 1
    assert "judged on 1 of 3 held-out input set(s)" in caplog.text


def test_held_out_set_i_is_what_the_data_loader_generates_as_iteration_i():
    """Drawn one at a time (memory for one set), the held-out sets are still the iterations Polygraphy's data
    loader would generate after the searched ones: set i of seed s is the first set of seed s + i."""
    cat = Catalog.load(PLANTED)
    together = generate_inputs(cat, {None: (0.0, 1.0)}, None, seed=3, iterations=3)
    for i in range(3):
        alone = generate_inputs(cat, {None: (0.0, 1.0)}, None, seed=3 + i)[0]
        assert alone.keys() == together[i].keys()
        for k in alone:
            np.testing.assert_array_equal(alone[k], together[i][k])


def test_a_device_backend_is_judged_against_onnx_runtimes_fp32_run(offset, monkeypatch):
    """Where the backend is not the emulator (ORT-CUDA, TensorRT) the held-out golden is ONNX Runtime's FP32 run
    of the model and the verdicts are the backend's own; nothing of the emulator's memory hooks is asked for."""
    import types

    import bisector.app.held_out as held_out
    import bisector.model.golden as golden
    from bisector.app.job import open_job
    from bisector.app.options import Inputs
    from bisector.budget import Budget

    path, seed = offset
    job = open_job(path, no_cache=True, atol=0.1, rtol=0.0, seed=seed)
    runs = []
    real = golden.run_reference_model
    monkeypatch.setattr(golden, "run_reference_model", lambda cat, feeds: runs.append(1) or real(cat, feeds))
    try:
        device_runs, emulator = [], job.backend

        def run(plan, feeds, outputs=None):  # the "device": the emulator under another name, without its hooks
            device_runs.append(sorted(plan.fp32))
            return emulator.run(plan, feeds, outputs)

        job.backend = types.SimpleNamespace(name="ort-cuda", run=run)
        found = types.SimpleNamespace(passed=True, fp32=frozenset(), evaluations={"total": 40},
                                      verdict=types.SimpleNamespace(excess=0.5))
        kept, record = held_out.check_held_out(job, Inputs(seed=seed), None, found, Budget())
    finally:
        job.backend = emulator
        job.close()
    assert runs == [1] and device_runs == [[]]  # one held-out set by default; the all-FP16 plan on the device
    assert record is not None and not record.passed and record.seed == seed + 1 and kept is found


def test_grown_inputs_extend_a_fitted_set_until_it_holds_on_the_next_input_set(offset, tmp_path, capsys):
    """--grow-inputs: the held-out set the all-FP16 set fails on joins the search, which goes on from the set and
    keeps both nodes FP32; that set is then judged on the input set after it, and holds there."""
    path, seed = offset
    r = api.precision(path, output_dir=tmp_path / "out", atol=0.1, rtol=0.0, seed=seed, grow_inputs=2,
                      no_cache=True)
    assert r.passed and r.minimal and set(r.fp32_nodes) == {"add_offset", "sub_offset"}
    held = r.constraints.held_out
    # four held-out sets a round by default with growth (GROWTH_HELD_OUT): the first round's join the search, and
    # the grown set is judged on the four after them
    assert held["passed"] is True and held["searched_input_sets"] == 5 and held["input_sets"] == 4
    assert held["seeds"] == [seed + 5, seed + 8]
    assert [(g["seeds"], g["set_before"], g["set_after"], g["passed"]) for g in held["grown"]] == \
        [([seed + 1, seed + 4], 0, 2, True)]
    assert r.constraints.evaluations.total > 3 + 2  # the first search's and the search on from its set
    assert "Grown on held-out inputs" in (tmp_path / "out" / "report.md").read_text()
    assert main_cli("precision", str(path), "--fp16", "--atol", "0.1", "--rtol", "0", "--seed", seed,
                    "--grow-inputs", 1, "--no-cache", "-o", tmp_path / "cli") == 0
    out = capsys.readouterr().out
    assert "FP32 nodes (2)" in out and "searched on 5 input sets (--grow-inputs)" in out and "fitted" not in out


def test_grown_inputs_stop_after_the_rounds_asked_and_say_the_set_is_still_fitted(offset, monkeypatch, caplog):
    """Where the set keeps failing fresh input sets, growth stops after --grow-inputs rounds; the last check's
    failure is the record, and each round's sets join the search, so the seeds run on without a gap."""
    import bisector.app.held_out as held_out
    from bisector.search.judge import judge as real

    def failing(*a, **k):  # every held-out judgement fails (the searches on judge through their own oracle)
        v = real(*a, **k)
        v.passed = False
        return v

    monkeypatch.setattr(held_out, "judge", failing)
    path, seed = offset
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, held_out=2, grow_inputs=2,
                          no_cache=True)
    held = r.constraints.held_out
    assert r.passed and held["passed"] is False and held["failed_sets"] == 2
    assert [g["seeds"] for g in held["grown"]] == [[seed + 1, seed + 2], [seed + 3, seed + 4]]
    assert held["searched_input_sets"] == 5 and held["seeds"] == [seed + 5, seed + 6]
    assert "round 2 of 2" in caplog.text and "Grown as far as --grow-inputs allows" in caplog.text


def test_grown_inputs_stay_within_max_evals(offset, caplog):
    """--max-evals counts the searches on from the set too: with none left, the set is reported fitted, not grown."""
    path, seed = offset
    with caplog.at_level(logging.WARNING, logger="bisector"):
        first = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, held_out=1, no_cache=True)
        capped = api.precision(path, output_dir=None, atol=0.1, rtol=0.0, seed=seed, grow_inputs=3, no_cache=True,
                               max_evals=first.constraints.evaluations.new)
    assert capped.fp32_nodes == [] and capped.constraints.held_out["passed"] is False
    assert "grown" not in capped.constraints.held_out and "no evaluations left" in caplog.text


@pytest.mark.parametrize("flags, says", [(["--grow-inputs", "-1"], "--grow-inputs"),
                                         (["--grow-inputs", "2", "--held-out", "0"], "--held-out 0"),
                                         (["--grow-inputs", "1", "--confirm-on", "ort-cuda"], "--confirm-on")])
def test_bad_grow_inputs_combinations_are_usage_errors(flags, says, capsys):
    assert main_cli("precision", str(PLANTED), "--fp16", "--atol", "1e-1", "--no-cache", *flags) == 2
    assert says in capsys.readouterr().err


def test_grow_inputs_with_inputs_from_files_is_a_usage_error(tmp_path, capsys):
    """Nothing more can be drawn from files: growth would silently do nothing, so it is refused before the search."""
    from bisector.model.polyjson import inputs_to_json

    x = generate_inputs(Catalog.load(PLANTED), {None: (0.0, 1.0)}, None)[0]
    (tmp_path / "x.json").write_text(inputs_to_json([x]))
    assert main_cli("precision", str(PLANTED), "--fp16", "--atol", "1e-1", "--no-cache", "--load-inputs",
                    tmp_path / "x.json", "--grow-inputs", "1", "-o", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "--grow-inputs" in err and "files" in err and not (tmp_path / "out" / "constraints.json").exists()


def test_a_set_grown_when_time_ran_out_is_not_called_held_or_fitted(offset, tmp_path, monkeypatch, capsys):
    """Where the search on from the set stops early (--time-limit, --max-evals), the set it returns was judged on no
    input set it did not use: held_out.passed is null, and the line and report.md say it was not judged."""
    import dataclasses

    import bisector.app.held_out as held_out

    real = held_out.run_search
    monkeypatch.setattr(held_out, "run_search",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), stop_reason="--time-limit spent"))
    path, seed = offset
    assert main_cli("precision", str(path), "--fp16", "--atol", "0.1", "--rtol", "0", "--seed", seed,
                    "--grow-inputs", 2, "--no-cache", "-o", tmp_path / "out") == 0
    held = json.loads((tmp_path / "out" / "constraints.json").read_text())["held_out"]
    assert held["passed"] is None and held["input_sets"] == 0 and held["seeds"] is None and len(held["grown"]) == 1
    assert "not judged on held-out inputs after it grew" in capsys.readouterr().out
    assert "is not judged on input sets the search did not use" in (tmp_path / "out" / "report.md").read_text()
