"""Writes every artifact of a finished search into the output directory, each one atomically."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from bisector.model import catalog as _catalog
from bisector.model.catalog import Catalog
from bisector.model.graph import weightless_copy
from bisector.errors import UsageError
from bisector.fp16.mixed import build_mixed_detached
from bisector.model import weights as weight_store
from bisector.artifacts.add_constraints import add_constraints_for, layer_precision_strings_for
from bisector.artifacts.constraints import Constraints
from bisector.artifacts import data_file
from bisector.artifacts.data_file import ALIGN, key_bytes, value_key
from bisector.artifacts.prewrite import MAX_UNUSED_SHARE, WeightPrewrite
from bisector.files import AtomicFile, clean_stale_temporaries, ensure_dir, remove_file, write_files_atomic
from bisector.artifacts.report import render_report


ARTIFACT_NAMES = ("constraints.json", "add_constraints.py", "model.mixed.onnx", "model.mixed.onnx.data",
                  "layer_precisions.json", "report.md", "profile.json", "profile.png")


def begin_artifacts(out_dir: Path) -> Path:
    """Before the first artifact of a run lands in `out_dir`: remove a stale constraints.json (its presence means
    a complete set, so it must never sit beside half of a new one) and the temporary files of killed runs."""
    out = ensure_dir(Path(out_dir))
    remove_file(out / "constraints.json")
    clean_stale_temporaries(out, ARTIFACT_NAMES)
    return out


def write_artifacts(out_dir: Path, catalog: Catalog, constraints: Constraints, extra_report: str = "",
                    mixed: bool = True, mixed_skipped: str = "the --time-limit was spent by the search",
                    rounded: Mapping[str, np.ndarray] | None = None,
                    prewritten: WeightPrewrite | None = None) -> dict[str, Path]:
    """Every artifact of a search; `mixed=False` (`--no-mixed`, or the --time-limit was spent: `mixed_skipped`
    says which in report.md): all but the mixed ONNX, the one whose cost grows with the weights, and a stale one
    of an earlier run is removed. The time this takes is recorded in constraints.json (`timings.artifacts`).
    `rounded`: weights the search rounded already (`fp16.mixed.build_mixed_detached`); `prewritten`: the mixed
    model's data file begun while the search ran (`artifacts.prewrite`; finished or dropped here)."""
    t0 = time.perf_counter()
    out = begin_artifacts(Path(out_dir))
    fp32 = list(constraints.fp32_nodes)
    paths = {
        "constraints": out / "constraints.json",
        "add_constraints": out / "add_constraints.py",
        "mixed": out / "model.mixed.onnx",
        "layer_precisions": out / "layer_precisions.json",
        "report": out / "report.md",
    }
    # constraints.json is written last and its presence means a complete set: begin_artifacts removed a stale
    # one first, so that a run that fails half way (disk full) never leaves new artifacts beside an old one.
    # Build everything in memory first: a failure here leaves no artifact of this run behind.
    if mixed:
        mixed_files, note = mixed_files_or_note(catalog, frozenset(fp32), paths["mixed"], rounded, prewritten)
        extra_report += note
        if not mixed_files:
            logging.getLogger("bisector").error("%s; the other artifacts are written", note.strip().replace("**", ""))
    else:
        if prewritten is not None:
            prewritten.discard()
        mixed_files = []
        for stale in (paths.pop("mixed"), out / "model.mixed.onnx.data"):
            remove_file(stale)
        extra_report += (
            f"\n\n**model.mixed.onnx was not written: {mixed_skipped}.** Write it with "
            f"`bisector convert {Path(constraints.model).name} --fp16 --fp32 <the fp32_nodes of constraints.json> "
            "-o model.mixed.onnx`.\n")
    # every artifact that sets precisions also carries the pinned nodes (FP32 in the verified plan too)
    # and the If nodes whose branches computed FP32 in every verdict: a TensorRT 10 build keeps them FP32 too
    unjudged = sorted(constraints.unjudged_branches)
    strings = layer_precision_strings_for(catalog, fp32, unjudged)
    script = add_constraints_for(catalog, fp32, unjudged)
    report = render_report(catalog, constraints, strings, extra_report)

    def text(value: str) -> Callable:
        data = value.encode("utf-8", errors="surrogateescape")
        return lambda f: f.write(data)

    # external data first, the model that names it next (renamed in this order once all are on the disk)
    write_files_atomic([*((path, fill, getattr(fill, "into", None)) for path, fill in mixed_files),
                        (paths["add_constraints"], text(script), None),
                        (paths["layer_precisions"], text(json.dumps(strings, indent=2) + "\n"), None),
                        (paths["report"], text(report), None)])
    if mixed and len(mixed_files) == 1:  # one file now: a .data file of an earlier, larger run is stale
        remove_file(out / "model.mixed.onnx.data")
    constraints.timings["artifacts"] = time.perf_counter() - t0
    constraints.write(paths["constraints"])  # last: its presence means the set is complete
    return paths


