"""The oracle: FP32 set -> verdict. Runs the backend on every input set, compares with golden, caches, journals.

Strategies only see `passes(frozenset) -> bool` (and the driver's `batch` hint, `evaluate_many`). Repeated sets
are answered from memory and are not counted; sets answered from the journal of an earlier (killed) run count as
`cached`; everything else is `new`.

With an executor (`--workers`, `--ray`; bisector.search.executors) new plans are judged elsewhere, several at a
time, but the memo, the journal and the budget stay here: `evaluate_many` answers what it can from memory and
the journal, sends only new plans — never more than the budget has left — journals each verdict as it arrives
(a killed run loses nothing finished), and returns the verdicts in the order asked.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Callable, Protocol, Sequence

from bisector.backends.base import Backend
from bisector.budget import (  # BudgetExhausted is part of the strategy protocol: strategies let it propagate
    Budget,
    BudgetExhausted,
)
from bisector.compare import Tolerance
from bisector.fp16.plan import Plan
from bisector.fp16.points import IdleFP32
from bisector.search.judge import Verdict, judge, summed_seconds
from bisector.packed_sets import SetMemo
from bisector.search.screen import Screen
from bisector.model.polyjson import Feeds


class Journal(Protocol):
    def lookup(self, plan: Plan) -> Verdict | None: ...

    def record(self, plan: Plan, verdict: Verdict) -> None: ...


KEEP_WHOLE = 16  # the most recent verdicts keep every output's comparison (older ones are slimmed: Verdict.slim)


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
        executor=None,
        screen: bool = False,
        idle: IdleFP32 | None = None,
    ):
        self.backend = backend
        self.candidates = tuple(candidates)
        self.feeds_list = list(feeds_list)
        self.golden = list(golden)
        self.tolerance = tolerance
        self.journal = journal
        self.budget = budget or Budget()
        self.on_verdict = on_verdict
        # Every plan asked, and its verdict, for the search's whole length: keyed, and the verdicts' `fp32` held,
        # as bit masks over the candidates (bisector.packed_sets), asked with any set of names
        self.verdicts: SetMemo = SetMemo(self.candidates)
        self.new = 0
        self.cached = 0
        self.history: list[Verdict] = []  # distinct verdicts in the order they were first asked
        # verdicts kept whole: the KEEP_WHOLE most recent, and that of the smallest passing set so far (the likely
        # answer); every other one is slimmed as it leaves (`_keep_whole`)
        self._recent: deque[Verdict] = deque()
        self._best: Verdict | None = None
        self.executor = executor  # None: judge here with `backend`
        self.rounds = 0  # sequential rounds of new evaluations: each call costs ceil(new plans / workers)
        # `screen`: judge a new plan first on the batch item of the last failure (bisector.search.screen; in this
        # process only: plans sent to an executor's workers are judged whole)
        self.screen = Screen(backend, self.candidates, self.feeds_list, self.golden, tolerance) if screen else None
        # A search's oracle judges every set without its idle FP32 members (`points.IdleFP32`: an exact reader of
        # FP16 values, an element mover for FP16 readers): the same values, so one judgement stands for all such
        # sets, a chain's removal is asked once, and no set a search reports keeps a node FP32 for nothing
        self.idle = idle if idle else None

    def canonical(self, fp32) -> frozenset[str]:
        """The set this oracle judges for `fp32`: `fp32` less its idle members (the same values); `fp32` itself
        where the oracle has no `idle`."""
        fp32 = frozenset(fp32)
        return self.idle.without(fp32) if self.idle is not None else fp32

    def verdict_of(self, fp32) -> Verdict | None:
        """The verdict of `fp32` (as judged: `canonical`), where it has been judged; None otherwise."""
        return self.verdicts.get(self.canonical(fp32))

    @property
    def workers(self) -> int:
        return self.executor.workers if self.executor is not None else 1

    @property
    def total(self) -> int:
        return self.new + self.cached

    def best_passing(self) -> frozenset[str] | None:
        passing = [v.fp32 for v in self.history if v.passed]
        if not passing:
            return None
        smallest = min(len(s) for s in passing)
        order = {n: i for i, n in enumerate(self.candidates)}
        return frozenset(min((s for s in passing if len(s) == smallest), key=lambda s: sorted(order[n] for n in s)))

    def passes(self, fp32: frozenset[str]) -> bool:
        return self.evaluate(frozenset(fp32)).passed

    def evaluate(self, fp32: frozenset[str], count: bool = True) -> Verdict:
        fp32 = self.canonical(fp32)
        if self.executor is not None:
            return self.evaluate_many([fp32], count=count)[0]
        key = self.verdicts.key(fp32)
        known = self.verdicts.get_key(key)
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
            verdict = self._judge_new(plan)
            if self.journal is not None:
                self.journal.record(plan, verdict)
            self.new += 1
            self.rounds += 1
        self._store(fp32, verdict, key)
        self.history.append(verdict)
        if self.on_verdict is not None:
            self.on_verdict(verdict)
        return verdict

    def confirm(self, fp32: frozenset[str]) -> Verdict:
        """The verdict of `fp32`, judged by the backend in this process: a verdict that came from the journal of an
        earlier run is judged again (not counted as an evaluation; the journal entry is replaced), and so is one
        whose comparisons were slimmed during the search. The final set of a search is reported from this, so it
        never rests on a stored verdict alone, nor on part of one."""
        fp32 = self.canonical(fp32)
        known = self.evaluate(fp32, count=False)
        from_journal = known.source == "journal" and self.confirm_final
        # a slimmed verdict (Verdict.slim) lost comparisons the report shows, a lean one their summaries: judged
        # again as well
        if not (from_journal or known.slimmed or known.lean):
            return known
        plan = Plan(fp32, self.candidates)
        fresh = self._judge(plan, lean=False)  # the final set's verdict is reported: all of it, never screened
        if fresh.passed != known.passed:
            logging.getLogger("bisector").warning(
                "the %s verdict for the final set (%s) differs from judging it now (%s): the backend is not "
                "deterministic%s; reporting the fresh verdict", "journal's" if from_journal else "search's",
                "pass" if known.passed else "fail", "pass" if fresh.passed else "fail",
                ", or the journal is stale" if from_journal else "")
        if from_journal and self.journal is not None:
            self.journal.record(plan, fresh)
        self._store(fp32, fresh)
        if known.slimmed:  # the history holds the whole verdict, not the slimmed one
            self.history[:] = [fresh if v is known else v for v in self.history]
        return fresh

    def whole(self, fp32: frozenset[str]) -> Verdict:
        """The verdict of a set already judged, judged on every input item where it failed on one item alone
        (`Verdict.screened`): its comparisons and excess are then the whole job's. The memo, the history and the
        journal keep the whole verdict; not an evaluation (the plan was counted when it was first judged)."""
        fp32 = self.canonical(fp32)
        known = self.verdicts[fp32]
        if known.screened is None:
            return known
        plan = Plan(fp32, self.candidates)
        full = self._judge(plan)
        full.seconds = summed_seconds(full.seconds, known.seconds)
        if full.passed != known.passed:  # the screen's own check makes this a backend that is not deterministic
            logging.getLogger("bisector").warning("a plan that failed on batch items %s passed on the whole batch: "
                                                  "judging whole batches from now on", known.screened)
            if self.screen is not None:
                self.screen.stop()
        if self.screen is not None and known.source != "journal":  # it counts this run's screened failures
            self.screen.screened -= 1
        if self.journal is not None:
            self.journal.record(plan, full)
        self._store(fp32, full)
        self.history[:] = [full if v is known else v for v in self.history]  # in place: callers may hold it
        return full

    def _judge(self, plan: Plan, lean: bool = True) -> Verdict:
        # The search reads a verdict's pass, excess and failing outputs: lean comparisons (no summaries); the set a
        # search reports is judged again in full (`confirm`)
        return judge(self.backend, plan, self.feeds_list, self.golden, self.tolerance, lean=lean)

    def _judge_new(self, plan: Plan) -> Verdict:
        """A new plan's verdict: screened on one batch item first where the oracle screens, else `_judge`."""
        if self.screen is None:
            return self._judge(plan)
        return self.screen.judge(plan, lambda: self._judge(plan))

    def evaluate_many(self, sets: Sequence[frozenset[str]], count: bool = True) -> list[Verdict]:
        """Verdicts for independent sets, in the order given. Without an executor: one after another, exactly as
        `evaluate`. With one: memo and journal first, then the new plans at once (at most the budget left; when
        it cuts the batch, the plans sent are judged and recorded, then BudgetExhausted is raised)."""
        fsets = [self.canonical(s) for s in sets]
        if self.executor is None:
            return [self.evaluate(s, count=count) for s in fsets]
        resolved: dict[frozenset[str], Verdict] = {}
        todo: list[frozenset[str]] = []
        order: list[frozenset[str]] = []  # first occurrence of each distinct set, for the history
        for s in fsets:
            if s in resolved or s in todo:
                continue
            order.append(s)
            known = self.verdicts.get(s)
            if known is not None:
                resolved[s] = known
                continue
            verdict = self.journal.lookup(Plan(s, self.candidates)) if self.journal is not None else None
            if verdict is not None:
                verdict.source = "journal"
                self.cached += 1
                self._remember(s, verdict)
                resolved[s] = verdict
                continue
            todo.append(s)
        fresh: dict[frozenset[str], Verdict] = {}
        stop: BudgetExhausted | None = None
        if todo:
            if count:
                try:
                    self.budget.check(self.new)
                except BudgetExhausted as exc:
                    stop = exc
                    todo = []
                if self.budget.max_evals is not None:
                    left = self.budget.max_evals - self.new
                    if left < len(todo):
                        stop = BudgetExhausted(f"--max-evals {self.budget.max_evals} reached")
                        todo = todo[:max(0, left)]
            started, base = [0], self.new

            def may_start() -> bool:
                nonlocal stop
                if not count or started[0] == 0:  # the first plan was checked above
                    started[0] += 1
                    return True
                try:
                    self.budget.check(base + started[0])  # dispatched, finished or not
                except BudgetExhausted as exc:
                    stop = stop or exc
                    return False
                started[0] += 1
                return True

            if todo:
                self.rounds += math.ceil(len(todo) / max(1, self.workers))
                try:
                    for i, payload in self.executor.run(todo, may_start):
                        verdict = Verdict.from_json(payload)
                        verdict.fp32 = todo[i]
                        if self.journal is not None:
                            self.journal.record(Plan(todo[i], self.candidates), verdict)
                        self.new += 1
                        self._store(todo[i], verdict)
                        fresh[todo[i]] = verdict
                        if self.on_verdict is not None:
                            self.on_verdict(verdict)
                finally:
                    self.history.extend(fresh[s] for s in order if s in fresh)  # in the order asked
                missing = [s for s in todo if s not in fresh]
                if missing and stop is None:
                    stop = BudgetExhausted("the budget ran out during a batch")
            resolved.update(fresh)
        if stop is not None:
            raise stop
        return [resolved[s] for s in fsets]

    def _keep_whole(self, verdict: Verdict) -> None:
        """Slim the verdict that leaves the recent window, unless it is the smallest passing set's (kept whole)."""
        if verdict.passed and (self._best is None or len(verdict.fp32) < len(self._best.fp32)):
            old, self._best = self._best, verdict
            if old is not None and not any(v is old for v in self._recent):
                old.slim()
        self._recent.append(verdict)
        if len(self._recent) > KEEP_WHOLE:
            out = self._recent.popleft()
            if out is not self._best:
                out.slim()

    def _store(self, fp32: frozenset[str], verdict: Verdict, key=None) -> None:
        """Remember `verdict` as the verdict of `fp32`; its `fp32` becomes the memo's packed form of the set
        (`key`: the memo's key of `fp32`, where the caller has it)."""
        key = self.verdicts.key(fp32) if key is None else key
        verdict.fp32 = self.verdicts.packed(key, len(fp32))  # type: ignore[assignment]  # reads as the frozenset
        self.verdicts.set_key(key, verdict)
        self._keep_whole(verdict)

    def _remember(self, s: frozenset[str], verdict: Verdict) -> None:
        self._store(s, verdict)
        self.history.append(verdict)
        if self.on_verdict is not None:
            self.on_verdict(verdict)
