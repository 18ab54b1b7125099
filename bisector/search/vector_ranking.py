"""A predicted ranking for ``auto``'s diffuse search, from the output error of each candidate alone in FP16.

Issue 15, seventh round (docs/benchmarks.md). For every candidate ``i`` the backend runs the plan "only ``i`` in
FP16" and keeps ``z_i`` = (output − golden) / threshold per output element (all float outputs, all input sets),
where threshold = max(atol, rtol·|golden|)·margin: an element passes the elementwise check iff |z| ≤ 1
(bisector.compare). These are emulator runs (the forward cone of one node each), not oracle evaluations.

Model: the errors of the FP16 nodes add up like independent noise — per element, the error of a plan with FP16
set F is about c·sqrt(Σ_{i∈F} z_i²) — calibrated by one real verdict (``c`` = real excess / predicted excess of
the plan the search starts from). Measured on the registry models, this root-sum-square model ranked better
than signed superposition Σ z_i (rounding errors do not cancel the same way in combination as alone) and better
than a model by tensor-rounding units (each rounded tensor counted once).

Ranking: the nodes in ``first`` stay FP32; from the rest all FP16, move to FP32 one at a time the node whose
removal most reduces the predicted violation Σ_elements relu(pred − 1); once the prediction passes, the node
that most reduces Σ pred². Only the ``top`` elements with the largest Σ_i z_i² are kept; the full vectors wait in
a temporary file meanwhile (`_at_risk`), so the ranking holds n x top numbers, not n x outputs.

An input set batched B >= 8 is ranked on its first B // 8 items where those stand for the batch (`batch_sample`):
the runs cost about an eighth; every verdict still judges the whole batch.

Only for the emulate backend, elementwise checks and outputs of at least ``MIN_ELEMENTS`` float elements (None
otherwise: the caller ranks another way).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from bisector.compare import golden_magnitude
from bisector.search.screen import part_of_the_batch
from bisector.budget import BudgetExhausted
from bisector.fp16.plan import Plan
from bisector.fp16.points import single_node_twins


log = logging.getLogger("bisector")

# Fewer float output elements (all outputs, all input sets) than this: no ranking. With one or two output numbers
# (the exported encoder: 2; ppocr-cls: 2) a per-element model is a scalar sensitivity ranking; measured there
# (docs/benchmarks.md, "Issue 15, seventh round") it gave fewer evaluations but larger sets than the probes.
MIN_ELEMENTS = 1024
SERIAL_FROM_BYTES = 4 << 20  # float output bytes (all outputs, input sets) from which the runs go one at a time


def predicted_ranking(oracle: Any, first: Sequence[str] = (), excess: Any = None, *, top: int = 4096,
                      min_elements: int | None = None, stats: dict | None = None,
                      on_run: Callable[[int, int], None] | None = None, memo: dict | None = None) -> list[str] | None:
    """All candidates of ``oracle``, ``first`` first, then by the greedy order above; None where not supported.

    ``excess``: the real excess (error / tolerance) of the plan keeping ``first`` FP32, for the calibration
    (None: no calibration), or a callable returning it, called only when the ranking can be computed (so a
    caller that must spend an evaluation on it spends nothing where the answer is None). ``stats`` (optional)
    receives ``runs`` (single-node emulator runs), ``seconds`` and ``predicted_prefix`` (how many nodes the model
    says must be FP32). ``on_run(done, total)`` (optional): called in the caller's thread as the candidates' runs
    come in (total: the candidates, twice that where the vectors are computed twice). ``memo`` (optional): keeps
    the candidates' error vectors for a later call on the same oracle and inputs, which then runs nothing (they
    do not depend on ``first``: --confirm-on asks twice, for the extension and the union's shrink)."""
    if memo is not None and "z" in memo:
        if callable(excess):
            excess = excess()
        return _finish(list(oracle.candidates), memo["z"].copy(), first, excess, oracle.tolerance, None,
                       [0], time.perf_counter())
    backend = getattr(oracle, "backend", None)
    own = None
    if not _is_emulator(backend):
        # A device backend (TensorRT, ORT-CUDA): the ranking comes from the CPU emulator on the same model and
        # inputs, built now and closed after. It only orders the candidates; every verdict is still the device's.
        own = backend = _emulator_for(backend)
        if backend is None:
            return None
    try:
        return _ranking(oracle, backend, first, excess, top, min_elements, stats, on_run, memo)
    finally:
        if own is not None:
            own.close()


def rankable(oracle: Any, min_elements: int | None = None) -> bool:
    """Whether `predicted_ranking` can rank for `oracle` (a cheap check, nothing run): elementwise checks on the
    float outputs, at least `MIN_ELEMENTS` of them, and an emulator (the backend, or one for a device backend's
    model in FP16 storage)."""
    backend = getattr(oracle, "backend", None)
    if not _is_emulator(backend) and (getattr(backend, "catalog", None) is None
                                      or getattr(backend, "storage", "fp16") != "fp16"):
        return False
    size = _elementwise_size(oracle)
    return bool(size) and size >= (MIN_ELEMENTS if min_elements is None else min_elements)


SAMPLE_SHARE = 8  # a batch of B >= SAMPLE_SHARE items is ranked on its first B // SAMPLE_SHARE (docs/benchmarks.md)