def mixed_files_or_note(catalog: Catalog, plan, path: Path, rounded: Mapping[str, np.ndarray] | None = None,
                        prewritten: "WeightPrewrite | None" = None) -> tuple[list[tuple[Path, Callable]], str]:
    """`mixed_model_files`, and where onnx.checker rejects the mixed model, `_unchecked_mixed`'s files (none where
    the fault is bisector's) and the sentence report.md adds ("" when checked)."""
    try:
        return mixed_model_files(catalog, plan, path, rounded, prewritten), ""
    except onnx.checker.ValidationError as exc:
        return _unchecked_mixed(catalog, plan, path, rounded, prewritten, exc)


def _unchecked_mixed(catalog: Catalog, plan, path: Path, rounded, prewritten, exc: Exception
                     ) -> tuple[list[tuple[Path, Callable]], str]:
    """The mixed model where onnx.checker rejected it. A model ONNX Runtime runs may fail the checker itself (a
    graph output declared with a type and no shape, an attribute of another opset): then the mixed model
    inherits the defect and is written unchecked, with a warning and a sentence for report.md. Where the model
    passes and only the mixed one fails, the fault is bisector's: no files, and the sentence says so (the search's
    answer is not lost for one artifact: `write_artifacts` writes the others)."""
    if prewritten is not None:  # a failed check may have dropped its file already: written afresh below
        prewritten.discard()
    try:  # the weights as typed inputs (their bytes are not the question, and not loaded)
        _check_without_external_data(weightless_copy(catalog.model))
    except onnx.checker.ValidationError as own:
        logging.getLogger("bisector").warning("the model itself fails onnx.checker (%s): %s is written unchecked",
                                              _first_line(own), path.name)
        files = mixed_model_files(catalog, plan, path, rounded, None, check=False)
        return files, (f"\n\n**{path.name} is written unchecked:** the model itself fails onnx.checker "
                       f"(`{_first_line(own)}`), and its mixed copy inherits that.\n")
    for stale in (path, path.with_name(path.name + ".data")):
        remove_file(stale)
    return [], (f"\n\n**{path.name} was not written:** it failed onnx.checker (`{_first_line(exc)}`) though the "
                "model passes it: a bisector bug, please report it. The FP32 set above is as judged; `bisector "
                "convert` writes the mixed model once it is fixed.\n")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def mixed_model_files(catalog: Catalog, plan, path: Path, rounded: Mapping[str, np.ndarray] | None = None,
                      prewritten: "WeightPrewrite | None" = None, check: bool = True) -> list[tuple[Path, Callable]]:
    """The mixed model of `plan` as files to write, checked with onnx.checker before anything is written: one
    .onnx; or .onnx + .onnx.data when its weights pass `data_file.EXTERNAL_DATA_FROM_BYTES` or the model would pass
    protobuf's 2 GB, the data streamed from the arrays. `prewritten`: the data file begun while the search ran
    (artifacts.prewrite): its weights are reused where the final model reads them, and the .data entry's fill
    carries the open file as `fill.into` (for `write_file_atomic(path, fill, into=fill.into)`)."""
    model, values = build_mixed_detached(catalog, plan, rounded)
    if data_file.stays_one_file(model, values):
        if prewritten is not None:
            prewritten.discard()
        return [_one_file(model, values, path, check)]
    return _external_files(model, values, path, prewritten, check)


