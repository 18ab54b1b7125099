"""Progress of a search, for people: a rich live panel on a terminal, plain log lines otherwise (CI).

Always on stderr (never stdout, so `--json -` and other machine output stay clean). One object receives both
kinds of event a search produces:

- the oracle's verdicts: ``Oracle(on_verdict=progress.on_verdict)`` (or ``job.oracle(on_verdict=...)``):
  evaluations done, new vs journal, the set size just judged, pass/fail, time per evaluation;
- the strategy's ``progress`` hint: ``run_search(..., progress=progress)``; strategies call it with
  ``{"phase", "fp32_size", "best", "evaluations"}`` (strategies/__init__.py), which adds the phase.

Use it as a context manager (the live display needs start and stop)::

    with SearchProgress(len(catalog.candidates), max_evals=..., time_limit=...) as progress:
        oracle = job.oracle(on_verdict=progress.on_verdict)
        result = run_search(oracle, strategy, options, progress=progress)
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, TextIO


class SearchProgress:
    def __init__(
        self,
        candidates: int = 0,
        stream: TextIO | None = None,
        live: bool | None = None,
        max_evals: int | None = None,
        time_limit: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.candidates = candidates
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_tty(self.stream) if live is None else live
        self.max_evals = max_evals
        self.time_limit = time_limit
        self.clock = clock
        self.started = clock()
        self.evaluations = 0  # distinct verdicts received
        self.new = 0
        self.cached = 0
        self.eval_seconds = 0.0  # backend time of new evaluations
        self.phase = "start"
        self.last_size: int | None = None
        self.last_passed: bool | None = None
        self.best: frozenset[str] | None = None
        self.expected_total: int | None = None  # the strategy's own estimate of the evaluations in all
        self.last_estimate: dict | None = None  # the last estimate said, so that the same one is said once
        self.last_advice = ""  # said once: the estimates after it that carry the same advice leave it out
        self.ranking: dict | None = None  # the predicted ranking's runs: {"runs", "total", "seconds"}, while they go
        self.ranking_seconds = 0.0  # time in those runs: no evaluations, so not in the time per evaluation
        self._ranking_line = -1e9  # when the last plain ranking line was printed
        self._live: Any = None

    # ---- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> "SearchProgress":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the API's SearchObserver protocol ----------------------------------------------------------------------
    def begin(self, candidates: int) -> None:
        self.candidates = candidates
        self.start()

    def end(self) -> None:
        self.stop()

    def start(self) -> None:
        self.started = self.clock()
        if self.live and self._live is None:
            from rich.console import Console
            from rich.live import Live

            # the live panel draws with escape sequences of its own: it writes to the real stream under the CLI's
            # SafeStream; names in it are escaped for rich markup and control characters (_render)
            raw = getattr(self.stream, "unwrapped", self.stream)
            console = Console(file=raw, stderr=self.stream is sys.stderr)
            self._live = Live(self._render(), console=console, refresh_per_second=8, transient=False)
            self._live.start()
        elif not self.live:
            self._line(f"search over {self.candidates} candidates started"
                       + (f"; budget {self.max_evals} evaluations" if self.max_evals else "")
                       + (f", {self.time_limit:g}s" if self.time_limit else ""))

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None
        elif not self.live:
            self._line(f"search done: {self.evaluations} evaluations ({self.new} new, {self.cached} cached), "
                       f"best {self._best_text()}, {self.elapsed():.1f}s")

    # ---- events ------------------------------------------------------------------------------------------------
    def on_verdict(self, verdict: Any) -> None:
        """Oracle callback (`Oracle(on_verdict=...)`): a `Verdict` with fp32, passed, seconds, source."""
        self.evaluations += 1
        if getattr(verdict, "source", "new") == "journal":
            self.cached += 1
        else:
            self.new += 1
            self.eval_seconds += sum(getattr(verdict, "seconds", {}).values())
        fp32 = getattr(verdict, "fp32", frozenset())  # kept as it is (a search's sets are packed: no copy)
        self.last_size, self.last_passed = len(fp32), bool(verdict.passed)
        if verdict.passed and (self.best is None or len(fp32) < len(self.best)):
            self.best = fp32
        if self._live is not None:
            self._live.update(self._render())
        elif not self.live:
            self._line(
                f"eval {self.evaluations}{' (journal)' if getattr(verdict, 'source', 'new') == 'journal' else ''}: "
                f"{self.last_size} FP32 -> {'pass' if verdict.passed else 'FAIL'}{_screened(verdict)} | "
                f"best {self._best_text()} | "
                f"phase {self.phase} | {self.elapsed():.1f}s{self._eta_text()}"
            )

    def __call__(self, info: dict) -> None:
        """Strategy `progress` hint: {"phase", "fp32_size", "best", "evaluations"}, and now and then an
        "estimate" {"evaluations", "set_size", "diffuse", "advice"[, "at_least"][, "set_at_most" | "set_at_least"]}:
        said once each time it changes ("at_least": both are lower bounds, the diffuse search's first estimate, from the
        culprits found so far; "set_at_most" / "set_at_least": only the set size is a bound)."""
        estimate = info.get("estimate")
        if isinstance(estimate, dict):
            self._on_estimate(estimate)
        ranking = info.get("ranking")
        if isinstance(ranking, dict):
            self._on_ranking(ranking)
        phase = info.get("phase")
        if phase and phase != self.phase:
            self.phase = str(phase)
            if not self.live:
                self._line(f"phase: {self.phase}")
        best = info.get("best")
        if best is not None and (self.best is None or len(best) < len(self.best)):
            self.best = frozenset(best)
        if self._live is not None:
            self._live.update(self._render())

    def _on_estimate(self, e: dict) -> None:
        total, size = e.get("evaluations"), e.get("set_size")
        self.expected_total = int(total) if isinstance(total, (int, float)) else self.expected_total
        about = "at least" if e.get("at_least") else "about"  # the diffuse search's first: culprits so far
        size_about = ("at most" if e.get("set_at_most") else "at least" if e.get("set_at_least")  # bounds on the set
                      else about)
        runs = e.get("ranking_runs")
        # The advice is a paragraph; a diffuse search's three or four estimates all carried the same one (the
        # 60-output chain: four lines of ~400 characters for four numbers), so it is said when it changes
        if e == self.last_estimate:
            return  # said already
        self.last_estimate = dict(e)
        advice = e.get("advice") if e.get("advice") and e.get("advice") != self.last_advice else ""
        text = (f"estimate: {about} {total} evaluations in all"
                + (f" (first {runs} single-node emulator runs to rank the nodes, not evaluations)"
                   if isinstance(runs, int) and runs > 0 else "")
                + f", a set of {size_about} {size} node(s)"
                + ("; FP16 error is diffuse (many nodes each add a little)" if e.get("diffuse") else "")
                + (f". {advice}" if advice else ""))
        self.last_advice = e.get("advice") or self.last_advice
        self._line(text)  # also under the live display: the estimate is worth a line in the log

    def _on_ranking(self, r: dict) -> None:
        """The driver's ranking runs (no evaluations): shown on the phase row, in plain mode a line every 10 s."""
        try:
            runs, total, seconds = int(r["runs"]), int(r["total"]), float(r["seconds"])
        except (KeyError, TypeError, ValueError):
            return
        done = runs >= total
        self.ranking = None if done else {"runs": runs, "total": total, "seconds": seconds}
        if done:
            self.ranking_seconds += seconds
        if not self.live and (done or self.clock() - self._ranking_line >= 10.0):
            self._ranking_line = self.clock()
            self._line(f"ranking: {runs}/{total} single-node emulator runs (not evaluations), {seconds:.1f}s"
                       + ("" if done else self._ranking_left()))

    def _ranking_left(self) -> str:
        r = self.ranking
        if not r or r["runs"] < max(3, r["total"] // 50):  # the first runs also build sessions: no guide yet
            return ""
        left = r["seconds"] / r["runs"] * (r["total"] - r["runs"])
        return f", ~{left:.0f}s left" if left >= 1 else ""

    # ---- numbers -----------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.started

    def per_eval(self) -> float | None:
        """Seconds per evaluation so far, the ranking's runs left out (on a recogniser at batch 8 they took 65 of
        the first 100 s and made the time left after them look three times as long)."""
        if not self.evaluations:
            return None
        spent = self.elapsed() - self.ranking_seconds
        if self.ranking:
            spent -= self.ranking["seconds"]
        return max(spent, 0.0) / self.evaluations

    def estimate_left(self) -> tuple[float, bool] | None:
        """(seconds left, exact_budget). From the budget when there is one, else from the strategy's estimate;
        otherwise a rough guess: a search for k culprits among N needs about k*log2(N/k) + 2k evaluations (k =
        best size so far, at least 1) — none while the best passing set holds more than a quarter of the
        candidates: early in a search that is all of them, or the group tests' shrinking complement, not the
        answer (a recogniser at batch 8 showed ~2164 s left at its first evaluation, for a 47 s search)."""
        per = self.per_eval()
        if per is None:
            return None
        bounds = []
        if self.max_evals is not None:
            bounds.append(max(self.max_evals - self.new, 0) * per)
        if self.time_limit is not None:
            bounds.append(max(self.time_limit - self.elapsed(), 0.0))
        if bounds:
            return min(bounds), True
        if self.expected_total is not None:
            return max(self.expected_total - self.evaluations, 0) * per, False
        k = max(len(self.best) if self.best is not None else 1, 1)
        n = max(self.candidates, 1)
        if k * 4 > n and self.best is not None:
            return None  # no basis for a guess yet
        total = k * math.log2(max(n / k, 2)) + 2 * k + 1
        return max(total - self.evaluations, 0) * per, False

    def _eta_text(self) -> str:
        est = self.estimate_left()
        if est is None:
            return ""
        seconds, exact = est
        return f", {'at most' if exact else '~'}{seconds:.0f}s left" if seconds >= 1 or exact else ""

    def _best_text(self) -> str:
        return "none yet" if self.best is None else f"{len(self.best)} FP32"

    def _line(self, text: str) -> None:
        from bisector.text import terminal

        print(f"[bisector] {terminal(text)}", file=self.stream, flush=True)

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(title="bisector search", show_header=False, box=None, padding=(0, 1))
        table.add_column(style="bold cyan", justify="right")
        table.add_column()
        budget = f" / {self.max_evals}" if self.max_evals else ""
        table.add_row("evaluations", f"{self.evaluations}{budget} ({self.new} new, {self.cached} from journal)")
        from bisector.text import rich_escape

        phase = rich_escape(self.phase)
        if self.ranking:
            phase += (f" ({self.ranking['runs']}/{self.ranking['total']} single-node runs"
                      f"{self._ranking_left()})")
        table.add_row("phase", phase)
        last = "-" if self.last_size is None else f"{self.last_size} FP32 -> {'[green]pass' if self.last_passed else '[red]fail'}"
        table.add_row("last candidate", last)
        best = self._best_text()
        if self.best is not None and len(self.best) <= 8:
            from bisector.text import rich_escape

            best += ": " + ", ".join(rich_escape(n) for n in sorted(self.best))
        table.add_row("best passing", best)
        per = self.per_eval()
        table.add_row("elapsed", f"{self.elapsed():.1f}s" + (f" ({per:.2f}s per evaluation)" if per else ""))
        eta = self._eta_text().lstrip(", ")
        table.add_row("estimate", eta or "-")
        return table


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _screened(verdict: Any) -> str:
    """' (on item 2)' for a failure found on the batch item(s) judged first (bisector.search.screen)."""
    screened = getattr(verdict, "screened", None)
    if not screened:
        return ""
    s, first, items = screened
    where = "input set" if items == 0 else ("item" if items == 1 else "items")
    what = f"{s}" if items == 0 else (f"{first}" if items == 1 else f"{first}-{first + items - 1}")
    return f" (on {where} {what})"
