"""Input feeds: generated from ranges and a seed (Polygraphy's defaults), or loaded from files; saved back.

Dynamic dimensions take `--input-shapes`; without it they become 1 with a warning (Polygraphy's rule).
"""

from __future__ import annotations

import hashlib
import os
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from onnx import helper

from bisector.model.catalog import Catalog
from bisector.errors import UsageError
from bisector.model.polyjson import Feeds, inputs_to_json, load_inputs_json

log = logging.getLogger("bisector")


@dataclass(frozen=True)
class InputMeta:
    name: str
    dtype: np.dtype
    shape: tuple  # ints, or str/None for dynamic dims


def input_metas(catalog: Catalog) -> list[InputMeta]:
    metas = []
    graph_inputs = {i.name: i for i in catalog.model.graph.input}
    for name in catalog.input_names:
        vi = graph_inputs[name]
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise UsageError(f"input {name!r} is not a tensor (sequence/map inputs are not supported)")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        ) if tt.HasField("shape") else None
        metas.append(InputMeta(name, dtype, dims))
    return metas


def resolve_shapes(metas: Sequence[InputMeta], overrides: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    known = {m.name for m in metas}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UsageError(f"--input-shapes names unknown input(s) {unknown}; the model's inputs are {sorted(known)}")
    shapes = {}
    for m in metas:
        if m.name in overrides:
            shape = overrides[m.name]
            if m.shape is not None and len(shape) != len(m.shape):
                raise UsageError(f"--input-shapes {m.name}: rank {len(shape)} but the model declares rank {len(m.shape)}")
            for got, want in zip(shape, m.shape or ()):
                if isinstance(want, int) and want >= 0 and got != want:
                    raise UsageError(f"--input-shapes {m.name}: {list(shape)} conflicts with the fixed shape {list(m.shape)}")
        elif m.shape is None:
            raise UsageError(f"input {m.name!r} has no declared shape; give it with --input-shapes {m.name}:[...]")
        else:
            # A dim_value of 0 is a fixed empty dimension (ONNX Runtime accepts only 0 there), as in Polygraphy,
            # whose data loader calls only negative or named dimensions dynamic
            dynamic = [d for d in m.shape if not (isinstance(d, int) and d >= 0)]
            if dynamic:
                log.warning("input %s has dynamic dimensions %s; using 1 (set --input-shapes)", m.name, dynamic)
            shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in m.shape)
        shapes[m.name] = shape
    return shapes


def generate_inputs(
    catalog: Catalog,
    val_range: dict[str | None, tuple[float, float]],
    shapes: dict[str, tuple[int, ...]] | None = None,
    seed: int = 1,
    iterations: int = 1,
) -> list[Feeds]:
    metas = input_metas(catalog)
    unknown = sorted(k for k in val_range if k is not None and k not in {m.name for m in metas})
    if unknown:
        raise UsageError(
            f"--val-range names unknown input(s) {unknown}; the model's inputs are {[m.name for m in metas]}"
        )
    resolved = resolve_shapes(metas, shapes or {})
    _check_memory(metas, resolved, iterations)
    warn_integer_default_range(metas, val_range)
    feeds_list = []
    for index in range(iterations):
        # Polygraphy's DataLoader (comparator/data_loader.py, numpy backend): a fresh RandomState(seed + index)
        # per iteration, inputs drawn in model order; floats random_sample * (hi - lo) + lo in float64, then cast;
        # integers and bools randint(int(lo), int(hi) + 1, dtype) — so the same --seed, --val-range,
        # --input-shapes and --iterations give the same arrays bit for bit.
        rng = np.random.RandomState(seed + index)
        feeds = {}
        for m in metas:
            lo, hi = val_range.get(m.name, val_range.get(None, (0.0, 1.0)))
            shape = resolved[m.name]
            if m.dtype == np.bool_:
                feeds[m.name] = np.array(rng.randint(low=bool(lo), high=bool(hi) + 1, size=shape, dtype=np.bool_))
            elif np.issubdtype(m.dtype, np.integer):
                lo_i, hi_i = int(lo), int(hi)
                if lo_i > hi_i:
                    raise UsageError(f"--val-range {m.name}: no integer lies in [{lo}, {hi}] for an integer input")
                feeds[m.name] = np.array(rng.randint(low=lo_i, high=hi_i + 1, size=shape, dtype=m.dtype))
            elif np.issubdtype(m.dtype, np.floating):
                feeds[m.name] = np.array((rng.random_sample(size=shape) * (hi - lo) + lo).astype(m.dtype))
            else:
                raise UsageError(f"input {m.name!r} has dtype {m.dtype}, which bisector cannot generate; use --load-inputs")
        feeds_list.append(feeds)
    return feeds_list


