"""The oracle: FP32 set -> verdict. Runs the backend on every input set, compares with golden, caches, journals.

Strategies only see `passes(frozenset) -> bool`. Repeated sets are answered from memory and are not counted;
sets answered from the journal of an earlier (killed) run count as `cached`; everything else is `new`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from bisector.backends.base import Backend
from bisector.budget import (  # BudgetExhausted is part of the strategy protocol: strategies let it propagate
    Budget,
    BudgetExhausted,
)
from bisector.compare import Tolerance
from bisector.fp16.plan import Plan
from bisector.search.judge import Verdict, judge
from bisector.model.polyjson import Feeds


class Journal(Protocol):
    def lookup(self, plan: Plan) -> Verdict | None: ...

    def record(self, plan: Plan, verdict: Verdict) -> None: ...


class Oracle:
    confirm_final = True  # `confirm`: judge a final set whose verdict came from the journal again
    def __init__(
        self,
        backend: Backend,
        candidates: Sequence[str],
        feeds_list: Sequence[Feeds],
        golden: Sequence[Feeds],
        tolerance: Tolerance,
        journal: Journal | None = None,
        budget: Budget | None = None,
        on_verdict: Callable[[Verdict], None] | None = None,
    ):
        self.backend = backend
        self.candidates = tuple(candidates)
        self.feeds_list = list(feeds_list)
        self.golden = list(golden)
        self.tolerance = tolerance
        self.journal = journal
        self.budget = budget or Budget()
        self.on_verdict = on_verdict
        self.verdicts: dict[frozenset[str], Verdict] = {}
        self.new = 0
        self.cached = 0
        self.history: list[Verdict] = []  # distinct verdicts in the order they were first asked

    @property
    def total(self) -> int:
        return self.new + self.cached

    def best_passing(self) -> frozenset[str] | None:
        passing = [v.fp32 for v in self.history if v.passed]
        if not passing:
            return None
        order = {n: i for i, n in enumerate(self.candidates)}
        return min(passing, key=lambda s: (len(s), sorted(order[n] for n in s)))

    def passes(self, fp32: frozenset[str]) -> bool:
        return self.evaluate(frozenset(fp32)).passed

    def evaluate(self, fp32: frozenset[str], count: bool = True) -> Verdict:
        fp32 = frozenset(fp32)
        known = self.verdicts.get(fp32)
        if known is not None:
            return known
        plan = Plan(fp32, self.candidates)
        verdict = self.journal.lookup(plan) if self.journal is not None else None
        if verdict is not None:
            verdict.source = "journal"
            self.cached += 1
        else:
            if count:
                self.budget.check(self.new)
            verdict = self._judge(plan)
            if self.journal is not None:
                self.journal.record(plan, verdict)
            self.new += 1
        self.verdicts[fp32] = verdict
        self.history.append(verdict)
        if self.on_verdict is not None:
            self.on_verdict(verdict)
        return verdict

    def confirm(self, fp32: frozenset[str]) -> Verdict:
        """The verdict of `fp32`, judged by the backend in this process: a verdict that came from the journal of an
        earlier run is judged again (not counted as an evaluation; the journal entry is replaced). The final set
        of a search is reported from this, so it never rests on a stored verdict alone."""
        fp32 = frozenset(fp32)
        known = self.evaluate(fp32, count=False)
        if known.source != "journal" or not self.confirm_final:
            return known
        plan = Plan(fp32, self.candidates)
        fresh = self._judge(plan)
        if fresh.passed != known.passed:
            import logging

            logging.getLogger("bisector").warning(
                "the journal's verdict for the final set (%s) differs from judging it now (%s): the backend is not "
                "deterministic, or the journal is stale; reporting the fresh verdict",
                "pass" if known.passed else "fail", "pass" if fresh.passed else "fail")
        if self.journal is not None:
            self.journal.record(plan, fresh)
        self.verdicts[fp32] = fresh
        return fresh

    def _judge(self, plan: Plan) -> Verdict:
        return judge(self.backend, plan, self.feeds_list, self.golden, self.tolerance)
