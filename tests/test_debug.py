"""`debug precision`: any check command as the oracle (Polygraphy's `debug precision --check`)."""

from __future__ import annotations

import json
import math
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from .conftest import PLANTED, SEED, main_cli, run_cli

PY = sys.executable

# passes iff every node named on its command line is in polygraphy_debug.json's FP32 set; counts its runs
NEEDS = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write("x\\n")
    assert os.path.exists("polygraphy_debug.onnx")
    fp32 = set(json.load(open("polygraphy_debug.json"))["fp32_nodes"])
    sys.exit(0 if set(sys.argv[1:]) <= fp32 else 1)
""")


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COUNT_FILE", str(tmp_path / "count"))
    (tmp_path / "needs.py").write_text(NEEDS)
    return tmp_path


def runs(work: Path) -> int:
    p = work / "count"
    return len(p.read_text().splitlines()) if p.exists() else 0


def test_two_named_nodes_found_then_journal_runs_no_check(work):
    args = ["debug", "precision", PLANTED, "--fp16", "--cache-dir", work / "cache", "-o", work / "out",
            "--no-progress", "--check", PY, "needs.py", "planted_exp", "planted_log"]
    assert main_cli(*args) == 0
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["planted_exp", "planted_log"] and c["passed"] and c["minimal"]
    first = runs(work)
    assert first == c["evaluations"]["new"] == c["check"]["checks_run"] > 0
    # 1-minimal by the verdicts: dropping either node fails the check
    verdicts = {frozenset(v["fp32"]): v for v in c["check"]["verdicts"]}
    assert verdicts[frozenset({"planted_exp"})]["status"] == "fail"
    assert verdicts[frozenset({"planted_log"})]["returncode"] == 1
    assert not list(work.glob("polygraphy_debug.*"))  # intermediate files removed
    assert "python" in (work / "out" / "report.md").read_text().split("## Check command")[1]
    # again, same cache: no check runs at all
    assert main_cli(*args) == 0
    assert runs(work) == first
    c2 = json.loads((work / "out" / "constraints.json").read_text())
    assert c2["evaluations"]["new"] == 0 and c2["evaluations"]["cached"] == c["evaluations"]["total"]
    assert c2["fp32_nodes"] == c["fp32_nodes"]


def _polygraphy_k(mode: str, n: int, direction: str, passes_k) -> int:
    """Polygraphy's own markers (tools/debug/subtool/precision.py) driven over the same candidates and check."""
    from polygraphy.tools.debug.subtool.precision import BisectMarker, LinearMarker

    marker = (BisectMarker if mode == "bisect" else LinearMarker)(n, direction)
    while True:
        if marker.step(passes_k(len(list(marker.select_layers())))):
            return marker.good


@pytest.mark.parametrize("mode,direction,need", [
    ("bisect", "forward", ["planted_exp", "planted_gain"]),
    ("bisect", "reverse", ["planted_exp", "planted_gain"]),
    ("linear", "reverse", ["planted_exp", "planted_log"]),
])
def test_mode_returns_polygraphys_k(work, mode, direction, need):
    from bisector.model.catalog import Catalog

    cands = list(Catalog.load(PLANTED).candidates)
    idx = [cands.index(n) for n in need]

    def passes_k(k):
        block = set(cands[:k]) if direction == "forward" else set(cands[len(cands) - k:])
        return set(need) <= block

    expected_k = _polygraphy_k(mode, len(cands), direction, passes_k)
    assert expected_k == (max(idx) + 1 if direction == "forward" else len(cands) - min(idx))
    assert main_cli("debug", "precision", PLANTED, "--fp16", "--mode", mode, "--dir", direction, "--no-cache",
                    "-o", work / "out", "--no-progress", "--hide-fail-output", "--check", PY, "needs.py", *need) == 0
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert len(c["fp32_nodes"]) == expected_k
    block = cands[:expected_k] if direction == "forward" else cands[len(cands) - expected_k:]
    assert sorted(c["fp32_nodes"]) == sorted(block)
    assert c["check"]["mode"] == mode and c["strategy"] == f"{mode} ({direction})"
    if mode == "bisect":
        assert runs(work) <= 2 + math.ceil(math.log2(len(cands)))
    else:
        assert runs(work) == expected_k + 2  # all-FP32 first, then K = 0, 1, …, K


