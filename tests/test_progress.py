"""The search progress display: plain lines on stderr when not a TTY, never stdout."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from bisector.cli.progress import SearchProgress


@dataclass
class FakeVerdict:
    fp32: frozenset
    passed: bool
    seconds: dict = field(default_factory=lambda: {"run": 0.01})
    source: str = "new"


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_plain_lines_when_not_a_tty(capsys):
    stream, clock = io.StringIO(), Clock()
    with SearchProgress(10, stream=stream, max_evals=20, clock=clock) as p:
        clock.t += 1
        p.on_verdict(FakeVerdict(frozenset("abcdefghij"), True))
        p({"phase": "verify", "fp32_size": 2, "best": None, "evaluations": 1})
        clock.t += 1
        p.on_verdict(FakeVerdict(frozenset("ab"), True))
        p.on_verdict(FakeVerdict(frozenset("a"), False, source="journal"))
    text = stream.getvalue()
    lines = text.splitlines()
    assert all(line.startswith("[bisector] ") for line in lines), lines
    assert "\x1b[" not in text  # no terminal control codes in CI logs
    assert "eval 1: 10 FP32 -> pass | best 10 FP32" in lines[1]
    assert "phase: verify" in lines[2]
    assert "eval 2: 2 FP32 -> pass | best 2 FP32 | phase verify | 2.0s" in lines[3]
    assert "at most" in lines[3]  # a budget gives a bound on the time left
    assert "eval 3 (journal): 1 FP32 -> FAIL | best 2 FP32" in lines[4]
    assert lines[-1].startswith("[bisector] search done: 3 evaluations (2 new, 1 cached), best 2 FP32")
    assert capsys.readouterr().out == ""


def test_default_stream_is_stderr_not_stdout(capsys):
    with SearchProgress(3, live=False) as p:
        p.on_verdict(FakeVerdict(frozenset({"x"}), True))
    captured = capsys.readouterr()
    assert captured.out == "" and "eval 1" in captured.err


def test_estimate_without_budget_is_a_rough_guess():
    clock = Clock()
    p = SearchProgress(64, stream=io.StringIO(), live=False, clock=clock)
    p.start()
    assert p.estimate_left() is None
    clock.t += 2
    p.on_verdict(FakeVerdict(frozenset(), False))
    seconds, exact = p.estimate_left()
    assert not exact and seconds > 0


def test_no_rough_guess_while_the_best_set_is_most_of_the_candidates():
    """Early in a search the best passing set is all candidates (or most of them): a guess with k = its size
    said ~2164 s left for a 47 s search. None is shown until the set is at most a quarter of them, or the
    strategy sends its own estimate."""
    clock = Clock()
    stream = io.StringIO()
    p = SearchProgress(400, stream=stream, live=False, clock=clock)
    p.start()
    clock.t += 1
    p.on_verdict(FakeVerdict(frozenset(range(400)), True))
    assert p.estimate_left() is None and "s left" not in stream.getvalue()
    clock.t += 1
    p.on_verdict(FakeVerdict(frozenset(range(150)), True))
    assert p.estimate_left() is None
    clock.t += 1
    p.on_verdict(FakeVerdict(frozenset(range(20)), True))
    seconds, exact = p.estimate_left()
    assert not exact and 0 < seconds < 200  # k = 20 of 400: about 20*log2(20) + 41 evaluations at 1 s each
    p({"estimate": {"evaluations": 10, "set_size": 5}})
    p.on_verdict(FakeVerdict(frozenset(range(300)), False))
    assert p.estimate_left() is not None  # the strategy's estimate: shown whatever the best set


def test_drives_a_real_strategy():
    from bisector.strategies.greedy import Greedy

    stream = io.StringIO()
    culprits = {"c", "f"}
    with SearchProgress(8, stream=stream, live=False) as p:
        def passes(s):
            ok = culprits <= s
            p.on_verdict(FakeVerdict(frozenset(s), ok))
            return ok

        answer = Greedy().search(list("abcdefgh"), passes, progress=p)
    assert answer == frozenset(culprits)
    assert p.best == frozenset(culprits)
    assert "best 2 FP32" in stream.getvalue().splitlines()[-1]


def test_live_mode_renders_to_its_stream_only(capsys):
    stream = io.StringIO()
    with SearchProgress(4, stream=stream, live=True) as p:
        p.on_verdict(FakeVerdict(frozenset({"a", "b"}), True))
        p({"phase": "shrink", "fp32_size": 1, "best": frozenset({"a", "b"}), "evaluations": 1})
    assert "best passing" in stream.getvalue() and "a, b" in stream.getvalue()
    assert capsys.readouterr().out == ""


def test_strategy_estimate_is_said_once_and_drives_the_eta():
    stream = io.StringIO()
    clock = iter(range(100)).__next__
    p = SearchProgress(100, stream=stream, live=False, clock=lambda: float(clock()))
    event = {"phase": "split", "estimate": {"evaluations": 40, "set_size": 12, "diffuse": True,
                                            "advice": "loosen --atol or use --max-evals"}}
    p(event)
    p(event)
    text = stream.getvalue()
    assert text.count("estimate: about 40 evaluations") == 1 and "diffuse" in text and "--max-evals" in text
    assert p.expected_total == 40
    p({"estimate": {"evaluations": 30, "set_size": 5, "diffuse": True, "advice": "", "at_least": True}})
    assert "estimate: at least 30 evaluations in all, a set of at least 5 node(s)" in stream.getvalue()
    p({"estimate": {"evaluations": 300, "set_size": 50, "diffuse": True, "advice": "", "set_at_most": True}})
    assert "estimate: about 300 evaluations in all, a set of at most 50 node(s)" in stream.getvalue()
    assert p.expected_total == 300
    p({"estimate": {"evaluations": 900, "set_size": 9, "diffuse": True, "advice": "", "set_at_least": True}})
    assert "estimate: about 900 evaluations in all, a set of at least 9 node(s)" in stream.getvalue()


def test_the_advice_is_said_when_it_changes_not_with_every_estimate():
    """A diffuse search says three or four estimates with the same paragraph of advice: the number changes, the
    advice is said once (and again only when it changes, as from sparse to diffuse)."""
    stream = io.StringIO()
    p = SearchProgress(100, stream=stream, live=False)
    sparse, diffuse = "Group testing needs about 9.", "Loosen the tolerance or cap the search with --max-evals."
    p({"estimate": {"evaluations": 20, "set_size": 3, "diffuse": False, "advice": sparse}})
    p({"estimate": {"evaluations": 60, "set_size": 9, "diffuse": True, "advice": diffuse, "at_least": True}})
    p({"estimate": {"evaluations": 300, "set_size": 50, "diffuse": True, "advice": diffuse, "set_at_most": True}})
    p({"estimate": {"evaluations": 280, "set_size": 40, "diffuse": True, "advice": diffuse, "set_at_most": True}})
    lines = [ln for ln in stream.getvalue().splitlines() if "estimate:" in ln]
    assert len(lines) == 4
    assert lines[0].endswith(sparse) and lines[1].endswith(diffuse)
    assert "--max-evals" not in lines[2] and "--max-evals" not in lines[3]
    assert "about 300 evaluations" in lines[2] and "about 280 evaluations" in lines[3]


def test_ranking_runs_are_shown_and_left_out_of_the_time_per_evaluation():
    """The predicted ranking's runs (no evaluations) appear as they go — a plain line every 10 s and the last,
    the live panel's phase row — and their seconds do not count in the time per evaluation, so the time left
    after them is not inflated by them."""
    stream, clock = io.StringIO(), Clock()
    p = SearchProgress(400, stream=stream, live=False, clock=clock)
    p.start()
    for _ in range(10):
        clock.t += 1
        p.on_verdict(FakeVerdict(frozenset({"a", "b"}), False))
    assert p.per_eval() == 1.0
    p({"phase": "predict"})
    for runs in range(1, 401, 20):  # 80 s of runs, reported every 4 s
        clock.t += 4
        p({"ranking": {"runs": runs, "total": 400, "seconds": 4.0 * (runs // 20 + 1)}})
        assert p.per_eval() == 1.0  # the runs are not evaluations
    clock.t += 4
    p({"ranking": {"runs": 400, "total": 400, "seconds": 84.0}})
    lines = [ln for ln in stream.getvalue().splitlines() if "ranking:" in ln]
    assert 8 <= len(lines) <= 10  # every 10 s of 84, and the last
    assert "single-node emulator runs (not evaluations)" in lines[0] and "s left" not in lines[0]  # 1 run: no guide
    assert all("s left" in ln for ln in lines[1:-1])
    assert lines[-1].endswith("ranking: 400/400 single-node emulator runs (not evaluations), 84.0s")
    clock.t += 2
    p.on_verdict(FakeVerdict(frozenset({"a"}), True))
    assert abs(p.per_eval() - 12.0 / 11) < 1e-9
    p.stop()


def test_live_panel_shows_the_ranking_runs_on_the_phase_row():
    stream = io.StringIO()
    with SearchProgress(4, stream=stream, live=True) as p:
        p({"phase": "predict", "ranking": {"runs": 100, "total": 400, "seconds": 10.0}})
        assert p.ranking == {"runs": 100, "total": 400, "seconds": 10.0}
        from rich.console import Console

        out = io.StringIO()
        Console(file=out, width=200).print(p._render())
        assert "predict (100/400 single-node runs, ~30s left)" in out.getvalue()
        p({"ranking": {"runs": 400, "total": 400, "seconds": 40.0}})
        assert p.ranking is None and p.ranking_seconds == 40.0


def test_the_estimate_names_the_ranking_runs_that_come_first():
    stream = io.StringIO()
    p = SearchProgress(400, stream=stream, live=False)
    p({"estimate": {"evaluations": 65, "set_size": 5, "diffuse": True, "advice": "", "at_least": True,
                    "ranking_runs": 403}})
    assert ("estimate: at least 65 evaluations in all (first 403 single-node emulator runs to rank the nodes, not "
            "evaluations), a set of at least 5 node(s)") in stream.getvalue()
    assert p.expected_total == 65  # the runs are not evaluations
