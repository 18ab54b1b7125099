"""Synthetic oracles for strategy tests and the benchmark (no ONNX): pure functions of the FP32 set."""

from __future__ import annotations

import hashlib
import random
from typing import Callable, Sequence

Oracle = Callable[[frozenset[str]], bool]


def names(n: int) -> list[str]:
    return [f"n{i:04d}" for i in range(n)]


def monotone(culprits: frozenset[str]) -> Oracle:
    """passes(S) iff every culprit is kept FP32."""
    return lambda s: culprits <= s


def either_of_pair(culprits: frozenset[str], pair: tuple[str, str]) -> Oracle:
    """The culprits must be FP32, and at least one node of ``pair`` (either suffices): monotone, two minima."""
    a, b = pair
    return lambda s: culprits <= s and (a in s or b in s)


def poisoned(culprits: frozenset[str], poison: tuple[str, str]) -> Oracle:
    """Non-monotone: culprits needed, but keeping both poison nodes in FP32 together breaks it."""
    p = frozenset(poison)
    return lambda s: culprits <= s and not p <= s


def mismatched_pair(culprits: frozenset[str], pair: tuple[str, str]) -> Oracle:
    """Non-monotone: the two nodes of ``pair`` must be in the same precision (both FP32 or both FP16)."""
    a, b = pair
    return lambda s: culprits <= s and ((a in s) == (b in s))


def random_function(candidates: Sequence[str], seed: int, p_pass: float = 0.5) -> Oracle:
    """An arbitrary (memoised, deterministic) function; all candidates FP32 always passes."""
    everything = frozenset(candidates)

    def f(s: frozenset[str]) -> bool:
        if s == everything:
            return True
        h = hashlib.sha256((str(seed) + "|" + ",".join(sorted(s))).encode()).digest()
        return h[0] < 256 * p_pass

    return f


def noisy(base: Oracle, flip: float, seed: int) -> Oracle:
    """Flips the answer of ``base`` with probability ``flip`` per distinct set (deterministic per set)."""

    def f(s: frozenset[str]) -> bool:
        h = hashlib.sha256((str(seed) + "#" + ",".join(sorted(s))).encode()).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        return (not base(s)) if u < flip else base(s)

    return f


def random_culprits(candidates: Sequence[str], k: int, seed: int) -> frozenset[str]:
    return frozenset(random.Random(seed).sample(list(candidates), k))


def is_one_minimal(passes: Oracle, s: frozenset[str]) -> bool:
    return passes(s) and all(not passes(s - {n}) for n in s)


# ------------------------------------------------------------------ diffuse error (the additive model)
def lognormal_weights(candidates: Sequence[str], sigma: float, seed: int) -> dict[str, float]:
    """Heavy-tailed per-node FP16 error weights: lognormal(0, sigma), deterministic per seed."""
    rng = random.Random(seed)
    return {n: rng.lognormvariate(0.0, sigma) for n in candidates}


def additive(weights: dict[str, float], threshold: float, jitter: float = 0.0, seed: int = 0) -> Oracle:
    """Diffuse error: passes(S) iff the summed weight of the nodes NOT in S (those in FP16) is <= threshold.

    Monotone (a superset of a passing set passes) but not a culprit structure: many minimal sets, of different
    sizes. The smallest passing set keeps the heaviest nodes (see :func:`additive_optimum`). ``jitter`` > 0 adds
    a deterministic per-set error term uniform in ±jitter·threshold (rounding errors do not add exactly), which
    makes the oracle slightly non-monotone near the threshold, as real ones are.
    """
    total = sum(weights.values())
    eps = 1e-9 * max(total, 1e-300)

    def error(s: frozenset[str]) -> float:
        kept = sum(weights[n] for n in s if n in weights)  # the FP16 side's weight is total - kept
        err = total - kept
        if jitter:
            h = hashlib.sha256((str(seed) + "~" + ",".join(sorted(s))).encode()).digest()
            err += jitter * threshold * (2 * int.from_bytes(h[:8], "big") / 2**64 - 1)
        return err

    def f(s: frozenset[str]) -> bool:
        return error(s) <= threshold + eps

    # the `excess` hint (error / tolerance), as the driver offers it for judged sets
    f.excess = lambda s: error(frozenset(s)) / threshold if threshold > 0 else float("inf")  # type: ignore[attr-defined]
    return f


def additive_case(n: int, sigma: float, keep_fraction: float, seed: int) -> tuple[list[str], dict[str, float], float]:
    """Candidates, weights and a threshold under which the smallest passing set is about ``keep_fraction`` × N.

    The threshold is the FP16 weight of all but the ``round(keep_fraction·N)`` heaviest nodes (so exactly that
    many heaviest nodes suffice), which places the answer's size independently of sigma.
    """
    cands = names(n)
    w = lognormal_weights(cands, sigma, seed)
    m = max(1, round(keep_fraction * n))
    light = sorted(w.values())[: n - m]
    return cands, w, sum(light)


def additive_optimum(weights: dict[str, float], threshold: float, costs: dict[str, float] | None = None) -> int:
    """Size of the smallest passing set of :func:`additive` (keep the heaviest nodes until the rest fits).

    ``costs`` is ignored for the size; it is here so callers can share one signature.
    """
    total = sum(weights.values())
    kept = 0.0
    for i, wt in enumerate(sorted(weights.values(), reverse=True)):
        if total - kept <= threshold * (1 + 1e-9):
            return i
        kept += wt
    return len(weights)
