"""`bisector convert`: Polygraphy's `convert`, where it does not need TensorRT.

`-o X.onnx --fp16` writes the mixed-precision ONNX (every candidate FP16 except `--fp32` nodes and
`--layer-precisions NAME:float32`); building an engine (`-o X.engine`, `--convert-to trt`) needs TensorRT and
exits 2 saying what to run instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector.cli.options import Fp32Nodes, Model, Verbose, setup_logging

Output = Annotated[Optional[Path], typer.Option("-o", "--output", help="Where to write the converted model.")]


def convert(ctx: typer.Context, model: Model, output: Output = None, fp16: Annotated[bool, typer.Option(
            "--fp16", help="FP16 for every candidate not kept FP32.")] = False, fp32: Fp32Nodes = None,
            layer_precisions: Annotated[Optional[list[str]], typer.Option(
                "--layer-precisions", help="NAME:float32 keeps a layer FP32.")] = None,
            convert_to: Annotated[Optional[str], typer.Option("--convert-to", help="onnx, or trt (needs TensorRT).")] = None,
            model_type: Annotated[Optional[str], typer.Option("--model-type", help="onnx (default).")] = None,
            verbose: Verbose = False) -> None:
    """Convert a model as `polygraphy convert` does: mixed-precision ONNX here; TensorRT engines need TensorRT."""
    from bisector.app.polyrun import check_model, needs_tensorrt
    from bisector.errors import UsageError

    setup_logging(verbose)
    check_model(Path(model), model_type, command="convert")
    if output is None:
        raise UsageError("convert: give the output file with -o FILE")
    if convert_to == "trt" or (convert_to is None and output.suffix in (".engine", ".plan", ".trt")):
        raise needs_tensorrt(
            f"convert -o {output.name}: building a TensorRT engine",
            f"keep the ONNX model and compare with `bisector run {Path(model).name} --trt --fp16 --onnxrt` (emulated "
            f"on the CPU, or --backend tensorrt where TensorRT is installed); `bisector precision "
            f"{Path(model).name} --fp16 -o DIR` writes the FP32 layer set and a mixed-precision ONNX for "
            f"`trtexec --onnx=... --stronglyTyped`; or run `polygraphy convert` on a machine with TensorRT.")
    if ctx.args:
        raise UsageError(f"convert: option(s) {' '.join(ctx.args)} apply to TensorRT builds only")
    if convert_to not in (None, "onnx") or output.suffix not in (".onnx",):
        raise UsageError(f"convert -o {output}: bisector writes ONNX only (-o FILE.onnx)")
    from bisector.files import write_bytes_atomic
    from bisector.fp16.mixed import build_mixed_model
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    cat = Catalog.load(Path(model))
    keep = set(fp32 or [])
    unknown = cat.unknown(sorted(keep))
    if unknown:
        raise UsageError(f"node(s) not in the model: {unknown}")
    if layer_precisions:
        from bisector.app.options import _layer_precisions
        from bisector.backends.trt_layers import layer_precisions_to_plan

        keep |= set(layer_precisions_to_plan(cat, _layer_precisions(layer_precisions)))
    plan = Plan(frozenset(n for n in keep if n in cat.candidates), cat.candidates) if fp16 else \
        Plan.all_fp32(cat.candidates)
    write_bytes_atomic(output, build_mixed_model(cat, plan).SerializeToString())
    typer.echo(f"[I] Saved model to {output}")
