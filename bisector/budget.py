"""Budgets: the one exception the search protocol shares between the driver and strategies (DESIGN §3), and the
Budget (--max-evals, --time-limit) that raises it.

It lives in the core package, with no dependencies, so the oracle can raise it without importing the strategy
plugins (and a source checkout runs without the install step that maps `strategies/` to `bisector.strategies`).
`bisector.strategies.BudgetExhausted` is this class.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class BudgetExhausted(Exception):
    """Raised by the driver's `passes` when --max-evals or --time-limit is spent. Strategies let it propagate."""


@dataclass
class Budget:
    max_evals: int | None = None
    time_limit: float | None = None
    started: float = field(default_factory=time.monotonic)

    def spent(self) -> bool:
        """The time limit has passed (work after the search is skipped then)."""
        return self.time_limit is not None and time.monotonic() - self.started >= self.time_limit

    def check(self, new_evals: int) -> None:
        if self.max_evals is not None and new_evals >= self.max_evals:
            raise BudgetExhausted(f"--max-evals {self.max_evals} reached")
        if self.time_limit is not None and time.monotonic() - self.started >= self.time_limit:
            raise BudgetExhausted(f"--time-limit {self.time_limit:g}s reached")