def _sample_batches() -> bool:
    """BISECTOR_RANKING_SAMPLE=0: the ranking's runs take the whole batch (their cost times the batch's share)."""
    return os.environ.get("BISECTOR_RANKING_SAMPLE", "1").strip() != "0"


def batch_sample(oracle: Any, backend: Any, cands: Sequence[str], min_elements: int | None = None
                 ) -> tuple[list, list, int]:
    """(feeds_list, golden, runs): the input sets the ranking's single-node runs use, their golden outputs, and
    the emulator runs spent deciding. A set batched B >= 8 is replaced by its first B // 8 items (SAMPLE_SHARE);
    the others stay whole (``feeds_list is oracle.feeds_list`` where none is replaced).

    Why: each single-node run costs about one inference of the whole batch (403 runs, 74 s, for a recogniser at
    batch 8, against 55 evaluations in 35 s); on one item of eight they cost 8 s, and the vectors and sums an
    eighth of the memory. The ranking only orders the candidates; every verdict still judges the whole batch.
    Measured on 17 diffuse searches of YOLOv8n and the recogniser at batch 2, 4 and 8 (docs/benchmarks.md,
    "Scale, twelfth round"): at batch 8 the wall fell by a third to a half and the evaluations did not grow; at
    batch 2 and 4 the evaluations grew on YOLOv8n (up to 2.4 times) for little time saved, so smaller batches
    rank on every item.

    A set is batched when every input and every float output has the same leading dimension B >= 8. Its sample
    is used only where the FP32 plan run on it gives the emulator's FP32 outputs of the whole batch at those items
    (within 1% of the tolerance, one run): a model that mixes its batch items (batch statistics, a time-major
    output), or that cannot run on fewer items (a batch fixed in a Reshape), ranks on the whole set."""
    tol = oracle.tolerance
    all_fp32 = Plan(frozenset(cands), tuple(cands))
    feeds_out, golden_out, runs = [], [], 0
    for feeds, gold in zip(oracle.feeds_list, oracle.golden):
        floats = [k for k, g in gold.items() if np.issubdtype(np.asarray(g).dtype, np.floating)]
        lead = {np.shape(a)[0] if np.ndim(a) else 0 for a in [*feeds.values(), *(gold[k] for k in floats)]}
        b = lead.pop() if len(lead) == 1 else 0
        m = b // SAMPLE_SHARE
        part = {k: np.ascontiguousarray(a[:m]) for k, a in feeds.items()} if floats and m else None
        if part is not None:
            runs += 1
            if not _stands_for_the_batch(backend, all_fp32, feeds, part, floats, gold, tol, m):
                _forget(backend, part)
                part = None
        feeds_out.append(feeds if part is None else part)
        golden_out.append(gold if part is None else {k: (np.asarray(g)[:m] if k in floats else g)
                                                     for k, g in gold.items()})
    size = sum(int(np.size(g)) for gold in golden_out for g in gold.values()
               if np.issubdtype(np.asarray(g).dtype, np.floating))
    replaced = [f for f, orig in zip(feeds_out, oracle.feeds_list) if f is not orig]
    if not replaced or size < (MIN_ELEMENTS if min_elements is None else min_elements):
        for f in replaced:
            _forget(backend, f)
        return oracle.feeds_list, oracle.golden, runs
    return feeds_out, golden_out, runs


def _forget(backend: Any, feeds: dict) -> None:
    """The backend drops its references of a sample's feeds (asked for a while, then never again)."""
    forget = getattr(backend, "forget", None)
    if callable(forget):
        forget(feeds)


def _lead(feeds: dict) -> int:
    return int(np.shape(next(iter(feeds.values())))[0])


def _stands_for_the_batch(backend: Any, all_fp32: Plan, feeds: dict, part: dict, floats: list[str], gold: dict,
                          tol: Any, m: int) -> bool:
    try:
        mine = backend.run(all_fp32, part, floats)
        whole = backend.run(all_fp32, feeds, floats)  # the FP32 reference of the whole batch: known already
    except Exception:  # noqa: BLE001 - a model that cannot run on fewer items ranks on all of them
        log.debug("ranking: the model does not run on %d item(s) of its batch", m, exc_info=True)
        return False
    for k in floats:
        a, w, g = np.asarray(mine[k]), np.asarray(whole[k]), np.asarray(gold[k])
        if a.shape != (m, *g.shape[1:]) or w.shape != g.shape:
            return False
        thr = _threshold(np.ascontiguousarray(g[:m], np.float32).reshape(-1), tol.atol.get(k), tol.rtol.get(k),
                         tol.margin)
        with np.errstate(all="ignore"):
            d = np.abs(a.astype(np.float32).reshape(-1) - w[:m].astype(np.float32).reshape(-1)) / thr
        if not np.all(d <= 0.01):  # NaN too
            log.debug("ranking: output %r of %d item(s) differs from the batch's; ranking on the whole batch", k, m)
            return False
    return True


def _is_emulator(backend: Any) -> bool:
    return getattr(backend, "name", None) == "emulate" and callable(getattr(backend, "run", None))


def _elementwise_size(oracle: Any) -> int | None:
    """How many float output numbers the checks judge (all input sets); None where one of them is judged by a
    mean/median/quantile check (not modelled: measured worse, see the module note)."""
    size = 0
    for gold in oracle.golden:
        for name, g in gold.items():
            if not np.issubdtype(np.asarray(g).dtype, np.floating):
                continue
            if oracle.tolerance.stat.get(name) != "elemwise":
                return None
            size += int(np.size(g))
    return size


