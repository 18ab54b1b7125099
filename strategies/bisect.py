"""Polygraphy-style bisection over a contiguous prefix (forward) or suffix (reverse) kept in FP32.

Polygraphy's ``debug precision --mode bisect`` searches the count K of layers kept in higher precision, from the
start (forward) or the end (reverse), assuming that passing is monotone in K. This version fixes its edge cases:
K=0 (everything FP16) is tried first and an empty set is returned if it passes; if only K=N passes, all candidates
are returned; if even K=N fails, all candidates are returned anyway (the driver sees that the final set fails).
About 1 + log2(N) calls. The result is a contiguous prefix or suffix, not a minimal set.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ._util import Asker

_DIRECTIONS = ("forward", "reverse")


class Bisect:
    name = "bisect"

    def __init__(self, direction: str = "forward") -> None:
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, not {direction!r}")
        self.direction = direction

    def block(self, candidates: Sequence[str], k: int) -> frozenset[str]:
        """The FP32 set for count K: the first K (forward) or last K (reverse) candidates."""
        if self.direction == "forward":
            return frozenset(candidates[:k])
        return frozenset(candidates[len(candidates) - k :])

    def search(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        **hints: object,
    ) -> frozenset[str]:
        cands = list(candidates)
        n = len(cands)
        ask = Asker(cands, passes, hints)
        ask.phase = "bisect"
        if ask(self.block(cands, 0)):
            return frozenset()
        lo, hi = 0, n  # lo fails; hi assumed to pass (asked at the end if never confirmed)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ask(self.block(cands, mid)):
                hi = mid
            else:
                lo = mid
        result = self.block(cands, hi)
        if hi == n:
            ask(result)  # K=N: report whether even all-FP32 passes; all candidates either way
        return result
