"""Polygraphy's JSON file formats (DESIGN §6): arrays, input lists and RunResults, both ways.

Files written by `polygraphy run --save-inputs/--save-outputs` load here, and ours load in Polygraphy.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from bisector.errors import UsageError

Feeds = dict[str, np.ndarray]


def encode_array(a: np.ndarray) -> dict[str, str]:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a), allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}


def decode_array(obj: Mapping[str, Any], where: str) -> np.ndarray:
    if obj.get("polygraphy_class") == "LazyArray":
        obj = obj.get("values", {})
    if obj.get("polygraphy_class") != "ndarray" or "array" not in obj:
        raise UsageError(f"{where}: not a Polygraphy ndarray entry")
    try:
        return np.load(io.BytesIO(base64.b64decode(obj["array"])), allow_pickle=False)
    except Exception as exc:
        raise UsageError(f"{where}: cannot decode the array ({exc})") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None


def inputs_to_json(feeds_list: Sequence[Mapping[str, np.ndarray]]) -> str:
    return json.dumps([{k: encode_array(v) for k, v in f.items()} for f in feeds_list], indent=1)


def load_inputs_json(path: Path) -> list[Feeds]:
    data = _read_json(path)
    if isinstance(data, dict) and data.get("polygraphy_class") == "RunResults":
        raise UsageError(f"{path} holds outputs (RunResults), not inputs; use --load-outputs")
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise UsageError(f"{path}: expected a Polygraphy input list [{{name: ndarray}}, ...]")
    return [{k: decode_array(v, f"{path}[{i}][{k}]") for k, v in d.items()} for i, d in enumerate(data)]


def run_results_to_json(runner: str, outputs_list: Sequence[Mapping[str, np.ndarray]], runtimes: Sequence[float]) -> str:
    iterations = [
        {
            "outputs": {k: {"values": encode_array(v), "polygraphy_class": "LazyArray"} for k, v in outs.items()},
            "runtime": float(rt),
            "runner_name": runner,
            "polygraphy_class": "IterationResult",
        }
        for outs, rt in zip(outputs_list, runtimes)
    ]
    return json.dumps({"lst": [[runner, iterations]], "polygraphy_class": "RunResults"}, indent=1)


def load_run_results(path: Path, runner: str | None = None) -> tuple[str, list[Feeds]]:
    """(runner name, outputs per iteration) of one runner of a RunResults file (the first, unless named)."""
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("polygraphy_class") != "RunResults" or "lst" not in data:
        raise UsageError(f"{path}: expected Polygraphy RunResults (polygraphy run --save-outputs)")
    runs = data["lst"]
    if not runs:
        raise UsageError(f"{path}: the RunResults file holds no runner")
    chosen = [r for r in runs if runner is None or r[0] == runner]
    if not chosen:
        raise UsageError(f"{path}: no runner named {runner!r} (found: {', '.join(r[0] for r in runs)})")
    name, iterations = chosen[0]
    outs = []
    for i, it in enumerate(iterations):
        entries = it.get("outputs", {}) if isinstance(it, dict) else {}
        outs.append({k: decode_array(v, f"{path}:{name}[{i}][{k}]") for k, v in entries.items()})
    return name, outs
