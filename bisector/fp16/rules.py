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


# ---- BF16 storage (`run --trt --bf16`): the same rules with bfloat16's range and precision --------------------------
BF16_MAX = float.fromhex("0x1.fep127")  # 3.3895e38
BF16_MIN_SUBNORMAL = 2.0**-133


def to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """FP32 -> bfloat16 bit patterns (uint16), IEEE round-to-nearest-even; NaN stays a (quiet) NaN, values beyond
    the largest bfloat16 round to inf as a real BF16 tensor would."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    with np.errstate(over="ignore"):
        rounded = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def from_bfloat16_bits(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_activation_bf16(a: np.ndarray) -> np.ndarray:
    """An FP32 array stored as BF16 and read back (round to nearest even; overflow to inf)."""
    return from_bfloat16_bits(to_bfloat16_bits(a))


def round_weight_bf16(a: np.ndarray) -> np.ndarray:
    """A weight as a BF16 layer holds it, read back as FP32: finite values clamped to ±BF16_MAX, nonzero values
    below the smallest BF16 subnormal lifted to it, the rest rounded to nearest even."""
    a = np.asarray(a, dtype=np.float32)
    finite = np.isfinite(a)
    clamped = np.where(finite, np.clip(a, -BF16_MAX, BF16_MAX), a)
    tiny = finite & (clamped != 0) & (np.abs(clamped) < BF16_MIN_SUBNORMAL)
    lifted = np.where(tiny, np.copysign(np.float32(BF16_MIN_SUBNORMAL), clamped), clamped).astype(np.float32)
    return round_activation_bf16(lifted)
