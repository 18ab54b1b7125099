"""Polygraphy's space-separated multi-value flags, turned into what click understands.

Polygraphy users write `--atol 1e-3 out0:1e-2` and `--fp32 Add Sub`; click options take one value each. Before
click sees argv, every value after a multi-value flag is given its own copy of the flag, so
`--fp32 Add Sub` becomes `--fp32 Add --fp32 Sub` (repeating the flag keeps appending). A value list ends at the
next token that starts with `-`. This is the only place that knows about it.
"""

from __future__ import annotations

from typing import Sequence

MULTI_VALUE_FLAGS = frozenset(
    {
        "--val-range",
        "--input-shapes",
        "--atol",
        "--rtol",
        "--check-error-stat",
        "--fp32",
        "--tactic-sources",
        "--load-inputs",
    }
)


def expand_multi_value_flags(argv: Sequence[str], flags: frozenset[str] = MULTI_VALUE_FLAGS) -> list[str]:
    out: list[str] = []
    current: str | None = None  # the multi-value flag whose values we are reading
    taken = 0
    for i, tok in enumerate(argv):
        if tok == "--":
            out.extend(argv[i:])
            return out
        if tok.startswith("-"):
            current = tok if tok in flags else None
            taken = 0
            out.append(tok)
            continue
        if current is not None:
            if taken:  # second and later values get their own copy of the flag
                out.append(current)
            taken += 1
        out.append(tok)
    return out
