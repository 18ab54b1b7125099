"""The search driver: loads a strategy plugin, hands it `passes`, and turns its answer into a checked result."""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Sequence

from bisector.errors import AccuracyFailure, UsageError
from bisector.search.judge import Verdict
from bisector.search.oracle import BudgetExhausted, Oracle
from bisector.search.unreachable import Unreachable, fp32_for_output, unreachable_outputs
from bisector.search.vector_ranking import RankingHint

log = logging.getLogger("bisector")

GROUP = "bisector.strategies"


def available_strategies() -> dict[str, Any]:
    """name -> entry point, built-ins and third-party plugins alike."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_strategy_class(name: str):
    eps = available_strategies()
    if name not in eps:
        raise UsageError(f"unknown strategy {name!r}; installed: {', '.join(sorted(eps)) or 'none'}")
    try:
        return eps[name].load()
    except Exception as exc:
        raise UsageError(f"strategy plugin {name!r} failed to load: {exc}") from None


def load_strategy(name: str, options: dict[str, Any] | None = None):
    cls = load_strategy_class(name)
    accepted = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in (options or {}).items() if v is not None and k in accepted}
    return cls(**kwargs)


@dataclass
class SearchResult:
    fp32: frozenset[str]
    passed: bool
    minimal: bool
    verdict: Verdict
    strategy: str
    stop_reason: str | None = None
    seconds: float = 0.0
    evaluations: dict[str, int] = field(default_factory=dict)
    rounds: int = 0  # sequential rounds of new evaluations (= new evaluations without an executor)
    workers: int = 1
    unreachable: dict[str, Unreachable] = field(default_factory=dict)  # outputs no FP16 value meets (see there)


def continued(found: SearchResult, then: SearchResult) -> SearchResult:
    """`then` (a search on from `found`'s set: the second opinion's, the held-out inputs' growth) as the result of
    the whole: its set and verdict, both searches' evaluations and rounds; the time stays the first search's (the
    record of the search on from it keeps its own)."""
    merged = dict(found.evaluations)
    for k in ("total", "new"):
        merged[k] = merged.get(k, 0) + then.evaluations.get(k, 0)
    return SearchResult(then.fp32, then.passed, then.minimal, then.verdict, found.strategy, then.stop_reason,
                        found.seconds, merged, found.rounds + then.rounds, found.workers, found.unreachable)


def run_search(
    oracle: Oracle,
    strategy_name: str,
    strategy_options: dict[str, Any] | None = None,
    hints: dict[str, Any] | None = None,
    progress: Callable[[dict], None] | None = None,
    start: frozenset[str] | None = None,
) -> SearchResult:
    """Search with `strategy_name`. `start`: an FP32 set found elsewhere (on emulate, or for an earlier model) to
    confirm and, where needed, extend or shrink, instead of searching from scratch."""
    strategy = load_strategy(strategy_name, strategy_options)
    t0 = time.perf_counter()
    candidates = oracle.candidates
    stop_reason = None
    # All-FP32 first: if even that fails, no FP32 set can help and the user needs the reason, not a search.
    try:
        # judged even when --time-limit is already spent (setup took it): without it nothing can be reported
        top = oracle.evaluate(frozenset(candidates), count=False)
    except BudgetExhausted as exc:
        raise AccuracyFailure(f"the budget ran out before any evaluation ({exc})") from None
    if not top.passed:
        if top.slimmed:  # from the journal, which keeps only the worst output's comparison: the message names them all
            top = oracle.confirm(frozenset(candidates))
        worst = ", ".join(
            f"{n} ({r.reason})" if r.reason else
            f"{n} (needs abs {r.required_abs:.3g} / rel {r.required_rel:.3g}; tolerance {r.atol:g}/{r.rtol:g}"
            + (f" times --margin {r.margin:g}" if r.margin < 1 else "") + ")"
            for n, r in top.outputs.items() if not r.passed
        )
        raise AccuracyFailure(
            "nothing passes, not even with every candidate FP32: failing output(s) " + worst + ". If the golden "
            "outputs were loaded (--load-outputs), first check they came from the same inputs (--load-inputs, or the "
            "same --seed/--val-range/--input-shapes), the same model and an FP32 runner (--onnxrt). Otherwise the "
            "difference comes from outside the candidates (pinned nodes, the backend itself) or the tolerance is tighter than "
            "FP32 run-to-run noise; loosen --atol/--rtol or check the pinned nodes with `bisector inspect`."
        )
    all_hints = {k: v for k, v in (hints or {}).items() if v is not None}
    if progress is not None:
        all_hints["progress"] = progress
    if oracle.budget.max_evals is not None:
        all_hints.setdefault("budget", oracle.budget.max_evals)
    # Independent sets of one call are judged at once on the oracle's executor (--workers/--ray; one after
    # another without one); `workers` tells the strategy how many sets a round may usefully hold.
    all_hints.setdefault("batch", lambda sets: [v.passed for v in oracle.evaluate_many(list(sets))])
    all_hints.setdefault("workers", oracle.workers)
    # How far an asked set passed or failed (error / tolerance): strategies may order their next questions by it
    all_hints.setdefault("excess", lambda fp32: _known_excess(oracle, fp32))
    # A ranking predicted from each candidate's own output error (emulator runs, no evaluations), computed only
    # when a strategy asks (auto: when its search turns diffuse); None where the backend cannot provide it
    ranking: dict[str, Any] = {}  # what the ranking cost, for the report (runs are not evaluations)
    all_hints.setdefault("predicted_ranking", RankingHint(oracle, ranking, progress=progress))
    if oracle.idle is not None:  # the set the oracle judges for a set asked: a strategy's memo counts what is judged
        all_hints.setdefault("canonical", oracle.canonical)
    # Nodes every passing set holds (an output no FP16 value meets): FP32 from the start, the search is over the
    # rest. A set confirmed elsewhere (`start`) is searched as it comes: where it lacks them, its extension adds them.
    unreachable = _unreachable(oracle, keep=start is None)
    kept = frozenset(n for u in unreachable.values() if u.kept for n in u.nodes)
    try:
        if kept:
            rest = [n for n in candidates if n not in kept]
            hints_ = {k: v for k, v in all_hints.items() if k != "predicted_ranking"}
            answer = kept | _search_with(strategy, kept, rest, oracle, hints_, all_hints.get("predicted_ranking"))
            # the proof made literal: each kept node's removal is judged (it fails), so 1-minimality is shown by
            # verdicts as for every other member
            oracle.evaluate_many([answer - {n} for n in sorted(kept)])
        elif start is None:
            answer = frozenset(strategy.search(candidates, oracle.passes, **all_hints))
        else:
            answer = _search_from(strategy, frozenset(start), candidates, oracle, all_hints)
    except BudgetExhausted as exc:
        stop_reason = str(exc)
        answer = oracle.best_passing() or frozenset(candidates)
    unknown = answer.difference(candidates)
    if unknown:
        raise UsageError(f"strategy {strategy_name!r} returned names that are not candidates: {sorted(unknown)}")
    answer = oracle.canonical(answer)  # the set judged for it: no idle FP32 member
    # The reported verdict is judged in this run: one from the journal of an earlier run is judged again (skipped
    # only when --time-limit is spent; the journal's rows are checksummed either way).
    verdict = oracle.evaluate(answer, count=False) if oracle.budget.spent() else oracle.confirm(answer)
    minimal = verdict.passed and stop_reason is None and not removable(oracle, answer, judge_missing=False)
    return SearchResult(
        fp32=answer,
        passed=verdict.passed,
        minimal=bool(minimal),
        verdict=verdict,
        strategy=strategy_name,
        stop_reason=stop_reason,
        seconds=time.perf_counter() - t0,
        evaluations={"total": oracle.total, "new": oracle.new, "cached": oracle.cached,
                     "emulator_runs": int(ranking.get("runs", 0)),
                     "screened": oracle.screen.screened if oracle.screen is not None else 0},
        rounds=oracle.rounds,
        workers=oracle.workers,
        unreachable=unreachable,
    )


# Backends whose FP16 nodes store FP16 values at the outputs (the emulator; ORT-CUDA runs the mixed model, FP16
# tensors): there an unreachable output proves its nodes necessary. TensorRT may fuse an FP16 layer with the
# output's FP32 reformat, so there the nodes are named, not kept.
_STORES_FP16 = ("emulate", "ort-cuda")


def _unreachable(oracle: Oracle, keep: bool = True) -> dict[str, Unreachable]:
    """`unreachable_outputs` of the oracle's golden outputs that a candidate can store in FP16, each with the
    nodes it needs FP32 (warned about where some value is unreachable). An output no candidate computes (a graph
    input, a pinned node's) is never FP16: left out, as are all of them where the backend has no model. `keep`:
    the search may keep the nodes FP32 from the start (where the backend stores FP16 values)."""
    backend = oracle.backend
    catalog = getattr(backend, "catalog", None)
    if catalog is None:
        return {}
    stores = keep and getattr(backend, "name", None) in _STORES_FP16 and getattr(backend, "storage", "fp16") == "fp16"
    candidates = set(oracle.candidates)
    found = {}
    for name, u in unreachable_outputs(oracle.golden, oracle.tolerance).items():
        u.nodes = [n for n in fp32_for_output(catalog, name) if n in candidates]
        if not u.nodes:
            continue
        u.kept = stores and bool(u.elements)
        found[name] = u
        if u.elements:
            log.warning("%s", u.message())
    return found


def removable(oracle: Oracle, answer: frozenset[str], judge_missing: bool = True) -> list[str]:
    """The nodes of `answer` whose single removal still passes (or was never judged), in candidate order.

    1-minimal is claimed only when proven by verdicts actually judged: every single removal tried and failed.
    Strategy-agnostic, so a third-party plugin cannot claim it by accident. `judge_missing`: judge removals the
    search did not ask (verify --check-minimal); otherwise an unjudged removal counts as not proven."""
    members = [c for c in oracle.candidates if c in answer]
    if judge_missing:  # independent sets: judged at once on the oracle's executor
        verdicts = oracle.evaluate_many([answer - {n} for n in members], count=False)
    else:
        verdicts = [oracle.verdict_of(answer - {n}) for n in members]
    return [n for n, v in zip(members, verdicts) if v is None or v.passed]


def _known_excess(oracle: Oracle, fp32) -> float | None:
    """The excess of a set the oracle has judged (None when it has not: a hint never costs an evaluation). A
    verdict that failed on a few batch items (bisector.search.screen) holds their excess, a lower bound: the
    set is judged on the whole batch for the hint (one run, not an evaluation), so that a strategy calibrating
    on it searches as it would have judging whole batches."""
    verdict = oracle.verdict_of(fp32)
    if verdict is not None and verdict.screened is not None:
        verdict = oracle.whole(frozenset(fp32))
    return None if verdict is None else verdict.excess


def _search_from(strategy, start: frozenset[str], candidates, oracle: Oracle, hints: dict) -> frozenset[str]:
    """Confirm and extend (DESIGN §4a: a CPU-found set checked on a real backend).

    If `start` passes, search only inside it (every other candidate stays FP16): the answer can only shrink.
    If not, `start` stays FP32 while the strategy finds what else must join it, and then the union is searched
    the same way, so the answer is 1-minimal again. When `start` is nearly right this costs a few evaluations
    where a search from scratch costs dozens (each one an engine build on TensorRT)."""
    def within(fp32: frozenset[str]) -> list[str]:
        return [n for n in candidates if n in fp32]

    ranking = hints.get("predicted_ranking")
    hints = {k: v for k, v in hints.items() if k != "predicted_ranking"}  # it ranks all candidates: see below

    if not oracle.passes(start):
        rest = [n for n in candidates if n not in start]
        # The ranking keeps the extension diffuse-aware: without it a diffuse extension is group testing (an
        # emulate set that failed ort-cuda by 13% on a layout detector grew to 124 nodes in 1091 GPU evaluations,
        # where a search from scratch there found 72 in 550; docs/verification.md, "Fifteenth round").
        memo: dict = {}  # the candidates' error vectors, run once for the extension and the shrink
        start = start | _search_with(strategy, start, rest, oracle, hints, ranking, memo)
        if callable(ranking):  # the union is searched as a diffuse search of its own (a set that passed as
            hints["predicted_ranking"] = RankingOf(ranking, within(start), memo=memo)  # found is shrunk as before)
    return frozenset(strategy.search(within(start), oracle.passes, **hints))


def _search_with(strategy, kept: frozenset[str], rest: list[str], oracle: Oracle, hints: dict, ranking: Any,
                 memo: dict | None = None) -> frozenset[str]:
    """The strategy's answer over `rest` while `kept` stays FP32: every set it asks (one at a time or in a batch,
    and the sets its hints speak of) is asked with `kept`; `ranking` (the predicted-ranking hint) ranks with `kept`
    first (`RankingOf`)."""
    inner = dict(hints)
    batch = hints.get("batch")
    if callable(batch):
        inner["batch"] = lambda sets: batch([frozenset(s) | kept for s in sets])
    excess = hints.get("excess")
    if callable(excess):
        inner["excess"] = lambda s: excess(frozenset(s) | kept)
    canonical = hints.get("canonical")
    if callable(canonical):
        inner["canonical"] = lambda s: canonical(frozenset(s) | kept) - kept
    if callable(ranking):
        inner["predicted_ranking"] = RankingOf(ranking, rest, kept=kept, memo=memo)
    progress = hints.get("progress")
    if callable(progress):
        inner["progress"] = lambda event: progress(_with_kept(event, kept))
    return frozenset(strategy.search(rest, lambda s: oracle.passes(frozenset(s) | kept), **inner))


def _with_kept(event: dict, kept: frozenset[str]) -> dict:
    """A strategy's progress event about sets over the rest, as sets of the whole plan (`kept` in each)."""
    event = dict(event)
    if event.get("best") is not None:
        event["best"] = frozenset(event["best"]) | kept
    if isinstance(event.get("fp32_size"), int):
        event["fp32_size"] += len(kept)
    estimate = event.get("estimate")
    if isinstance(estimate, dict) and isinstance(estimate.get("set_size"), int):
        event["estimate"] = {**estimate, "set_size": estimate["set_size"] + len(kept)}
    return event


class RankingOf:
    """The ``predicted_ranking`` hint for a search over a subset of the candidates (`members`) while `kept` stays
    FP32 and every other candidate FP16 — the searches `_search_from` runs: the hint's ranking with `kept` first
    (so its greedy order and its calibration are those of the plan keeping `kept` FP32: the excess the strategy
    hands over is that plan's, `passes(s | kept)`), restricted to `members`. No model behind it (the shrink's
    predicted order would be calibrated on the wrong plans)."""

    def __init__(self, hint: Any, members: Sequence[str], kept: frozenset[str] = frozenset(),
                 memo: dict | None = None):
        self._hint, self._members, self._kept, self._memo = hint, list(members), sorted(kept), memo
        self.can_rank = getattr(hint, "can_rank", False)
        self.exact_backend = getattr(hint, "exact_backend", False)
        self.runs = getattr(hint, "runs", None)
        self.stats = getattr(hint, "stats", None)

    def __call__(self, first: Sequence[str] = (), excess: Any = None) -> list[str] | None:
        head = self._kept + [n for n in first if n not in self._kept]
        rank = self._hint(head, excess, memo=self._memo) if self._memo is not None else self._hint(head, excess)
        if rank is None:
            return None
        members = set(self._members)
        return [n for n in rank if n in members]
