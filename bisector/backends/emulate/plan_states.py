"""The latest plan's tensors at a few cuts between blocks, so that a plan close to it resumes from a cut.

`NodeExecutor.run_changed` recomputes a plan's cone from the FP32 reference: every block from the first with an
FP16 node on. In a diffuse search nearly every block has an FP16 node, so every evaluation ran every block
again — also the 1-minimality check's plans, each the passing set with one member moved to FP16, whose blocks
before that member compute exactly what the passing set's run computed. Blocks are in topological order and a
block's outputs depend only on which nodes of it and of the blocks before it are FP16 (its session variant and
its inputs; `NodeExecutor._block_spec`), so where two plans first differ in block d, every block before d
computes the same for both, bit for bit.

Kept: the latest plan's values (those that differ from the reference, by reference, not copied) of the tensors
that cross the *cuts*, block boundaries every `step` blocks; a run that first differs from it in block d
resumes at the last cut at or before d, seeded with the tensors crossing that cut, where that starts later than
the reference would. A cut at every block boundary keeps a whole plan's activations: the tiny recogniser's
9.7 MB took its search from 1.88 to 2.05 x its inference's peak memory. So the cuts are spaced until what
crosses them fits the budget (a quarter of the model's weights and reference tensors, at most a sixteenth of the
process's peak before the search: `NodeExecutor._size_states`). One plan at a time: the run that resumes from
the kept plan takes it over and keeps its own in its place (keeping the passing set a check starts from beside
the latest left as many blocks to run, for twice the memory; docs/benchmarks.md, "Scale, thirty-ninth round").
"""

from __future__ import annotations

import bisect
import os
import threading
import weakref
from typing import Mapping, Sequence

import numpy as np


def enabled() -> bool:
    """BISECTOR_PLAN_STATES=0 turns resuming off (every plan's cone from the reference, as before)."""
    return os.environ.get("BISECTOR_PLAN_STATES", "1").strip() != "0"


class _State:
    __slots__ = ("reference", "layout", "fp16", "tensors")

    def __init__(self, reference: "weakref.ref", layout: "_Layout", fp16: frozenset[str],
                 tensors: dict[str, np.ndarray]):
        self.reference, self.layout, self.fp16, self.tensors = reference, layout, fp16, tensors


class _Layout:
    """The cuts for one reference's tensor sizes: `cuts` (sorted block indices; a cut k lies before block k) and
    `kept`, the tensors that cross at least one of them."""
    __slots__ = ("reference", "budget", "cuts", "kept")

    def __init__(self, reference: "weakref.ref", budget: int, cuts: list[int], kept: frozenset[str]):
        self.reference, self.budget, self.cuts, self.kept = reference, budget, cuts, kept


class PlanStates:
    """The latest plan's tensors at the cuts, over a fixed partition into blocks (`blocks`: each block's node
    names, input tensors and output tensors, in the executor's order; `outputs`: the graph's outputs)."""

    def __init__(self, blocks: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]], outputs: Sequence[str],
                 budget: int = 0):
        self.budget = budget
        self.blocks = len(blocks)
        self.block_of: dict[str, int] = {n: i for i, (names, _, _) in enumerate(blocks) for n in names}
        self.produced_by: dict[str, int] = {t: i for i, (_, _, outs) in enumerate(blocks) for t in outs}
        # the last block that reads each block output (a graph output: past the last block, read by the caller)
        self.last_read: dict[str, int] = {t: i for t, i in self.produced_by.items()}
        for j, (_, ins, _) in enumerate(blocks):
            for t in ins:
                if t in self.last_read and self.last_read[t] < j:
                    self.last_read[t] = j
        for t in outputs:
            if t in self.last_read:
                self.last_read[t] = len(blocks)
        self._state: _State | None = None
        self._layouts: dict[int, _Layout] = {}  # by the reference's id (checked against its weak reference)
        self._lock = threading.Lock()  # evaluation threads (`--workers`) share the executor
        self.resumed = 0  # runs that resumed from the kept plan (tests, benchmarks)

    def layout(self, reference: Mapping) -> _Layout | None:
        """The cuts for this reference: the closest spacing whose crossing tensors fit the budget (None: none
        does, or the reference cannot be told apart from others). Worked out once per reference and budget."""
        layout = self._layouts.get(id(reference))
        if layout is None or layout.reference() is not reference or layout.budget != self.budget:
            layout = self._lay_out(reference)
            if layout is None:
                return None
            with self._lock:
                if len(self._layouts) >= 8:  # (references of a screen's parts, of other input sets)
                    self._layouts = {k: v for k, v in self._layouts.items() if v.reference() is not None}
                self._layouts[id(reference)] = layout
        return layout if layout.cuts else None

    def _lay_out(self, reference: Mapping) -> _Layout | None:
        try:
            ref = weakref.ref(reference)
        except TypeError:
            return None
        sizes = {t: _nbytes(reference, t) for t in self.produced_by}
        last_cut = self.blocks - 1
        step = 1
        while step < self.blocks:
            # a tensor made in block p and last read in block r crosses a cut if a multiple of step in (p, r] is one
            kept = frozenset(t for t, p in self.produced_by.items()
                             if (min(self.last_read[t], last_cut) // step) * step > p)
            if sum(sizes[t] for t in kept) <= self.budget:
                return _Layout(ref, self.budget, list(range(step, self.blocks, step)), kept)
            step = step + 1 if step < 4 else step * 2
        return _Layout(ref, self.budget, [], frozenset())  # nothing fits: no cuts

    def start(self, reference: Mapping, fp16: frozenset[str]
              ) -> tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """(cut, seed, inherited) where the kept plan of this reference lets a run of `fp16` start at a later
        block than the reference does: run blocks from `cut` on, with `seed` (the kept plan's values of the
        tensors crossing the cut) over the reference; `inherited`: the kept plan's tensors made before the cut,
        which are this plan's too (what it keeps of them). None: start from the reference. The kept plan is
        handed over to the run either way (it keeps its own in its place)."""
        layout = self.layout(reference)
        with self._lock:
            state = self._state
            if state is None or layout is None or state.reference() is not reference or state.layout is not layout:
                return None
            self._state = None
        block_of = self.block_of
        differ = [block_of[n] for n in fp16 ^ state.fp16 if n in block_of]
        first = min(differ, default=self.blocks)
        at = bisect.bisect_right(layout.cuts, first) - 1
        if at < 0:
            return None
        cut = layout.cuts[at]
        if cut <= min((block_of[n] for n in fp16 if n in block_of), default=self.blocks):
            return None  # the reference's own cone starts there or later
        self.resumed += 1
        produced_by, last_read = self.produced_by, self.last_read
        inherited = {t: v for t, v in state.tensors.items() if produced_by[t] < cut}
        seed = {t: v for t, v in inherited.items() if cut <= last_read[t]}
        return cut, seed, inherited

    def store(self, reference: Mapping, fp16: frozenset[str], tensors: dict[str, np.ndarray]) -> None:
        """Keep a plan's tensors at the cuts (those that differ from the reference) in place of the kept one."""
        layout = self.layout(reference)
        if layout is None:
            return
        with self._lock:
            self._state = _State(layout.reference, layout, fp16, tensors)

    def clear(self) -> None:
        """Let go of the kept plan (the cuts stay: they hold no tensor)."""
        with self._lock:
            self._state = None


def _nbytes(reference: Mapping, t: str) -> int:
    size = getattr(reference, "nbytes_of", None)
    if size is not None:
        return size(t)
    return int(getattr(reference.get(t), "nbytes", 0)) if t in reference else 0
