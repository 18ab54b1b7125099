"""`bisector batch nightly.toml`: several models, one command, one summary, a non-zero exit if any regressed.
The config format is described in bisector/app/batch.py; each entry's `args` are parsed by the same flag
parser as `bisector precision` / `bisector verify`, then the API runs it in-process."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bisector.cli.options import (raw_stream, safe_table, JsonOut, JunitOut, Verbose, human_output, json_to_stdout, setup_logging,
                                  write_json)
from bisector.errors import UsageError

log = logging.getLogger("bisector")


def batch(
    config: Annotated[Path, typer.Argument(help="TOML file describing the models and their flags.")],
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only the named models.")] = None,
    json_out: JsonOut = None,
    junit: JunitOut = None,
    verbose: Verbose = False,
) -> None:
    """Run several models from a config file; print a summary; exit non-zero if any model regressed."""
    from rich.console import Console

    from bisector.app import api

    setup_logging(verbose)
    cfg = api.load_config(config)
    redirect = contextlib.redirect_stdout(sys.stderr) if json_to_stdout(json_out) else contextlib.nullcontext()
    with redirect:  # stdout carries the batch JSON alone: the models' own lines go to stderr
        result = api.run_batch(cfg, parse_args, only=only,
                               on_model=lambda e: log.info("batch: %s (%s)", e.name, e.mode))
    suite = api.Suite()
    for m in result.models:
        suite.add_outputs(m.name, m.outputs, m.seconds)
        if m.exit_code != 0 and (m.regression or m.error or not m.outputs or m.missing_nodes):
            suite.cases.append(api.Case(m.name, m.mode, False, m.regression or m.error or f"{m.mode} failed ({m.status})",
                                    m.seconds, error=m.exit_code in (2, 3)))
    table = safe_table(title=f"bisector batch: {Path(config).name}")
    for col in ("model", "mode", "status", "FP32 nodes", "seconds"):
        table.add_column(col)
    for m in result.models:
        table.add_row(m.name, m.mode, m.status, "-" if m.fp32_nodes is None else str(len(m.fp32_nodes)),
                      f"{m.seconds:.1f}")
    say = human_output(json_out)
    Console(file=raw_stream(sys.stderr if json_to_stdout(json_out) else sys.stdout), markup=False,
            highlight=False).print(table)
    for m in result.models:
        if m.regression:
            say(f"{m.name}: {m.regression}")
    if json_out is not None:
        write_json(json_out, json.dumps({"models": [m.to_json() for m in result.models]}, indent=2) + "\n")
    if junit is not None:
        suite.write(junit)
    raise typer.Exit(result.exit_code)


def parse_args(mode: str, args: list[str]) -> dict[str, Any]:
    """A config entry's flags, parsed exactly as `bisector <mode>` parses them, as API keyword options (only the
    options given, so `verify` keeps defaulting to what the constraints recorded)."""
    import typer.main

    from bisector.cli.argv import expand_multi_value_flags
    from bisector.cli.main import app

    cmd = typer.main.get_command(app).commands[mode]  # type: ignore[attr-defined]
    if mode == "verify":  # the entry names its constraints file; the parser only needs the flag present
        args = [*args, "--constraints", "CONSTRAINTS"]
    try:
        ctx = cmd.make_context(mode, expand_multi_value_flags(["MODEL", *args]), resilient_parsing=False)
    except Exception as exc:  # the flag parser's usage errors (typer vendors click: no public class to name)
        if not hasattr(exc, "format_message"):
            raise
        raise UsageError(f"args {args}: {exc.format_message()}") from None
    api_fields = _api_fields() | (_PRECISION_OUTPUT if mode == "precision" else set())
    given = {p.name for p in cmd.params if p.name and getattr(ctx.get_parameter_source(p.name), "name", "") != "DEFAULT"}
    return {k: v for k, v in ctx.params.items() if k in api_fields and k in given}


# `precision`'s own output flags that the API takes too (`api.precision(plot=..., mixed=...)`): a nightly entry's
# `--no-mixed` or `--plot` means what it means on the command line, not nothing.
_PRECISION_OUTPUT = {"plot", "mixed"}


def _api_fields() -> set[str]:
    import dataclasses

    from bisector.app.options import GROUPS

    return {f.name for g in GROUPS for f in dataclasses.fields(g)}
