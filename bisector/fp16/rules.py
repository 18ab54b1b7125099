"""FP16 storage rules (DESIGN §4): the numbers, and how each op family runs as an FP16 node.

- activations: IEEE round-to-nearest-even; finite values from 65520 up become inf, as a real FP16 tensor would.
- weights (`round_weight`, and `weight_rule` its FP16 form): what TensorRT and ModelOpt AutoCast do when they convert weights: clamp finite values
  to ±65504, lift nonzero values below the smallest subnormal (2^-24) to ±2^-24, round the rest to nearest.
- op families (`op_rule`): how an FP16 node of a given op type computes and stores. Today every family is
  "FP16 storage, FP32 math inside the layer"; families whose outputs are exact copies or selections of their
  (already FP16) inputs are marked so the emulation can skip a rounding that changes nothing. A family computed
  in FP16 *arithmetic* (as some GPU kernels do) is one more `OpRule` registered here with `register_op_rule`;
  every consumer asks `op_rule` and nothing else.

Which tensors a plan rounds is `bisector.fp16.points`; the Cast nodes that realise it are `bisector.fp16.casts`.
Callers look these functions up through the module (`rules.round_weight(...)`), so a patched rule reaches the
emulation, the sensitivity profile and the mixed-precision writer alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from bisector.fp16 import fastcast

FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 2.0**-24


def round_activation(a: np.ndarray) -> np.ndarray:
    """An FP32 array stored as FP16 and read back (no warnings: overflow to inf is the point)."""
    return fastcast.round_half(np.asarray(a))


def round_weight(a: np.ndarray) -> np.ndarray:
    """An FP32 weight as an FP16 layer holds it, read back as FP32 (what the emulation feeds an FP16 node):
    finite values clamp to ±65504, nonzero values below 2^-24 lift to ±2^-24, the rest rounds to nearest even.
    The one home of the weight rule: `weight_rule` (the FP16 copy the mixed model stores) derives from it."""
    a = np.asarray(a, dtype=np.float32)
    if a.size:
        # Fast path, exact: plain rounding (ORT's hardware Cast pair, fastcast) is the rule wherever it gives no
        # inf or NaN (then every value was finite and below 65520, and those in (65504, 65520) round to 65504, the
        # clamp's value), except for nonzero values it sent to ±0, lifted to ±2^-24 (values in (2^-25, 2^-24)
        # round to 2^-24 already, what the lift gives). Real weights have a few such values per million. Bit for
        # bit the definition below (tests/test_fp16_rules.py), ~10x faster than numpy's float16 conversion.
        r = _fast_path(a, fastcast.round_half, np.uint32(0x7FFFFFFF), np.uint32(0x7F800000))
        if r is not None:
            return r
    finite = np.isfinite(a)
    clamped = np.where(finite, np.clip(a, -FP16_MAX, FP16_MAX), a)
    tiny = finite & (clamped != 0) & (np.abs(clamped) < FP16_MIN_SUBNORMAL)
    lifted = np.where(tiny, np.copysign(np.float32(FP16_MIN_SUBNORMAL), clamped), clamped)
    with np.errstate(over="ignore", invalid="ignore"):
        return lifted.astype(np.float16).astype(np.float32)


def weight_rule(a: np.ndarray) -> np.ndarray:
    """`round_weight` as the FP16 array an FP16 layer holds (exact: its values are FP16 values)."""
    if round_weight is not _BUILT_IN_ROUND_WEIGHT:  # the rule was changed in its home: derive from it
        return fastcast.to_half(round_weight(a))
    a = np.asarray(a, dtype=np.float32)
    if a.size:
        # The same fast path as round_weight's, one conversion instead of three (FP32 -> FP16 -> FP32 -> FP16):
        # writing a mixed model converts every FP16 weight.
        h = _fast_path(a, fastcast.to_half, np.uint16(0x7FFF), np.uint16(0x7C00))
        if h is not None:
            return h
    return fastcast.to_half(round_weight(a))


_BUILT_IN_ROUND_WEIGHT = round_weight


def weight_rule_is_elementwise(storage: str) -> bool:
    """Whether the FP16 weight rule in force converts each value on its own (the built-in one does; a rule
    changed in its home may not), so that a weight may be converted a slice at a time."""
    return storage == "fp16" and round_weight is _BUILT_IN_ROUND_WEIGHT


# The checks on a converted weight run over its bits in slices that stay in the CPU's cache: on a whole 100 MB
# weight, the masked copy alone (50-100 MB of fresh pages) cost more than ORT's Cast (weight_rule 73 -> ~20 ms).
CHECK_SLICE = 1 << 18


def _fast_path(a: np.ndarray, convert, magnitude: np.generic, inf_bits: np.generic) -> np.ndarray | None:
    """`convert(a)` (plain rounding) with nonzero values it sent to ±0 lifted; None where the rule needs its slow
    path (the conversion gave an inf or NaN)."""
    out = convert(a)
    zeros = _zeros_when_finite(out, magnitude, inf_bits)
    if zeros is None:
        return None
    _lift(out, a, zeros)
    return out


def _zeros_when_finite(converted: np.ndarray, magnitude: np.generic, inf_bits: np.generic) -> np.ndarray | None:
    """For FP16 values (uint16 `magnitude` mask) or FP16 values read back as FP32 (uint32 mask): None when any is
    inf or NaN (the weight had a value beyond FP16's range, or a NaN: the rule's slow path), else the flat
    positions of the zeros, which the caller checks against the source."""
    bits = converted.reshape(-1).view(magnitude.dtype)
    scratch = np.empty(min(bits.size, CHECK_SLICE), bits.dtype)
    zeros = []
    for start in range(0, bits.size, CHECK_SLICE):
        part = bits[start : start + CHECK_SLICE]
        m = np.bitwise_and(part, magnitude, out=scratch[: part.size])
        if m.max() >= inf_bits:
            return None
        if np.count_nonzero(m) < m.size:
            zeros.append(np.flatnonzero(m == 0) + start)
    return np.concatenate(zeros) if zeros else _NO_ZEROS


_NO_ZEROS = np.zeros(0, np.intp)


def _lift(converted: np.ndarray, source: np.ndarray, zeros: np.ndarray) -> None:
    """Nonzero source values the conversion sent to ±0 become ±2^-24, in place (`converted` is a fresh array;
    positions are in C order, `.flat`'s, whatever the arrays' layout: numpy's astype keeps a Fortran order)."""
    if not zeros.size:
        return
    src = source.reshape(-1)[zeros]
    kept = src != 0
    if kept.any():
        converted.flat[zeros[kept]] = np.copysign(np.float32(FP16_MIN_SUBNORMAL), src[kept])


# ---- op families -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpRule:
    """How an FP16 node of one op family runs.

    `exact_outputs`: its float outputs are copies, selections or sign changes of its float data inputs (which an
    FP16 node reads as FP16 values), so storing them in FP16 changes nothing: the emulation skips that rounding
    (an exact no-op, a measurable saving); the mixed model stores them FP16 all the same.
    """

    name: str
    exact_outputs: bool = False


STORAGE = OpRule("fp16-storage")
EXACT_STORAGE = OpRule("fp16-storage-exact", exact_outputs=True)

_OP_RULES: dict[str, OpRule] = {
    op: EXACT_STORAGE
    for op in (
        "Relu Identity Reshape Transpose Flatten Squeeze Unsqueeze Slice Gather GatherElements GatherND Concat "
        "Split Tile Expand MaxPool GlobalMaxPool ReduceMax ReduceMin Max Min Neg Abs Sign Floor Ceil Round Where "
        "DepthToSpace SpaceToDepth TopK Dropout"
    ).split()
}


def op_rule(op_type: str) -> OpRule:
    """The rule an FP16 node of `op_type` follows (STORAGE unless a family registered another)."""
    return _OP_RULES.get(op_type, STORAGE)


def register_op_rule(op_types: Iterable[str], rule: OpRule) -> None:
    """Make every op type in `op_types` follow `rule` (for a new family, e.g. FP16 arithmetic)."""
    for op in op_types:
        _OP_RULES[op] = rule


# Ops whose float output holds copies of its one float data input's elements, nothing computed (moved, selected,
# repeated): rounding that input first or the output after gives the same bits. Narrower than `exact_outputs`
# (Relu, Max, Floor, ... are exact on FP16 inputs but do not commute with rounding bit for bit: a signed zero,
# an integer beyond FP16's spacing; Dropout copies only outside training mode). `points.single_node_twins`
# relies on it.
ROUNDING_COMMUTES = frozenset(
    "Identity Reshape Transpose Flatten Squeeze Unsqueeze Slice Gather GatherElements GatherND Tile Expand "
    "DepthToSpace SpaceToDepth".split())


def commutes_with_rounding(op_type: str, domain: str = "") -> bool:
    """Whether rounding an FP16 node's float input before `op_type` equals rounding its output after."""
    return op_type in ROUNDING_COMMUTES and domain in ("", "ai.onnx")


def copies_elements(node) -> bool:
    """Whether every float output of `node` holds copies of its float data inputs' elements, nothing computed, so
    rounding its inputs before equals rounding its outputs after, and on FP16 inputs it writes FP16 values: the
    ROUNDING_COMMUTES ops, Concat and Split (several inputs or outputs), Resize and Upsample in nearest mode
    (not `tf_crop_and_resize`, which fills with a float attribute), and Pad where it adds no float value of its
    own (reflect, edge or wrap, or constant with no constant_value input: zeros). `points.IdleFP32` relies on it."""
    if node.domain not in ("", "ai.onnx"):
        return False
    op = node.op_type
    if op in ROUNDING_COMMUTES or op in ("Concat", "Split"):
        return True
    attrs = {a.name: a for a in node.attribute}

    def text(name: str, default: str) -> str:
        a = attrs.get(name)
        return a.s.decode("utf-8", "replace") if a is not None else default

    if op in ("Resize", "Upsample"):
        return text("mode", "nearest") == "nearest" and text("coordinate_transformation_mode", "") != "tf_crop_and_resize"
    if op == "Pad":
        mode = text("mode", "constant")
        return mode in ("reflect", "edge", "wrap") or (
            mode == "constant" and (len(node.input) < 3 or not node.input[2]) and "value" not in attrs)
    return False


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


# ---- the storage type of a plan's reduced-precision nodes --------------------------------------------------------
STORAGES = ("fp16", "bf16")


def half_type(storage: str) -> int:
    """The ONNX element type a reduced-precision node stores: FLOAT16, or BFLOAT16 (`run --trt --bf16`)."""
    from onnx import TensorProto

    return TensorProto.BFLOAT16 if storage == "bf16" else TensorProto.FLOAT16


def round_activation_as(storage: str, a: np.ndarray) -> np.ndarray:
    return round_activation_bf16(a) if storage == "bf16" else round_activation(a)


def round_weight_as(storage: str, a: np.ndarray) -> np.ndarray:
    return round_weight_bf16(a) if storage == "bf16" else round_weight(a)

