"""What a journal row keeps (issue 14, forty-second round): the plan as a digest of its names, and of the verdict
what a search reads back (pass, the worst output's comparison, the failing outputs' names) — and that a search
resumed from such rows, or from rows an earlier version wrote, ends where an uninterrupted one does."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisector.compare import OutputComparison
from bisector.fp16.plan import Plan
from bisector.search.journal import plan_digest, row_checksum
from bisector.search.judge import Verdict

from .conftest import main_cli

TOL = ["--fp16", "--atol", "3e-4", "--rtol", "3e-4"]


def _many_outputs(path, n: int = 36, every: int = 3):
    """A MatMul/Tanh chain with every `every`-th Tanh a graph output: FP16 error adds up along it, so a search at
    3e-4 asks plans where some outputs pass and others fail."""
    rng = np.random.default_rng(3)
    nodes, inits, t = [], [], "x"
    for i in range(n):
        w = (np.eye(8) + rng.standard_normal((8, 8)) * 0.05).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [t, f"w{i}"], [f"m{i}"], name=f"mm,{i}"),  # a comma: names are data
                  helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f'tanh"{i}')]
        t = f"t{i}"
    outs = [f"t{i}" for i in range(every - 1, n, every)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 8]) for o in outs], initializer=inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path, outs


def _rows(cache):
    db = sqlite3.connect(str(cache / "journal.sqlite"))
    try:
        return db.execute("SELECT key, plan, verdict, checksum FROM evaluations").fetchall()
    finally:
        db.close()


def _search(model, out, cache):
    assert main_cli("precision", model, *TOL, "-o", out, "--cache-dir", cache, "--held-out", "0") == 0
    return json.loads((out / "constraints.json").read_text())


def test_rows_keep_the_worst_comparison_and_the_failing_names_and_a_resume_ends_the_same(tmp_path):
    model, outs = _many_outputs(tmp_path / "m.onnx")
    cache = tmp_path / "c"
    first = _search(model, tmp_path / "a", cache)
    rows = _rows(cache)
    assert len(rows) == first["evaluations"]["total"] > 10
    partly = 0
    for key, plan, text, checksum in rows:
        assert plan.startswith("sha256:") and len(plan) == 7 + 64  # not the names: 11 KB a row on a long chain
        assert checksum == row_checksum(key, plan, text)
        doc = json.loads(text)
        assert "fp32" not in doc  # the row's plan is the set
        assert doc["slim"] is True and len(doc["outputs"]) == 1 and set(doc["failing"]) <= set(outs)
        assert doc["passed"] == (not doc["failing"])
        (name, worst), = doc["outputs"].items()
        assert worst["passed"] == (name not in doc["failing"])  # the worst output fails wherever any does
        partly += 0 < len(doc["failing"]) < len(outs)
    assert partly, "the model should make plans where some outputs fail and others pass"

    second = _search(model, tmp_path / "b", cache)  # every plan from the journal
    assert second["evaluations"]["new"] == 0 and second["evaluations"]["cached"] == first["evaluations"]["total"]
    assert second["fp32_nodes"] == first["fp32_nodes"]
    # the final set was judged again in full: constraints.json has every output's comparison, as the first run's
    assert set(second["outputs"]) == set(outs) and "lean" not in json.dumps(second["outputs"])
    assert second["outputs"] == first["outputs"]


def test_rows_an_earlier_version_wrote_are_still_replayed(tmp_path, monkeypatch):
    from bisector.search.journal import SqliteJournal

    model, _ = _many_outputs(tmp_path / "m.onnx")
    cache = tmp_path / "c"
    old_rows = {}  # the digest of each recorded plan -> the row the forty-first round wrote for it
    record = SqliteJournal.record

    def recording(self, plan, verdict):
        # then: the plan as its names (Plan.key()), the whole verdict with its set and every comparison
        old_rows[plan_digest(plan.key())] = (plan.key(), json.dumps(verdict.to_json()))
        record(self, plan, verdict)

    monkeypatch.setattr(SqliteJournal, "record", recording)
    first = _search(model, tmp_path / "a", cache)
    monkeypatch.setattr(SqliteJournal, "record", record)
    db = sqlite3.connect(str(cache / "journal.sqlite"))
    for key, plan, _, _ in _rows(cache):
        names, legacy = old_rows[plan]
        assert '"fp32"' in legacy
        db.execute("UPDATE evaluations SET plan=?, verdict=?, checksum=? WHERE key=? AND plan=?",
                   (names, legacy, row_checksum(key, names, legacy), key, plan))
    db.commit()
    db.close()
    assert not any(p.startswith("sha256:") for _, p, _, _ in _rows(cache))
    second = _search(model, tmp_path / "b", cache)
    assert second["evaluations"]["new"] == 0 and second["fp32_nodes"] == first["fp32_nodes"]


def test_a_slim_row_reads_back_as_the_verdict_the_search_saw():
    def comparison(name, excess):
        return OutputComparison(name, excess <= 1, "elemwise", 1e-3, 1e-3, excess * 1e-3, excess * 1e-3, {}, {}, {},
                                {}, int(excess > 1), 16, "", excess, 1.0, lean=True)

    outputs = {n: comparison(n, e) for n, e in (("a", 0.4), ("b", 3.0), ("c", 1.5), ("d", 0.9))}
    v = Verdict(frozenset({"x", "y"}), False, outputs, 0, {"run": 0.1})
    back = Verdict.from_json({**v.journal_json(), "fp32": ["x", "y"]})
    assert (back.passed, back.excess, sorted(back.failing)) == (False, 3.0, ["b", "c"])
    assert back.slimmed and list(back.outputs) == ["b"]
    one = Verdict(frozenset(), True, {"a": comparison("a", 0.4)}, 0)
    doc = one.journal_json()
    assert "slim" not in doc and Verdict.from_json({**doc, "fp32": []}).slimmed is False  # nothing was dropped


def test_a_failing_all_fp32_set_from_the_journal_names_every_failing_output(tmp_path, capsys):
    from bisector.model.polyjson import run_results_to_json

    model, outs = _many_outputs(tmp_path / "m.onnx", n=9)
    wrong = tmp_path / "golden.json"  # zeros: every output of every plan fails, all-FP32 too
    wrong.write_text(run_results_to_json("onnxrt-runner-N0-elsewhere", [{o: np.zeros((2, 8), np.float32)
                                                                         for o in outs}], [0.0]))
    args = ["precision", model, *TOL, "--load-outputs", wrong, "--cache-dir", tmp_path / "c"]
    for run in ("fresh", "from the journal"):
        assert main_cli(*args, "-o", tmp_path / run) == 1
        err = capsys.readouterr().err
        assert "nothing passes" in err, run
        assert all(f"{o} (needs abs" in err for o in outs), (run, err)
    rows = _rows(tmp_path / "c")
    assert len(rows) == 1 and json.loads(rows[0][2])["slim"]  # the second run read the slim row, then judged again


def test_a_journal_is_not_replayed_on_a_machine_whose_cpu_kernels_differ(tmp_path, monkeypatch):
    """A cache directory shared by machines of other kinds (NFS home, one CI cache for a mixed fleet): the
    emulator's last bits depend on the CPU's instruction set and the ORT pool, so one machine's verdicts are not
    another's. The same machine replays them all."""
    from bisector import machine

    model, _ = _many_outputs(tmp_path / "m.onnx", n=12)
    cache = tmp_path / "c"
    first = _search(model, tmp_path / "a", cache)
    assert first["evaluations"]["total"] > 3
    real = machine.cpu_kernels()
    monkeypatch.setattr(machine, "cpu_kernels", lambda: "avx2; one shared pool of 64 threads")
    other = _search(model, tmp_path / "b", cache)
    assert other["evaluations"]["cached"] == 0 and other["evaluations"]["new"] == first["evaluations"]["total"]
    monkeypatch.setattr(machine, "cpu_kernels", lambda: real)
    again = _search(model, tmp_path / "c2", cache)
    assert again["evaluations"]["new"] == 0 and again["evaluations"]["cached"] == first["evaluations"]["total"]
    assert first["backend"]["cpu_kernels"] == real
