"""Zeller's delta debugging (ddmin) minimising the FP32 set, finished with single-removal sweeps.

The "failure" ddmin preserves is "passes": starting from all candidates (which must pass, else all candidates
are returned), split the current set into n chunks; keep a chunk that passes on its own (n=2), else keep a
complement that passes (n-1), else double the granularity, until chunks are single nodes. A final sweep of
single removals (repeated until stable) makes the result 1-minimal for any oracle.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ._util import Asker, one_minimal


def _split(items: list[str], n: int) -> list[list[str]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


class DDMin:
    name = "ddmin"

    def search(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        **hints: object,
    ) -> frozenset[str]:
        cands = list(candidates)
        ask = Asker(cands, passes, hints)
        ask.phase = "ddmin"
        everything = frozenset(cands)
        if not ask(everything):
            return everything
        current = list(cands)
        if ask(frozenset()):
            return frozenset()
        n = 2
        while len(current) >= 2:
            chunks = _split(current, n)
            reduced = False
            for chunk in chunks:
                if ask(frozenset(chunk)):
                    current, n, reduced = chunk, 2, True
                    break
            if not reduced and n > 2:
                for chunk in chunks:
                    gone = set(chunk)
                    complement = [x for x in current if x not in gone]
                    if ask(frozenset(complement)):
                        current, n, reduced = complement, max(n - 1, 2), True
                        break
            if not reduced:
                if n >= len(current):
                    break
                n = min(2 * n, len(current))
        return one_minimal(ask, frozenset(current))