def test_check_timeout_is_its_own_verdict_exit_3(work):
    (work / "slow.py").write_text("import time, sys\ntime.sleep(30)\n")
    r = run_cli("debug", "precision", SEED, "--fp16", "--cache-dir", work / "cache", "--check-timeout", "0.5",
                "--no-progress", "--check", PY, "slow.py", cwd=work)
    assert r.returncode == 3, r.stderr
    assert "timed out" in r.stderr and "ran past 0.5s" in r.stderr and "Traceback" not in r.stderr
    # journaled with its own status, and retried (not replayed) on the next run
    from bisector.search.journal import SqliteJournal  # noqa: F401

    import sqlite3

    rows = sqlite3.connect(work / "cache" / "journal.sqlite").execute("SELECT verdict FROM evaluations").fetchall()
    assert [json.loads(v)["status"] for (v,) in rows] == ["timeout"]


def test_check_killed_by_signal_is_a_crash_exit_3(work):
    (work / "boom.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = run_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--no-progress", "--check", PY, "boom.py", cwd=work)
    assert r.returncode == 3, r.stderr
    assert "crashed" in r.stderr and "SIGKILL" in r.stderr


def test_crash_counts_as_failing_with_on_check_error_fail(work):
    # crashes unless Add is FP32: Polygraphy would read that as a fail; we report it as a crash
    (work / "crashy.py").write_text(textwrap.dedent("""
        import json, os, signal, sys
        fp32 = set(json.load(open("polygraphy_debug.json"))["fp32_nodes"])
        if "Add" not in fp32:
            os.kill(os.getpid(), signal.SIGSEGV)
        sys.exit(0 if "Sub" in fp32 else 1)
    """))
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--on-check-error", "fail", "-o",
                    work / "out", "--no-progress", "--check", PY, "crashy.py") == 0
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["Add", "Sub"] and c["minimal"]
    statuses = {v["status"] for v in c["check"]["verdicts"]}
    assert "crash" in statuses and "fail" in statuses
    crash = next(v for v in c["check"]["verdicts"] if v["status"] == "crash")
    assert crash["signal"] == "SIGSEGV" and crash["passed"] is False


def test_fail_regex_reads_output_not_exit_code(work):
    (work / "talk.py").write_text(textwrap.dedent("""
        import json
        fp32 = set(json.load(open("polygraphy_debug.json"))["fp32_nodes"])
        print("ok" if {"Add", "Sub"} <= fp32 else "ACCURACY MISMATCH")
    """))  # always exits 0
    base = ["debug", "precision", SEED, "--fp16", "--no-cache", "-o", work / "out", "--no-progress",
            "--hide-fail-output"]
    assert main_cli(*base, "--fail-regex", "MISMATCH", "--check", PY, "talk.py") == 0
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["Add", "Sub"]
    failing = [v for v in c["check"]["verdicts"] if not v["passed"]]
    assert failing and all(v["status"] == "fail" and v["returncode"] == 0 and "--fail-regex" in v["reason"]
                           for v in failing)
    assert main_cli(*base, "--check", PY, "talk.py") == 0  # without the regex, exit 0 passes everything
    assert json.loads((work / "out" / "constraints.json").read_text())["fp32_nodes"] == []


