"""--confirm-on: when the set found on one backend fails on another, the search that extends it there gets the
predicted ranking too, restricted to the candidates outside the set and calibrated on the plan that keeps the set
FP32 (without it a diffuse extension was group testing: 124 nodes in 1091 GPU evaluations where a search from
scratch found 72 in 550; docs/verification.md)."""

from __future__ import annotations

from bisector.search.driver import RankingOf, _search_from

CANDS = [f"c{i}" for i in range(10)]
NEEDED = frozenset({"c0", "c5"})


class FakeHint:
    """A predicted_ranking hint: `first` first, then the other candidates from the last to the first."""

    can_rank, exact_backend = True, False

    def __init__(self):
        self.stats = {"runs": 0}
        self.calls = []

    def __call__(self, first=(), excess=None, memo=None):
        self.calls.append((list(first), excess() if callable(excess) else excess))
        return list(first) + [c for c in reversed(CANDS) if c not in first]


class Oracle:
    def __init__(self):
        self.asked = []

    def passes(self, s):
        self.asked.append(frozenset(s))
        return NEEDED <= frozenset(s)


class Recording:
    """Asks the ranking once (calibrated by the excess of all its candidates FP16) and returns what passes needs."""

    def __init__(self):
        self.rankings = []

    def search(self, candidates, passes, predicted_ranking=None, **hints):
        if predicted_ranking is not None:
            self.rankings.append((list(candidates), predicted_ranking((), lambda: 0.5 if passes(frozenset()) else 2.0)))
        else:
            self.rankings.append((list(candidates), None))
        return frozenset(c for c in candidates if c in NEEDED)


def test_a_failing_start_is_extended_with_the_ranking_of_the_candidates_outside_it():
    hint, strategy, oracle = FakeHint(), Recording(), Oracle()
    answer = _search_from(strategy, frozenset({"c0"}), CANDS, oracle, {"predicted_ranking": hint})
    assert answer == NEEDED
    (rest, extension), (union, shrink) = strategy.rankings
    assert "c0" not in rest and extension == [c for c in reversed(CANDS) if c != "c0"]
    # the hint ranked with the start kept FP32, calibrated on that plan (the extension's empty set is `start`)
    assert hint.calls[0] == (["c0"], 2.0)
    assert union == ["c0", "c5"] and shrink == ["c5", "c0"]  # the union, ranked as a search of its own


def test_a_start_that_passes_is_shrunk_as_before_without_the_ranking():
    strategy = Recording()
    _search_from(strategy, frozenset({"c0", "c5", "c7"}), CANDS, Oracle(), {"predicted_ranking": FakeHint()})
    assert strategy.rankings == [(["c0", "c5", "c7"], None)]


def test_the_restricted_ranking_keeps_what_the_driver_reads():
    hint = FakeHint()
    ranked = RankingOf(hint, ["c3", "c1"], kept=frozenset({"c9"}))
    assert ranked.can_rank and not ranked.exact_backend and ranked.stats is hint.stats
    assert ranked(["c1"]) == ["c1", "c3"] and hint.calls[-1][0] == ["c9", "c1"]

    class Cannot(FakeHint):
        def __call__(self, first=(), excess=None, memo=None):
            return None

    assert RankingOf(Cannot(), ["c1"])() is None


def test_the_report_says_when_only_the_emulator_judged(tmp_path):
    """An emulate result is a proposal at tight tolerances (6 of 30 held on a GPU): report.md says so, and stops
    saying so once --confirm-on judged the set elsewhere."""
    import json

    from bisector.artifacts.constraints import Constraints
    from bisector.artifacts.report import render_report
    from bisector.model.catalog import Catalog

    from .conftest import PLANTED, main_cli, planted_spec

    out = tmp_path / "o"
    assert main_cli("precision", PLANTED, "--fp16", *planted_spec()["args"], "-o", out, "--no-cache") == 0
    assert "Judged on the CPU emulator only" in (out / "report.md").read_text()
    c = Constraints.read(out / "constraints.json")
    c.confirmed_on = "ort-cuda"
    strings = json.loads((out / "layer_precisions.json").read_text())
    assert "Judged on the CPU emulator only" not in render_report(Catalog.load(PLANTED), c, strings)


