"""The oracle of `debug precision`: a check (a command, or a Python `passes` callable) judges each FP32 set.

It is the search's ordinary `Oracle` (memo, budget, `on_verdict`, counting new/cached) with the judge swapped: a
`Checker` turns a plan into a `CheckVerdict` (status, the check's exit code or signal, its duration). Verdicts are
journaled under a key of model, check command and how its end is read, and the candidate set, so a resumed or
repeated search runs no check twice. A check that timed out, crashed or could not be prepared is not an answer:
by default it stops the search (`CheckError`, exit 3); with `on_error="fail"` it counts as a failing set, as
Polygraphy counts it, and is reported with its own status.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from bisector.budget import Budget, BudgetExhausted
from bisector.errors import BackendFailure, UsageError
from bisector.fp16.plan import Plan
from bisector.search.judge import Verdict
from bisector.search.oracle import Oracle

ERRORS = ("timeout", "crash", "error")


@dataclass
class CheckVerdict(Verdict):
    """A verdict of a check: `passed` is what the search sees; `status` says why (pass, fail, timeout, crash,
    error); `returncode`/`signal` and `seconds["check"]` are the check's own."""

    status: str = "pass"
    returncode: int | None = None
    signal: str | None = None
    reason: str = ""
    output: str = ""
    timeout: float | None = None
    iteration: int = 0

    @property
    def check_seconds(self) -> float:
        return float(self.seconds.get("check", 0.0))

    def to_json(self) -> dict:
        return self._with_check(super().to_json())

    def journal_json(self) -> dict:
        return self._with_check(super().journal_json())

    def _with_check(self, d: dict) -> dict:
        d.update(status=self.status, returncode=self.returncode, signal=self.signal, reason=self.reason,
                 output=self.output, timeout=self.timeout, iteration=self.iteration)
        return d

    def summary(self) -> dict:
        """One row of the report: no output, no comparisons."""
        return {"iteration": self.iteration, "fp32": sorted(self.fp32), "status": self.status, "passed": self.passed,
                "returncode": self.returncode, "signal": self.signal, "reason": self.reason,
                "seconds": round(self.check_seconds, 4), "source": self.source}

    @classmethod
    def from_json(cls, d: dict) -> "CheckVerdict":
        return cls(frozenset(d["fp32"]), bool(d["passed"]), {}, int(d.get("worst_set", 0)), dict(d.get("seconds", {})),
                   status=d.get("status", "pass" if d["passed"] else "fail"), returncode=d.get("returncode"),
                   signal=d.get("signal"), reason=d.get("reason", ""), output=d.get("output", ""),
                   timeout=d.get("timeout"), iteration=int(d.get("iteration", 0)))


class Checker(Protocol):
    """Judges one plan. `timeout`: the most seconds the check may take (None: no limit)."""

    def check(self, plan: Plan, iteration: int, timeout: float | None) -> CheckVerdict: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class CheckError(BackendFailure):
    """A check that timed out, crashed or could not be prepared, with on_error="stop": exit 3."""

    def __init__(self, message: str, verdict: CheckVerdict):
        super().__init__(message)
        self.verdict = verdict


class CheckJournal:
    """The journal of check verdicts: the SQLite journal (None: --no-cache) plus a loaded debug replay.

    Error verdicts (timeout, crash, error) are recorded but answered again only under on_error="fail", and a
    timeout only when it ran under at least the current --check-timeout: resuming is how a user retries them."""

    def __init__(self, sqlite=None, replay: dict[frozenset[str], CheckVerdict] | None = None,
                 on_error: str = "stop", timeout: float | None = None):
        self.sqlite = sqlite
        self.replay = dict(replay or {})
        self.on_error = on_error
        self.timeout = timeout

    def _usable(self, v: CheckVerdict | None) -> CheckVerdict | None:
        if v is None or v.status not in ERRORS:
            return v
        if self.on_error != "fail":
            return None
        if v.status == "timeout" and (self.timeout is None or (v.timeout or 0) < self.timeout):
            return None
        return v

    def lookup(self, plan: Plan) -> CheckVerdict | None:
        v = self._usable(self.replay.get(plan.fp32))
        if v is not None:
            v.source = "replay"
            return v
        if self.sqlite is None or not self.sqlite.resume:
            return None
        doc = self.sqlite.lookup_json(plan)  # checksummed rows only (journal.py)
        return None if doc is None else self._usable(CheckVerdict.from_json(doc))

    def record(self, plan: Plan, verdict: Verdict) -> None:
        if self.sqlite is not None:
            self.sqlite.record(plan, verdict)

    def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()


