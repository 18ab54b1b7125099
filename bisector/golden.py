"""Golden FP32 outputs: ONNX Runtime on the original model, computed once per (model, inputs) and cached.

The cache is content-addressed (model bytes, input bytes, ORT version), so a second identical search makes no
reference run at all. `--load-outputs` takes Polygraphy RunResults instead.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from .artifacts.io import write_bytes_atomic
from .catalog import Catalog
from .errors import UsageError
from .inputs import inputs_digest
from .polyjson import Feeds, load_run_results

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
        golden = Golden([{k: o[k] for k in catalog.output_names} for o in outs], "file", 0, 0.0, Path(load_outputs))
        check_finite(golden)
        return golden

    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "golden" / f"{golden_key(catalog, feeds_list)}.npz"
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as data:
                    outs = [{k: data[f"{i}/{k}"] for k in catalog.output_names} for i in range(len(feeds_list))]
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
        buf = io.BytesIO()
        np.savez(buf, **{f"{i}/{k}": v for i, o in enumerate(outs) for k, v in o.items()})
        try:
            write_bytes_atomic(path, buf.getvalue())
        except UsageError as exc:  # a cache we cannot write costs time, not correctness
            log.warning("golden outputs not cached: %s", exc)
    return golden


def run_reference_model(catalog: Catalog, feeds_list: Sequence[Feeds]) -> list[Feeds]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        if catalog.path.exists() and catalog.model.ByteSize() > (1 << 31) - 1:
            session = ort.InferenceSession(str(catalog.path), opts, providers=["CPUExecutionProvider"])
        else:
            session = ort.InferenceSession(catalog.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise UsageError(f"ONNX Runtime cannot load {catalog.path} for the FP32 reference run: {exc}") from None
    names = [o.name for o in session.get_outputs()]
    outs = []
    for i, feeds in enumerate(feeds_list):
        try:
            values = session.run(names, dict(feeds))
        except Exception as exc:
            raise UsageError(f"the FP32 reference run failed on input set {i}: {exc}") from None
        outs.append(dict(zip(names, values)))
    return outs


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