class RankingHint:
    """The ``predicted_ranking`` hint as the driver offers it: ``hint(first, excess)`` computes the ranking
    (`predicted_ranking`, its cost recorded in ``stats``). ``hint.exact_backend`` says beforehand, without running
    anything, that it can rank *and* that its emulator is the backend that judges; ``Auto`` then switches to its
    ranked search sooner. On a device backend the ranking comes from an emulator whose errors are not the
    device's: there the sooner switch cost more device evaluations (H100, ORT-CUDA, four cases: 1112 -> 1215;
    docs/verification.md, "Issue 15, ninth round"), so it is False and the hint is used at the usual switch."""

    def __init__(self, oracle: Any, stats: dict | None = None, progress: Callable[[dict], None] | None = None,
                 every: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._oracle, self.stats = oracle, stats if stats is not None else {}
        backend = getattr(oracle, "backend", None)
        self.can_rank = rankable(oracle)  # said beforehand (nothing run): the estimate counts its runs
        self.exact_backend = _is_emulator(backend) and self.can_rank
        self._progress, self._every, self._clock = progress, every, clock

    @functools.cached_property
    def runs(self) -> int:
        """The single-node runs per input set the ranking takes (twins run once): what the estimate says up front,
        counted when first asked (a search that never turns diffuse never asks)."""
        catalog = getattr(getattr(self._oracle, "backend", None), "catalog", None)
        cands = list(getattr(self._oracle, "candidates", ()))
        return len(cands) - len(single_node_twins(catalog, cands)) if catalog is not None else len(cands)

    def __call__(self, first: Sequence[str] = (), excess: Any = None, memo: dict | None = None) -> "Ranking | None":
        """`memo`: see `predicted_ranking` (a caller that will ask again keeps the vectors in it)."""
        served = memo is not None and "z" in memo  # the memo's vectors: this call runs nothing
        rank = predicted_ranking(self._oracle, list(first), excess, stats=self.stats, on_run=self._on_run(),
                                 memo=memo)
        if self.stats.get("runs") and not served:
            sample = self.stats.get("batch_sample")
            log.info("predicted ranking: %d single-node emulator runs in %.1f s (not evaluations%s)",
                     self.stats["runs"], self.stats.get("seconds", 0.0),
                     f"; on the first {sample[0]} of {sample[1]} items of the batch" if sample else "")
        return rank

    def _on_run(self) -> Callable[[int, int], None] | None:
        """The runs as a ``{"ranking": {"runs", "total", "seconds"}}`` progress event, at most one per ``every``
        seconds besides the first and the last: the runs are no evaluations, and on a large model they take
        minutes (403 runs, 65 s, on a recogniser at batch 8) that a progress display otherwise shows as a stall."""
        progress = self._progress
        if not callable(progress):
            return None
        t0: list[float] = []  # when the runs started: on_run(0, total), after the calibration evaluation
        last = [None]

        def on_run(done: int, total: int) -> None:
            now = self._clock()
            if not t0:
                t0.append(now)
            if done == 0 or (last[0] is not None and done < total and now - last[0] < self._every):
                return
            last[0] = now
            try:
                progress({"ranking": {"runs": done, "total": total, "seconds": now - t0[0]}})
            except Exception:  # noqa: BLE001 - a display, never a reason to fail the search
                log.debug("ranking progress callback failed", exc_info=True)

        return on_run


def _emulator_for(backend: Any) -> Any:
    """An emulate backend on `backend`'s model (None: no model, or a storage other than FP16)."""
    catalog = getattr(backend, "catalog", None)
    if catalog is None or getattr(backend, "storage", "fp16") != "fp16":
        return None
    from bisector.backends.emulate.backend import EmulateBackend

    emulator = EmulateBackend()
    emulator.open(catalog)
    return emulator


def _ranking(oracle: Any, backend: Any, first: Sequence[str], excess: Any, top: int, min_elements: int | None,
             stats: dict | None, on_run: Callable[[int, int], None] | None = None,
             memo: dict | None = None) -> list[str] | None:
    t0 = time.perf_counter()
    cands = list(oracle.candidates)
    n = len(cands)
    if n == 0:
        return []
    size = _elementwise_size(oracle)
    if not size or size < (MIN_ELEMENTS if min_elements is None else min_elements):
        return None  # other checks, or a handful of output numbers: a scalar sensitivity ranking (MIN_ELEMENTS)
    runs = [0]
    feeds_list, golden = oracle.feeds_list, oracle.golden
    if _sample_batches():
        feeds_list, golden, runs[0] = batch_sample(oracle, backend, cands, min_elements)
    if stats is not None:
        sampled = [(_lead(f), _lead(o)) for f, o in zip(feeds_list, oracle.feeds_list) if f is not o]
        stats["batch_sample"] = sampled[0] if sampled else None  # (items ranked, batch) of the first set
    try:
        return _rank(oracle, backend, cands, first, excess, top, stats, on_run, feeds_list, golden, runs, t0, memo)
    finally:
        for feeds, orig in zip(feeds_list, oracle.feeds_list):
            if feeds is not orig:
                _forget(backend, feeds)


def _rank(oracle: Any, backend: Any, cands: list[str], first: Sequence[str], excess: Any, top: int,
          stats: dict | None, on_run: Callable[[int, int], None] | None, feeds_list: list, golden: list,
          runs: list[int], t0: float, memo: dict | None = None) -> "Ranking":
    n = len(cands)
    tol = oracle.tolerance
    checks = []  # (input set, output name, golden flat, threshold flat)
    for s, gold in enumerate(golden):
        for name, g in gold.items():
            g = np.asarray(g)
            if not np.issubdtype(g.dtype, np.floating):
                continue
            g = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)  # the golden itself where it is float32 already
            checks.append((s, name, g, _threshold(g, tol.atol.get(name), tol.rtol.get(name), tol.margin)))
    size = sum(c[2].size for c in checks)  # the sample's, where the ranking runs on one
    if callable(excess):
        excess = excess()
    everything = frozenset(cands)
    budget = getattr(oracle, "budget", None)
    lock = threading.Lock()

    def vector(i: int) -> np.ndarray:
        return errors(Plan(everything - {cands[i]}, tuple(cands)))

    def all_fp16() -> np.ndarray:
        return errors(Plan(frozenset(), tuple(cands)))

    def errors(plan: Plan) -> np.ndarray:
        if budget is not None and budget.spent():  # the runs are search work: --time-limit bounds them too
            raise BudgetExhausted(f"--time-limit {budget.time_limit:g}s reached")
        parts = []
        for s, feeds in enumerate(feeds_list):
            want = [name for s2, name, _, _ in checks if s2 == s]
            if not want:
                continue
            outs = backend.run(plan, feeds, want)
            with lock:
                runs[0] += 1
            for s2, name, g, thr in checks:
                if s2 == s:
                    parts.append(scaled_error(outs[name], g, thr))
            del outs
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    k = max(64, min(top, int(4e9 / n**2)))  # the greedy costs about n²·k/2 element operations: ≤ ~2e9
    # Runs one at a time where the outputs are large: such a model's runs are large too, its sessions already
    # split their work over the cores, and two runs at once held two runs' activations (PP-OCRv4 recogniser at
    # batch 8, 17 MB of output: +286 MB against +147 MB one at a time, for 6% less time; a 12 x 384
    # transformer's 0.2 MB outputs: +18 MB, 27% less time with two)
    # On ORT's shared pool (bisector.ort_pool) each run has both cores already, and two runs at once wait on each
    # other's parallel sections: one at a time there (YOLOX-style detector, 279 runs: 5.7 -> 5.2 s)
    from bisector import ort_pool

    threads = 1 if size * 4 >= SERIAL_FROM_BYTES or ort_pool.shared() else None
    one_off = getattr(backend, "one_off_plans", None)  # the single-node plans are not asked again: not kept
    # runs on a sample of the batch: sessions they build decide their thread pool as the batch's run would
    scale = max([_lead(o) / _lead(f) for f, o in zip(feeds_list, oracle.feeds_list) if f is not o] or [1.0])
    # A candidate whose plan changes exactly the values another's does (a chain of Reshape/Transpose/...: one
    # run stands for the chain; `points.single_node_twins`) takes that one's vector: 242 -> 168 runs on a note
    # transcriber's CQT front end, 303 -> 279 on a 6-layer transformer
    catalog = getattr(backend, "catalog", None)
    twin = single_node_twins(catalog, cands) if catalog is not None else {}
    index = {x: i for i, x in enumerate(cands)}
    rep = [index[twin.get(x, x)] for x in cands]
    with one_off() if callable(one_off) else contextlib.nullcontext(), part_of_the_batch(backend, scale):
        if size <= k:
            unique = sorted(set(rep))
            rows = dict(zip(unique, in_order(lambda m: vector(unique[m]), len(unique), threads,
                                             _Counter(on_run, len(unique)))))
            z = np.stack([rows[r] for r in rep])
            del rows
        else:
            z = _at_risk(vector, rep, size, k, threads, on_run, everything=all_fp16)
    if memo is not None:
        memo["z"] = z.copy()  # `_finish` squares z in place for the model
    return _finish(cands, z, first, excess, tol, stats, runs, t0)