class CheckOracle(Oracle):
    """`Oracle` whose judge is a `Checker`. `on_error`: "stop" (CheckError, exit 3) or "fail" (a failing set).

    Not safe to call from several threads at once: a command check writes its candidate to one fixed path in the
    working directory, where the user's command expects it (`parallel_safe = False` tells a parallel driver)."""

    parallel_safe = False
    # the final set's stored verdict is reported as is: re-running the user's check command on a fully replayed
    # search is what a resumed debug run promises not to do (its journal rows are checksummed like the oracle's)
    confirm_final = False

    def __init__(self, checker: Checker, candidates: Sequence[str], journal: CheckJournal | None = None,
                 budget: Budget | None = None, on_verdict: Callable[[Verdict], None] | None = None,
                 on_error: str = "stop", check_timeout: float | None = None):
        if on_error not in ("stop", "fail"):
            raise UsageError(f"--on-check-error {on_error!r}: choose stop or fail")
        super().__init__(backend=None, candidates=candidates, feeds_list=[], golden=[], tolerance=None,  # type: ignore[arg-type]
                         journal=journal, budget=budget, on_verdict=on_verdict)
        self.checker = checker
        self.on_error = on_error
        self.check_timeout = check_timeout
        self.iterations = 0  # checks actually run (new verdicts)
        self.errors: list[CheckVerdict] = []  # timeouts, crashes, errors (the one that stopped the search included)

    def _timeout(self) -> tuple[float | None, bool]:
        """(limit for the next check, whether that limit is the --time-limit's rather than --check-timeout's)."""
        left = None
        if self.budget.time_limit is not None:
            left = max(0.0, self.budget.time_limit - (time.monotonic() - self.budget.started))
        if left is not None and (self.check_timeout is None or left < self.check_timeout):
            return max(left, 0.001), True
        return self.check_timeout, False

    def _judge(self, plan: Plan, lean: bool = True) -> CheckVerdict:  # a check's verdict has no comparisons to thin
        self.iterations += 1
        limit, is_budget = self._timeout()
        verdict = self.checker.check(plan, self.iterations, limit)
        if verdict.status == "timeout" and is_budget:
            raise BudgetExhausted(f"--time-limit {self.budget.time_limit:g}s reached while a check ran")
        if verdict.status in ERRORS:
            verdict.passed = False
            self.errors.append(verdict)
            if self.on_error == "stop":  # journaled for the record; a resumed search runs it again
                if self.journal is not None:
                    self.journal.record(plan, verdict)
                raise CheckError(error_message(verdict), verdict)
        return verdict


def error_message(v: CheckVerdict) -> str:
    what = {"timeout": "timed out", "crash": "crashed", "error": "failed to run"}[v.status]
    tail = v.output.strip().splitlines()[-8:]
    shown = ("; last output:\n  " + "\n  ".join(tail)) if tail else ""
    return (f"the check {what} on iteration {v.iteration} ({len(v.fp32)} FP32 node(s)): {v.reason} after "
            f"{v.check_seconds:.2f}s. This is neither a pass nor a fail, so the search stopped (exit 3). Fix the "
            f"check (or raise --check-timeout) and run the same command again: verdicts so far are journaled and "
            f"not re-run; or pass --on-check-error fail to count such a candidate as failing, as Polygraphy does"
            f"{shown}")


def load_replay(path: Path) -> dict[frozenset[str], CheckVerdict]:
    """A replay saved by `--save-debug-replay` (ours: verdicts keyed by FP32 set). Polygraphy's own replays
    (`_N0`, `_N1`, … iteration contexts of TensorRT layer indices) cannot be mapped onto node sets."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--load-debug-replay: {path} not found") from None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past Python's limit
        raise UsageError(f"--load-debug-replay {path}: not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or "bisector_verdicts" not in doc:
        raise UsageError(f"--load-debug-replay {path}: not a bisector debug replay (a Polygraphy replay counts "
                         "TensorRT layers by iteration and cannot be mapped onto ONNX node sets; bisector's journal "
                         "already skips every candidate judged before with the same model and check)")
    try:
        return {frozenset(d["fp32"]): CheckVerdict.from_json(d) for d in doc["bisector_verdicts"]}
    except (TypeError, KeyError, ValueError, AttributeError) as exc:  # a replay edited by hand or cut short
        raise UsageError(f"--load-debug-replay {path}: not a readable bisector debug replay "
                         f"({type(exc).__name__}: {exc})") from None


def replay_document(history: Sequence[Verdict], description: dict[str, Any]) -> dict:
    """A debug replay: ours (verdicts by FP32 set), plus Polygraphy-shaped iteration records for reading."""
    doc: dict[str, Any] = {"bisector_verdicts": [v.to_json() for v in history], "description": description}
    for i, v in enumerate(history):
        doc[f"_N{i}"] = {"state": {"fp32_nodes": sorted(v.fp32)}, "iteration_info": {"iteration": i},
                         "success": bool(v.passed), "polygraphy_class": "IterationContext"}
    return doc
