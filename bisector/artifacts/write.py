"""Writes every artifact of a finished search into the output directory, each one atomically."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from ..catalog import Catalog
from ..mixed import build_mixed_model
from .add_constraints import layer_precision_strings, render_add_constraints
from .constraints import Constraints
from .io import ensure_dir, write_bytes_atomic, write_text_atomic
from .report import render_report


def write_artifacts(out_dir: Path, catalog: Catalog, constraints: Constraints, extra_report: str = "") -> dict[str, Path]:
    out = ensure_dir(Path(out_dir))
    fp32 = list(constraints.fp32_nodes)
    paths = {
        "constraints": out / "constraints.json",
        "add_constraints": out / "add_constraints.py",
        "mixed": out / "model.mixed.onnx",
        "layer_precisions": out / "layer_precisions.json",
        "report": out / "report.md",
    }
    # Build everything in memory first: a failure here leaves no artifact of this run behind.
    mixed = build_mixed_model(catalog, frozenset(fp32))
    onnx.checker.check_model(mixed)
    float_outputs = {n: [catalog.is_float(o) for o in catalog.nodes[n].output if o] for n in fp32}
    strings = layer_precision_strings(fp32, float_outputs=float_outputs)
    script = render_add_constraints(fp32, catalog.path.name)
    report = render_report(catalog, constraints, strings, extra_report)

    write_bytes_atomic(paths["mixed"], mixed.SerializeToString())
    write_text_atomic(paths["add_constraints"], script)
    write_text_atomic(paths["layer_precisions"], json.dumps(strings, indent=2) + "\n")
    write_text_atomic(paths["report"], report)
    constraints.write(paths["constraints"])  # last: its presence means the set is complete
    return paths
