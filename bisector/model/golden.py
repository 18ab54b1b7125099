"""Golden FP32 outputs: ONNX Runtime on the original model, computed once per (model, inputs) and cached.

The cache is content-addressed (model bytes, input bytes, ORT version), so a second identical search makes no
reference run at all. `--load-outputs` takes Polygraphy RunResults instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from bisector import heap, ort_pool
from bisector.model import catalog as _catalog
from bisector.model import weights as weight_store
from bisector.files import write_file_atomic
from bisector.model.catalog import Catalog
from bisector.errors import UsageError
from bisector.model.inputs import inputs_digest
from bisector.model.polyjson import Feeds, load_golden_runner

log = logging.getLogger("bisector")
GOLDEN_FORMAT = "golden-v3"  # v2: each entry carries a checksum of its arrays (`_DIGEST`); v3: not from a session
# whose shared weights the transpose optimizer had rewritten (`weights.share_into`: such goldens could be wrong)
_DIGEST = "__digest__"
# The computing process's peak RSS, beside the arrays: not covered by the checksum, and a value that is not a
# positive integer is ignored (it sets memory levels, never a verdict)
_PEAK = "__peak__"


@dataclass
class Golden:
    outputs: list[Feeds]  # one dict per input set: graph output name -> array
    source: str  # computed | cache | file
    reference_runs: int
    seconds: float
    path: Path | None = None
    runner: str | None = None  # the runner of a --load-outputs file that made these outputs
    # Peak resident memory (bytes) of the process that ran the FP32 reference model, just after: about one plain
    # inference (issue 14's yardstick). Kept with a cached entry; the emulator's memory levels start from it
    # (`EmulateBackend.expect_inference_peak`). None: not known (a --load-outputs file, an older cache entry).
    peak_bytes: int | None = None

    def __post_init__(self) -> None:
        # Reference data: read-only, so nothing can change it under a search (and the comparator may keep a
        # golden array's summary for as long as the array lives)
        for feeds in self.outputs:
            for a in feeds.values():
                if isinstance(a, np.ndarray):
                    a.flags.writeable = False


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("bisector"))


def golden_key(catalog: Catalog, feeds_list: Sequence[Feeds]) -> str:
    text = f"{GOLDEN_FORMAT}|{catalog.sha256}|{inputs_digest(feeds_list)}|ort-{ort.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()


def get_golden(
    catalog: Catalog,
    feeds_list: Sequence[Feeds],
    cache_dir: Path | None,
    load_outputs: Path | Sequence[Path] | None = None,
    *, golden_runner: str | None = None, allow_reduced_golden: bool = False, outputs: Sequence[str] | None = None,
    check: bool = True,
) -> Golden:
    if load_outputs is not None:
        files = [Path(p) for p in load_outputs] if isinstance(load_outputs, (list, tuple)) else [Path(load_outputs)]
        runner, outs, precision = load_golden_runner(files, golden_runner, allow_reduced_golden)
        load_outputs = ", ".join(map(str, files))  # type: ignore[assignment]
        if precision == "unknown":
            log.warning("--load-outputs %s: runner %s does not say in which precision it ran; using it as golden "
                        "because it was named", load_outputs, runner)
        log.info("golden outputs: runner %s of %s", runner, load_outputs)
        if len(outs) < len(feeds_list):
            raise UsageError(f"--load-outputs {load_outputs}: {len(outs)} iteration(s) for {len(feeds_list)} input set(s)")
        outs = outs[: len(feeds_list)]
        wanted = list(outputs) if outputs is not None else catalog.output_names
        for i, o in enumerate(outs):
            missing = sorted(set(wanted) - set(o))
            if missing:
                raise UsageError(f"--load-outputs {load_outputs} (runner {runner}, iteration {i}): missing output(s) {missing}")
            check_declared(catalog, o, f"--load-outputs {load_outputs} (runner {runner}, iteration {i})")
        golden = Golden([{k: spill(o[k]) for k in wanted} for o in outs], "file", 0, 0.0, files[0], runner)
        if check:
            check_finite(golden)
        return golden

    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "golden" / f"{golden_key(catalog, feeds_list)}.npz"
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as data:  # one array in memory at a time
                    outs = [{k: spill(data[f"{i}/{k}"]) for k in catalog.output_names} for i in range(len(feeds_list))]
                    stored = str(data[_DIGEST][()]) if _DIGEST in data.files else None
                    peak = _stored_peak(data[_PEAK]) if _PEAK in data.files else None
                # the entry's own checksum: a bit flip or an edited file (other values, shapes, NaN) is recomputed
                if stored != inputs_digest(outs):
                    raise ValueError("its checksum does not match its arrays (damaged or edited)")
                golden = Golden(outs, "cache", 0, 0.0, path, peak_bytes=peak)
                check_finite(golden)
                return golden
            except Exception as exc:  # a corrupt cache entry is recomputed, never trusted
                log.warning("ignoring unreadable golden cache %s (%s)", path, exc)

    t0 = time.perf_counter()
    before = heap.peak_rss_bytes()
    outs = run_reference_model(catalog, feeds_list)
    after = heap.peak_rss_bytes()
    # Recorded only where the reference run set the process's peak: a peak earlier work set (another model's
    # search in the same process) says nothing of this model's inference
    peak = after if after is not None and before is not None and after > before else None
    golden = Golden(outs, "computed", len(feeds_list), time.perf_counter() - t0, path, peak_bytes=peak)
    check_finite(golden, feeds_list)
    if path is not None:
        arrays = {f"{i}/{k}": v for i, o in enumerate(outs) for k, v in o.items()}
        arrays[_DIGEST] = np.array(inputs_digest(outs))
        if golden.peak_bytes:
            arrays[_PEAK] = np.array(golden.peak_bytes, np.int64)
        try:
            write_file_atomic(path, lambda f: np.savez(f, **arrays))  # streamed: no second copy in memory
        except UsageError as exc:  # a cache we cannot write costs time, not correctness
            log.warning("golden outputs not cached: %s", exc)
    return golden


def run_reference_model(catalog: Catalog, feeds_list: Sequence[Feeds]) -> list[Feeds]:
    opts = ort_pool.session_options()
    opts.log_severity_level = 4  # a failure reaches the user once, as our error with ORT's message in it
    try:
        session = None
        if catalog.external_data and catalog.path.is_file():
            # ONNX Runtime reads the file and its external data itself: no serialised copy of the weights (beyond
            # 2 GB SerializeToString fails; below, it doubles the peak memory of a model with 1 GB of weights).
            try:
                session = ort.InferenceSession(str(catalog.path), opts, providers=["CPUExecutionProvider"])
            except Exception:
                if catalog.model.ByteSize() > _catalog.PROTOBUF_LIMIT:
                    raise
        if session is None and catalog.weight_arrays:
            # On the catalog's own arrays: no serialised copy of the weights, no 2 GB protobuf limit (the
            # protobuf holds stubs). Not first for external data: there ORT maps the file itself, while on
            # handed-over arrays its session set-up made a transient copy of every weight (1.27 GB model:
            # 2.7 GB against 1.4 GB by path).
            session = weight_store.ort_session(catalog.model, catalog.weight_arrays, opts, ["CPUExecutionProvider"])
        if session is None:
            if catalog.model.ByteSize() > _catalog.PROTOBUF_LIMIT:
                raise UsageError(f"{catalog.path}: a model beyond 2 GB must be loaded from a file with external data")
            session = ort.InferenceSession(catalog.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"ONNX Runtime cannot load {catalog.path} for the FP32 reference run: {exc}") from None
    names = [o.name for o in session.get_outputs()]
    outs = []
    for i, feeds in enumerate(feeds_list):
        try:
            values = session.run(names, dict(feeds))
        except Exception as exc:
            said = str(exc).rstrip().rstrip(".")  # ORT's own full stop, before ours
            raise UsageError(f"the FP32 reference run failed on input set {i}: {said}{_dynamic_hint(catalog, feeds)}") from None
        outs.append({k: _own(spill(v)) for k, v in zip(names, values)})
        del values
    return outs


def _stored_peak(value: np.ndarray) -> int | None:
    try:
        peak = int(np.asarray(value).reshape(()))
    except (TypeError, ValueError):
        return None
    return peak if 0 < peak < 1 << 50 else None


def _own(a: np.ndarray) -> np.ndarray:
    """`a` in memory of its own. ONNX Runtime hands back outputs that point into its session's memory arena, and
    an output kept for the whole search (the golden) kept that arena, every activation buffer of the reference
    run, alive with it: PP-OCRv4's recogniser at batch 8 held 64 MB more for its 16 MB output."""
    if isinstance(a, np.ndarray) and not isinstance(a, np.memmap) and a.base is not None and not a.flags.owndata:
        return np.array(a, copy=True)
    return a