def test_fail_codes_and_ignore_fail_codes(work):
    from bisector.backends.check import CheckSpec, classify

    assert classify(CheckSpec(["x"]), 1, "") == (False, "exit code 1")
    assert classify(CheckSpec(["x"], fail_codes=[3]), 1, "")[0] is True
    assert classify(CheckSpec(["x"], fail_codes=[3]), 3, "")[0] is False
    assert classify(CheckSpec(["x"], fail_codes=[3], fail_regex=["E"]), 3, "fine")[0] is True
    assert classify(CheckSpec(["x"], ignore_fail_codes=[4]), 4, "")[0] is True
    assert classify(CheckSpec(["x"], fail_regex=["E+"]), 0, "EEE")[0] is False


SEED_LINES = [  # shared/seeds/004: `polygraphy debug precision …` with the program name changed
    "debug precision net_bs8.onnx --fp16 --tactic-sources cublas --check polygraphy run polygraphy_debug.engine "
    "--trt --load-outputs onnx_res.json --abs 1e-1",
    "debug precision net_bs8.onnx --fp16 --tactic-sources cublas --check polygraphy run polygraphy_debug.engine "
    "--trt --load-inputs  net_input.json --load-outputs onnx_res.json --abs 1e-1 --no-remove-intermediate",
]


@pytest.mark.parametrize("line", SEED_LINES)
def test_seed_lines_exit_2_without_tensorrt(work, line):
    from bisector.backends.check import tensorrt_installed

    if tensorrt_installed():
        pytest.skip("TensorRT is installed here")
    r = run_cli(*line.split(), cwd=work)
    assert r.returncode == 2
    assert "needs a TensorRT engine" in r.stderr and "polygraphy_debug.onnx" in r.stderr
    assert "bisector run" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("how", ["--in-process", "--subprocess-check"])
def test_seed_line_rewritten_to_the_candidate_json_runs_to_a_result(work, how):
    shutil.copy(SEED, work / "net_bs8.onnx")
    # the seed's golden workflow: inputs and ONNX-Runtime outputs saved in Polygraphy's formats
    assert main_cli("run", "net_bs8.onnx", "--fp16", "--fp32", "MatMul_0", "Add", "Sub", "MatMul_1",
                    "--val-range", "x:[1,2]", "--save-inputs", "net_input.json", "--no-cache") == 0
    from bisector.model.catalog import Catalog
    from bisector.model.golden import run_reference_model
    from bisector.model.inputs import load_inputs
    from bisector.model.polyjson import run_results_to_json

    cat = Catalog.load(work / "net_bs8.onnx")
    feeds = load_inputs([work / "net_input.json"], cat)
    (work / "onnx_res.json").write_text(run_results_to_json("onnxrt-runner", run_reference_model(cat, feeds), [0.0]))
    line = (f"debug precision net_bs8.onnx --fp16 --tactic-sources cublas {how} --no-progress -o out --no-cache --check "
            f"bisector run net_bs8.onnx --fp16 --constraints polygraphy_debug.json --load-inputs net_input.json "
            "--load-outputs onnx_res.json --atol 1e-1 --no-cache").split()
    bindir = str(Path(PY).parent)
    r = run_cli(*line, cwd=work, env={"PATH": bindir + ":" + __import__("os").environ["PATH"]})
    assert r.returncode == 0, r.stderr
    assert "FP32 nodes (2): Add Sub" in r.stdout
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["Add", "Sub"]
    assert all(("in process" in v["reason"]) == (how == "--in-process") for v in c["check"]["verdicts"])


def test_existing_iteration_artifact_is_not_overwritten(work):
    (work / "polygraphy_debug.onnx").write_text("mine")
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--check", PY, "needs.py") == 2
    assert (work / "polygraphy_debug.onnx").read_text() == "mine"


