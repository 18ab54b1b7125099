"""The judge: run one plan on every input set, compare with golden, keep the worst set. The one place this loop
lives: the oracle (search), `evaluate`/`run`, `verify` and `profile` all call it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from bisector.backends.base import Backend
from bisector.compare import OutputComparison, Tolerance, compare_outputs
from bisector.fp16.plan import Plan
from bisector.model.polyjson import Feeds


@dataclass
class Verdict:
    """A plan's judgement. `outputs` are the comparisons of the worst input set (a failing set is always worse
    than a passing one; among equals, the larger excess)."""

    fp32: frozenset[str]
    passed: bool
    outputs: dict[str, OutputComparison]
    worst_set: int
    seconds: dict[str, float] = field(default_factory=dict)
    source: str = "new"  # new | journal
    # (input set, first item, items) when a failing verdict was judged on those batch items alone
    # (`search.screen`; items 0: the one input set, unbatched): the verdict is the whole job's, its comparisons
    # those of the items (their excess a lower bound of the whole's); None: judged on everything
    screened: tuple[int, int, int] | None = None
    # True once `slim` dropped the comparisons of every output but the worst
    slimmed: bool = False
    # the failing outputs' names where `slim` dropped their comparisons (None: read them from `outputs`)
    failing_names: tuple[str, ...] | None = None

    @property
    def excess(self) -> float:
        """The worst output's error in units of its tolerance (1 = exactly at tolerance)."""
        return max((r.excess for r in self.outputs.values()), default=0.0)

    @property
    def lean(self) -> bool:
        """Judged without the summaries only a report shows (`compare_output(lean=True)`)."""
        return any(r.lean for r in self.outputs.values())

    @property
    def failing(self) -> list[str]:
        if self.failing_names is not None:
            return list(self.failing_names)
        return [k for k, r in self.outputs.items() if not r.passed]

    def slim(self) -> None:
        """Keep only what a search reads back from an old verdict: the worst output's comparison, and the names
        of the failing outputs (so `passed`, `excess` and `failing` stay as they were). A search keeps every
        verdict to its end, one comparison per output each: a 60-output model's 2773 verdicts held 120 MB of
        them, and still 60 MB with the failing outputs' comparisons kept. The oracle judges the final set again
        where its verdict was slimmed (`Oracle.confirm`), so the report has them all."""
        if self.slimmed or len(self.outputs) <= 1:
            return
        worst = self._worst()
        failing = tuple(k for k, r in self.outputs.items() if not r.passed)
        self.outputs, self.slimmed = {worst: self.outputs[worst]}, True
        self.failing_names = failing  # the dict's own key strings: a pointer each

    def _worst(self) -> str:
        """The name of the output with the largest excess: the one comparison a slim verdict keeps."""
        return max(self.outputs, key=lambda k: self.outputs[k].excess)

    def to_json(self) -> dict:
        return {"fp32": sorted(self.fp32), "passed": self.passed, "worst_set": self.worst_set, "seconds": self.seconds,
                "outputs": {k: o.to_json() for k, o in self.outputs.items()},
                **({"screened": list(self.screened)} if self.screened is not None else {})}

    def journal_json(self) -> dict:
        """What the journal keeps of this verdict: what a search reads back from it, as `slim` keeps it in memory
        (`passed`, `excess`: the worst output's comparison, and the failing outputs' names), and not the FP32
        set, which is the row's plan (`journal.lookup_json` puts it back). Every output's comparison made a
        60-output model's row 39 KB and their encoding a quarter of its search's time (docs/benchmarks.md,
        "Scale, forty-second round"). Where a verdict from the journal is shown, it is judged again in full
        (`Oracle.confirm`: the final set, a failing all-FP32 set)."""
        d: dict = {"passed": self.passed, "worst_set": self.worst_set, "seconds": self.seconds}
        outputs = self.outputs
        if len(outputs) > 1 or self.slimmed:
            worst = self._worst()
            d.update(slim=True, failing=self.failing)
            outputs = {worst: outputs[worst]}
        d["outputs"] = {k: o.to_json() for k, o in outputs.items()}
        if self.screened is not None:
            d["screened"] = list(self.screened)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        outputs = {k: OutputComparison.from_json(k, o) for k, o in d["outputs"].items()}
        screened = d.get("screened")
        v = cls(frozenset(d["fp32"]), bool(d["passed"]), outputs, int(d["worst_set"]), dict(d.get("seconds", {})),
                screened=tuple(int(x) for x in screened) if screened else None)  # type: ignore[arg-type]
        if d.get("slim"):  # `journal_json`: the worst output's comparison, the failing outputs' names
            v.slimmed = True
            v.failing_names = tuple(str(x) for x in d.get("failing", ()))
        return v


@dataclass
class Judged:
    """What a caller that looks closer than the search gets besides the verdict: every set's outputs and
    comparisons (for `run --save-outputs`, the per-tensor report, error histograms)."""

    verdict: Verdict
    outputs: list[dict[str, np.ndarray]]
    comparisons: list[dict[str, OutputComparison]]
    runtimes: list[float]


def summed_seconds(*parts: Mapping[str, float]) -> dict[str, float]:
    """Verdict timings added key by key (a plan judged in parts: a screen's items, then the rest)."""
    keys = {k for p in parts for k in p}
    return {k: sum(p.get(k, 0.0) for p in parts) for k in keys}


RunFn = Callable[[Plan, Feeds, list[str]], Mapping[str, np.ndarray]]


def judge(backend: Backend, plan: Plan, feeds_list: Sequence[Feeds], golden: Sequence[Feeds], tolerance: Tolerance,
          *, keep: bool = False, expected: Sequence[Feeds] | None = None, run: RunFn | None = None,
          lean: bool = False) -> Verdict | Judged:
    """Run `plan` on every input set and compare with golden. `expected`: more tensors to compare per set (e.g.
    intermediate tensors of the FP32 reference); they are reported but only graph outputs decide the verdict.
    `keep`: return a `Judged` with every set's outputs and comparisons (differences kept) instead of the verdict.
    `lean`: comparisons without the summaries only a report shows (a search's verdicts; not with `keep`)."""
    run = run or backend.run
    worst: dict[str, OutputComparison] | None = None
    worst_i, worst_score, passed = 0, (False, -1.0), True
    t_run = t_cmp = 0.0
    kept_outputs, kept_cmp, runtimes = [], [], []
    for i, (feeds, gold) in enumerate(zip(feeds_list, golden)):
        want = dict(gold) if expected is None else {**expected[i], **gold}
        t0 = time.perf_counter()
        outs = run(plan, feeds, list(want))
        t1 = time.perf_counter()
        result = compare_outputs(outs, want, tolerance, keep_diff=keep, lean=lean and not keep)
        t_cmp += time.perf_counter() - t1
        t_run += t1 - t0
        graph = {k: result[k] for k in gold}
        ok = all(r.passed for r in graph.values())
        score = (not ok, max((r.excess for r in graph.values()), default=0.0))  # a failing set is worse
        passed &= ok
        if worst is None or score > worst_score:
            worst, worst_i, worst_score = graph, i, score
        if keep:
            kept_outputs.append({k: outs[k] for k in gold})
            kept_cmp.append(result)
            runtimes.append(t1 - t0)
    verdict = Verdict(plan.fp32, passed, worst or {}, worst_i, {"run": t_run, "compare": t_cmp})
    return Judged(verdict, kept_outputs, kept_cmp, runtimes) if keep else verdict
