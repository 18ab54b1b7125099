"""A `debug precision` candidate's files, written where the user's check command expects them (Polygraphy's
iteration artifact, `polygraphy_debug.*` in the current directory by default):

- `<base>.onnx`: the strongly typed mixed-precision model of the candidate (`fp16.mixed.build_mixed_model`;
  BF16 with `--bf16`, `fp16.bf16`);
- `<base>.json`: a constraints.json of the candidate (`fp32_nodes`, `fp16_nodes`, Polygraphy `--layer-precisions`
  and trtexec strings, model digest, iteration), readable by `bisector run --constraints`;
- `<base>.engine`: a TensorRT engine built with the candidate's precisions, only where TensorRT is installed (the
  TensorRT backend's builder, `EngineWriter`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisector.errors import UsageError
from bisector.fp16.bf16 import to_bf16

if TYPE_CHECKING:  # pragma: no cover
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

log = logging.getLogger("bisector")


@dataclass
class CandidateFiles:
    """Writes a candidate's iteration artifacts: `<base>.onnx`, `<base>.json` and (TensorRT) `<base>.engine`."""

    catalog: "Catalog"
    base: Path  # e.g. Path("polygraphy_debug")
    precision: str = "fp16"  # fp16 | bf16
    engine_builder: Any = None  # an EngineWriter, or None (no TensorRT)
    written: list[Path] = field(default_factory=list)

    @property
    def onnx_path(self) -> Path:
        return self.base.with_name(self.base.name + ".onnx")

    @property
    def json_path(self) -> Path:
        return self.base.with_name(self.base.name + ".json")

    @property
    def engine_path(self) -> Path:
        return self.base.with_name(self.base.name + ".engine")

    def paths(self) -> list[Path]:
        return [self.onnx_path, self.json_path] + ([self.engine_path] if self.engine_builder is not None else [])

    def write(self, plan: "Plan", iteration: int) -> dict[str, float]:
        """Write the files of `plan`; returns seconds per step."""
        from bisector.fp16.mixed import build_mixed_model

        t0 = time.perf_counter()
        model = build_mixed_model(self.catalog, plan)
        if self.precision == "bf16":
            model = to_bf16(model, self.catalog)
        _replace(self.onnx_path, model.SerializeToString())
        _replace(self.json_path, (json.dumps(self.document(plan, iteration), indent=2) + "\n").encode())
        seconds = {"write": time.perf_counter() - t0}
        if self.engine_builder is not None:
            t1 = time.perf_counter()
            data = self.engine_builder.build(plan)  # BuildFailure propagates: its own verdict
            _replace(self.engine_path, data)
            seconds["engine"] = time.perf_counter() - t1
        self.written = self.paths()
        return seconds

    def document(self, plan: "Plan", iteration: int) -> dict[str, Any]:
        """`<base>.json`: a constraints.json (so `bisector run --constraints <base>.json` and `verify` read it)
        with `passed: false` until judged, plus the FP16 nodes, layer-precision strings and the iteration."""
        from bisector import __version__
        from bisector.artifacts.add_constraints import layer_precision_strings_for
        from bisector.artifacts.constraints import Constraints, Evaluations, Golden

        order = {n: i for i, n in enumerate(self.catalog.candidates)}
        doc = Constraints(
            tool_version=__version__, model=str(self.catalog.path), model_sha256=self.catalog.sha256,
            backend={"backend": "candidate"}, precision=self.precision, tolerances={}, inputs={},
            fp32_nodes=sorted(plan.fp32), passed=False, minimal=False, evaluations=Evaluations(total=0, new=0, cached=0),
            golden=Golden(source="none"), strategy="debug precision candidate", candidates=len(self.catalog.candidates),
            pinned=dict(self.catalog.pinned), headroom=None, worst_input_set=0).model_dump(mode="json")
        doc.update({f"{self.precision}_nodes": sorted(plan.fp16, key=order.__getitem__), "iteration": iteration,
                    "onnx": self.onnx_path.name, "candidate": True,
                    "layer_precisions": layer_precision_strings_for(self.catalog, sorted(plan.fp32))})
        return doc

    def remove(self) -> None:
        for p in self.written:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not clean up %s: %s", p, exc)
        self.written = []


def _replace(path: Path, data: bytes) -> None:
    """Write then rename (the check never sees half a file), without fsync: these files live for one check, and a
    durable write costs more than the check's own start on some disks (docs/benchmarks.md)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write the candidate file {path}: {exc.strerror or exc}") from None


class EngineWriter:
    """Serialized TensorRT engines of plans, through the TensorRT backend's builder (one timing cache for the
    whole search). Only constructed where TensorRT is installed."""

    def __init__(self, catalog: "Catalog", backend_options: dict[str, Any], precision: str = "fp16") -> None:
        from bisector.backends.tensorrt import TensorRTBackend

        accepted = ("precision_constraints", "strongly_typed", "load_timing_cache", "save_timing_cache",
                    "builder_optimization_level", "tactic_sources", "input_shapes", "module", "cudart")
        self.backend = TensorRTBackend(**{k: v for k, v in backend_options.items() if k in accepted and v is not None})
        self.backend.open(catalog)
        self.catalog = catalog
        self.precision = precision

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Build shapes: the model's static shapes, dynamic dimensions 1 (Polygraphy's default), --input-shapes."""
        shapes = {}
        for vi in self.catalog.model.graph.input:
            if vi.name not in self.catalog.input_names:
                continue
            dims = vi.type.tensor_type.shape.dim
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims)
        shapes.update(self.backend.options.input_shapes)
        return shapes

    def build(self, plan: "Plan") -> bytes:
        b = self.backend
        engines = b._engines
        if engines is None:
            from bisector.errors import BackendFailure

            raise BackendFailure("the TensorRT engine writer was used after close()")
        shapes = self.shapes()
        if b.path == "weak":
            assert b._weak is not None
            network = b._weak.apply(plan)
            config = engines.make_config(network, shapes)
            b._weak.set_flags(config)
        else:
            from bisector.fp16.mixed import build_mixed_model

            model = build_mixed_model(self.catalog, plan)
            if self.precision == "bf16":
                model = to_bf16(model, self.catalog)
            network, _parser = engines.parse(model.SerializeToString(), plan=plan)
            config = engines.make_config(network, shapes)
        return bytes(engines.build(network, config, plan))

    def describe(self) -> dict[str, str]:
        return self.backend.describe()

    def close(self) -> None:
        self.backend.close()