def test_no_remove_intermediate_keeps_last_candidate_and_iter_artifact_name(work):
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--no-remove-intermediate", "--no-progress",
                    "--iter-artifact", "cand.engine", "-o", work / "out", "--check", PY, "-c",
                    "import json,sys; sys.exit(0 if 'Add' in json.load(open('cand.json'))['fp32_nodes'] and "
                    "'Sub' in json.load(open('cand.json'))['fp32_nodes'] else 1)") == 0
    assert (work / "cand.onnx").exists() and (work / "cand.json").exists()
    doc = json.loads((work / "cand.json").read_text())
    assert doc["candidate"] is True and "layer_precisions" in doc and "fp16_nodes" in doc
    import onnx

    onnx.checker.check_model(onnx.load(work / "cand.onnx"))


def test_candidate_json_is_read_by_bisector_run(work):
    from bisector.artifacts.constraints import Constraints
    from bisector.artifacts.candidate import CandidateFiles
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    cat = Catalog.load(SEED)
    f = CandidateFiles(cat, work / "polygraphy_debug")
    f.write(Plan(frozenset({"Add"}), cat.candidates), 1)
    assert Constraints.read(work / "polygraphy_debug.json").fp32_nodes == ["Add"]


def test_bf16_candidate_model_is_bf16(work):
    import onnx
    from onnx import TensorProto

    from bisector.artifacts.candidate import CandidateFiles
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    cat = Catalog.load(SEED)
    CandidateFiles(cat, work / "polygraphy_debug", "bf16").write(Plan(frozenset({"Add"}), cat.candidates), 1)
    m = onnx.load(work / "polygraphy_debug.onnx")
    types = {vi.type.tensor_type.elem_type for vi in m.graph.value_info} | \
        {a.i for n in m.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"} | \
        {i.data_type for i in m.graph.initializer}
    assert TensorProto.BFLOAT16 in types and TensorProto.FLOAT16 not in types
    onnx.checker.check_model(m)
    assert json.loads((work / "polygraphy_debug.json").read_text())["precision"] == "bf16"


def test_python_api_passes_callable_in_process(work):
    import bisector

    seen = []

    def agrees(c) -> bool:  # a user's criterion: max abs error below 0.1 on every input set
        seen.append(len(c.fp32))
        assert (Path(c) / "polygraphy_debug.onnx").exists()
        return all(float(np.max(np.abs(o["y"] - g["y"]))) < 0.1 for o, g in zip(c.outputs, c.golden))

    r = bisector.debug_precision(SEED, passes=agrees, val_range={"x": (1, 2)}, no_cache=True,
                                 output_dir=work / "out")
    assert r.fp32_nodes == ["Add", "Sub"] and r.passed and r.minimal
    assert r.checks_run == len(seen) > 0
    assert (work / "out" / "model.mixed.onnx").exists()


def test_python_api_needs_exactly_one_oracle(work):
    import bisector
    from bisector.errors import UsageError

    with pytest.raises(UsageError):
        bisector.debug_precision(SEED)
    with pytest.raises(UsageError):
        bisector.debug_precision(SEED, check=["true"], passes=lambda c: True)


def test_debug_replay_saved_and_loaded(work):
    args = ["debug", "precision", SEED, "--fp16", "--no-cache", "--no-progress", "-o", work / "out"]
    assert main_cli(*args, "--save-debug-replay", "replay.json", "--check", PY, "needs.py", "Add", "Sub") == 0
    first = runs(work)
    doc = json.loads((work / "replay.json").read_text())
    assert len(doc["bisector_verdicts"]) == first and doc["_N0"]["success"] is True
    assert main_cli(*args, "--load-debug-replay", "replay.json", "--check", PY, "needs.py", "Add", "Sub") == 0
    assert runs(work) == first
    (work / "poly.json").write_text(json.dumps({"_N0": {"success": True}}))
    assert main_cli(*args, "--load-debug-replay", "poly.json", "--check", PY, "needs.py") == 2
    # a replay edited by hand or nested past Python's recursion limit: exit 2 naming the file, not internal error
    for name, text in (("bad_entry.json", json.dumps({"bisector_verdicts": [5]})),
                       ("no_fp32.json", json.dumps({"bisector_verdicts": [{"passed": True}]})),
                       ("deep.json", '{"bisector_verdicts": ' + "[" * 100_000 + "]" * 100_000 + "}")):
        (work / name).write_text(text)
        r = run_cli(*args, "--load-debug-replay", name, "--check", PY, "needs.py", cwd=work)
        assert r.returncode == 2 and name in r.stderr and "internal error" not in r.stderr, r.stderr


def test_time_limit_stops_a_long_check_as_budget(work):
    (work / "slow.py").write_text("import time\ntime.sleep(30)\n")
    r = run_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--time-limit", "1", "--no-progress",
                "--check", PY, "slow.py", cwd=work)
    assert r.returncode == 1 and "budget ran out" in r.stderr


