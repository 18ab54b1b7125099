"""`emulate`: exact FP16 *storage* emulation on the CPU (DESIGN §4), the default backend.

The graph stays FP32; wherever a real FP16 build would store a tensor in FP16, the value is rounded the way an
FP16 tensor holds it. ONNX Runtime's CPU provider is never asked to run FP16 itself: it silently computes FP16
graphs in FP32 (measured), which would approve every plan.

Cost per plan: only the forward cone of the plan's FP16 nodes is recomputed (see executor.py); sessions are
built once per node, not once per plan.
"""

from __future__ import annotations

import contextlib
import threading

from typing import Iterator, Mapping, Sequence

import numpy as np
import onnxruntime as ort

from bisector import __version__, machine
from bisector.model.catalog import Catalog
from bisector.backends.emulate.executor import NodeExecutor, Overlay
from bisector.backends.emulate.reference import ReferenceStore
from bisector.fp16 import rules
from bisector.fp16.arithmetic import check_mode, rules_tag
from bisector.fp16.plan import Plan
from bisector.fp16.points import rounding_points
from bisector.model.inputs import feeds_digest


class EmulateBackend:
    name = "emulate"
    # A run on one item of a batch computes what the batch run computes at that item (ORT's CPU kernels choose
    # their algorithm from shapes, not values; bisector.search.screen checks it per model and item, bit for bit)
    screens_items = True
    # Judging an item first saves its share of each block's compute; each block's ONNX Runtime call costs the
    # same either way. Where the tensors crossing block boundaries average under this many bytes in the batch's
    # FP32 reference, the calls are the run: a 60-output chain on a 4 x 16 batch took 77 s screened and 59 s
    # judging whole batches (docs/benchmarks.md, "Scale, thirty-fifth round"). Decided from sizes, not timings:
    # the same on every machine.
    SCREEN_FROM_BYTES = 64 << 10

    def __init__(self, threads: int = 0, reference_cache_size: int = 8, block_size: int | None = None,
                 arithmetic: str = "storage", storage: str = "fp16"):
        self.arithmetic = check_mode(arithmetic)
        if storage not in rules.STORAGES:
            raise ValueError(f"storage {storage!r}: fp16 or bf16")
        self.storage = storage  # what the plan's non-FP32 nodes store: FP16 (default) or BF16 (`run --trt --bf16`)
        self.block_size = block_size
        self.threads = threads
        self.reference_cache_size = reference_cache_size
        self.catalog: Catalog | None = None
        self.executor: NodeExecutor | None = None
        self._references: dict[str, ReferenceStore] = {}
        self._boundaries: dict[str, ReferenceStore] = {}
        self._feeds_keys: dict[int, tuple[Mapping[str, np.ndarray], str]] = {}
        self._reference_lock = threading.Lock()  # evaluation threads: one FP32 reference per feeds, computed once

    # ---- protocol ------------------------------------------------------------------------------------------
    def open(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.executor = NodeExecutor(catalog, threads=self.threads, block_size=self.block_size,
                                     arithmetic=self.arithmetic, storage=self.storage)
        self._references.clear()
        self._boundaries.clear()
        self._feeds_keys.clear()

    def describe(self) -> dict[str, str]:
        tag = rules_tag(self.arithmetic)
        # cpu_kernels: part of the journal's key, since the same plan's bits can differ on another CPU or pool
        return {"backend": self.name, "onnxruntime": ort.__version__,
                "rules": tag if self.storage == "fp16" else f"bf16-{tag}", "bisector": __version__,
                "cpu_kernels": machine.cpu_kernels()}

    def rounded_weights(self) -> dict[str, np.ndarray]:
        """The FP16-rounded weight copies the search still holds (by the weight rule: FP16 arrays, or FP32 arrays
        of FP16 values), for the mixed model's writer to use instead of rounding again; {} for BF16 storage."""
        if self.executor is None or self.executor.storage != "fp16":
            return {}
        executor = self.executor
        paged = {k[1] if isinstance(k, tuple) else k: v for k, v in executor._paged.items()}
        return {**executor._converted, **executor._halves, **paged}

    @contextlib.contextmanager
    def part_of_the_batch(self, scale: float) -> Iterator[None]:
        """Runs inside this block take 1/`scale` of the batch (bisector.search.screen's items, the predicted
        ranking's sample): a block session built by one of them gets its intra-op pool as if the whole batch had
        run (a session first run on one item of eight was left single-threaded, and the batch's later runs of it
        took up to twice as long on 2 cores). The same results, but for a MatMul whose output is small against its
        inner sum, which MLAS splits across threads (README, known issues)."""
        executor = self.executor
        before, executor.run_scale = executor.run_scale, max(1.0, float(scale))
        try:
            yield
        finally:
            executor.run_scale = before

    def drop_plan_states(self) -> None:
        """Let go of the latest plan's tensors that the search's evaluations resume from (`NodeExecutor`'s
        `plan_states`): after the search, before what follows it allocates."""
        if self.executor is not None:
            self.executor.drop_plan_states()

    @contextlib.contextmanager
    def one_off_plans(self) -> Iterator[None]:
        """Plans run inside this block are not asked again (the predicted ranking's single-node plans): the block
        sessions built for them are freed after their run instead of kept (bisector.search.vector_ranking)."""
        executor = self.executor
        before, executor.keep_variants = executor.keep_variants, False
        # The latest plan's tensors go too: the single-node runs do not resume from them, and their peak (the
        # ranking's per-node error vectors) would stack on them (the layout detector: +8% peak with them kept)
        executor.drop_plan_states()
        try:
            yield
        finally:
            executor.keep_variants = before

    @contextlib.contextmanager
    def once_after_search(self) -> Iterator[None]:
        """Plans run inside this block are one-off runs after the search (the held-out inputs' check,
        bisector.app.held_out): no block session is kept for them, and each run gives back the pages of the
        file-backed weights it read. Their FP32 reference reads every weight; without this the whole model's
        weights came back into the process at once (a 3-evaluation search of a 226 MB-weight transformer: peak
        407 -> 467 MB)."""
        executor = self.executor
        before = executor.keep_variants, executor.release_fed
        executor.keep_variants, executor.release_fed = False, True
        executor.drop_plan_states()  # (a search's, of no use to these runs)
        try:
            yield
        finally:
            executor.keep_variants, executor.release_fed = before

    def expect_inference_peak(self, peak_bytes: int | None) -> None:
        """The peak resident memory of the process that computed the golden outputs (bytes; None: unknown): the
        memory levels the executor keeps to (`NodeExecutor.set_baseline`) start from it where this process's own
        peak is lower, as it is where the goldens came from the cache."""
        if self.executor is not None:
            self.executor.set_baseline(peak_bytes)

    def forget(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Drop the FP32 references of these feeds (the ranking's batch sample, bisector.search.vector_ranking:
        asked for a while, then never again; kept, they would hold memory and a place in the bounded caches)."""
        with self._reference_lock:
            known = self._feeds_keys.pop(id(feeds), None)
            key = known[1] if known is not None and known[0] is feeds else feeds_digest(feeds)
            self._references.pop(key, None)
            self._boundaries.pop(key, None)

    def close(self) -> None:
        self.executor = None
        for cache in (self._references, self._boundaries, self._feeds_keys):
            cache.clear()

    def run(self, plan: Plan, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        # Fused blocks do not return block-internal tensors: asking for one runs node by node.
        fused = outputs is None or set(outputs) <= set(self.catalog.output_names)
        tensors = self._evaluate(plan, feeds, fused=fused)
        names = list(outputs) if outputs is not None else self.catalog.output_names
        return {n: tensors[n] for n in names}

    def screen_pays(self, feeds: Mapping[str, np.ndarray]) -> bool:
        """Whether judging part of this batch first can cost less than the batch (bisector.search.screen): the
        tensors between its blocks (the FP32 reference a search reads, graph outputs included) average at least
        SCREEN_FROM_BYTES."""
        executor = self.executor
        if executor is None or not executor.blocks:
            return True
        ref = self._boundary_reference(feeds)  # sizes without reading spilled tensors back
        given = set(executor.weights) | set(feeds)
        tensors = sum(1 for k in ref if k not in given)
        return ref.computed_bytes(given) >= self.SCREEN_FROM_BYTES * max(tensors, 1)

    # ---- extras used by `run --mark-all` and `profile` -------------------------------------------------------
    def reference(self, feeds: Mapping[str, np.ndarray]) -> ReferenceStore:
        """All tensors of the FP32 run for these feeds (computed once per distinct feeds)."""
        key = self._feeds_key(feeds)
        ref = self._references.get(key)
        if ref is None:
            with self._reference_lock:
                ref = self._references.get(key)
                if ref is None:
                    if len(self._references) >= self.reference_cache_size:
                        self._references.pop(next(iter(self._references)))
                    ref = self._references[key] = self.executor.run_reference(feeds)
        return ref

    def run_node_by_node(self, plan: Plan, feeds: Mapping[str, np.ndarray],
                         outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The graph outputs under `plan` with every node of its cone run alone (no fusion across a block's FP32
        nodes), at a fused evaluation's memory: the second opinion on a final set (bisector.app.second_opinion).
        Near FP16's resolution an FP32 ulp that a fusion moves can flip a later FP16 rounding (README)."""
        names = list(outputs) if outputs is not None else self.catalog.output_names
        if not set(names) <= set(self.catalog.output_names):
            raise ValueError("run_node_by_node returns graph outputs only")
        ref = self._boundary_reference(feeds)
        points = rounding_points(self.catalog, plan)
        if not points.fp16:
            return {n: ref[n] for n in names}
        self.executor.drop_plan_states()  # asked once the search is over: its latest plan is of no use here
        tensors = Overlay(self.executor.run_changed(ref, points, fused=True, per_node=True), ref)
        return {n: tensors[n] for n in names}

    def node_by_node_differs(self, plan: Plan) -> bool:
        """Whether `run_node_by_node` can give other bits than `run` for `plan` (some block of its cone fuses FP32
        nodes); False: both compute the same, and the fused verdict stands for both."""
        points = rounding_points(self.catalog, plan)
        return bool(points.fp16) and self.executor.unfused_blocks(points) > 0

    def run_all(self, plan: Plan, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every tensor under `plan` (a view: unchanged tensors are the reference's arrays)."""
        return self._evaluate(plan, feeds, fused=False)

    def _feeds_key(self, feeds: Mapping[str, np.ndarray]) -> str:
        """The feeds' content digest, hashed once per feeds object: the oracle passes the same input sets to
        every evaluation, and hashing large inputs on each one would be repeated work on the hot path."""
        known = self._feeds_keys.get(id(feeds))
        if known is not None and known[0] is feeds:
            return known[1]
        key = feeds_digest(feeds)
        self._feeds_keys[id(feeds)] = (feeds, key)  # holding `feeds` keeps its id from being reused
        return key

    def _boundary_reference(self, feeds: Mapping[str, np.ndarray]) -> ReferenceStore:
        """What fused evaluation reads: the FP32 tensors crossing block boundaries (the full reference if known)."""
        key = self._feeds_key(feeds)
        ref = self._references.get(key) or self._boundaries.get(key)
        if ref is None:
            with self._reference_lock:
                ref = self._references.get(key) or self._boundaries.get(key)
                if ref is None:
                    if len(self._boundaries) >= self.reference_cache_size:
                        self._boundaries.pop(next(iter(self._boundaries)))
                    ref = self._boundaries[key] = self.executor.run_reference(feeds, boundary_only=True)
        return ref

    def _evaluate(self, plan: Plan, feeds: Mapping[str, np.ndarray], fused: bool) -> Mapping[str, np.ndarray]:
        ref = self._boundary_reference(feeds) if fused else self.reference(feeds)
        points = rounding_points(self.catalog, plan)
        if not points.fp16:
            return ref
        return Overlay(self.executor.run_changed(ref, points, fused=fused), ref)

    def run_node(self, fp16: frozenset[str], node: str, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One node under the rules, its inputs taken from `tensors` (e.g. the FP32 reference).

        `fp16` is the plan's FP16 set: the node reads its inputs and stores its outputs exactly as it would
        inside `run_all`. Returns its outputs (as stored) by tensor name. Used by `profile` for local errors.
        """
        proto = self.catalog.nodes[node]
        spec = self.executor.spec(proto, rounding_points(self.catalog, fp16), tensors)
        outs = self.executor.run_node(proto, [tensors[t] for t in self.catalog.node_inputs(node)], *spec)
        return dict(zip([o for o in proto.output if o], outs))
