"""Parsing of Polygraphy-style values, in one place: ranges, shapes, per-output tolerances and error stats.

`--val-range x:[1,2] [0,1]`, `--input-shapes x:[1,3,224,224]`, `--atol 1e-3 out0:1e-2`. Names are split from
values on the *last* ':' so tensor names that contain ':' keep working (Polygraphy's rule).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Generic, Iterable, TypeVar

from bisector.errors import UsageError

T = TypeVar("T")

ERROR_STATS = ("elemwise", "mean", "median", "max", "quantile")


@dataclass(frozen=True)
class PerOutput(Generic[T]):
    """A default value plus per-output overrides."""

    default: T
    per_output: dict[str, T] = field(default_factory=dict)

    def get(self, output: str) -> T:
        return self.per_output.get(output, self.default)

    def as_dict(self) -> dict:
        return {"default": self.default, **({"per_output": dict(self.per_output)} if self.per_output else {})}


def split_name(token: str) -> tuple[str | None, str]:
    """'name:value' -> (name, value); a bare value -> (None, value). Splits on the last ':' outside brackets."""
    depth = 0
    for i in range(len(token) - 1, -1, -1):
        c = token[i]
        if c in "])":
            depth += 1
        elif c in "[(":
            depth -= 1
        elif c == ":" and depth == 0:
            return token[:i], token[i + 1 :]
    return None, token


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a number") from None
    if math.isnan(value):
        raise UsageError(f"{what}: NaN is not allowed")
    return value


def parse_tolerance(tokens: Iterable[str] | None, default: float, flag: str) -> PerOutput[float]:
    result, per = default, {}
    for tok in tokens or ():
        name, text = split_name(tok)
        value = _number(text, f"{flag} {tok!r}")
        if value < 0:
            raise UsageError(f"{flag} {tok!r}: a tolerance cannot be negative")
        if name is None:
            result = value
        elif not name:
            raise UsageError(f"{flag} {tok!r}: empty output name before ':'")
        else:
            per[name] = value
    return PerOutput(result, per)


def parse_error_stat(tokens: Iterable[str] | None) -> PerOutput[str]:
    result, per = "elemwise", {}
    for tok in tokens or ():
        name, text = split_name(tok)
        if text not in ERROR_STATS:
            raise UsageError(f"--check-error-stat {tok!r}: choose one of {', '.join(ERROR_STATS)}")
        if name is None:
            result = text
        else:
            per[name] = text
    return PerOutput(result, per)


def _literal_list(text: str, what: str) -> list:
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise UsageError(f"{what}: {text!r} is not a list like [1,2]")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(f"{what}: {text!r} is not a list like [1,2]") from None
    if not isinstance(value, (list, tuple)):
        raise UsageError(f"{what}: {text!r} is not a list like [1,2]")
    return list(value)


def parse_val_range(tokens: Iterable[str] | None) -> dict[str | None, tuple[float, float]]:
    """{input name or None (all inputs): (low, high)}."""
    ranges: dict[str | None, tuple[float, float]] = {}
    for tok in tokens or ():
        name, text = split_name(tok)
        what = f"--val-range {tok!r}"
        values = _literal_list(text, what)
        if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise UsageError(f"{what}: expected two numbers, like x:[0,1]")
        lo, hi = float(values[0]), float(values[1])
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise UsageError(f"{what}: expected finite low <= high")
        if name == "":
            raise UsageError(f"{what}: empty input name before ':'")
        ranges[name] = (lo, hi)
    return ranges


def parse_input_shapes(tokens: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for tok in tokens or ():
        name, text = split_name(tok)
        what = f"--input-shapes {tok!r}"
        if not name:
            raise UsageError(f"{what}: expected name:[dims], like x:[1,3,224,224]")
        dims = _literal_list(text, what)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise UsageError(f"{what}: dimensions must be non-negative integers")
        shapes[name] = tuple(dims)
    return shapes
