"""The backend protocol: a plan and input feeds in, output arrays out.

Backends know nothing about searches; the oracle drives them. Each one proves at start (its canary) that it
really computes in FP16, because an oracle that silently runs FP32 would approve every plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from bisector.model.catalog import Catalog
    from bisector.fp16.plan import Plan

Feeds = Mapping[str, np.ndarray]


class Backend(Protocol):
    name: str

    def open(self, catalog: "Catalog") -> None:
        """One-time preparation for this model (sessions, builder, timing cache)."""

    def canary(self) -> None:
        """Raise BackendFailure when FP16 is not really in effect."""

    def run(self, plan: "Plan", feeds: Feeds, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Outputs (graph outputs, or the named tensors) of the model under `plan`, as float32/int arrays."""

    def describe(self) -> dict[str, str]:
        """Name, versions and options: what makes two evaluations comparable (journal key, constraints.json)."""

    def close(self) -> None:
        """Release sessions, engines and device memory."""
