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
    if isinstance(obj, Mapping) and obj.get("polygraphy_class") == "LazyArray":
        obj = obj.get("values", {})
    if not isinstance(obj, Mapping) or obj.get("polygraphy_class") != "ndarray" or "array" not in obj:
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
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit number, [[[[…
        raise UsageError(f"{path} is not valid JSON ({exc})") from None


def run_results_runners(data: Mapping[str, Any], path: object) -> list[tuple[str, list]]:
    """`lst` of a RunResults document as (runner name, iterations) pairs, its shape checked: a file that is not
    what it claims is a UsageError naming it, never an internal error."""
    runs = data.get("lst")
    if not isinstance(runs, list) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], list)
            for r in runs):
        raise UsageError(f"{path}: malformed RunResults ('lst' must be a list of [runner name, iterations] pairs)")
    return [(r[0], r[1]) for r in runs]


def iteration_outputs(it: Any, where: str) -> Mapping[str, Any]:
    """The `outputs` mapping of one IterationResult (empty where it has none)."""
    entries = it.get("outputs", {}) if isinstance(it, Mapping) else {}
    if not isinstance(entries, Mapping):
        raise UsageError(f"{where}: malformed IterationResult ('outputs' must map names to arrays)")
    return entries


def runner_provenance(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """bisector's record of each runner's precision in a RunResults file it wrote (empty where absent or odd)."""
    own = data.get("bisector")
    runners = own.get("runners") if isinstance(own, Mapping) else None
    return runners if isinstance(runners, Mapping) else {}


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
    runs = run_results_runners(data, path)
    if not runs:
        raise UsageError(f"{path}: the RunResults file holds no runner")
    chosen = [r for r in runs if runner is None or r[0] == runner]
    if not chosen:
        raise UsageError(f"{path}: no runner named {runner!r} (found: {', '.join(r[0] for r in runs)})")
    name, iterations = chosen[0]
    outs = []
    for i, it in enumerate(iterations):
        entries = iteration_outputs(it, f"{path}:{name}[{i}]")
        outs.append({k: decode_array(v, f"{path}:{name}[{i}][{k}]") for k, v in entries.items()})
    return name, outs


# ---- runners and golden provenance (issue 12 item 4, issue 18) ---------------------------------------------------
# Runner name prefixes whose outputs are an FP32 reference (Polygraphy's ONNX-Runtime, reference-plugin, TF runners).
REFERENCE_PREFIXES = ("onnxrt-runner", "pluginref-runner", "tf-runner", "onnx-runner")


def runner_name(prefix: str, count: int = 0) -> str:
    """A runner name as Polygraphy makes one: `trt-runner-N0-04/01/24-15:29:00`."""
    import time

    return f"{prefix}-N{count}-{time.strftime('%x')}-{time.strftime('%X')}"


def run_results_many(runs: Sequence[tuple[str, Sequence[Mapping[str, np.ndarray]], Sequence[float], Mapping[str, Any]]]) -> str:
    """RunResults with several runners, in order; each runner's provenance (precision, backend, FP32 nodes) is
    recorded under the top-level key "bisector" (Polygraphy ignores keys it does not know)."""
    lst = []
    for runner, outputs_list, runtimes, _ in runs:
        lst.append([runner, [
            {"outputs": {k: {"values": encode_array(v), "polygraphy_class": "LazyArray"} for k, v in outs.items()},
             "runtime": float(rt), "runner_name": runner, "polygraphy_class": "IterationResult"}
            for outs, rt in zip(outputs_list, runtimes)]])
    provenance = {runner: dict(p) for runner, _, _, p in runs}
    return json.dumps({"lst": lst, "polygraphy_class": "RunResults", "bisector": {"runners": provenance}}, indent=1)


def runner_precision(name: str, provenance: Mapping[str, Any]) -> str:
    """fp32 (a reference), a reduced precision (fp16, bf16), or unknown."""
    recorded = provenance.get(name, {}).get("precision") if isinstance(provenance.get(name), Mapping) else None
    if recorded:
        return str(recorded)
    if name.startswith(REFERENCE_PREFIXES):
        return "fp32"
    if name.startswith("bisector-"):  # bisector before issue 18 saved a plan's (reduced-precision) outputs so
        return "fp16"
    return "unknown"


def load_golden_runner(path: Path | Sequence[Path], runner: str | None = None,
                       allow_reduced: bool = False) -> tuple[str, list[Feeds], str]:
    """(runner, outputs per iteration, precision) of the runner of a RunResults file that may serve as golden:
    the one named, else the first FP32 reference runner. A reduced-precision runner is refused unless
    `allow_reduced`; one of unknown precision (e.g. Polygraphy's trt-runner) must be named."""
    runs, provenance = [], {}
    files = list(path) if isinstance(path, (list, tuple)) else [path]
    for one in files:
        data = _read_json(one)
        if not isinstance(data, dict) or data.get("polygraphy_class") != "RunResults" or "lst" not in data:
            raise UsageError(f"{one}: expected Polygraphy RunResults (polygraphy run --save-outputs)")
        runs += run_results_runners(data, one)
        provenance.update(runner_provenance(data))
    path = ", ".join(map(str, files))  # type: ignore[assignment]
    if not runs:
        raise UsageError(f"{path}: the RunResults file holds no runner")
    kinds = {r[0]: runner_precision(r[0], provenance) for r in runs}
    listing = ", ".join(f"{n} ({k})" for n, k in kinds.items())
    if runner is not None:
        chosen = [r for r in runs if r[0] == runner]
        if not chosen:
            raise UsageError(f"{path}: no runner named {runner!r} (found: {listing})")
    else:
        chosen = [r for r in runs if kinds[r[0]] == "fp32"]
        if not chosen:
            raise UsageError(
                f"{path} holds no FP32 reference runner to use as golden (found: {listing}). Golden outputs must "
                f"come from an FP32 reference (e.g. `polygraphy run MODEL --onnxrt --save-outputs FILE` or "
                f"`bisector run MODEL --onnxrt --save-outputs FILE`); name a runner with --golden-runner to use it "
                f"anyway")
    name, iterations = chosen[0]
    precision = kinds[name]
    if precision not in ("fp32", "unknown") and not allow_reduced:
        raise UsageError(
            f"{path}: runner {name!r} ran in reduced precision ({precision}); its outputs cannot be golden — every "
            f"FP16 plan would be compared with FP16 outputs and pass. Save golden with an FP32 reference runner "
            f"(--onnxrt), or pass --allow-reduced-golden if this is really what you want")
    outs = []
    for i, it in enumerate(iterations):
        entries = iteration_outputs(it, f"{path}:{name}[{i}]")
        outs.append({k: decode_array(v, f"{path}:{name}[{i}][{k}]") for k, v in entries.items()})
    return name, outs, precision