def test_argv_check_split_keeps_check_flags_verbatim():
    from bisector.cli.argv import CHECK_COMMAND, expand_multi_value_flags, split_check

    argv = ["debug", "precision", "m.onnx", "--fail-code", "1", "2", "--check", "polygraphy", "run", "x.onnx",
            "--atol", "1e-1", "out:2", "--fp32", "A", "B"]
    args = split_check(expand_multi_value_flags(argv))
    assert args == ["debug", "precision", "m.onnx", "--fail-code", "1", "--fail-code", "2"]
    assert CHECK_COMMAND.get() == ["polygraphy", "run", "x.onnx", "--atol", "1e-1", "out:2", "--fp32", "A", "B"]


def test_missing_check_and_missing_program_are_usage_errors(work):
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache") == 2
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--check") == 2
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--check", "no-such-program-xyz") == 2


@pytest.mark.parametrize("base", ["", ".", ".."])
def test_iter_artifact_without_a_file_name_is_a_usage_error(work, capsys, base):
    """`--iter-artifact ''` (or '.') was an internal error: Path('.') has an empty name."""
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--iter-artifact", base, "--check", "true") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("bisector: error: --iter-artifact") and "internal error" not in last, last


@pytest.mark.parametrize("version", ["10.13.0.35", "11.0.0.1"])
def test_engine_written_per_candidate_where_tensorrt_is_installed(work, monkeypatch, version):
    """TensorRT present (the recording fake): an engine-naming check is accepted and every candidate gets its
    polygraphy_debug.engine, built with its precisions (weak: layer.precision per FP32 node; strong: parsed from
    the candidate's mixed ONNX)."""
    import functools

    from bisector.app import debug as debug_mod
    from bisector.artifacts.candidate import EngineWriter

    try:
        from tests.fake_tensorrt import make_fake_cudart, make_fake_tensorrt
    except ImportError:  # pragma: no cover
        from fake_tensorrt import make_fake_cudart, make_fake_tensorrt  # type: ignore[no-redef]

    trt = make_fake_tensorrt(version)

    class FakeWriter(EngineWriter):
        def __init__(self, catalog, options, precision="fp16"):
            super().__init__(catalog, {**options, "module": trt, "cudart": make_fake_cudart()}, precision)

    monkeypatch.setattr(debug_mod, "tensorrt_installed", lambda: True)
    monkeypatch.setattr(debug_mod, "EngineWriter", FakeWriter)
    (work / "eng.py").write_text(textwrap.dedent("""
        import json, os, sys
        assert os.path.getsize("polygraphy_debug.engine") > 0
        fp32 = set(json.load(open("polygraphy_debug.json"))["fp32_nodes"])
        sys.exit(0 if {"Add", "Sub"} <= fp32 else 1)
    """))
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--tactic-sources", "CUBLAS", "-o",
                    work / "out", "--no-progress", "--check", PY, "eng.py", "polygraphy_debug.engine") == 0
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert c["fp32_nodes"] == ["Add", "Sub"] and c["backend"]["engine"].startswith("tensorrt ")
    builds = [x for x in trt.calls if x[0] == "builder.build_serialized_network"]
    assert len(builds) == c["check"]["checks_run"]
    if version.startswith("10"):
        marked = {x[1] for x in trt.calls if x[0] == "layer.precision"}
        assert {"Add", "Sub"} <= marked
    else:
        assert not [x for x in trt.calls if x[0] == "layer.precision"]
    assert not (work / "polygraphy_debug.engine").exists()


