"""FP16 storage rules (DESIGN §4), in one place so the emulation and the mixed-precision ONNX agree.

- activations: IEEE round-to-nearest-even; finite values from 65520 up become inf, as a real FP16 tensor would.
- weights: what TensorRT and ModelOpt AutoCast do when they convert weights: clamp finite values to ±65504, lift
  nonzero values below the smallest subnormal (2^-24) to ±2^-24, round the rest to nearest.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 2.0**-24


def round_activation(a: np.ndarray) -> np.ndarray:
    """An FP32 array stored as FP16 and read back (no warnings: overflow to inf is the point)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(np.float16).astype(np.float32)


def convert_weight(a: np.ndarray) -> np.ndarray:
    """An FP32 weight as an FP16 layer holds it, returned as FP16."""
    a = np.asarray(a, dtype=np.float32)
    finite = np.isfinite(a)
    clamped = np.where(finite, np.clip(a, -FP16_MAX, FP16_MAX), a)
    tiny = finite & (clamped != 0) & (np.abs(clamped) < FP16_MIN_SUBNORMAL)
    lifted = np.where(tiny, np.copysign(np.float32(FP16_MIN_SUBNORMAL), clamped), clamped)
    with np.errstate(over="ignore", invalid="ignore"):
        return lifted.astype(np.float16)


def round_weight(a: np.ndarray) -> np.ndarray:
    """convert_weight, read back as FP32 (what the emulation feeds an FP16 node)."""
    return convert_weight(a).astype(np.float32)