def test_a_second_ranking_with_the_memo_runs_nothing_and_ranks_as_a_fresh_one():
    """--confirm-on asks the ranking twice (extension, then the union's shrink) with other `first` sets: the error
    vectors do not depend on them, so the memo's second call runs no emulator and gives the fresh call's ranking."""
    from bisector.search.vector_ranking import predicted_ranking

    from .test_strategies_predicted import _job

    job = _job()
    try:
        oracle = job.oracle()
        cands = list(oracle.candidates)
        runs = []
        real = job.backend.run
        job.backend.run = lambda *a, **k: runs.append(1) or real(*a, **k)
        memo: dict = {}
        first = predicted_ranking(oracle, [], 2.0, min_elements=0, memo=memo)
        n = len(runs)
        assert n >= len(cands) - 1 and "z" in memo  # a run per candidate but one twin (the head's Reshape, Transpose)
        again = predicted_ranking(oracle, cands[:2], 1.5, min_elements=0, memo=memo)
        assert len(runs) == n  # nothing ran
        fresh = predicted_ranking(oracle, cands[:2], 1.5, min_elements=0)
        assert list(again) == list(fresh) and again.model.scale == fresh.model.scale
        assert list(predicted_ranking(oracle, [], 2.0, min_elements=0, memo=memo)) == list(first)
    finally:
        job.close()


def test_the_hint_logs_its_runs_once_when_the_memo_serves_the_second_call(caplog):
    import logging

    from bisector.search.vector_ranking import RankingHint

    from .test_strategies_predicted import _job

    job = _job()
    try:
        hint = RankingHint(job.oracle())
        memo: dict = {}
        with caplog.at_level(logging.INFO, logger="bisector"), \
                __import__("unittest.mock").mock.patch("bisector.search.vector_ranking.MIN_ELEMENTS", 0):
            hint((), 2.0, memo=memo)
            hint((), 2.0, memo=memo)
        assert caplog.text.count("single-node emulator runs") == 1 and "z" in memo
    finally:
        job.close()


def test_ort_cudas_process_logger_is_set_only_when_asked(monkeypatch):
    """ORT's process-wide logger belongs to the process: the backend sets it from BISECTOR_ORT_PROCESS_LOG_SEVERITY
    (the CLI sets 4 unless --verbose), and leaves an API user's process alone otherwise."""
    import onnxruntime
    import pytest

    from bisector.backends.ort_cuda import OrtCudaBackend
    from bisector.errors import UsageError

    calls = []
    monkeypatch.setattr(onnxruntime, "set_default_logger_severity", calls.append, raising=False)
    monkeypatch.delenv("BISECTOR_ORT_PROCESS_LOG_SEVERITY", raising=False)
    OrtCudaBackend(providers=["CPUExecutionProvider"])
    assert calls == []
    monkeypatch.setenv("BISECTOR_ORT_PROCESS_LOG_SEVERITY", "4")
    OrtCudaBackend(providers=["CPUExecutionProvider"])
    assert calls == [4]
    monkeypatch.setenv("BISECTOR_ORT_PROCESS_LOG_SEVERITY", "loud")
    with pytest.raises(UsageError, match="0 \\(verbose\\) to 4"):
        OrtCudaBackend(providers=["CPUExecutionProvider"])


def test_the_command_line_quiets_ort_unless_verbose(monkeypatch):
    from bisector.cli.options import setup_logging

    monkeypatch.delenv("BISECTOR_ORT_PROCESS_LOG_SEVERITY", raising=False)
    setup_logging(True)
    import os

    assert "BISECTOR_ORT_PROCESS_LOG_SEVERITY" not in os.environ
    setup_logging(False)
    assert os.environ["BISECTOR_ORT_PROCESS_LOG_SEVERITY"] == "4"