def test_engine_build_failure_is_an_error_verdict(work, monkeypatch):
    from bisector.app import debug as debug_mod
    from bisector.errors import BuildFailure

    class Failing:
        def __init__(self, *a, **k):
            pass

        def build(self, plan):
            raise BuildFailure("no tactic")

        def describe(self):
            return {"backend": "tensorrt"}

        def close(self):
            pass

    monkeypatch.setattr(debug_mod, "tensorrt_installed", lambda: True)
    monkeypatch.setattr(debug_mod, "EngineWriter", Failing)
    r = run_cli  # noqa: F841 (in-process below: the monkeypatches must apply)
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--no-progress", "--check", PY,
                    "needs.py") == 3
    assert runs(work) == 0  # the check never ran on an unbuilt engine


def test_start_from_a_constraints_json_confirms_with_few_checks(work):
    args = ["debug", "precision", PLANTED, "--fp16", "--no-cache", "--no-progress", "--check", PY, "needs.py",
            "planted_exp", "planted_log"]
    assert main_cli(*args[:-5], "-o", work / "a", *args[-5:]) == 0
    scratch = runs(work)
    (work / "count").unlink()
    assert main_cli(*args[:-5], "-o", work / "b", "--start-from", work / "a" / "constraints.json", *args[-5:]) == 0
    assert json.loads((work / "b" / "constraints.json").read_text())["fp32_nodes"] == ["planted_exp", "planted_log"]
    assert runs(work) < scratch


def test_artifacts_sorted_and_iter_info_written(work):
    (work / "art.py").write_text(textwrap.dedent("""
        import json, sys
        info = json.load(open("info.json"))
        open("log.txt", "w").write(str(info["iteration"]))
        sys.exit(0 if {"Add", "Sub"} <= set(info["fp32_nodes"]) else 1)
    """))
    assert main_cli("debug", "precision", SEED, "--fp16", "--no-cache", "--no-progress", "--iter-info", "info.json",
                    "--artifacts", "log.txt", "--artifacts-dir", "arts", "-o", work / "out", "--check", PY,
                    "art.py") == 0
    c = json.loads((work / "out" / "constraints.json").read_text())
    good = list((work / "arts" / "good").glob("log_*.txt"))
    bad = list((work / "arts" / "bad").glob("log_*.txt"))
    assert len(good) == sum(v["passed"] for v in c["check"]["verdicts"]) and len(good) + len(bad) == c["check"]["checks_run"]
    assert not (work / "info.json").exists()


def test_seed_line_rewritten_to_the_candidate_onnx_with_polygraphy_runs_to_a_result(work):
    """The seed's check rewritten to `polygraphy run polygraphy_debug.onnx --onnxrt …` (Polygraphy itself as the
    check). ORT's CPU provider computes FP16 nodes in FP32, so everything passes — bisector says so up front."""
    pytest.importorskip("polygraphy")
    shutil.copy(SEED, work / "net_bs8.onnx")
    assert main_cli("run", "net_bs8.onnx", "--fp16", "--fp32", "MatMul_0", "Add", "Sub", "MatMul_1",
                    "--val-range", "x:[1,2]", "--save-inputs", "net_input.json", "--no-cache") == 0
    from bisector.model.catalog import Catalog
    from bisector.model.golden import run_reference_model
    from bisector.model.inputs import load_inputs
    from bisector.model.polyjson import run_results_to_json

    cat = Catalog.load(work / "net_bs8.onnx")
    feeds = load_inputs([work / "net_input.json"], cat)
    (work / "onnx_res.json").write_text(run_results_to_json("onnxrt-runner", run_reference_model(cat, feeds), [0.0]))
    polygraphy = str(Path(PY).parent / "polygraphy")
    if not Path(polygraphy).exists():
        pytest.skip("no polygraphy executable beside this Python")
    line = ("debug precision net_bs8.onnx --fp16 --tactic-sources cublas --no-progress -o out --no-cache --check "
            f"{polygraphy} run polygraphy_debug.onnx --onnxrt --load-inputs net_input.json --load-outputs "
            "onnx_res.json --atol 1e-1").split()
    r = run_cli(*line, cwd=work)
    assert r.returncode == 0, r.stderr
    assert "computes FP16 nodes in FP32" in r.stderr
    c = json.loads((work / "out" / "constraints.json").read_text())
    assert c["passed"] and all(v["status"] == "pass" for v in c["check"]["verdicts"])


