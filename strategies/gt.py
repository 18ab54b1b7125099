"""``gt``: adaptive group testing (generalised binary splitting with an estimated number of culprits).

This is the ``auto`` of before issue 15, kept as ``gt`` for comparison; the new ``auto`` (auto.py) runs the same
search, with the same calls, while the error looks sparse, and switches to a ranked search when it is diffuse.

The search view
---------------
At any time the candidates are split into *D* (culprits found: must stay FP32), *U* (undecided) and cleared
nodes (proven to be fine in FP16 together). Testing a group ``G ⊆ U`` means asking ``passes(D ∪ (U − G))``:
everything undecided except ``G`` stays FP32, so for a monotone oracle (``passes(S)`` iff culprits ⊆ S) the
answer is True exactly when ``G`` holds no culprit. A clean group is cleared at once; a contaminated group is
halved until one culprit is isolated (Hwang's generalised binary splitting). The group size is chosen from a
posterior over the number of culprits still in ``U``: with a prior P(k) on the total and the observations so
far (|D| culprits found, the rest of the cleared nodes clean), P(m remaining) ∝ P(|D|+m)·C(|U|, m)/C(N, |D|+m),
and the group is the size (a power of two, or all of ``U``) whose chance of being clean is most uncertain —
the test that carries the most information. Testing all of ``U`` is the question "are we done?", which is
literally ``passes(D)``: when it passes it is the final ``passes(R)`` check; when it fails just before the
last culprit is found it is literally ``passes(R − {c})`` for that culprit.

Verification (why the result is 1-minimal for any oracle)
---------------------------------------------------------
No inference from monotonicity is trusted for the result: at the end ``passes(R)`` and every ``passes(R − {n})``
are asked literally (re-asking a set costs nothing: the driver and this class both cache). If ``R`` fails or a
removal passes — only possible for a non-monotone oracle — the result is repaired: greedy removal from the
smallest passing set seen (or all candidates), then single-removal sweeps until stable.

Scores
------
With informative ``scores`` (higher = more likely FP16-intolerant) candidates are visited in descending score
order and the top ones are tested individually as long as each is a culprit; the first clean one ends that
phase and the rest goes through group testing (still in score order, so likely culprits share groups).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from ._util import Asker, repair


class _AllFail(Exception):
    """Even all candidates in FP32 fail: nothing to search."""


_LGAMMA: list[float] = [math.inf]  # _LGAMMA[i] == math.lgamma(i) for i >= 1 (a pole at 0), filled on demand


def _lgammas(n: int) -> list[float]:
    """math.lgamma(i) for i < n at least, as a list: the posterior's sums ask the same few thousand values
    millions of times in a long diffuse search (a 1200-node chain: 11 M lgamma calls, ~10% of its wall)."""
    if len(_LGAMMA) < n:
        _LGAMMA.extend(math.lgamma(i) for i in range(len(_LGAMMA), n))
    return _LGAMMA


def _log_comb(n: int, k: int) -> float:
    if k < 0 or k > n:
        return -math.inf
    lg = _lgammas(n + 2)
    return lg[n + 1] - lg[k + 1] - lg[n - k + 1]


POST_CACHE_SIZE = 64  # posteriors remembered (`_posterior`)


class _Posterior(list):
    """A posterior over the culprits left among ``u`` undecided nodes, as (m, weight) pairs (a plain list to its
    readers), with what `_p_clean` asks of it kept once: the terms of m that do not depend on the group size, and
    the answers so far. A diffuse search chooses thousands of group sizes, each by a binary search of `_p_clean`
    over sizes, each a sum over hundreds of m (a 1200-node chain: 13 000 sums, 8% of its wall); the same
    operations in the same order, so the same bits."""

    __slots__ = ("u", "clean", "_terms")
    # The one posterior whose terms are kept: 64 cached posteriors' terms held 39 000 tuples (~4 MB) on that chain,
    # and the binary search of one group size asks one posterior
    _holder: list["_Posterior | None"] = [None]

    def __init__(self, pairs: list[tuple[int, float]], u: int) -> None:
        super().__init__(pairs)
        self.u = u
        self.clean: dict[int, float] = {}  # group size -> P(clean)
        self._terms: list[tuple[int, float, float, float]] | None = None

    def terms(self) -> list[tuple[int, float, float, float]]:
        """(m, weight, lgamma(m + 1), log C(u, m)) for each pair, the last computed as `_p_clean` computes it."""
        if self._terms is None:
            held = self._holder[0]
            if held is not None:
                held._terms = None
            u, lg = self.u, _lgammas(self.u + 2)
            self._terms = [(m, w, lg[m + 1], lg[u + 1] - lg[m + 1] - lg[u - m + 1]) for m, w in self]
            self._holder[0] = self
        return self._terms


class GroupTesting:
    """Adaptive group testing with a 1-minimal, literally verified result.

    Options: ``prior_decay``, ``prior_power`` — the prior over the total number of culprits k is
    P(k) ∝ decay^k · (k+1)^-power (default geometric, decay 0.7: small k likely, any k possible; tuned on the
    synthetic benchmark); ``power_of_two`` — restrict group sizes to powers of two (Hwang) instead of any size;
    ``smart_split`` — split contaminated groups where P(first part clean) ≈ 1/2 rather than in halves;
    ``use_scores`` — follow the ``scores`` hint when given.
    """

    name = "gt"

    def __init__(
        self,
        prior_decay: float = 0.7,
        use_scores: bool = True,
        power_of_two: bool = False,
        smart_split: bool = True,
        prior_power: float = 0.0,
    ) -> None:
        self.prior_power = prior_power
        self.power_of_two = power_of_two
        self._post_cache: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
        self.smart_split = smart_split
        if not 0.0 < prior_decay <= 1.0:
            raise ValueError("prior_decay must be in (0, 1]")
        self.prior_decay = prior_decay
        self.use_scores = use_scores

    # ------------------------------------------------------------------ posterior
    def _posterior(self, n_total: int, n_found: int, n_undecided: int) -> list[tuple[int, float]]:
        """P(m culprits remain among the undecided), as (m, weight) pairs that sum to 1."""
        key = (n_total, n_found, n_undecided)
        cached = self._post_cache.get(key)
        if cached is not None:
            return cached
        u = n_undecided
        logw: list[tuple[int, float]] = []
        top = -math.inf  # the largest log-weight so far
        # log P(k) = k·log(decay) − power·log(k + 1) for k = n_found + m, + log C(u, m) − log C(n_total, k), the
        # log-binomials from the lgamma table inline: the same operations in the same order as through `_log_comb`
        # (log(decay) is the same float each time), in a third of the time
        lg = _lgammas(max(u, n_total) + 2)
        log_decay, power = math.log(self.prior_decay), self.prior_power
        for m in range(0, u + 1):
            k = n_found + m
            comb_total = lg[n_total + 1] - lg[k + 1] - lg[n_total - k + 1] if k <= n_total else -math.inf
            lw = ((k * log_decay - power * math.log(k + 1)) + (lg[u + 1] - lg[m + 1] - lg[u - m + 1])
                  - comb_total)
            logw.append((m, lw))
            top = max(top, lw)
            if m > 4 and lw < top - 40:  # the tail is negligible
                break
        weights = [(m, math.exp(lw - top)) for m, lw in logw]
        z = sum(w for _, w in weights)
        post = _Posterior([(m, w / z) for m, w in weights], u)
        # A diffuse search visits thousands of (found, undecided) states, each posterior up to `undecided` long
        # (a 1200-node chain: 1.2 M pairs, 51 MB); repeats come from the state just asked, so a few suffice
        if len(self._post_cache) >= POST_CACHE_SIZE:
            self._post_cache.clear()
        self._post_cache[key] = post
        return post

    @staticmethod
    def _p_clean(post: list[tuple[int, float]], u: int, g: int) -> float:
        """P(a given group of g undecided nodes holds no culprit)."""
        lg = _lgammas(u + 2)
        if isinstance(post, _Posterior) and post.u == u:
            known = post.clean.get(g)
            if known is not None:
                return known
            total, head, limit = 0.0, lg[u - g + 1], u - g
            for m, w, lg_m, comb in post.terms():  # m ascending
                if m > limit:
                    break
                total += w * math.exp((head - lg_m - lg[limit - m + 1]) - comb)  # as below, term by term
            post.clean[g] = total
            return total
        total = 0.0
        for m, w in post:
            if m <= u - g:  # _log_comb(u - g, m) - _log_comb(u, m), inlined (same operations, same order)
                total += w * math.exp((lg[u - g + 1] - lg[m + 1] - lg[u - g - m + 1])
                                      - (lg[u + 1] - lg[m + 1] - lg[u - m + 1]))
        return total

    def _closest_half(self, f: Callable[[int], float], lo: int, hi: int) -> int:
        """The size in [lo, hi] whose (non-increasing) probability f(size) is closest to 1/2."""
        a, b = lo, hi
        while b - a > 1:  # f(a) >= 1/2 > f(b) after the loop, when both ends straddle 1/2
            mid = (a + b) // 2
            if f(mid) >= 0.5:
                a = mid
            else:
                b = mid
        return min((a, b), key=lambda x: (abs(f(x) - 0.5), x))

    def _group_size(self, post: list[tuple[int, float]], u: int) -> int:
        if self.power_of_two:
            best_g, best_d = u, 2.0
            g = 1
            sizes = []
            while g < u:
                sizes.append(g)
                g *= 2
            sizes.append(u)
            for g in sizes:
                d = abs(self._p_clean(post, u, g) - 0.5)
                if d < best_d - 1e-12:
                    best_g, best_d = g, d
            return best_g
        return self._closest_half(lambda g: self._p_clean(post, u, g), 1, u)

    def _split_size(self, post: list[tuple[int, float]], u: int, g: int) -> int:
        """For a contaminated group of g: the first-part size h whose P(clean | group contaminated) ≈ 1/2."""
        if g <= 2 or not self.smart_split:
            return g // 2
        pg = self._p_clean(post, u, g)
        if pg >= 1.0 - 1e-12:
            return g // 2

        def f(h: int) -> float:
            return (self._p_clean(post, u, h) - pg) / (1.0 - pg)

        return self._closest_half(f, 1, g - 1)

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
        order = self._order(cands, hints.get("scores"))
        n_total = len(order)

        found: list[str] = []  # D, in discovery order
        undecided: list[str] = list(order)  # U, in visiting order
        seen_pass = False
        in_phase1 = False  # phase 1 ends at its first pass: its isolations need no all-FP32 sanity check

        def test(group: Sequence[str]) -> bool:
            """True when ``group`` (⊆ U) can go FP16 together with everything already cleared."""
            nonlocal seen_pass
            gone = set(group)
            ok = ask(frozenset(found) | frozenset(x for x in undecided if x not in gone))
            seen_pass = seen_pass or ok
            return ok

        def isolate(group: list[str]) -> None:
            """``group`` ⊆ U is contaminated: halve it until one culprit is isolated; clear clean halves."""
            nonlocal undecided, seen_pass
            while len(group) > 1:
                post = self._posterior(n_total, len(found), len(undecided))
                half = group[: self._split_size(post, len(undecided), len(group))]
                if test(half):
                    gone = set(half)
                    undecided = [x for x in undecided if x not in gone]
                    group = group[len(half) :]
                else:
                    group = half
            culprit = group[0]
            if not seen_pass and not in_phase1:
                # Nothing has passed yet: make sure all-FP32 passes at all before trusting any isolation.
                if not ask(frozenset(cands)):
                    raise _AllFail
                seen_pass = True
            found.append(culprit)
            undecided = [x for x in undecided if x != culprit]
            ask.report(len(found))

        try:
            # Phase 1 (only with informative scores): test the top-scored nodes one by one while they are culprits.
            if order is not cands:
                ask.phase = "scores"
                in_phase1 = True
                while undecided:
                    if test(undecided[:1]):
                        undecided = undecided[1:]
                        break
                    isolate(undecided[:1])
                in_phase1 = False
                # Are the top-scored culprits all of them? (When yes, this is the final passes(R) check.)
                if found and undecided and test(undecided):
                    undecided = []

            # Phase 2: generalised binary splitting with a posterior-chosen group size.
            ask.phase = "split"
            while undecided:
                post = self._posterior(n_total, len(found), len(undecided))
                g = self._group_size(post, len(undecided))
                group = undecided[:g]
                if test(group):
                    gone = set(group)
                    undecided = [x for x in undecided if x not in gone]
                    continue
                isolate(group)
        except _AllFail:
            return frozenset(cands)

        result = frozenset(found)
        return repair(ask, result, order)

    def _order(self, cands: list[str], scores: object) -> list[str]:
        if not self.use_scores or not isinstance(scores, Mapping) or not scores:
            return cands
        vals = {n: float(scores.get(n, 0.0)) for n in cands}  # type: ignore[arg-type]
        if len(set(vals.values())) <= 1:
            return cands
        idx = {n: i for i, n in enumerate(cands)}
        return sorted(cands, key=lambda n: (-vals[n], idx[n]))
