"""Nightly-job features: journal + resume after SIGKILL, budgets, verify, JUnit, batch configs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from .conftest import PLANTED, SEED, journal_rows, main_cli, planted_spec

SEED_ARGS = ["--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]"]


def test_sigkill_then_resume_replays_from_journal(tmp_path, cache_dir):
    spec = planted_spec()
    args = [sys.executable, "-m", "bisector.cli.main", "precision", str(PLANTED), "--fp16", *spec["args"],
            "--strategy", "greedy", "-o", str(tmp_path / "killed"), "--cache-dir", str(cache_dir)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while journal_rows(cache_dir) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = journal_rows(cache_dir)
    assert committed >= 8, "the search must have committed evaluations before the kill"
    assert not (tmp_path / "killed" / "constraints.json").exists()

    out = tmp_path / "resumed"
    assert main_cli("precision", PLANTED, "--fp16", *spec["args"], "--strategy", "greedy", "-o", out,
                    "--cache-dir", cache_dir) == 0
    c = json.loads((out / "constraints.json").read_text())
    assert c["fp32_nodes"] == sorted(spec["fp32_nodes"])
    ev = c["evaluations"]
    assert ev["cached"] >= committed and ev["total"] == ev["new"] + ev["cached"]
    # no plan judged twice: every journal row is either replayed or new in the resumed run
    assert journal_rows(cache_dir) == ev["total"]


def test_changing_tolerance_or_inputs_misses_the_journal(tmp_path, cache_dir):
    def search(*extra):
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        assert main_cli("precision", SEED, "--fp16", "--val-range", "x:[1,2]", *extra, "-o", out,
                        "--cache-dir", cache_dir) == 0
        return json.loads((out / "constraints.json").read_text())["evaluations"]

    first = search("--atol", "1e-1")
    assert first["cached"] == 0
    assert search("--atol", "1e-1")["new"] == 0  # same key: fully replayed
    assert search("--atol", "2e-1")["cached"] == 0  # tolerance changed
    assert search("--atol", "1e-1", "--seed", "5")["cached"] == 0  # inputs changed
    assert search("--atol", "1e-1", "--no-resume")["cached"] == 0


def test_max_evals_reports_best_so_far_not_minimal(tmp_path, cache_dir):
    out = tmp_path / "o"
    assert main_cli("precision", SEED, *SEED_ARGS, "--max-evals", "2", "-o", out, "--cache-dir", cache_dir) == 0
    c = json.loads((out / "constraints.json").read_text())
    assert c["minimal"] is False and c["passed"] is True and "max-evals" in c["stop_reason"]
    assert c["evaluations"]["new"] == 2


def test_verify_passes_fails_and_names_missing_nodes(tmp_path, cache_dir):
    out = tmp_path / "o"
    assert main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir) == 0
    cpath = out / "constraints.json"
    js = tmp_path / "v.json"
    assert main_cli("verify", SEED, "--constraints", cpath, "--check-minimal", "--json", js, "--cache-dir", cache_dir) == 0
    assert json.loads(js.read_text())["passed"] is True

    data = json.loads(cpath.read_text())
    data["fp32_nodes"] = ["Add"]  # a required node dropped
    dropped = tmp_path / "dropped.json"
    dropped.write_text(json.dumps(data))
    assert main_cli("verify", SEED, "--constraints", dropped, "--json", js, "--cache-dir", cache_dir) == 1
    v = json.loads(js.read_text())
    assert v["failing_outputs"] == ["y"] and v["outputs"]["y"]["required_tolerance"]["abs"] > 0.1

    data["fp32_nodes"] = ["Add", "Sub_renamed"]
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(data))
    r = subprocess.run([sys.executable, "-m", "bisector.cli.main", "verify", str(SEED), "--constraints", str(renamed),
                        "--cache-dir", str(cache_dir)], capture_output=True, text=True)
    assert r.returncode == 1 and "Sub_renamed" in r.stdout and "no longer exist" in r.stdout


def test_a_failing_output_says_how_far_past_its_tolerance_it_is(tmp_path, cache_dir, capsys):
    """The needed abs and rel that verify prints are output-wide maxima of each; an element fails only where it
    exceeds both, so the line also says the output's excess (the smallest scale of the tolerance that passes)."""
    out = tmp_path / "o"
    assert main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir) == 0
    data = json.loads((out / "constraints.json").read_text())
    data["fp32_nodes"] = ["Add"]  # a required node dropped
    dropped, js = tmp_path / "dropped.json", tmp_path / "v.json"
    dropped.write_text(json.dumps(data))
    capsys.readouterr()
    assert main_cli("verify", SEED, "--constraints", dropped, "--json", js, "--cache-dir", cache_dir) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FAIL y"))
    excess = json.loads(js.read_text())["outputs"]["y"]["excess"]
    assert excess > 1 and f"; {excess:.3g} × the tolerance)" in line


