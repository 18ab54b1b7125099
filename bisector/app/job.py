"""Assembles one job from parsed options: catalog, inputs, golden, backend (canary checked) and oracle.

The CLI only parses flags into `JobOptions`; every command builds its pieces here, in the order of DESIGN §2.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bisector.backends import backend_factory
from bisector.backends.base import Backend
from bisector.backends.canary import run_canary
from bisector.model.catalog import Catalog
from bisector.compare import Tolerance
from bisector.errors import UsageError
from bisector.model.golden import Golden, default_cache_dir, get_golden
from bisector.model.inputs import generate_inputs, inputs_digest, load_inputs, save_inputs
from bisector.search.oracle import Budget, Oracle
from bisector.model.polyjson import Feeds
from bisector.values import (
    parse_error_stat,
    parse_input_shapes,
    parse_tolerance,
    parse_val_range,
)

log = logging.getLogger("bisector")


@dataclass
class JobOptions:
    model: Path
    val_range: list[str] = field(default_factory=list)
    input_shapes: list[str] = field(default_factory=list)
    seed: int = 1
    iterations: int = 1
    load_inputs: list[Path] = field(default_factory=list)
    save_inputs: Path | None = None
    load_outputs: Path | None = None
    atol: list[str] = field(default_factory=list)
    rtol: list[str] = field(default_factory=list)
    check_error_stat: list[str] = field(default_factory=list)
    error_quantile: float = 0.99
    backend: str = "emulate"
    backend_options: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None
    no_cache: bool = False


@dataclass
class Job:
    options: JobOptions
    catalog: Catalog
    feeds_list: list[Feeds]
    golden: Golden
    tolerance: Tolerance
    backend: Backend
    inputs_info: dict[str, Any]
    cache_dir: Path | None = None

    def journal(self, resume: bool = True):
        """The SQLite journal for this job's key, or None when caching is off (--no-cache)."""
        if self.cache_dir is None:
            return None
        from bisector import __version__
        from bisector.search.journal import SqliteJournal

        description = {
            "model_sha256": self.catalog.sha256, "inputs": self.inputs_info["digest"],
            "golden": golden_digest(self.golden),
            # what decides verdicts, not what a search observes along the way (ort-cuda's CPU-fallback record)
            "backend": {k: v for k, v in self.backend.describe().items() if not k.startswith("cpu_fallback")},
            "tolerances": self.tolerance.describe(), "bisector": __version__,
        }
        return SqliteJournal(self.cache_dir / "journal.sqlite", description, resume=resume)

    def oracle(self, budget: Budget | None = None, journal=None, on_verdict=None) -> Oracle:
        return Oracle(self.backend, self.catalog.candidates, self.feeds_list, self.golden.outputs, self.tolerance,
                      journal=journal, budget=budget, on_verdict=on_verdict)

    def close(self) -> None:
        self.backend.close()


def parse_tolerance_options(o: JobOptions) -> Tolerance:
    if not 0.0 <= o.error_quantile <= 1.0:
        raise UsageError(f"--error-quantile {o.error_quantile}: must lie in [0, 1]")
    return Tolerance(
        atol=parse_tolerance(o.atol, 1e-5, "--atol"),
        rtol=parse_tolerance(o.rtol, 1e-5, "--rtol"),
        stat=parse_error_stat(o.check_error_stat),
        quantile=o.error_quantile,
    )


def build_job(o: JobOptions, canary: bool = True) -> Job:
    # Parse every flag before any expensive work, so a typo costs nothing.
    tolerance = parse_tolerance_options(o)
    ranges = parse_val_range(o.val_range)
    shapes = parse_input_shapes(o.input_shapes)
    if o.iterations < 1:
        raise UsageError(f"--iterations {o.iterations}: must be at least 1")
    make_backend = backend_factory(o.backend, **o.backend_options)
    catalog = Catalog.load(o.model)
    for flag, per in (("--atol", tolerance.atol), ("--rtol", tolerance.rtol), ("--check-error-stat", tolerance.stat)):
        unknown = sorted(set(per.per_output) - set(catalog.names) - set(catalog.output_names) - _all_tensors(catalog))
        if unknown:
            raise UsageError(f"{flag} names unknown output(s) {unknown}; the model's outputs are {catalog.output_names}")

    if o.load_inputs:
        if ranges or shapes:
            log.warning("--load-inputs given: --val-range/--input-shapes are ignored")
        feeds_list = load_inputs(o.load_inputs, catalog)
        info = {"source": "file", "files": [str(p) for p in o.load_inputs]}
    else:
        feeds_list = generate_inputs(catalog, ranges, shapes, seed=o.seed, iterations=o.iterations)
        info = {"source": "generated", "seed": o.seed, "iterations": o.iterations,
                "val_range": {k or "*": list(v) for k, v in ranges.items()} or {"*": [0.0, 1.0]},
                "shapes": {k: list(v.shape) for k, v in feeds_list[0].items()}}
    info["sets"] = len(feeds_list)
    info["digest"] = inputs_digest(feeds_list)
    if o.save_inputs is not None:
        save_inputs(o.save_inputs, feeds_list)

    cache_dir = None if o.no_cache else (o.cache_dir or default_cache_dir())
    golden = get_golden(catalog, feeds_list, cache_dir, o.load_outputs)

    if canary:
        run_canary(make_backend)
    backend = make_backend()
    backend.open(catalog)
    return Job(o, catalog, feeds_list, golden, tolerance, backend, info, cache_dir)


def golden_digest(golden: Golden) -> str:
    import hashlib

    h = hashlib.sha256()
    for outs in golden.outputs:
        for name in sorted(outs):
            h.update(name.encode())
            h.update(np.ascontiguousarray(outs[name]).tobytes())
    return h.hexdigest()


def _all_tensors(catalog: Catalog) -> set[str]:
    return {t for n in catalog.model.graph.node for t in n.output}
