"""`gt`'s posterior and group-size arithmetic (shared by `auto`): the kept terms give the bits of the plain sums,
so a search asks the same plans as before they were kept (a resumed search replays its journal only if so)."""

from __future__ import annotations

import math
import random

from bisector.strategies.gt import GroupTesting, _Posterior


def _plain_posterior(s: GroupTesting, n_total: int, n_found: int, u: int) -> list[tuple[int, float]]:
    """The posterior as written before the forty-second round: prior and log-binomials by the formulas."""
    def log_comb(n, k):
        return -math.inf if k < 0 or k > n else math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)

    logw, top = [], -math.inf
    for m in range(u + 1):
        k = n_found + m
        lw = (k * math.log(s.prior_decay) - s.prior_power * math.log(k + 1)) + log_comb(u, m) - log_comb(n_total, k)
        logw.append((m, lw))
        top = max(top, lw)
        if m > 4 and lw < top - 40:
            break
    weights = [(m, math.exp(lw - top)) for m, lw in logw]
    z = sum(w for _, w in weights)
    return [(m, w / z) for m, w in weights]


def _plain_p_clean(post, u: int, g: int) -> float:
    lg = math.lgamma
    total = 0.0
    for m, w in post:
        if m <= u - g:
            total += w * math.exp((lg(u - g + 1) - lg(m + 1) - lg(u - g - m + 1)) - (lg(u + 1) - lg(m + 1) - lg(u - m + 1)))
    return total


def test_kept_terms_give_the_bits_of_the_plain_sums():
    rng = random.Random(7)
    checked = 0
    for _ in range(150):
        s = GroupTesting(prior_decay=rng.choice([0.5, 0.7, 1.0]), prior_power=rng.choice([0.0, 1.5]))
        n = rng.randint(1, 2500)
        found = rng.randint(0, n)
        u = rng.randint(1, max(1, n - found)) if n > found else 0
        post = s._posterior(n, found, u)
        assert isinstance(post, _Posterior) and list(post) == _plain_posterior(s, n, found, u)
        for g in rng.sample(range(1, u + 1), min(u, 12)) if u else []:
            want = _plain_p_clean(post, u, g)
            assert s._p_clean(post, u, g) == want  # computed
            assert s._p_clean(post, u, g) == want  # remembered
            assert s._p_clean(list(post), u, g) == want  # a plain list of the same pairs: the general path
            checked += 1
    assert checked > 500


def test_group_sizes_are_those_of_the_plain_arithmetic():
    s = GroupTesting()
    for n, found, u in ((1200, 300, 600), (1200, 0, 1200), (64, 3, 20), (5000, 40, 4000)):
        post = s._posterior(n, found, u)
        plain = _plain_posterior(s, n, found, u)

        def closest(f, lo, hi):
            a, b = lo, hi
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (mid, b) if f(mid) >= 0.5 else (a, mid)
            return min((a, b), key=lambda x: (abs(f(x) - 0.5), x))

        assert s._group_size(post, u) == closest(lambda g: _plain_p_clean(plain, u, g), 1, u)


def test_one_posterior_holds_its_terms_at_a_time():
    """The terms cost memory (~100 bytes a pair; 64 cached posteriors of a 1200-node chain held ~4 MB of them):
    only the posterior asked last keeps them, and its answers stay the same when they are computed again."""
    s = GroupTesting()
    a, b = s._posterior(1200, 100, 800), s._posterior(1200, 101, 799)
    first = s._p_clean(a, 800, 37)
    s._p_clean(b, 799, 37)
    assert a._terms is None and b._terms is not None
    a.clean.clear()
    assert s._p_clean(a, 800, 37) == first and b._terms is None
