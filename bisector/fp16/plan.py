"""A plan: which candidate nodes stay FP32; every other candidate runs FP16. One small immutable value."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    fp32: frozenset[str]
    candidates: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = self.fp32.difference(self.candidates)
        if unknown:
            raise ValueError(f"not candidates: {sorted(unknown)}")

    @property
    def fp16(self) -> frozenset[str]:
        return frozenset(self.candidates).difference(self.fp32)

    def key(self) -> str:
        """A stable, unambiguous text key for caches and journals: the sorted names as a JSON list, so no name
        (one containing a newline, a comma, a quote) can make two different sets share a key."""
        return json.dumps(sorted(self.fp32), ensure_ascii=False)

    @classmethod
    def all_fp16(cls, candidates: tuple[str, ...]) -> "Plan":
        return cls(frozenset(), candidates)

    @classmethod
    def all_fp32(cls, candidates: tuple[str, ...]) -> "Plan":
        return cls(frozenset(candidates), candidates)