def _finish(cands: list[str], z: np.ndarray, first: Sequence[str], excess: Any, tol: Any, stats: dict | None,
            runs: list[int], t0: float) -> "Ranking":
    """The greedy order and the model from the candidates' error vectors `z` (nodes x kept elements)."""
    everything = frozenset(cands)
    margin = float(tol.margin or 1.0)
    start = excess / margin if isinstance(excess, (int, float)) else None  # units: |z| <= 1 passes
    fp32 = [i for i, x in enumerate(cands) if x in set(first)]
    order, predicted = _greedy(z, fp32, start, squared=False)
    np.square(z, out=z)  # the model keeps z's own buffer (n x k float32): no allocation beyond the ranking's
    model = Prediction(cands, z, margin)
    if start is not None:
        model.calibrate(first, excess)
    if stats is not None:
        stats.update(runs=runs[0], seconds=time.perf_counter() - t0, predicted_prefix=predicted)
    head = [x for x in first if x in everything]
    seen = set(head)
    return Ranking(head + [cands[i] for i in order if cands[i] not in seen], model)


class Ranking(list):
    """The predicted ranking (a plain list of names) with the model behind it as ``model`` (a :class:`Prediction`):
    a strategy that only orders uses the list; one that wants the model's forecast of a plan asks ``model``."""

    def __init__(self, names: Sequence[str], model: "Prediction | None" = None) -> None:
        super().__init__(names)
        self.model = model