def test_journal_replays_errors_only_when_they_count_as_failures():
    from bisector.fp16.plan import Plan
    from bisector.search.check_oracle import CheckJournal, CheckVerdict

    cands = ("a", "b")
    t = CheckVerdict(frozenset({"a"}), False, {}, 0, {"check": 1.0}, status="timeout", timeout=1.0)
    plan = Plan(frozenset({"a"}), cands)
    assert CheckJournal(replay={t.fp32: t}, on_error="stop").lookup(plan) is None  # retried
    assert CheckJournal(replay={t.fp32: t}, on_error="fail", timeout=1.0).lookup(plan) is t
    assert CheckJournal(replay={t.fp32: t}, on_error="fail", timeout=5.0).lookup(plan) is None  # longer limit now
    crash = CheckVerdict(frozenset({"a"}), False, {}, 0, {}, status="crash", signal="SIGSEGV")
    assert CheckJournal(replay={crash.fp32: crash}, on_error="fail").lookup(plan) is crash
    back = CheckVerdict.from_json(crash.to_json())
    assert (back.status, back.signal, back.passed) == ("crash", "SIGSEGV", False)


def test_ctrl_c_kills_the_running_check_and_exits_130(work):
    import os
    import signal
    import subprocess
    import time

    (work / "hang.py").write_text("import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    p = subprocess.Popen([PY, "-m", "bisector.cli.main", "debug", "precision", str(SEED), "--fp16", "--no-cache",
                          "--no-progress", "--check", PY, "hang.py"], cwd=work, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (work / "pid").exists() or not (work / "pid").read_text():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    child = int((work / "pid").read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert not list(work.glob("polygraphy_debug.*"))


def test_objective_flops_is_accepted_and_confirm_on_is_refused(work):
    base = ["debug", "precision", SEED, "--fp16", "--no-cache", "--no-progress", "-o", work / "out"]
    assert main_cli(*base, "--objective", "flops", "--check", PY, "needs.py", "Add", "Sub") == 0
    assert json.loads((work / "out" / "constraints.json").read_text())["fp32_nodes"] == ["Add", "Sub"]
    assert main_cli(*base, "--confirm-on", "emulate", "--check", PY, "needs.py") == 2


def test_held_out_is_refused_where_the_check_command_judges(work, capsys):
    """--held-out judges with bisector's comparison on generated inputs: with a check command as the oracle it would
    be silently ignored, so it is refused (0, off, is accepted)."""
    base = ["debug", "precision", SEED, "--fp16", "--no-cache", "--no-progress", "-o", work / "out"]
    assert main_cli(*base, "--held-out", "2", "--check", PY, "needs.py") == 2
    assert "--held-out" in capsys.readouterr().err
    assert main_cli(*base, "--held-out", "0", "--check", PY, "needs.py", "Add", "Sub") == 0
    capsys.readouterr()
    assert main_cli(*base, "--grow-inputs", "2", "--check", PY, "needs.py") == 2  # growth judges the same way
    assert "--grow-inputs" in capsys.readouterr().err
