"""The one exception the search protocol shares between the driver and strategies (DESIGN §3).

It lives in the core package, with no dependencies, so the oracle can raise it without importing the strategy
plugins (and a source checkout runs without the install step that maps `strategies/` to `bisector.strategies`).
`bisector.strategies.BudgetExhausted` is this class.
"""


class BudgetExhausted(Exception):
    """Raised by the driver's `passes` when --max-evals or --time-limit is spent. Strategies let it propagate."""
