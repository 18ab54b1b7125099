"""`convert`: Polygraphy's `convert` where it needs no TensorRT — the mixed-precision ONNX; engines need TensorRT."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from bisector.app.options import parse_layer_precisions
from bisector.app.polyrun import check_model, needs_tensorrt
from bisector.errors import UsageError

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


def convert(model: str | Path, output: str | Path | None, *, fp16: bool = False, fp32: Iterable[str] = (),
            layer_precisions: Sequence[str] | dict | None = None, convert_to: str | None = None,
            model_type: str | None = None, extra_args: Sequence[str] = ()) -> Path:
    """Write the model with every candidate FP16 (`fp16`) except `fp32` nodes and `layer_precisions` float32
    layers — or all FP32 — as ONNX to `output`. An engine output is a UsageError saying TensorRT is needed."""
    check_model(Path(model), model_type, command="convert")
    if output is None:
        raise UsageError("convert: give the output file with -o FILE")
    output = Path(output)
    name = Path(model).name
    if convert_to == "trt" or (convert_to is None and output.suffix in ENGINE_SUFFIXES):
        raise needs_tensorrt(
            f"convert -o {output.name}: building a TensorRT engine",
            f"keep the ONNX model and compare with `bisector run {name} --trt --fp16 --onnxrt` (emulated on the CPU, "
            f"or --backend tensorrt where TensorRT is installed); `bisector precision {name} --fp16 -o DIR` writes "
            f"the FP32 layer set and a mixed-precision ONNX for `trtexec --onnx=... --stronglyTyped`; or run "
            f"`polygraphy convert` on a machine with TensorRT.")
    if extra_args:
        raise UsageError(f"convert: option(s) {' '.join(extra_args)} apply to TensorRT builds only")
    if convert_to not in (None, "onnx") or output.suffix != ".onnx":
        raise UsageError(f"convert -o {output}: bisector writes ONNX only (-o FILE.onnx)")
    import onnx

    from bisector.artifacts.write import mixed_files_or_note
    from bisector.files import write_file_atomic
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    cat = Catalog.load(Path(model))
    keep = set(fp32)
    unknown = cat.unknown(sorted(keep))
    if unknown:
        raise UsageError(f"node(s) not in the model: {unknown}")
    specs = parse_layer_precisions(layer_precisions)
    if specs:
        from bisector.backends.trt_layers import layer_precisions_to_plan

        keep |= set(layer_precisions_to_plan(cat, specs))
    plan = Plan(frozenset(n for n in keep if n in cat.candidates), cat.candidates) if fp16 else \
        Plan.all_fp32(cat.candidates)
    files, note = mixed_files_or_note(cat, plan, Path(output))  # unchecked where the model itself fails the checker
    if not files:  # the model passes the checker and its mixed copy does not: a bisector bug
        raise onnx.checker.ValidationError(note.strip())
    for path, fill in files:  # external data first, the model last
        write_file_atomic(path, fill)
    return output
