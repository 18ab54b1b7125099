"""Polygraphy's space-separated multi-value flags, turned into what click understands.

Polygraphy users write `--atol 1e-3 out0:1e-2` and `--fp32 Add Sub`; click options take one value each. Before
click sees argv, every value after a multi-value flag is given its own copy of the flag, so
`--fp32 Add Sub` becomes `--fp32 Add --fp32 Sub` (repeating the flag keeps appending). A value list ends at the
next token that starts with `-`. The flags come from the option groups (`multi=True`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Sequence

# `debug precision … --check CMD…`: everything after --check is the check command (Polygraphy's REMAINDER)
CHECK_FLAGS = frozenset({"--check", "--check-inference"})
CHECK_COMMAND: ContextVar[list[str] | None] = ContextVar("CHECK_COMMAND", default=None)


def split_check(argv: Sequence[str]) -> list[str]:
    """Cut `--check CMD…` off argv (first occurrence, before any `--`); CMD is kept in CHECK_COMMAND for the
    `debug` commands to read. Click never sees the check command, so its flags cannot be taken for ours."""
    argv = list(argv)
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        if tok in CHECK_FLAGS:
            CHECK_COMMAND.set(argv[i + 1:])
            return argv[:i]
    CHECK_COMMAND.set(None)
    return argv

def expand_multi_value_flags(argv: Sequence[str], flags: frozenset[str] | None = None) -> list[str]:
    if flags is None:
        from bisector.cli.options import multi_value_flags

        flags = multi_value_flags()
        _CURRENT[:] = list(argv)
        argv = expand_abbreviations(argv)
    out: list[str] = []
    current: str | None = None  # the multi-value flag whose values we are reading
    taken = 0
    for i, tok in enumerate(argv):
        if tok == "--" or tok in CHECK_FLAGS:  # the check command after --check is copied verbatim
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


_CURRENT: list[str] = []


def current_argv() -> list[str]:
    """The command line (after the program name) that this process is running, as the user typed it."""
    return list(_CURRENT)


def expand_abbreviations(argv: Sequence[str]) -> list[str]:
    """argparse's allow_abbrev, which Polygraphy users rely on (`--abs 1e-4` for `--abs-tol`): a long option that
    is an unambiguous prefix of exactly one long flag of the command becomes that flag. Exact flags, unknown and
    ambiguous prefixes are left for click to judge."""
    flags = _command_flags(argv)
    if not flags:
        return list(argv)
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "--":
            return out + list(argv[i:])
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok.partition("=")
            if name not in flags:
                matches = sorted(f for f in flags if f.startswith(name))
                if len({flags[f] for f in matches}) == 1:  # one option, whatever its spellings (--iter)
                    tok = matches[0] + eq + value
        out.append(tok)
    return out


def _command_flags(argv: Sequence[str]) -> dict[str, str]:
    """The long flags of the (sub)command named in argv, each with the name of the option it sets."""
    try:
        import typer

        from bisector.cli.main import app

        cmd = typer.main.get_command(app)
        for tok in argv:
            if tok.startswith("-"):
                continue
            sub = getattr(cmd, "commands", {}).get(tok)
            if sub is None:
                break
            cmd = sub
        return {o: str(p.name) for p in getattr(cmd, "params", []) for o in [*p.opts, *p.secondary_opts]
                if o.startswith("--")}
    except Exception:  # abbreviations are a convenience; click still parses the command line
        return {}