def _dynamic_hint(catalog: Catalog, feeds: Feeds) -> str:
    """When dynamic dimensions were set to 1 by default, say so: that is the usual reason a model cannot run."""
    from bisector.model.inputs import input_metas

    dynamic = [f"{m.name}{list(m.shape)}" for m in input_metas(catalog)
               if m.shape is not None and any(not (isinstance(d, int) and d >= 0) for d in m.shape)]
    if not dynamic:
        # the usual reason then: an input that is an index, a shape, a count or a scale got generated values
        return (". If an input carries indices, shapes, counts or scales, give it values the model accepts: "
                "--val-range NAME:[lo,hi], or real inputs with --load-inputs")
    used = ", ".join(f"{k}:{list(np.shape(v))}" for k, v in feeds.items())
    return (f". The model has dynamic input dimensions ({', '.join(dynamic)}); the run used {used}. "
            f"Give the shapes the model needs with --input-shapes, e.g. --input-shapes {dynamic[0].split('[')[0]}:[...]")


# ---- large arrays: spilled to disk beyond a threshold (Polygraphy's POLYGRAPHY_ARRAY_SWAP_THRESHOLD_MB) --------
SWAP_ENV = "BISECTOR_ARRAY_SWAP_THRESHOLD_MB"
POLYGRAPHY_SWAP_ENV = "POLYGRAPHY_ARRAY_SWAP_THRESHOLD_MB"  # Polygraphy's spelling, honoured when ours is unset
_swap_dir: tempfile.TemporaryDirectory | None = None


