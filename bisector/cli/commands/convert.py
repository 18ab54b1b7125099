"""`bisector convert`: Polygraphy's `convert`, where it does not need TensorRT.

`-o X.onnx --fp16` writes the mixed-precision ONNX (every candidate FP16 except `--fp32` nodes and
`--layer-precisions NAME:float32`); building an engine (`-o X.engine`, `--convert-to trt`) needs TensorRT and
exits 2 saying what to run instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bisector.app import api
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
    setup_logging(verbose)
    out = api.convert(model, output, fp16=fp16, fp32=fp32 or [], layer_precisions=layer_precisions,
                      convert_to=convert_to, model_type=model_type, extra_args=list(ctx.args))
    typer.echo(f"[I] Saved model to {out}")
