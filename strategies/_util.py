"""Helpers shared by the built-in strategies: a memoising asker and the 1-minimal cleanup."""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Callable, Iterable, Mapping, Sequence

from bisector.packed_sets import SetMemo


WITNESS_WINDOW = 256  # answers of each kind `Asker.non_monotone` compares a new answer with


class Asker:
    """Asks ``passes`` at most once per set, remembers answers, tracks the best passing set, reports progress.

    The driver caches as well; this local memo keeps the strategy's own bookkeeping (which sets it has asked)
    independent of the driver, so decisions never depend on anything but the answers.
    """

    def __init__(
        self,
        candidates: Sequence[str],
        passes: Callable[[frozenset[str]], bool],
        hints: Mapping[str, object],
    ) -> None:
        self.candidates = list(candidates)
        self.index = {n: i for i, n in enumerate(self.candidates)}
        self._passes = passes
        # every set asked, as a bit mask over the candidates (a diffuse search asks thousands of sets of
        # thousands of nodes: as frozensets they weighed more than the model's inference; packed_sets)
        self.memo: SetMemo = SetMemo(self.candidates)
        self.best: frozenset[str] | None = None
        self.phase = "start"
        progress = hints.get("progress")
        self._progress = progress if callable(progress) else None
        batch = hints.get("batch")
        self._batch = batch if callable(batch) else None
        workers = hints.get("workers")
        # how many sets one batch call may usefully hold (None: no limit); without ``batch`` there is no batching
        self.workers: int | None = workers if isinstance(workers, int) and workers >= 1 else None
        self.rounds = 0  # batch calls + single calls made (a measure of wall time when sets run concurrently)
        excess = hints.get("excess")
        # the ``excess`` hint: error / tolerance of a set already asked (how far it passed or failed), or None
        self._excess = excess if callable(excess) else None
        canonical = hints.get("canonical")
        # the ``canonical`` hint: the set the oracle judges for a set asked (less its idle FP32 members: the same
        # values): the memo is kept by it, so it counts what is judged
        self._canonical = canonical if callable(canonical) else None
        # Whether the answers so far show the oracle is not monotone: a set passed whose FP32 members are a
        # proper subset of a set that failed (more FP32, yet a failure). Checked against the last WITNESS_WINDOW
        # answers of each kind (bit masks: an AND each), so it costs nothing a search would notice. A monotone
        # oracle never shows one; real ones near the tolerance do (rounding errors that cancel), and that is where
        # `pair_removals` can find a smaller set.
        self.non_monotone = False
        self._recent: tuple[deque[int], deque[int]] = (deque(maxlen=WITNESS_WINDOW), deque(maxlen=WITNESS_WINDOW))

    # ------------------------------------------------------------------ asking
    def _record(self, s: frozenset[str], ok: bool, key=None) -> None:
        key = self.memo.key(s) if key is None else key
        self.memo.set_key(key, ok)
        if not self.non_monotone and isinstance(key, bytes):
            self._witness(int.from_bytes(key, "little"), ok)
        if ok and (self.best is None or len(s) < len(self.best)):
            self.best = s
        self.report(len(s))

    def _witness(self, mask: int, ok: bool) -> None:
        passed, failed = self._recent
        if ok:  # a passing set inside a failed one
            self.non_monotone = any(mask & f == mask for f in failed)
            passed.append(mask)
        else:  # a failing set holding a passed one
            self.non_monotone = any(p & mask == p for p in passed)
            failed.append(mask)

    def canon(self, s: Iterable[str]) -> frozenset[str]:
        """`s` as the oracle judges it (the ``canonical`` hint), else as it is."""
        s = frozenset(s)
        return frozenset(self._canonical(s)) if self._canonical is not None else s

    def __call__(self, s: Iterable[str]) -> bool:
        s = self.canon(s)
        key = self.memo.key(s)
        known = self.memo.get_key(key)
        if known is not None:
            return known
        self.rounds += 1
        ok = bool(self._passes(s))
        self._record(s, ok, key)
        return ok

    @property
    def parallel(self) -> int:
        """Sets per round worth proposing: the ``workers`` hint when ``batch`` is offered, else 1."""
        if self._batch is None:
            return 1
        return self.workers or 1

    def emit(self, event: Mapping[str, object]) -> None:
        """Send an extra event (e.g. ``{"estimate": {...}}``) through the ``progress`` hint, with the usual keys."""
        if self._progress is not None:
            d: dict[str, object] = {
                "phase": self.phase,
                "fp32_size": None,
                "best": self.best,
                "evaluations": len(self.memo),
            }
            d.update(event)
            self._progress(d)

    def many(self, sets: Sequence[Iterable[str]]) -> list[bool]:
        """Answers for several independent sets; uses the ``batch`` hint when the driver offers one."""
        fsets = [self.canon(s) for s in sets]
        todo: list[frozenset[str]] = []
        seen: set[frozenset[str]] = set()
        for s in fsets:
            if s not in self.memo and s not in seen:
                seen.add(s)
                todo.append(s)
        if todo:
            if self._batch is not None and len(todo) > 1:
                step = self.workers or len(todo)  # no more sets per call than the driver can run at once
                for i in range(0, len(todo), step):
                    chunk = todo[i : i + step]
                    if len(chunk) == 1:
                        self(chunk[0])
                        continue
                    self.rounds += 1
                    answers = list(self._batch(chunk))
                    if len(answers) != len(chunk):
                        raise ValueError("batch returned a different number of answers than sets")
                    for s, ok in zip(chunk, answers):
                        self._record(s, bool(ok))
            else:
                for s in todo:
                    self(s)
        return [self.memo[s] for s in fsets]

    def known(self, s: Iterable[str]) -> bool | None:
        return self.memo.get(self.canon(s))

    @property
    def has_excess(self) -> bool:
        return self._excess is not None

    def excess(self, s: Iterable[str]) -> float | None:
        """How far an asked set's error is from the tolerance (> 1: failed; None: not offered or not known)."""
        if self._excess is None:
            return None
        try:
            value = self._excess(frozenset(s))
        except Exception:  # noqa: BLE001 - a hint, never a reason to fail the search
            return None
        return float(value) if isinstance(value, (int, float)) else None

    # ------------------------------------------------------------------ helpers
    def ordered(self, s: Iterable[str]) -> list[str]:
        return sorted(s, key=self.index.__getitem__)

    def report(self, fp32_size: int | None = None) -> None:
        if self._progress is not None:
            self._progress(
                {
                    "phase": self.phase,
                    "fp32_size": fp32_size,
                    "best": self.best,
                    "evaluations": len(self.memo),
                }
            )


