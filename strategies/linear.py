"""Polygraphy-style linear search: grow a contiguous FP32 prefix (forward) or suffix (reverse) K = 0, 1, 2, ...

Stops at the first passing K; up to N+1 calls. If no K passes, returns all candidates (the driver sees that the
final set fails). The result is a contiguous block, not a minimal set.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ._util import Asker
from .bisect import Bisect


class Linear:
    name = "linear"

    def __init__(self, direction: str = "forward") -> None:
        self._block = Bisect(direction)
        self.direction = direction

    def search(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        **hints: object,
    ) -> frozenset[str]:
        cands = list(candidates)
        ask = Asker(cands, passes, hints)
        ask.phase = "linear"
        for k in range(len(cands) + 1):
            s = self._block.block(cands, k)
            if ask(s):
                return s
        return frozenset(cands)