class Prediction:
    """The root-sum-square model of the module note, for any plan: ``excess(fp32)`` is the predicted excess
    (error / tolerance, the ``excess`` hint's units: above ``margin`` fails) of the plan keeping ``fp32`` in FP32,
    c·sqrt(max over the kept elements of Σ_{i FP16} z_i²)·margin. Holds the n × k squared errors at the kept
    elements (float32: 600 × 4096 is 9.8 MB) and the scale c², set by ``calibrate`` from one real excess (the
    ranking's own calibration when it had one, else 1: uncalibrated). Only names cross this interface."""

    def __init__(self, names: Sequence[str], q: np.ndarray, margin: float = 1.0, scale: float = 1.0) -> None:
        self.names = list(names)
        self.index = {x: i for i, x in enumerate(self.names)}
        self.q = np.ascontiguousarray(q, np.float32)  # squared normalised errors, nodes x kept elements
        self.margin = float(margin)
        self.scale = float(scale)  # c²
        self._all = self.q.sum(0, dtype=np.float64)

    def _mask(self, fp32) -> np.ndarray:
        keep = np.zeros(len(self.names), bool)
        idx = [self.index[x] for x in fp32 if x in self.index]
        keep[idx] = True
        return keep

    def load(self, fp32) -> np.ndarray:
        """Σ_{i FP16} z_i² per kept element (unscaled), float64."""
        keep = self._mask(fp32)
        if keep.sum() * 2 < len(keep):
            return np.maximum(self._all - self.q[keep].sum(0, dtype=np.float64), 0.0)
        return self.q[~keep].sum(0, dtype=np.float64)

    def raw(self, fp32) -> float:
        """The uncalibrated excess in units of |z| (c = 1, no margin)."""
        return float(np.sqrt(self.load(fp32).max(initial=0.0)))

    def excess(self, fp32) -> float:
        """The predicted excess of the plan keeping ``fp32`` FP32 (above ``margin``: predicted to fail)."""
        return float(np.sqrt(self.scale) * self.raw(fp32) * self.margin)

    def calibrate(self, fp32, excess: float) -> bool:
        """Scale the model so that its excess of ``fp32`` is ``excess`` (a real one); False (unchanged) when
        either is not a positive finite number."""
        raw = self.raw(fp32)
        if not (isinstance(excess, (int, float)) and np.isfinite(excess) and excess > 0 and raw > 0):
            return False
        self.scale = float((excess / self.margin / raw) ** 2)
        return True

    def eliminate(self, fp32, budget: float | None = None) -> list[tuple[str, float]]:
        """Backward elimination: from the plan keeping ``fp32`` FP32, move its members to FP16 one at a time,
        each time the one whose move raises the predicted violation least (Σ_elements relu(pred² − budget²);
        while nothing is violated, the least Σ_elements z_i² / room left: the scarce elements weigh more).
        Returns (member, predicted excess after the move) for every member, in that order. ``budget``: the
        excess the search may spend (default ``margin``)."""
        members = [self.index[x] for x in dict.fromkeys(fp32) if x in self.index]
        if not members:
            return []
        total = self.load(fp32) * self.scale
        limit = (budget if budget is not None else self.margin) / self.margin
        lim2 = limit * limit
        rows = self.q[members].astype(np.float64) * self.scale
        left = list(range(len(members)))
        out: list[tuple[str, float]] = []
        while left:
            sub = rows[left]
            value = np.empty(len(left))
            room = lim2 - total
            weight = 1.0 / np.maximum(room, 1e-3 * lim2)  # scarce elements weigh more (a knapsack's greedy)
            for at in range(0, len(left), 64):
                t = total[None, :] + sub[at : at + 64]
                value[at : at + 64] = (np.maximum(t - lim2, 0.0).sum(1) * 1e6
                                       + (sub[at : at + 64] * weight[None, :]).sum(1))
            j = int(np.argmin(value))
            total = total + sub[j]
            out.append((self.names[members[left[j]]], float(np.sqrt(total.max(initial=0.0)) * self.margin)))
            left.pop(j)
        return out