def one_minimal(ask: Asker, s: frozenset[str], order: Sequence[str] | None = None) -> frozenset[str]:
    """Make a *passing* set 1-minimal: remove single nodes while the rest passes, until no removal passes.

    Every single-removal check on the final set is asked literally (no inference), so the result is 1-minimal
    for any oracle. The checks on one set are independent, so they go through ``batch`` when offered; when some
    removal passes, a sequential sweep (keeping each passing removal at once) follows, and the whole repeats
    until a set has no passing removal. ``order`` (default: candidate order) is the sweep order.
    """
    ask.phase = "verify"
    rank = {n: i for i, n in enumerate(order)} if order is not None else ask.index
    while True:
        members = sorted(s, key=rank.__getitem__)
        answers = ask.many([s - {n} for n in members])
        if not any(answers):
            return s
        removable = [n for n, ok in zip(members, answers) if ok]
        s = s - {removable[0]}
        # sweep the other removals that passed (a node whose removal failed from the larger set is asked again
        # only in the next full check: for a monotone oracle it fails again), then check everything again
        for n in removable[1:]:
            if ask(s - {n}):
                s = s - {n}


def repair(ask: Asker, result: frozenset[str], order: Sequence[str] | None = None) -> frozenset[str]:
    """Verify and, if needed, repair a proposed result so that it passes and is 1-minimal.

    If ``result`` fails (a non-monotone oracle fooled the search), start from the smallest passing set seen,
    or all candidates; if even all candidates fail, return all candidates (the driver reports the failure).
    Nodes of the failed proposal are tried for removal last: they are the likely culprits.
    """
    ask.phase = "verify"
    if ask.parallel > 1 and result and ask.known(result) is None:
        # one round: the final check and every single removal (wasted only if the result fails)
        rank = {n: i for i, n in enumerate(order)} if order is not None else ask.index
        ask.many([result] + [result - {n} for n in sorted(result, key=rank.__getitem__)])
    if ask(result):
        return one_minimal(ask, result, order)
    start = ask.best
    if start is None:
        everything = frozenset(ask.candidates)
        if not ask(everything):
            return everything
        start = everything
    base = list(order) if order is not None else ask.candidates
    late = [n for n in base if n in result]
    early = [n for n in base if n not in result]
    return greedy_reduce(ask, start, early + late)


