"""Judge a new plan first on the batch item where the last failure was (issue 14: a search costs its evaluations).

One failing element fails a plan. A batch of B items is B computations that do not mix (checked below), and
near the tolerance the failures of a search concentrate: on the PP-OCRv4 recogniser at batch 8 every one of the
37 failing plans of its search had its worst element in the same item (docs/benchmarks.md, "Scale, fourteenth
round"). So once a full verdict has failed, the oracle runs each new plan on that one item first: if the item
fails, the plan fails, at about 1/B of the batch's cost; if it passes, the whole batch is judged as always.

The pass/fail verdict is the one the whole batch gives; a failing verdict found on one item differs only in its
details: its comparisons (excess, mismatches, statistics) are the item's, so its excess is a lower bound of the
batch's, and it says so (`Verdict.screened`; the journal keeps it). A passing verdict is always the whole batch's.

When it applies:
- every output is checked elementwise (a mean or a median over the batch is not decided by one item);
- the backend says its runs of one item compute what its batch run computes at that item (`screens_items`: the
  emulator, whose ONNX Runtime CPU kernels choose their algorithm from shapes, never from values);
- the input set is batched (every input and every output has the same leading dimension B >= 2), and the FP32
  plan run on the item gives the batch's FP32 outputs at that item bit for bit (checked once per item; a model
  that mixes its items, e.g. by batch statistics, or cannot run on one item, is judged whole as before);
- the first failure found on an item is also judged on the whole batch, and screening stops for the search (with
  a warning) unless the batch fails too with at least the item's excess;
- the backend says a run on part of the batch can cost less (`screen_pays`: on the emulator, block-boundary
  tensors of 64 KiB and up on average; below that each block's ONNX Runtime call is the cost, whatever the
  batch, and a screen that passes is a second run for nothing);
- it pays: where the failures spread over the items, a screen that passes before a failing batch costs a run
  for nothing, so screening stops once fewer than HIT_RATE of the failing plans failed on their screen (after
  MIN_OUTCOMES of them). Measured on six searches at batch 8 (docs/benchmarks.md, "Scale, fourteenth round"):
  where 62-100% of the failures were caught the searches took 15-38% less time; at 50% (a recogniser at
  48 x 320, 3e-3: the worst item moved among all eight) 4% more before this rule, 2% less with it.
With several input sets, the set of the last failure is judged first in the same way (whole, when not batched).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bisector.compare import Tolerance
from bisector.fp16.plan import Plan
from bisector.model.polyjson import Feeds
from bisector.search.judge import Verdict, judge, summed_seconds

log = logging.getLogger("bisector")

WHOLE = -1  # the item index of a screen that runs a whole (unbatched) input set
SIZES = (1, 2)  # items judged first: one, else two (ORT's MatMul on one row can take another kernel: not bit-exact)
HIT_RATE = 0.6  # screening goes on while at least this share of the failing plans failed on their screen
MIN_OUTCOMES = 12  # failing plans screened before the share decides
KEEP_PARTS = 2  # items whose feeds and FP32 references stay known (the target and the one before)


class Screen:
    """The item screening of one oracle (`Oracle(screen=True)`); `judge(plan, whole)` replaces `whole()`."""

    def __init__(self, backend: Any, candidates: Sequence[str], feeds_list: Sequence[Feeds],
                 golden: Sequence[Feeds], tolerance: Tolerance):
        self.backend = backend
        self.candidates = tuple(candidates)
        self.feeds_list, self.golden, self.tolerance = list(feeds_list), list(golden), tolerance
        self.enabled = bool(getattr(backend, "screens_items", False)) and all(
            tolerance.stat.get(name) == "elemwise" for gold in golden for name in gold)
        self.target: tuple[int, int] | None = None  # (input set, item or WHOLE) of the last failure
        self._parts: dict[tuple[int, int], tuple[Feeds, Feeds, tuple[int, int, int]] | None] = {}
        self._confirmed = False  # the first failure found on an item was judged on the whole batch too
        self.screened = 0  # plans failed on one item (for the report)
        self.hits = self.misses = 0  # failing plans whose screen failed / passed
        self._recent: list[tuple[int, int]] = []  # targets, oldest first: their parts are kept (KEEP_PARTS)
        self._cannot: set[tuple[int, int]] = set()  # (id of an input set, items) the model failed to run on

    def judge(self, plan: Plan, whole: Callable[[], Verdict]) -> Verdict:
        part = self._part(*self.target) if self.enabled and self.target is not None else None
        spent: dict[str, float] = {}
        if part is not None:
            with part_of_the_batch(self.backend, self._scale(part)):
                item = judge(self.backend, plan, [part[0]], [part[1]], self.tolerance, lean=True)
            spent = item.seconds
            if not item.passed:
                s, i = self.target
                item.worst_set, item.screened = s, part[2]
                self._count(hit=True)
                if self._confirmed or i == WHOLE:
                    self.screened += 1
                    return item
                self._confirmed = True
                full = whole()
                if full.passed or not full.excess >= item.excess:
                    self.stop()
                    log.warning("a plan failed on item %d of input set %d but %s on the whole batch: judging "
                                "whole batches from now on", i, s, "passed" if full.passed else "less")
                self._learn(full)
                return _plus(full, spent)
            if self.target[1] == WHOLE:  # the other input sets, then the verdict of all of them as `judge` keeps it
                verdict = self._with_the_others(plan, item, self.target[0])
                self._learn(verdict)
                return verdict
        verdict = whole()
        if part is not None and not verdict.passed:
            self._count(hit=False)
        self._learn(verdict)
        return _plus(verdict, spent)

    def _with_the_others(self, plan: Plan, first: Verdict, s: int) -> Verdict:
        """The verdict over every input set, where set `s` (judged first, passed) is `first`: the other sets judged
        now, and the worst set kept as `judge` keeps it (a failing set is worse; then the larger excess; on a tie
        the earlier set)."""
        rest = [k for k in range(len(self.feeds_list)) if k != s]
        other = judge(self.backend, plan, [self.feeds_list[k] for k in rest], [self.golden[k] for k in rest],
                      self.tolerance, lean=True)
        other.worst_set = rest[other.worst_set]
        if not other.passed:
            self._count(hit=False)
        first.worst_set = s
        mine, theirs = (False, first.excess), (not other.passed, other.excess)
        worse = other if theirs > mine or (theirs == mine and other.worst_set < s) else first
        return Verdict(plan.fp32, other.passed, worse.outputs, worse.worst_set,
                       summed_seconds(first.seconds, other.seconds))

    def _scale(self, part: tuple[Feeds, Feeds, tuple[int, int, int]]) -> float:
        """How many times the batch the part's items are (1 for a whole input set)."""
        s, _, m = part[2]
        return (self._batch(s) or m) / m if m else 1.0

    def _count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        seen = self.hits + self.misses
        if self.enabled and seen >= MIN_OUTCOMES and self.hits < HIT_RATE * seen:
            self.stop()
            log.info("screening stops: %d of %d failing plans failed on the batch item judged first (the failures "
                     "spread over the items)", self.hits, seen)

    def stop(self) -> None:
        """No more screening in this search; the items' feeds and FP32 references go."""
        self.enabled = False
        for target in list(self._parts):
            self._drop(target)

    def _learn(self, verdict: Verdict) -> None:
        """Where a full failing verdict failed worst: its input set, and the item of its worst element."""
        if verdict.passed or not self.enabled or verdict.screened is not None:
            return
        s = verdict.worst_set
        worst = max(verdict.outputs.values(), key=lambda r: r.excess, default=None)
        gold = self.golden[s].get(worst.name) if worst is not None else None
        item = WHOLE
        if worst is not None and worst.worst_index is not None and gold is not None and np.ndim(gold) >= 1:
            item = int(np.unravel_index(worst.worst_index, np.shape(gold))[0])
        if self._batch(s) is None:
            item = WHOLE
        if item == WHOLE and len(self.feeds_list) < 2:
            return  # one unbatched set: nothing smaller to judge first
        self.target = (s, item)
        self._recent = [t for t in self._recent if t != self.target] + [self.target]
        for old in self._recent[:-KEEP_PARTS]:
            self._drop(old)
        self._recent = self._recent[-KEEP_PARTS:]

    def _batch(self, s: int) -> int | None:
        """B where every input and every golden output of set `s` leads with the same B >= 2, else None."""
        arrays = [*self.feeds_list[s].values(), *self.golden[s].values()]
        lead = {np.shape(a)[0] if np.ndim(a) else 0 for a in arrays}
        b = lead.pop() if len(lead) == 1 else 0
        return b if b >= 2 else None

    def _part(self, s: int, i: int) -> tuple[Feeds, Feeds, tuple[int, int, int]] | None:
        """The feeds, golden outputs and (set, first item, items) to judge first (items 0: the whole set), or None
        where no slice around item `i` stands for the batch."""
        if i == WHOLE:
            return self.feeds_list[s], self.golden[s], (s, 0, 0)
        if (s, i) not in self._parts:
            self._parts[(s, i)] = None
            feeds, gold = self.feeds_list[s], self.golden[s]
            pays = getattr(self.backend, "screen_pays", None)
            if pays is not None and not pays(feeds):
                self.stop()
                log.info("screening off: the batch's tensors are small enough that a run on part of it costs "
                         "what the whole batch costs")
                return None
            b = self._batch(s) or 0
            for m in SIZES:
                if m >= b:
                    break
                if (id(feeds), m) in self._cannot:
                    continue
                lo = min(i, b - m)
                one = {k: np.ascontiguousarray(np.asarray(v)[lo:lo + m]) for k, v in feeds.items()}
                if self._stands_for(feeds, one, list(gold), lo, m):
                    self._parts[(s, i)] = (one, {k: np.asarray(g)[lo:lo + m] for k, g in gold.items()}, (s, lo, m))
                    break
        return self._parts[(s, i)]

    def _stands_for(self, feeds: Mapping[str, np.ndarray], one: Feeds, names: list[str], lo: int, m: int) -> bool:
        """The FP32 plan on items lo..lo+m alone gives the batch's FP32 outputs there, bit for bit."""
        fp32 = Plan(frozenset(self.candidates), self.candidates)
        try:
            mine = self.backend.run(fp32, one, names)
            whole = self.backend.run(fp32, feeds, names)  # the batch's FP32 reference: known already
        except Exception:  # noqa: BLE001 - a model that cannot run on fewer items is judged whole
            log.debug("screening: the model does not run on %d item(s) of its batch", m, exc_info=True)
            self._forget(one)
            self._cannot.add((id(feeds), m))  # nor on any other m items of this set: not tried again
            return False
        for k in names:
            a, w = np.asarray(mine[k]), np.asarray(whole[k])
            if a.shape != (m, *w.shape[1:]) or a.dtype != w.dtype or a.tobytes() != w[lo:lo + m].tobytes():
                log.debug("screening: output %r of items %d..%d alone differs from the batch's", k, lo, lo + m - 1)
                self._forget(one)
                return False
        return True

    def _drop(self, target: tuple[int, int]) -> None:
        """The item screened so far is no longer the target: its feeds and FP32 reference go (an item found
        not to stand for its batch stays known as such)."""
        if self._parts.get(target) is not None:
            self._forget(self._parts.pop(target)[0])  # type: ignore[index]

    def _forget(self, feeds: Feeds) -> None:
        forget = getattr(self.backend, "forget", None)  # the item's FP32 reference: asked no more
        if callable(forget):
            forget(feeds)


def part_of_the_batch(backend: Any, scale: float):
    """The backend's `part_of_the_batch(scale)` (emulate: sessions first run on a part decide their thread pool as
    the batch's run would), or nothing."""
    hint = getattr(backend, "part_of_the_batch", None)
    return hint(scale) if callable(hint) and scale > 1 else contextlib.nullcontext()


def _plus(verdict: Verdict, seconds: Mapping[str, float]) -> Verdict:
    """The verdict with the screen's run and comparison counted in its own (the report's timings)."""
    if seconds:
        verdict.seconds = summed_seconds(verdict.seconds, seconds)
    return verdict
