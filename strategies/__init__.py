"""Search strategies: pure searches over node names (DESIGN §3).

A strategy is a class constructible with no arguments (options are keyword arguments with defaults) with

    search(candidates, passes, **hints) -> frozenset[str]

``candidates`` are node names in topological order; ``passes(S)`` is True when keeping exactly ``S`` in FP32
(every other candidate FP16) meets tolerance. Optional hints, all ignorable:

- ``scores``: Mapping[str, float], higher = more likely FP16-intolerant;
- ``budget``: int, the most distinct ``passes`` calls; the driver's ``passes`` raises :class:`BudgetExhausted`
  when it is exceeded and strategies let it propagate;
- ``progress``: Callable[[dict], None], called with ``{"phase", "fp32_size", "best", "evaluations"}`` where
  ``best`` is the smallest passing set known so far (or None). An event may carry one more key:
  ``"estimate"``: ``{"evaluations": int, "set_size": int, "diffuse": bool, "advice": str}`` — the strategy's
  forecast of the total evaluations and the FP32 set size, whether the FP16 error looks diffuse (many nodes each
  adding a little) rather than sparse (a few culprits), and a sentence naming cheaper alternatives (loosen the
  tolerance, ``--strategy bisect``, ``--max-evals``). ``auto`` sends it after its first evaluations (when the
  first culprit is isolated) and again when it switches to its diffuse search and when that knows its size;
  on switching it adds ``"ranking_runs"`` (int) where it will ask ``predicted_ranking`` (whose hint says
  ``can_rank``, and may say ``runs``, how many it takes): the emulator runs that ranking costs first, which are
  not evaluations;
- ``batch``: Callable[[list[frozenset[str]]], list[bool]], evaluates independent sets at once;
- ``workers``: int, how many sets one ``batch`` call may usefully hold (sets that run concurrently). Strategies
  send no more per call and may propose that many independent sets per round; without ``batch`` it is ignored;
- ``costs``: Mapping[str, float], FP32 cost per node (e.g. FLOPs: ``bisector.costs.node_costs(model)``); a
  strategy may then prefer a cheaper FP32 set over a smaller one (``auto`` does where that is cheap to do);
- ``excess``: Callable[[frozenset[str]], float | None], how far a set already asked passed or failed: its worst
  output's error in units of the tolerance (above the margin, 1 by default: fails), or None for a set not judged
  yet — asking never costs an evaluation. ``Auto(nearest_miss=True)`` orders its 1-minimality retries by it;
- ``predicted_ranking``: Callable[[Sequence[str], object], list[str] | None], called as
  ``predicted_ranking(first, excess)``: every candidate, ``first`` first, then the rest in the order in which a
  model of the FP16 error says they should go FP32 (most needed first), calibrated so that the model's error of the
  plan keeping ``first`` FP32 equals ``excess`` (None: uncalibrated; or a callable returning it, called only when
  the ranking can be computed, so an evaluation spent on it is never wasted); None where it cannot be had. The driver
  offers it with elementwise checks on every backend (bisector/search/vector_ranking.py: one CPU emulator run per
  candidate alone in FP16 — on a device backend an emulator of the same model, the device judging every plan —
  not evaluations, but not free: call it only when the ranking is needed; bounded by --time-limit). ``auto``
  calls it once, when its search turns diffuse. The driver's list also carries the model behind it as
  ``ranking.model`` (bisector.search.vector_ranking.Prediction; absent from other providers: check with
  ``getattr``): ``model.excess(fp32)`` predicts any plan's excess, ``model.calibrate(fp32, excess)`` rescales it
  to a real verdict, ``model.eliminate(fp32)`` orders a set's members by predicted harm
  (``Auto(predicted_shrink=True)``);
- ``canonical``: Callable[[frozenset[str]], frozenset[str]], the set the driver judges for a set asked: the set
  less its idle FP32 members, which keep nothing FP32 (bisector.fp16.points.IdleFP32: the same values, so the
  same verdict). A strategy that keys its memory by it asks each judged set once and counts what is judged
  (the built-ins do: ``_util.Asker``); the driver reports the answer in this form either way.

Nothing here imports ONNX: strategies only see names.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

__all__ = [
    "BudgetExhausted",
    "Strategy",
    "load_strategies",
    "CountingOracle",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "bisector.strategies"


from bisector.budget import BudgetExhausted  # noqa: E402  (defined in the core: the oracle raises it)


@runtime_checkable
class Strategy(Protocol):
    def search(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        **hints: object,
    ) -> frozenset[str]: ...


def load_strategies() -> dict[str, type]:
    """Every strategy registered under the ``bisector.strategies`` entry-point group, by name."""
    found: dict[str, type] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        found[ep.name] = ep.load()
    return found


class CountingOracle:
    """Wrap a ``passes`` function: cache answers, count distinct sets asked, record the call sequence.

    ``calls`` lists every set asked (repeats included), ``distinct`` counts different sets, ``budget`` makes it
    raise :class:`BudgetExhausted` like the driver does. Useful for tests and benchmarks.
    """

    def __init__(self, passes: Callable[[frozenset[str]], bool], budget: int | None = None,
                 canonical: Callable[[frozenset[str]], frozenset[str]] | None = None) -> None:
        self._passes = passes
        self.budget = budget
        self.cache: dict[frozenset[str], bool] = {}
        self.calls: list[frozenset[str]] = []
        # the set judged for a set asked (the driver's ``canonical`` hint: its oracle drops idle FP32 members);
        # sets with the same one count once, as the oracle judges them once
        self._canonical = canonical

    @property
    def distinct(self) -> int:
        return len(self.cache)

    def __call__(self, fp32: frozenset[str]) -> bool:
        fp32 = frozenset(fp32)
        self.calls.append(fp32)
        if self._canonical is not None:
            fp32 = frozenset(self._canonical(fp32))
        if fp32 not in self.cache:
            if self.budget is not None and len(self.cache) >= self.budget:
                raise BudgetExhausted(f"budget of {self.budget} evaluations spent")
            self.cache[fp32] = bool(self._passes(fp32))
        return self.cache[fp32]

    def batch(self, sets: list[frozenset[str]]) -> list[bool]:
        return [self(s) for s in sets]


def _scores_or_none(scores: object) -> Mapping[str, float] | None:
    if isinstance(scores, Mapping) and scores:
        return scores
    return None
