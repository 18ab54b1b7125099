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
