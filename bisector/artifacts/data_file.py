"""The layout of a mixed model's external data file (`model.mixed.onnx.data`): when a mixed model gets one, which
weights go there, at what alignment, and what a weight's bytes are known by. Shared by the writer after the search
(`artifacts.write`) and the one that begins the file while the search runs (`artifacts.prewrite`)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx

from bisector.model import catalog as _catalog

ALIGN = 4096  # as onnx.save_model aligns external data, so that runtimes can map it
EXTERNAL_MIN_BYTES = 1024  # initializers at least this large go to the .data file of a large mixed model
# Mixed models whose weights pass this go to .onnx + .onnx.data, streamed from the arrays: one file would mean a
# protobuf of every weight plus its serialised bytes at once (a 1.27 GB model: 2.8 GB peak writing it).
EXTERNAL_DATA_FROM_BYTES = 256 * 2**20


def stays_one_file(model: onnx.ModelProto, values: Mapping[str, object]) -> bool:
    """Whether a detached mixed model is written as one .onnx (weights below EXTERNAL_DATA_FROM_BYTES and the
    whole within protobuf's 2 GB) rather than .onnx + .onnx.data."""
    weight_bytes = sum(int(v.nbytes) for v in values.values())  # arrays and FP16Copy: sizes, nothing converted
    return weight_bytes < EXTERNAL_DATA_FROM_BYTES and model.ByteSize() + weight_bytes <= _catalog.PROTOBUF_LIMIT


def value_key(name: str, value) -> tuple:
    """What a weight's bytes are known by: its name in the mixed model, element type and shape."""
    return name, np.dtype(value.dtype).str, tuple(int(d) for d in np.shape(value))


def key_bytes(key: tuple) -> int:
    """The size of the weight `value_key` names."""
    return np.dtype(key[1]).itemsize * int(np.prod(key[2], dtype=np.int64))
