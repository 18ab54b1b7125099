"""A plan: which candidate nodes stay FP32; every other candidate runs FP16. One small immutable value."""

from __future__ import annotations

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
        """A stable text key (sorted names) for caches and journals."""
        return "\n".join(sorted(self.fp32))

    @classmethod
    def all_fp16(cls, candidates: tuple[str, ...]) -> "Plan":
        return cls(frozenset(), candidates)

    @classmethod
    def all_fp32(cls, candidates: tuple[str, ...]) -> "Plan":
        return cls(frozenset(candidates), candidates)