def swap_threshold_bytes() -> int | None:
    """Arrays larger than this many bytes live in memory-mapped files; None (unset or negative): never."""
    text = (os.environ.get(SWAP_ENV) or os.environ.get(POLYGRAPHY_SWAP_ENV) or "").strip()
    if not text:
        return None
    try:
        mb = float(text)
    except ValueError:
        raise UsageError(f"{SWAP_ENV}={text!r}: expected a number of megabytes") from None
    return None if mb < 0 else int(mb * (1 << 20))


def spill(a: np.ndarray) -> np.ndarray:
    """`a`, or a read-only memory-mapped copy of it on disk when it is beyond the swap threshold."""
    global _swap_dir
    limit = swap_threshold_bytes()
    if limit is None or not isinstance(a, np.ndarray) or a.nbytes <= limit or a.dtype.hasobject:
        return a
    if _swap_dir is None:
        _swap_dir = tempfile.TemporaryDirectory(prefix="bisector-swap-")
    fd, path = tempfile.mkstemp(suffix=".npy", dir=_swap_dir.name)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, a, allow_pickle=False)
    except OSError as exc:
        raise UsageError(f"cannot spill a {a.nbytes >> 20} MB array to {_swap_dir.name}: {exc.strerror or exc}") from None
    return np.load(path, mmap_mode="r")


def check_finite(golden: Golden, feeds_list: Sequence[Feeds] = ()) -> None:
    """NaN/Inf in the FP32 reference make every comparison meaningless: stop, do not search blindly. Where the
    input set itself holds NaN/Inf (loaded inputs, a data loader script), the message says so: --val-range is no
    cause there."""
    for i, outs in enumerate(golden.outputs):
        for name, a in outs.items():
            if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
                n_nan, n_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
                feeds = feeds_list[i] if i < len(feeds_list) else {}
                bad = [k for k, v in feeds.items()
                       if np.issubdtype(np.asarray(v).dtype, np.floating) and not np.all(np.isfinite(v))]
                cause = (f"Input set {i} itself holds NaN or Inf in {', '.join(map(repr, bad))}: give finite inputs."
                         if bad else "Check the model and the input ranges (--val-range) first.")
                raise UsageError(
                    f"the FP32 golden output {name!r} (input set {i}, source {golden.source}) contains "
                    f"{n_nan} NaN and {n_inf} Inf values; comparisons against it are meaningless. {cause}"
                )


def check_declared(catalog: Catalog, outs: Feeds, where: str) -> None:
    """Loaded golden outputs must fit the model: the dtype and static dimensions each graph output declares."""
    from onnx import helper

    for vi in catalog.model.graph.output:
        if vi.name not in outs:
            continue
        a, t = outs[vi.name], vi.type.tensor_type
        if t.elem_type:
            want = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
            if np.asarray(a).dtype != want:
                raise UsageError(f"{where}: output {vi.name!r} has dtype {np.asarray(a).dtype}, the model's is {want}; "
                                 f"these outputs come from another model")
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            shape = np.shape(a)
            if len(shape) != len(dims) or any(d and d != s for d, s in zip(dims, shape)):
                raise UsageError(f"{where}: output {vi.name!r} has shape {list(shape)}, the model declares "
                                 f"{[d if d else '?' for d in dims]}; these outputs come from another model or "
                                 f"other input shapes")