def greedy_reduce(ask: Asker, s: frozenset[str], order: Sequence[str]) -> frozenset[str]:
    """From a passing ``s``: try removing each node in ``order``, keep removals that pass; then 1-minimal."""
    ask.phase = "greedy"
    width = ask.parallel
    if width <= 1:
        for n in order:
            if n in s and ask(s - {n}):
                s = s - {n}
    else:
        # ``width`` removals per round; the first that passes is kept, later ones that passed are asked again
        # against the smaller set (those that failed stay FP32: for a monotone oracle they fail again)
        queue = [n for n in order if n in s]
        while queue:
            chunk, queue = queue[:width], queue[width:]
            answers = ask.many([s - {n} for n in chunk])
            first = next((i for i, ok in enumerate(answers) if ok), None)
            if first is not None:
                s = s - {chunk[first]}
                queue = [n for n, ok in zip(chunk[first + 1 :], answers[first + 1 :]) if ok] + queue
    rank = {n: i for i, n in enumerate(order)}
    for n in ask.candidates:
        rank.setdefault(n, len(rank))
    return one_minimal(ask, s, sorted(rank, key=rank.__getitem__))


def group_reduce(ask: Asker, s: frozenset[str], order: Sequence[str], first: int | None = None) -> frozenset[str]:
    """From a passing ``s``: remove the nodes of ``order`` (most removable first) in adaptive chunks.

    A chunk that can go FP16 together (``s`` minus the chunk passes) is removed and the next chunk is twice as
    large; a chunk that fails is halved and retried from its start; a single node that fails stays. In a run of
    removable nodes this costs about log2 of the run, in a run of nodes that must stay one evaluation each —
    against one per node for ``greedy_reduce``. The result passes; it is not yet checked for 1-minimality.
    """
    ask.phase = "shrink"
    queue = [n for n in order if n in s]
    g = max(1, first if first is not None else len(queue) // 8)
    while queue:
        g = min(g, len(queue))
        chunk = queue[:g]
        if ask(s - frozenset(chunk)):
            s = s - frozenset(chunk)
            queue = queue[g:]
            g *= 2
        elif g == 1:
            queue = queue[1:]
        else:
            g //= 2
    return s


def one_minimal_cyclic(ask: Asker, s: frozenset[str], order: Sequence[str] | None = None,
                       nearest_miss: bool = False, groups: bool = False,
                       recheck_nearest: bool = False) -> frozenset[str]:
    """Make a passing set 1-minimal by cycling through its members: a removal that passes is kept at once.

    Stops when every member's removal has failed against the current set since the last change — that is the
    literal 1-minimality check (``passes(s)`` is known True and every ``passes(s - {n})`` was asked), paid once.
    ``one_minimal`` checks the whole set after each change instead: on an oracle where removals keep passing
    after others (non-monotone near the tolerance) that costs |s| per round, this about 1/p per accepted removal
    (p: the share of members whose removal passes) plus |s| once. With ``batch`` + ``workers`` the next P
    members' removals go out together (the first that passes is kept; later answers of that round are stale).
    ``nearest_miss`` (with the ``excess`` hint): retry the removals that failed by the least first.
    ``groups`` (one worker): after a removal passes, try the next members in pairs, then fours, ... (the group
    doubles while removals pass); a failing group falls back to single removals at its start
    (:func:`_one_minimal_cyclic_groups`). The stop is the same literal check. ``recheck_nearest`` (with
    ``groups`` and the ``excess`` hint): once the sweep comes back to members it tried before, it re-checks them
    nearest miss first, from the nearest again after each accepted removal (:func:`_recheck_nearest`).
    """
    ask.phase = "verify"
    rank = {n: i for i, n in enumerate(order)} if order is not None else ask.index
    members = sorted(s, key=lambda n: rank.get(n, len(rank) + ask.index[n]))
    if not ask(s):
        return s  # callers pass a passing set; a failing one is the caller's to repair
    if nearest_miss and ask.has_excess:
        return _one_minimal_nearest_miss(ask, s, members)
    width = ask.parallel
    if groups and width <= 1:
        return _one_minimal_cyclic_groups(ask, s, members, nearest=recheck_nearest and ask.has_excess)
    i = 0  # position in ``members`` of the next removal to try
    clean = 0  # consecutive failed removals against the current ``s``
    while members and clean < len(members):
        k = min(width, len(members) - clean)
        chunk = [members[(i + j) % len(members)] for j in range(k)]
        answers = ask.many([s - {n} for n in chunk]) if k > 1 else [ask(s - {chunk[0]})]
        first = next((j for j, ok in enumerate(answers) if ok), None)
        if first is None:
            clean += k
            i = (i + k) % len(members)
            continue
        gone = chunk[first]
        pos = members.index(gone)
        members.pop(pos)
        s = s - {gone}
        clean = 0
        i = pos % len(members) if members else 0
    return s


def _one_minimal_nearest_miss(ask: Asker, s: frozenset[str], members: list[str]) -> frozenset[str]:
    """``one_minimal_cyclic`` with the ``excess`` hint: after a change, the members whose removal failed by the
    least are retried first (the idea: near the tolerance a removal that missed by 1% is what a change turns into
    a pass, one that missed by 5x is not). Members never tried go first (in rank order), then the nearest misses;
    the stop is the same literal check: every member's removal failed against the final set. Measured, not the
    default: on generated transformers at tight tolerances 0.59x the evaluations of the cyclic order on one
    (set 1.10x) and 1.76x on another (set 0.94x); neutral on the bench's real cases (docs/benchmarks.md)."""
    width = ask.parallel
    pos = {n: i for i, n in enumerate(members)}
    miss: dict[str, float] = {}  # member -> excess of its last failed removal (inf: unknown)
    failed: set[str] = set()  # members whose removal failed against the current s
    while True:
        todo = sorted((n for n in members if n not in failed), key=lambda n: (n in miss, miss.get(n, 0.0), pos[n]))
        if not todo:
            return s
        chunk = todo[:width]
        answers = ask.many([s - {n} for n in chunk]) if len(chunk) > 1 else [ask(s - {chunk[0]})]
        first = next((j for j, ok in enumerate(answers) if ok), None)
        for n in chunk[: len(chunk) if first is None else first]:
            failed.add(n)
            miss[n] = _excess_or_inf(ask, s - {n})
        if first is not None:  # later answers of this round were against the old set: stale, not failures
            gone = chunk[first]
            members.remove(gone)
            s = s - {gone}
            failed.clear()


def _one_minimal_cyclic_groups(ask: Asker, s: frozenset[str], members: list[str],
                               nearest: bool = False) -> frozenset[str]:
    """``one_minimal_cyclic`` (one worker) with group removals: after a removal passes, the next ``g`` members
    (cyclic order) are tried together, ``g`` doubling while groups pass (runs of members that do not matter —
    on real models often consecutive nodes whose FP16 copy changes nothing — go in about log2 of the run); a
    failing group of ``g`` > 1 costs one evaluation and the search goes on with single removals from the group's
    start. Stops as ``one_minimal_cyclic`` does: every single removal failed against the final set, asked
    literally, so the result is 1-minimal for any oracle."""
    i = 0  # position in ``members`` of the next removal to try
    clean = 0  # consecutive failed single removals against the current ``s``
    g = 1
    miss: dict[str, float] = {}  # ``nearest``: member -> excess of its last failed single removal
    while members and clean < len(members):
        g = max(1, min(g, len(members) - clean))  # never a member whose single removal failed against this s
        chunk = [members[(i + j) % len(members)] for j in range(g)]
        if nearest and g == 1 and chunk[0] in miss:  # back at members tried before: the re-checks
            failed = {members[(i - k) % len(members)] for k in range(1, clean + 1)}
            return _recheck_nearest(ask, s, members, miss, failed)
        if ask(s - frozenset(chunk)):
            gone = set(chunk)
            s = s - gone
            # the member after the chunk, in the old cyclic order, is where the search goes on
            after = next((members[(i + j) % len(members)] for j in range(g, len(members))
                          if members[(i + j) % len(members)] not in gone), None)
            members = [n for n in members if n not in gone]
            i = members.index(after) if after is not None else 0
            clean = 0
            g *= 2
        elif g > 1:
            g = 1  # a group that failed: its members one at a time
        else:
            if nearest:
                miss[chunk[0]] = _excess_or_inf(ask, s - {chunk[0]})
            clean += 1
            i = (i + 1) % len(members)
    return s


def _recheck_nearest(ask: Asker, s: frozenset[str], members: list[str], miss: dict[str, float],
                     failed: set[str]) -> frozenset[str]:
    """The rest of a cyclic 1-minimality check once every member was tried: the members not yet failed against
    the current ``s``, nearest miss first (the smallest excess of their last failed removal); after an accepted
    removal, from the nearest again. Why: near the tolerance a removal that failed can pass after others (the
    oracle is not monotone there), and these are the near misses: on a 151-node set the seven removals the
    cyclic order accepted on its second and third sweeps were at ranks 1-46 of 146 by their last excess
    (docs/benchmarks.md, "Issue 15, thirty-eighth round"). Stops with every member's removal failed against the
    final set, asked literally: 1-minimal for any oracle."""
    pos = {n: i for i, n in enumerate(members)}
    while True:
        todo = sorted((n for n in members if n not in failed), key=lambda n: (miss.get(n, math.inf), pos[n]))
        if not todo:
            return s
        for n in todo:
            if ask(s - {n}):
                members.remove(n)
                s = s - {n}
                failed = set()
                break
            failed.add(n)
            miss[n] = _excess_or_inf(ask, s - {n})


def _excess_or_inf(ask: Asker, s: frozenset[str]) -> float:
    """An asked set's excess for ordering the re-checks; inf where the hint has none (or NaN): last."""
    e = ask.excess(s)
    return e if e is not None and e == e else math.inf


def pair_removals(ask: Asker, s: frozenset[str], one_min: Callable[[frozenset[str]], frozenset[str]],
                  nearest: int = 8) -> frozenset[str]:
    """From a 1-minimal passing ``s``: try removing two members together, among the ``nearest`` single removals
    that failed by the least (the ``excess`` hint), pairs of the smallest summed excess first; when one passes,
    ``one_min`` makes it 1-minimal again and the pairs of the new set are tried, until none of them passes.

    Why: a monotone oracle never passes a pair whose single removals both failed, but a real one near the
    tolerance does. On Basic Pitch at 1e-2 (docs/benchmarks.md, "Issue 15, forty-third round") the CQT front end's
    two copy chains each failed alone (excess 1.19 and 1.15: rounding one of two inputs that a later step
    compares) and passed together (0.85): 66 nodes became 44. Costs up to C(nearest, 2) evaluations per set,
    fewer where the pairs' sets were asked already (a pair inside one chain of idle members is its single
    removal). Without the ``excess`` hint, or on a set of fewer than three members, nothing is asked.
    Removals whose set is the same as another's (``canonical``: one chain of idle members) count once."""
    if not ask.has_excess or nearest < 2:
        return s
    width = max(1, ask.parallel)
    while len(s) >= 3:
        ask.phase = "pairs"
        singles: dict[frozenset[str], str] = {}
        for x in ask.ordered(s):
            singles.setdefault(ask.canon(s - {x}), x)
        misses = []
        for judged, x in singles.items():
            e = ask.excess(judged) if ask.known(judged) is False else None
            if e is not None and math.isfinite(e):
                misses.append((e, ask.index[x], x))
        misses.sort()
        near = misses[:nearest]
        pairs = sorted(((ea + eb, ia, ib), a, b) for (ea, ia, a), (eb, ib, b) in itertools.combinations(near, 2))
        proposals: list[frozenset[str]] = []
        hit = None
        for _, a, b in pairs:
            p = ask.canon(s - {a, b})
            known = ask.known(p)
            if known:  # asked before and passed (a later step of the search): free
                hit = p
                break
            if known is None and p not in proposals:
                proposals.append(p)
        for i in range(0 if hit is None else len(proposals), len(proposals), width):
            chunk = proposals[i : i + width]
            answers = ask.many(chunk) if len(chunk) > 1 else [ask(chunk[0])]
            hit = next((p for p, ok in zip(chunk, answers) if ok), None)
            if hit is not None:
                break
        if hit is None:
            return s
        s = one_min(hit)
    return s
