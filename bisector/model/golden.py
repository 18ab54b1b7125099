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

from bisector.model import catalog as _catalog
from bisector.files import write_file_atomic
from bisector.model.catalog import Catalog
from bisector.errors import UsageError
from bisector.model.inputs import inputs_digest
from bisector.model.polyjson import Feeds, load_run_results

log = logging.getLogger("bisector")
GOLDEN_FORMAT = "golden-v1"


@dataclass
class Golden:
    outputs: list[Feeds]  # one dict per input set: graph output name -> array
    source: str  # computed | cache | file
    reference_runs: int
    seconds: float
    path: Path | None = None


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
    load_outputs: Path | None = None,
) -> Golden:
    if load_outputs is not None:
        runner, outs = load_run_results(Path(load_outputs))
        if len(outs) < len(feeds_list):
            raise UsageError(f"--load-outputs {load_outputs}: {len(outs)} iteration(s) for {len(feeds_list)} input set(s)")
        outs = outs[: len(feeds_list)]
        for i, o in enumerate(outs):
            missing = sorted(set(catalog.output_names) - set(o))
            if missing:
                raise UsageError(f"--load-outputs {load_outputs} (runner {runner}, iteration {i}): missing output(s) {missing}")
        _check_against_model(catalog, outs, Path(load_outputs))
        golden = Golden([{k: spill(o[k]) for k in catalog.output_names} for o in outs], "file", 0, 0.0, Path(load_outputs))
        check_finite(golden)
        return golden

    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "golden" / f"{golden_key(catalog, feeds_list)}.npz"
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as data:  # one array in memory at a time
                    outs = [{k: spill(data[f"{i}/{k}"]) for k in catalog.output_names} for i in range(len(feeds_list))]
                golden = Golden(outs, "cache", 0, 0.0, path)
                check_finite(golden)
                return golden
            except UsageError:
                raise
            except Exception as exc:  # a corrupt cache entry is recomputed, never trusted
                log.warning("ignoring unreadable golden cache %s (%s)", path, exc)

    t0 = time.perf_counter()
    outs = run_reference_model(catalog, feeds_list)
    golden = Golden(outs, "computed", len(feeds_list), time.perf_counter() - t0, path)
    check_finite(golden)
    if path is not None:
        arrays = {f"{i}/{k}": v for i, o in enumerate(outs) for k, v in o.items()}
        try:
            write_file_atomic(path, lambda f: np.savez(f, **arrays))  # streamed: no second copy in memory
        except UsageError as exc:  # a cache we cannot write costs time, not correctness
            log.warning("golden outputs not cached: %s", exc)
    return golden


def _check_against_model(catalog: Catalog, outs: Sequence[Feeds], path: Path) -> None:
    """Golden outputs from a file must be the model's: its declared output dtypes and static shapes (a file of
    another model is an input error, exit 2 — not an accuracy failure that 'nothing passes')."""
    from onnx import helper

    for o in catalog.model.graph.output:
        t = o.type.tensor_type
        want_dtype = helper.tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
        for i, got in enumerate(outs):
            a = np.asarray(got[o.name]) if not isinstance(got[o.name], np.ndarray) else got[o.name]
            where = f"--load-outputs {path} (iteration {i}), output {o.name!r}"
            if want_dtype is not None and a.dtype != want_dtype and not (
                    np.issubdtype(a.dtype, np.floating) and np.issubdtype(want_dtype, np.floating)):
                raise UsageError(f"{where}: dtype {a.dtype}, but the model's output is {want_dtype}")
            if dims is not None and (len(dims) != a.ndim or any(
                    d is not None and d > 0 and d != n for d, n in zip(dims, a.shape))):
                shown = [d if d else "?" for d in dims]
                raise UsageError(f"{where}: shape {list(a.shape)}, but the model declares {shown}")


def run_reference_model(catalog: Catalog, feeds_list: Sequence[Feeds]) -> list[Feeds]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        if catalog.model.ByteSize() > _catalog.PROTOBUF_LIMIT:
            # SerializeToString fails beyond 2 GB: ONNX Runtime reads the file and its external data itself.
            if not catalog.path.is_file():
                raise UsageError(f"{catalog.path}: a model beyond 2 GB must be loaded from a file with external data")
            session = ort.InferenceSession(str(catalog.path), opts, providers=["CPUExecutionProvider"])
        else:
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
            raise UsageError(f"the FP32 reference run failed on input set {i}: {exc}{_dynamic_hint(catalog, feeds)}") from None
        outs.append({k: spill(v) for k, v in zip(names, values)})
    return outs


def _dynamic_hint(catalog: Catalog, feeds: Feeds) -> str:
    """When dynamic dimensions were set to 1 by default, say so: that is the usual reason a model cannot run."""
    from bisector.model.inputs import input_metas

    dynamic = [f"{m.name}{list(m.shape)}" for m in input_metas(catalog)
               if m.shape is not None and any(not (isinstance(d, int) and d > 0) for d in m.shape)]
    if not dynamic:
        return ""
    used = ", ".join(f"{k}:{list(np.shape(v))}" for k, v in feeds.items())
    return (f". The model has dynamic input dimensions ({', '.join(dynamic)}); the run used {used}. "
            f"Give the shapes the model needs with --input-shapes, e.g. --input-shapes {dynamic[0].split('[')[0]}:[...]")


# ---- large arrays: spilled to disk beyond a threshold (Polygraphy's POLYGRAPHY_ARRAY_SWAP_THRESHOLD_MB) --------
SWAP_ENV = "BISECTOR_ARRAY_SWAP_THRESHOLD_MB"
_swap_dir: tempfile.TemporaryDirectory | None = None


def swap_threshold_bytes() -> int | None:
    """Arrays larger than this many bytes live in memory-mapped files; None (unset or negative): never."""
    text = os.environ.get(SWAP_ENV, "").strip()
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


def check_finite(golden: Golden) -> None:
    """NaN/Inf in the FP32 reference make every comparison meaningless: stop, do not search blindly."""
    for i, outs in enumerate(golden.outputs):
        for name, a in outs.items():
            if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
                n_nan, n_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
                raise UsageError(
                    f"the FP32 golden output {name!r} (input set {i}, source {golden.source}) contains "
                    f"{n_nan} NaN and {n_inf} Inf values; comparisons against it are meaningless. Check the model "
                    f"and the input ranges (--val-range) first."
                )
