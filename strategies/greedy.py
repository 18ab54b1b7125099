"""Greedy one-at-a-time removal from all-FP32, then sweeps until the result is 1-minimal for any oracle.

Start from all candidates in FP32 (if that fails, return all candidates); for each candidate in order try to
return it to FP16 and keep the change if the rest still passes. With a non-monotone oracle a later removal can
make an earlier kept node removable, so single-removal sweeps of the result repeat until none passes. N+1 calls
for a monotone oracle plus the checks of the final sweep that were not already asked.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ._util import Asker, greedy_reduce


class Greedy:
    name = "greedy"

    def __init__(self, direction: str = "forward") -> None:
        if direction not in ("forward", "reverse"):
            raise ValueError(f"direction must be 'forward' or 'reverse', not {direction!r}")
        self.direction = direction

    def search(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        **hints: object,
    ) -> frozenset[str]:
        cands = list(candidates)
        ask = Asker(cands, passes, hints)
        ask.phase = "greedy"
        everything = frozenset(cands)
        if not ask(everything):
            return everything
        order = cands if self.direction == "forward" else cands[::-1]
        return greedy_reduce(ask, everything, order)