def test_a_failure_within_tolerance_says_it_is_the_margin(tmp_path, cache_dir, capsys):
    """verify judges with the recorded headroom (--margin): a set within the tolerance but above the margin fails,
    and the line says so instead of printing a needed tolerance below the tolerance next to FAIL."""
    out = tmp_path / "o"
    assert main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir) == 0
    excess = 1.0 - json.loads((out / "constraints.json").read_text())["headroom"]
    assert 0.0 < excess < 1.0
    capsys.readouterr()
    margin = f"{excess * 0.9:.3g}"
    assert main_cli("verify", SEED, "--constraints", out / "constraints.json", "--margin", margin,
                    "--cache-dir", cache_dir) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FAIL y"))
    assert f"times the margin {float(margin):g}: excess {excess:.3g} > {float(margin):g}" in line
    assert main_cli("verify", SEED, "--constraints", out / "constraints.json", "--margin", "1",
                    "--cache-dir", cache_dir) == 0
    assert "margin" not in next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pass y"))


def test_junit_is_valid_and_marks_the_failing_case(tmp_path, cache_dir):
    out = tmp_path / "o"
    main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir)
    data = json.loads((out / "constraints.json").read_text())
    data["fp32_nodes"] = ["Sub"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    junit = tmp_path / "j.xml"
    assert main_cli("verify", SEED, "--constraints", bad, "--junit", junit, "--cache-dir", cache_dir) == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "1"
    case = root.find("testsuite/testcase")
    assert case.get("name") == "y" and case.find("failure") is not None
    assert "exceeds tolerance" in case.find("failure").get("message")


def test_batch_runs_both_models_and_fails_when_one_regresses(tmp_path, cache_dir):
    good = tmp_path / "good.json"
    main_cli("precision", SEED, *SEED_ARGS, "-o", tmp_path / "g", "--cache-dir", cache_dir)
    data = json.loads((tmp_path / "g" / "constraints.json").read_text())
    good.write_text(json.dumps(data))
    data["fp32_nodes"] = ["Add"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    config = tmp_path / "nightly.toml"
    config.write_text(f"""
[defaults]
args = ["--fp16", "--cache-dir", "{cache_dir}"]
output_dir = "out"

[[model]]
name = "seed-search"
path = "{SEED}"
args = ["--atol", "1e-1", "--val-range", "x:[1,2]"]
expect_fp32 = ["Add", "Sub"]

[[model]]
name = "seed-verify-bad"
path = "{SEED}"
mode = "verify"
constraints = "bad.json"
""")
    js = tmp_path / "batch.json"
    assert main_cli("batch", config, "--json", js, "--junit", tmp_path / "b.xml") == 1
    models = {m["name"]: m for m in json.loads(js.read_text())["models"]}
    assert models["seed-search"]["exit_code"] == 0 and models["seed-search"]["fp32_nodes"] == ["Add", "Sub"]
    assert models["seed-verify-bad"]["exit_code"] == 1
    assert main_cli("batch", config, "--only", "seed-search") == 0
    config.write_text(config.read_text().replace('bad.json', 'good.json'))
    assert main_cli("batch", config) == 0


@pytest.mark.parametrize("content,fragment", [("[[model]]\npath = 1\nbogus = 2\n", "invalid batch config"),
                                              ("not = [toml", "not valid TOML")])
def test_bad_batch_config_is_exit_2(tmp_path, content, fragment, capsys):
    config = tmp_path / "c.toml"
    config.write_text(content)
    assert main_cli("batch", config) == 2
    assert fragment in capsys.readouterr().err


def test_several_input_sets_must_all_pass_and_the_worst_is_reported(tmp_path, cache_dir):
    """Small inputs survive x + 65504 - 65504 in FP16 within atol 0.1; inputs in [1, 2] do not. A plan must pass
    on every set, so the second set alone decides the answer, and it is reported as the worst."""
    import numpy as np

    from bisector.model.polyjson import inputs_to_json

    rng = np.random.default_rng(0)
    small = {"x": rng.uniform(0, 0.01, (1, 1, 256, 256)).astype(np.float32)}
    large = {"x": rng.uniform(1, 2, (1, 1, 256, 256)).astype(np.float32)}
    results = {}
    for label, sets in (("small", [small]), ("both", [small, large])):
        path = tmp_path / f"{label}.json"
        path.write_text(inputs_to_json(sets))
        out = tmp_path / label
        assert main_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--load-inputs", path, "-o", out,
                        "--cache-dir", cache_dir) == 0
        results[label] = json.loads((out / "constraints.json").read_text())
    assert results["small"]["fp32_nodes"] == []
    both = results["both"]
    assert both["inputs"]["sets"] == 2 and both["fp32_nodes"] == ["Add", "Sub"]
    assert "worst of 2 input set(s)" in (tmp_path / "both" / "report.md").read_text()
    # all-FP16 passes on the small set and fails on the large one: verify names set 1 as the worst
    data = dict(both, fp32_nodes=[])
    (tmp_path / "empty.json").write_text(json.dumps(data))
    js = tmp_path / "v.json"
    assert main_cli("verify", SEED, "--constraints", tmp_path / "empty.json", "--load-inputs", tmp_path / "both.json",
                    "--json", js, "--cache-dir", cache_dir) == 1
    assert json.loads(js.read_text())["worst_input_set"] == 1


@pytest.mark.parametrize("command", ["precision", "verify", "run"])
def test_json_to_stdout_is_pure_json(tmp_path, cache_dir, command):
    """`--json -`: stdout carries the JSON alone (progress and human lines go to stderr), for `| jq` in CI."""
    out = tmp_path / "o"
    main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir)
    extra = {"precision": ["-o", tmp_path / "p"], "verify": ["--constraints", out / "constraints.json"],
             "run": ["--fp32", "Add", "Sub"]}[command]
    args = [command, SEED, *(SEED_ARGS if command != "verify" else ["--fp16"]), *extra, "--json", "-",
            "--cache-dir", cache_dir]
    r = subprocess.run([sys.executable, "-m", "bisector.cli.main", *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["passed"] is True
    assert r.stderr  # the human-readable part went somewhere


@pytest.mark.parametrize("start", [["Add"], ["Add", "MatMul_0", "Sub"]], ids=["too-small", "too-big"])
def test_start_from_extends_or_shrinks_to_a_minimal_set(tmp_path, cache_dir, start):
    """--start-from: a set found elsewhere is judged first, then extended (too small) or shrunk (too big)."""
    out = tmp_path / "o"
    main_cli("precision", SEED, *SEED_ARGS, "-o", out, "--cache-dir", cache_dir)
    data = json.loads((out / "constraints.json").read_text())
    data["fp32_nodes"] = start
    start_file = tmp_path / "start.json"
    start_file.write_text(json.dumps(data))
    out2 = tmp_path / "o2"
    assert main_cli("precision", SEED, *SEED_ARGS, "--start-from", start_file, "--no-resume", "-o", out2,
                    "--cache-dir", cache_dir) == 0
    c = json.loads((out2 / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["Add", "Sub"] and c["minimal"]


def test_start_from_saves_evaluations_on_planted(tmp_path, cache_dir):
    spec = planted_spec()
    planted = sorted(spec["fp32_nodes"])
    out = tmp_path / "o"
    assert main_cli("precision", PLANTED, "--fp16", *spec["args"], "--no-plot", "-o", out, "--cache-dir", cache_dir,
                    "--no-resume") == 0
    scratch = json.loads((out / "constraints.json").read_text())["evaluations"]["total"]
    data = json.loads((out / "constraints.json").read_text())
    data["fp32_nodes"] = planted[:-1]  # one node short, as a CPU-found set might be on a real backend
    start_file = tmp_path / "start.json"
    start_file.write_text(json.dumps(data))
    out2 = tmp_path / "o2"
    assert main_cli("precision", PLANTED, "--fp16", *spec["args"], "--no-plot", "--start-from", start_file,
                    "-o", out2, "--cache-dir", cache_dir, "--no-resume") == 0
    c = json.loads((out2 / "constraints.json").read_text())
    assert c["fp32_nodes"] == planted and c["minimal"]
    assert c["evaluations"]["total"] < scratch