def _check_memory(metas: Sequence[InputMeta], shapes: dict[str, tuple[int, ...]], iterations: int) -> None:
    """Refuse, before allocating, input sets that cannot fit in the memory available (a typo in --input-shapes
    such as x:[100000,100000,100000] would otherwise end in MemoryError, or in the OOM killer)."""
    import math

    stored = sum(math.prod(shapes[m.name]) * np.dtype(m.dtype).itemsize for m in metas) * iterations
    scratch = max((math.prod(shapes[m.name]) * 8 for m in metas), default=0)  # the float64 draw of one input
    need = stored + scratch
    available = available_memory()
    if available is not None and need > available:
        sizes = ", ".join(f"{m.name}:{list(shapes[m.name])}" for m in metas)
        raise UsageError(f"the generated inputs need {_bytes(need)} ({sizes}, {iterations} set(s)) but only "
                         f"{_bytes(available)} of memory is available; check --input-shapes and --iterations")


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable; else physical pages free), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def warn_integer_default_range(metas: Sequence[InputMeta], val_range: dict[str | None, tuple[float, float]]) -> None:
    """Integer inputs under the default range get only 0 and 1 (Polygraphy's rule too): usually not what an index
    or token input needs, so say so once per input."""
    for m in metas:
        if np.issubdtype(m.dtype, np.integer) and m.name not in val_range and None not in val_range:
            log.warning("integer input %s gets values in the default range [0, 1] (only 0 and 1); give its real range "
                        "with --val-range %s:[lo,hi] or --load-inputs", m.name, m.name)


def load_data_script(script: str | Path, catalog: Catalog) -> list[Feeds]:
    """Polygraphy's `--data-loader-script FILE[:FUNC]`: FUNC (default `load_data`) takes no arguments and returns
    (or yields) feed dicts {input name: array}, one per iteration."""
    import importlib.util
    import os

    text = os.fspath(script)
    path, sep, func = text.rpartition(":")
    if not sep or Path(text).is_file():
        path, func = text, "load_data"
    func = func or "load_data"
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--data-loader-script: file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"bisector_data_loader_{abs(hash(str(path.resolve())))}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except (Exception, SystemExit) as exc:  # sys.exit() in a script is its failure, not bisector's exit
        raise UsageError(f"--data-loader-script {path}: importing it failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, func, None)
    if fn is None:
        raise UsageError(f"--data-loader-script {path}: no {func!r} in the script")
    try:
        data = fn() if callable(fn) else fn
        feeds_list = [{k: np.asarray(v) for k, v in dict(feeds).items()} for feeds in data]
    except UsageError:
        raise
    except (Exception, SystemExit) as exc:
        raise UsageError(f"--data-loader-script {path}:{func} failed: {type(exc).__name__}: {exc}") from None
    if not feeds_list:
        raise UsageError(f"--data-loader-script {path}:{func} yielded no input set")
    for i, feeds in enumerate(feeds_list):
        check_feeds(catalog, feeds, f"--data-loader-script set {i}")
    return feeds_list


def load_inputs(paths: Sequence[Path], catalog: Catalog) -> list[Feeds]:
    feeds_list: list[Feeds] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UsageError(f"--load-inputs: file not found: {path}")
        if path.suffix == ".npz":
            try:
                with np.load(path, allow_pickle=False) as data:
                    feeds_list.append({k: data[k] for k in data.files})
            except Exception as exc:
                raise UsageError(f"--load-inputs {path}: not a readable .npz ({exc})") from None
        else:
            feeds_list.extend(load_inputs_json(path))
    if not feeds_list:
        raise UsageError("--load-inputs: the files hold no input set")
    for i, feeds in enumerate(feeds_list):
        check_feeds(catalog, feeds, f"--load-inputs set {i}")
    return feeds_list


def check_feeds(catalog: Catalog, feeds: Feeds, where: str) -> None:
    metas = {m.name: m for m in input_metas(catalog)}
    unknown = sorted(set(feeds) - set(metas))
    if unknown:
        raise UsageError(f"{where}: unknown input(s) {unknown}; the model's inputs are {sorted(metas)}")
    missing = sorted(set(metas) - set(feeds))
    if missing:
        raise UsageError(f"{where}: missing input(s) {missing}")
    for name, a in feeds.items():
        m = metas[name]
        if a.dtype != m.dtype:
            raise UsageError(f"{where}: input {name!r} has dtype {a.dtype}, the model expects {m.dtype}")
        if m.shape is not None:
            if a.ndim != len(m.shape):
                raise UsageError(f"{where}: input {name!r} has rank {a.ndim} {list(a.shape)}, the model expects rank {len(m.shape)} {list(m.shape)}")
            for got, want in zip(a.shape, m.shape):
                if isinstance(want, int) and want > 0 and got != want:
                    raise UsageError(f"{where}: input {name!r} has shape {list(a.shape)}, the model expects {list(m.shape)}")


def save_inputs(path: Path, feeds_list: Sequence[Feeds]) -> None:
    from bisector.files import write_bytes_atomic

    path = Path(path)
    if path.suffix == ".npz":
        import io

        if len(feeds_list) != 1:
            raise UsageError("--save-inputs: .npz holds one input set; use .json for several iterations")
        buf = io.BytesIO()
        np.savez(buf, **feeds_list[0])
        write_bytes_atomic(path, buf.getvalue())
    else:
        write_bytes_atomic(path, inputs_to_json(feeds_list).encode())


def inputs_digest(feeds_list: Sequence[Feeds]) -> str:
    h = hashlib.sha256()
    for feeds in feeds_list:
        h.update(feeds_digest(feeds).encode())
    return h.hexdigest()


def feeds_digest(feeds) -> str:
    """A content digest of one input set (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    import json

    for name in sorted(feeds):
        a = np.ascontiguousarray(feeds[name])
        # framed: a JSON header with the byte count, then the bytes (no two input sets can share a digest)
        h.update(json.dumps([name, str(a.dtype), list(a.shape), a.nbytes], ensure_ascii=True).encode() + b"\n")
        h.update(a.tobytes())
    return h.hexdigest()