def _one_file(model: onnx.ModelProto, values: dict, path: Path, check: bool = True) -> tuple[Path, Callable]:
    """One .onnx, streamed from the arrays (`weights.Serialized`): the checker sees the graph with the stubs as
    typed inputs (the weight bytes are numpy's, written as they are)."""
    if check and values:
        _check_without_external_data(model)
    elif check:  # no stubs: the model as it is (no copy of it to check)
        onnx.checker.check_model(model)
    data = weight_store.Serialized(model, values)
    return path, data.write


def _external_files(model: onnx.ModelProto, values: dict, path: Path,
                    prewritten: "WeightPrewrite | None" = None, check: bool = True) -> list[tuple[Path, Callable]]:
    """`model` as .onnx + .onnx.data: the stubs' `values` and inline initializers from `data_file.EXTERNAL_MIN_BYTES` up go
    to the data file, written straight from the arrays (after a prewritten file's content, reusing its weights)."""
    data_path = path.with_name(path.name + ".data")
    moved: list[tuple[TensorProto, object]] = []  # (initializer, array or FP16Copy) that go to the data file
    for init in model.graph.initializer:
        if weight_store.is_stub(init):
            moved.append((init, values[init.name]))
        elif init.ByteSize() >= data_file.EXTERNAL_MIN_BYTES:
            moved.append((init, np.ascontiguousarray(numpy_helper.to_array(init))))
    into, offsets, begun = _reusable(prewritten, moved)
    offset = begun
    layout: list[tuple[int, object]] = []  # (offset, array or FP16Copy) still to write
    for init, raw in moved:
        at = offsets.get(value_key(init.name, raw))
        if at is None:
            offset += (-offset) % ALIGN
            at = offset
            layout.append((at, raw))
            offset += raw.nbytes
        if not weight_store.is_stub(init):
            init.CopyFrom(TensorProto(name=init.name, data_type=init.data_type, dims=list(init.dims),
                                      data_location=TensorProto.EXTERNAL))
        del init.external_data[:]
        for key, value in (("location", data_path.name), ("offset", str(at)), ("length", str(raw.nbytes))):
            init.external_data.add(key=key, value=value)
    try:
        if model.ByteSize() > _catalog.PROTOBUF_LIMIT:
            raise UsageError("the mixed model is beyond 2 GB even without its weights; it cannot be saved as ONNX")
        if check:
            _check_without_external_data(model)
    except BaseException:
        if into is not None:  # the prewritten file goes with the model that cannot be written
            into.discard()
        raise
    model_bytes = model.SerializeToString()

    def fill_data(f):
        at = begun  # FP16 copies are converted one ahead while the previous one is written (`weights.in_turn`)
        for (start, _), raw in zip(layout, weight_store.in_turn([v for _, v in layout])):
            if start > at:
                f.write(bytes(start - at))
            f.write(memoryview(raw.reshape(-1).view(np.uint8)))
            at = start + raw.nbytes

    fill_data.into = into  # type: ignore[attr-defined]
    return [(data_path, fill_data), (path, lambda f: f.write(model_bytes))]


def _reusable(prewritten: "WeightPrewrite | None", moved: list[tuple[TensorProto, object]]
              ) -> tuple[AtomicFile | None, dict[tuple, int], int]:
    """The prewritten data file, its offsets and size when the final model reads enough of it (else it is dropped,
    and the data file is written compactly: None, {}, 0)."""
    taken = prewritten.take() if prewritten is not None else None
    if taken is None:
        return None, {}, 0
    into, offsets, size = taken
    wanted = {value_key(init.name, raw) for init, raw in moved}
    unused = sum(key_bytes(k) for k in offsets if k not in wanted)  # weights only: padding is there either way
    if unused > MAX_UNUSED_SHARE * sum(key_bytes(k) for k in offsets):
        into.discard()
        return None, {}, 0
    return into, {k: v for k, v in offsets.items() if k in wanted}, size


def _check_without_external_data(model: onnx.ModelProto) -> None:
    """onnx.checker before the .data file exists: external weights are checked as graph inputs of their type."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    external = [i for i in light.graph.initializer if i.data_location == TensorProto.EXTERNAL]
    keep = [i for i in light.graph.initializer if i.data_location != TensorProto.EXTERNAL]
    del light.graph.initializer[:]
    light.graph.initializer.extend(keep)
    declared = {i.name for i in light.graph.input}
    light.graph.input.extend(onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                             for i in external if i.name not in declared)
    onnx.checker.check_model(light)