def scaled_error(out: Any, g: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """(out - g) / thr as one float32 array (in place after the subtraction: 17 MB each on a recogniser at batch 8,
    were 4 temporaries each), NaN and ±inf as ±1e6 (only squares are used: the sign does not matter)."""
    z = np.asarray(out, np.float32).ravel() - g
    np.divide(z, thr, out=z)
    # A finite sum means no NaN or inf (either one makes the sum non-finite); nan_to_num's own scan cost 19 ms of
    # each single-node run on a 17 MB output (7.6 of the recogniser's 70 s of ranking), with nothing to replace.
    if not np.isfinite(np.add.reduce(z, dtype=np.float64)):
        np.nan_to_num(z, copy=False, nan=1e6, posinf=1e6, neginf=-1e6)
    return z


_STEP = 1 << 18  # elements per chunk of the whole-output arithmetic: a few MB of temporaries at any output size


def _threshold(g: np.ndarray, atol: float, rtol: float, margin: float) -> np.ndarray:
    """Each element's tolerance, max(atol, rtol·|g|) · margin (|g| as the comparator takes it), at least
    float32's smallest normal, as float32 — chunk by chunk: whole-array, its two temporaries (|g| with epsilon, the
    unrounded threshold) stayed alive through the ranking, 32 of the 128 MB it held on a recogniser at batch 8."""
    out = np.empty(g.size, np.float32)
    tiny = np.finfo(np.float32).tiny
    for lo in range(0, g.size, _STEP):
        c = g[lo:lo + _STEP]
        out[lo:lo + _STEP] = np.maximum(np.maximum(atol, rtol * golden_magnitude(c)) * margin, tiny)
    return out


def _accumulate_squares(ss: np.ndarray, v: np.ndarray, times: int = 1) -> None:
    """ss += times · v² in float64 (what v.astype(float64) ** 2 adds), chunk by chunk: no float64 copy of v."""
    for lo in range(0, v.size, _STEP):
        sq = np.square(v[lo:lo + _STEP], dtype=np.float64)
        if times != 1:
            sq *= times
        ss[lo:lo + _STEP] += sq


class _Counter:
    """``on_run(done, total)`` for the vectors as they are yielded (the consumer's thread); passes counted on."""

    def __init__(self, on_run: Callable[[int, int], None] | None, total: int) -> None:
        self.on_run, self.total, self.done = on_run, total, 0
        if on_run is not None:
            on_run(0, total)  # the runs start now (after the calibration evaluation, which is not one of them)

    def __call__(self) -> None:
        self.done += 1
        if self.on_run is not None:
            self.on_run(self.done, self.total)


def _at_risk(vector, rep: list[int], size: int, k: int, threads: int | None = None,
             on_run: Callable[[int, int], None] | None = None,
             everything: Callable[[], np.ndarray] | None = None) -> np.ndarray:
    """The n vectors at the k elements with the largest Σ_i z_i², in one pass over the candidates: the vectors wait
    in an unlinked temporary file (TMPDIR; the page cache, not the process's memory: 303 vectors of 75k numbers
    held in memory took a 6 x 384 transformer's search from 241 to 561 MB), and are read back at those elements.
    Where no temporary file can be written, the vectors are computed twice (first the sums, then the elements), or,
    given ``everything`` (the all-FP16 plan's vector), once: at the PRESELECT x k elements where that plan errs
    most, which under the model are where Σ_i z_i² is largest (`_preselected`).
    ``rep[i]``: the candidate whose vector is candidate i's (i itself, or an earlier twin): only those run."""
    import shutil
    import tempfile

    n = len(rep)
    unique = sorted(set(rep))
    times = {u: 0 for u in unique}
    for r in rep:
        times[r] += 1
    members: dict[int, list[int]] = {u: [] for u in unique}
    for i, r in enumerate(rep):
        members[r].append(i)

    def vectors(count: "_Counter"):
        return in_order(lambda m: vector(unique[m]), len(unique), threads, count)

    try:
        # The file holds the vectors that run (up to n x size x 4 bytes: 6.8 GB for a recogniser at batch 8). Where
        # that is more than half the free space of TMPDIR (on a tmpfs: memory), compute the vectors twice instead.
        if len(unique) * size * 4 > shutil.disk_usage(tempfile.gettempdir()).free // 2:
            raise OSError("the vectors would fill the temporary directory")
        ss = np.zeros(size, np.float64)
        # written and read back with plain file calls, not mapped: the pages of a mapped file count in the
        # process's resident memory (a memmap here cost the 6 x 384 search ~80 MB of RSS)
        with tempfile.TemporaryFile(prefix="bisector-vectors-") as f:
            v = None
            for u, v in zip(unique, vectors(_Counter(on_run, len(unique)))):
                v = np.ascontiguousarray(v, np.float32)
                f.write(memoryview(v).cast("B"))
                _accumulate_squares(ss, v, times[u])
            del v
            keep = np.argsort(np.negative(ss, out=ss))[:k]  # = argsort(-ss), without a copy of ss
            del ss
            z = np.empty((n, k), np.float32)
            row = np.empty(size, np.float32)
            f.seek(0)
            for u in unique:
                if f.readinto(memoryview(row).cast("B")) != row.nbytes:
                    raise OSError("short read of the vectors' temporary file")
                z[members[u]] = row[keep]
            return z
    except OSError:
        ss = None  # a first pass cut short: its sums go before the two-pass sums are allocated
    if everything is not None:
        return _preselected(vectors, everything, rep, unique, members, times, size, k, on_run)
    ss = np.zeros(size, np.float64)
    count = _Counter(on_run, 2 * len(unique))  # both passes
    for u, v in zip(unique, vectors(count)):
        _accumulate_squares(ss, v, times[u])
    keep = np.argsort(np.negative(ss, out=ss))[:k]
    del ss
    z = np.empty((n, k), np.float32)
    for u, v in zip(unique, vectors(count)):
        z[members[u]] = v[keep]
    return z


PRESELECT = 4  # `_preselected`: elements kept per element the model keeps
PRESELECT_BYTES = 256 << 20  # at most this much of the preselected rows in memory (fewer elements beyond)


def _preselected(vectors, everything: Callable[[], np.ndarray], rep: list[int], unique: list[int],
                 members: dict[int, list[int]], times: dict[int, int], size: int, k: int,
                 on_run: Callable[[int, int], None] | None) -> np.ndarray:
    """`_at_risk` in one pass where the vectors cannot wait on disk: an image segmenter's 12 outputs (30 M numbers
    at 1024², 727 candidates: 87 GB of vectors) ran every candidate twice, 40 minutes of runs on 2 cores. The model
    says a plan's error per element is c·sqrt(Σ_{i FP16} z_i²), so the all-FP16 plan errs most where Σ_i z_i² is
    largest: its PRESELECT·k largest |z| are taken, each candidate's vector kept there, and the k with the largest
    sum of squares among them chosen. Exact where those elements hold the top k; one run more than the
    candidates' instead of twice theirs."""
    width = int(min(size, max(k, min(PRESELECT * k, PRESELECT_BYTES // max(4 * len(unique), 1)))))
    worst = np.negative(np.abs(np.asarray(everything(), np.float32)))
    # the width largest in any order (a partition, O(size): a full argsort of 30 M numbers took seconds)
    pre = np.argpartition(worst, width - 1)[:width] if width < size else np.arange(size)
    del worst
    log.info("predicted ranking: the candidates' error vectors (%d x %d numbers) do not fit the temporary "
             "directory; ranked at the %d elements where the all-FP16 plan errs most, one run each", len(unique),
             size, width)
    rows = np.empty((len(unique), width), np.float32)
    ss = np.zeros(width, np.float64)
    for m, v in enumerate(vectors(_Counter(on_run, len(unique)))):
        rows[m] = np.asarray(v, np.float32)[pre]
        _accumulate_squares(ss, rows[m], times[unique[m]])
    keep = np.argsort(np.negative(ss, out=ss))[:k]
    z = np.empty((len(rep), len(keep)), np.float32)
    for m, u in enumerate(unique):
        z[members[u]] = rows[m, keep]
    return z


def in_order(vector, n: int, threads: int | None = None, done: Callable[[], None] | None = None) -> Iterator[np.ndarray]:
    """vector(0), ..., vector(n - 1), computed `threads` at a time (the emulate backend takes concurrent runs,
    as evaluation threads do; its block sessions mostly run on one thread each), yielded in order, at most
    2 x threads computed ahead. ``done()`` is called in the consumer's thread as each one is ready."""
    from bisector.cores import usable_cores

    threads = threads or usable_cores()
    if threads <= 1 or n <= 1:
        for i in range(n):
            v = vector(i)
            if done is not None:
                done()
            yield v
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="bisector-ranking") as pool:
        pending: deque = deque()
        nxt = 0
        try:
            for _ in range(n):
                while nxt < n and len(pending) < 2 * threads:
                    pending.append(pool.submit(vector, nxt))
                    nxt += 1
                v = pending.popleft().result()
                if done is not None:
                    done()
                yield v
        finally:
            for fut in pending:
                fut.cancel()


# A greedy step computes the bound below first from PRUNE_FROM nodes and PRUNE_ELEMENTS of (node, violated
# element) pairs; below either, every node's value (the bound's own pass and sort would cost more than they save:
# PP-OCRv5's recogniser, 535 nodes and a few violated elements a step, 0.07 -> 0.18 s with the bound always on)
PRUNE_FROM = 128
PRUNE_ELEMENTS = 1 << 20


def _gain_bounds(rows_of: Callable, idx: np.ndarray, cols: Any, base: np.ndarray,
                 column_max: np.ndarray) -> np.ndarray:
    """An upper bound of how much moving each node idx[i] lowers Σ_e h(total_e), h(t) = relu(sqrt(t) − 1):
    Σ_e q_je · w_e with w_e = 1 / (2 sqrt(max(total_e − M_e, 1))), M_e the largest q_·e. Why: h is 0 up to 1 and
    concave above, with slope 1 / (2 sqrt(t)); the node's own square q ≤ M takes total − q ≥ total − M, so
    h(total) − h(total − q) ≤ q / (2 sqrt(max(total − M, 1))) (where total − q < 1, h(total) ≤ q / 2 and w = 1/2).
    One matrix-vector product per 64 nodes instead of the value's seven passes; raised by 1e-6 relative against
    rounding (all terms are positive)."""
    with np.errstate(all="ignore"):
        w = np.where(base > 1.0, 0.5 / np.sqrt(np.maximum(base - column_max[cols], 1.0)), 0.0)
    bound = np.empty(len(idx))
    for lo in range(0, len(idx), 64):
        bound[lo : lo + 64] = rows_of(idx[lo : lo + 64], cols) @ w
    return bound * (1 + 1e-6) + 1e-12


def _pruned_argmin(values: Callable[[np.ndarray], np.ndarray], bound: np.ndarray, base: np.ndarray,
                   tie: np.ndarray) -> int:
    """argmin_i values(i) + tie[i] (the first of equals, as np.argmin), computing values only where they can win:
    value_i ≥ Σ_e h(total_e) − bound_i, so the nodes go in order of that floor, 64 at a time, until the next floor
    is above the least value found (with a slack far above the float64 sums' rounding)."""
    with np.errstate(all="ignore"):
        everything = float(np.maximum(np.sqrt(base) - 1.0, 0.0).sum())
    floor = everything - bound + tie
    slack = 1e-7 * (everything + 1.0)
    order = np.argsort(floor, kind="stable")
    best, best_at, done = np.inf, -1, 0
    while done < len(order):
        if floor[order[done]] > best + slack:
            break
        at = order[done : done + 64]
        value = values(at) + tie[at]
        done += len(at)
        for v, i in zip(value.tolist(), at.tolist()):
            if v < best or (v == best and i < best_at):
                best, best_at = v, i
    return best_at


def _greedy(q: np.ndarray, first: list[int], start: float | None, squared: bool = True) -> tuple[list[int], int]:
    """The greedy order on squared normalised errors ``q`` (nodes × elements; not changed), or on the errors
    themselves (``squared=False``: float32, squared into float64 a chunk at a time — the n x k float64 squares
    held whole were the search's peak after a 12 x 384 transformer's ranking, +20 MB; the same numbers, so the
    same order); ``first`` are FP32 from the start; ``start``: the real excess of that start in units of the
    margin (scales the model to it), or None.

    While the prediction is violated, the node moved next is the one whose removal leaves the least
    Σ_e relu(sqrt(total_e − q_je) − 1) (ties: the least Σ_e (total_e − q_je)). Only the elements still violated
    (total_e > 1) can add to the first sum, so only those columns are computed, and the second is
    Σ total − Σ_e q_je, from row sums: the full n × k pass per step was ~10 of a 12 x 384 transformer's 24 s of
    ranking. Once nothing is violated, the least Σ_e (total_e − q_je) is the largest row sum, and moving a node
    does not change how the others compare: the rest follows in order of row sums."""
    n = q.shape[0]
    fp16 = np.ones(n, bool)
    fp16[first] = False
    scale = 1.0

    # The chunks' work arrays, reused: the command fixes glibc's mmap threshold (bisector.heap), so a fresh
    # temporary of a MB or two per chunk was a new map whose pages fault in on first touch — on a 60-output
    # chain's 1200 x 2777 errors that doubled the greedy's time (6.8 -> 13.5 s)
    width = q.shape[1]
    gathered, picked = np.empty(64 * width, q.dtype), np.empty(64 * width, q.dtype)
    scaled = np.empty(64 * width)

    def rows_of(r, cols=slice(None)) -> np.ndarray:
        """The scaled squares at rows ``r`` (an index array or a slice; 64 at most), columns ``cols``, as
        float64 — in a work array that the next call overwrites. (Scaling commutes with indexing bit for bit:
        what scaling the whole array first gave.)"""
        if isinstance(r, slice):
            part = q[r]
        else:
            part = np.take(q, r, axis=0, out=gathered[: len(r) * width].reshape(len(r), width), mode="clip")
        if not isinstance(cols, slice):
            part = np.take(part, cols, axis=1, out=picked[: len(part) * len(cols)].reshape(len(part), len(cols)),
                           mode="clip")
        elif cols != slice(None):
            part = part[:, cols]
        out = scaled[: part.shape[0] * part.shape[1]].reshape(part.shape)
        if squared:
            np.copyto(out, part)
        else:
            np.square(part, out=out, dtype=np.float64)
        if scale != 1.0:
            out *= scale
        return out

    total = np.zeros(q.shape[1])
    for i in np.flatnonzero(fp16):  # row by row, as q[fp16].sum(0) adds them, without its n x k copy
        total += rows_of(slice(i, i + 1))[0]
    if start is not None and np.isfinite(start) and start > 0 and total.max() > 0:
        scale = (start / np.sqrt(total.max())) ** 2  # c²: the model's excess of the start = the real one
    total = total * scale
    rows = np.concatenate([rows_of(slice(at, at + 64)).sum(1) for at in range(0, n, 64)]) if n else np.zeros(0)
    column_max: np.ndarray | None = None  # each element's largest scaled square over all nodes (`_gain_bounds`)
    order: list[int] = []
    while fp16.any():
        over = np.flatnonzero(total > 1.0)
        if not over.size:
            break
        idx = np.flatnonzero(fp16)
        cols = over if 2 * over.size < total.size else slice(None)  # the rest add 0: a plain slice is cheaper
        base = total[cols]

        def values(at: np.ndarray) -> np.ndarray:
            """Σ_e relu(sqrt(total_e − q_je) − 1) of the nodes idx[at], 64 at a time (bounded float64
            temporaries); each node's sum is its own row's, whichever others are computed with it."""
            value = np.empty(len(at))
            for lo in range(0, len(at), 64):
                part = rows_of(idx[at[lo : lo + 64]], cols)
                np.subtract(base[None, :], part, out=part)
                np.maximum(part, 0.0, out=part)
                np.sqrt(part, out=part)
                part -= 1.0
                np.maximum(part, 0.0, out=part)
                value[lo : lo + 64] = part.sum(1)
            return value

        tie = 1e-9 * (total.sum() - rows[idx])
        if len(idx) < PRUNE_FROM or len(idx) * len(base) < PRUNE_ELEMENTS:
            value = values(np.arange(len(idx))) + tie
            j = int(idx[int(np.argmin(value))])
        else:
            if column_max is None:
                column_max = np.zeros(q.shape[1])
                for at in range(0, n, 64):
                    np.maximum(column_max, rows_of(slice(at, at + 64)).max(0), out=column_max)
            j = int(idx[_pruned_argmin(values, _gain_bounds(rows_of, idx, cols, base, column_max), base, tie)])
        fp16[j] = False
        order.append(j)
        total = np.maximum(total - rows_of(slice(j, j + 1))[0], 0.0)
    predicted = len(first) + len(order)
    rest = np.flatnonzero(fp16)
    order.extend(int(i) for i in rest[np.argsort(-rows[rest], kind="stable")])
    return order, predicted
