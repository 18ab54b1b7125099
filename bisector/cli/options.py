"""Flags from the API's typed option groups, declared once (in bisector.app.options) and shown as help panels.

`command(*groups)` gives a command function the flags of every group it names; the command receives the group
instances (already checked) in `opts`. CLI-only flags (output, logging) are declared here, once.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

Model = Annotated[Path, typer.Argument(help="The ONNX model.", show_default=False)]
Fp16 = Annotated[bool, typer.Option("--fp16", help="Reduced precision to search for: FP16 (the default).",
                                    rich_help_panel="Inputs")]
Fp32Nodes = Annotated[Optional[list[str]], typer.Option("--fp32", help="Nodes to keep in FP32 (space-separated).")]
ConstraintsIn = Annotated[Optional[Path], typer.Option("--constraints", help="Keep the fp32_nodes of a constraints.json in FP32.")]
JunitOut = Annotated[Optional[Path], typer.Option("--junit", help="JUnit XML here: one test case per model output.",
                                                  rich_help_panel="Output")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="A machine-readable summary here (`-`: stdout, "
                                                 "which then holds nothing else).", rich_help_panel="Output")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and tracebacks.", rich_help_panel="Output")]

CLI_MULTI_VALUE_FLAGS = frozenset({"--fp32"})


def multi_value_flags() -> frozenset[str]:
    """Every Polygraphy-style space-separated multi-value flag (see argv.py)."""
    from bisector.app.api import Check

    return CLI_MULTI_VALUE_FLAGS | {flag for g in (*api_groups(), Check) for f in dataclasses.fields(g)
                                    if f.metadata.get("multi") for flag in f.metadata["flags"]}


def api_groups() -> tuple[type, ...]:
    from bisector.app.options import GROUPS, POLYGRAPHY_GROUPS

    return GROUPS + POLYGRAPHY_GROUPS


@functools.cache
def _hints(group: type) -> dict[str, Any]:
    # once per group, not per field: ~200 fields each resolving their group's string annotations again took
    # 0.1 s of every command's start (docs/benchmarks.md, "Scale, thirty-seventh round")
    return typing.get_type_hints(group)


def _parameter(group: type, f: dataclasses.Field) -> inspect.Parameter:
    meta = f.metadata
    cli_type = meta["cli"] or _hints(group)[f.name]
    help_text = meta["help"]
    if f.name == "strategy":
        help_text += f" Installed: {_strategies()}."
    option = typer.Option(*meta["flags"], help=help_text, rich_help_panel=group.panel, show_default=meta["show_default"])
    default = f.default if f.default is not dataclasses.MISSING else None
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[cli_type, option])


def _strategies() -> str:
    try:
        from bisector.search.driver import available_strategies

        return ", ".join(sorted(available_strategies()))
    except Exception:  # help text must never fail
        return "?"


def command(*groups: type, defaults: dict[str, Any] | None = None) -> Callable[[Callable], Callable]:
    """Decorate `fn(..., opts)`: add every field of `groups` as a flag; call `fn` with `opts` mapping each group
    class to its instance (a bad value raises the group's UsageError before any work)."""

    def decorate(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn, include_extras=True)  # resolve `from __future__` string annotations
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(fn).parameters.values() if p.name != "opts"]
        fields = {f.name: g for g in groups for f in dataclasses.fields(g)}
        added = [_parameter(g, f) for g in groups for f in dataclasses.fields(g)]
        if defaults:
            added = [p.replace(default=defaults[p.name]) if p.name in defaults else p for p in added]

        def wrapper(**kw: Any) -> Any:
            return fn(**{k: v for k, v in kw.items() if k not in fields}, opts=build_groups(groups, kw))

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        wrapper.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
        return wrapper

    return decorate


def build_groups(groups: tuple[type, ...], values: dict[str, Any]) -> dict[type, Any]:
    """Group instances from flag values by field name."""
    return {g: g(**{f.name: values[f.name] for f in dataclasses.fields(g) if f.name in values}) for g in groups}


def setup_logging(verbose: bool) -> None:
    """Our log lines on stderr; other libraries (matplotlib, onnx) keep their own, quieter, defaults."""
    logger = logging.getLogger("bisector")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:  # ORT's process-wide logger (ort-cuda: cuDNN's recovered errors), ours to set in a command
        os.environ.setdefault("BISECTOR_ORT_PROCESS_LOG_SEVERITY", "4")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[bisector] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted (a captured or redirected stderr included)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def json_to_stdout(json_out) -> bool:
    return json_out is not None and str(json_out) == "-"


def write_json(json_out, text: str) -> None:
    """`--json FILE` (written atomically) or `--json -` (stdout, which then carries the JSON alone)."""
    if json_to_stdout(json_out):
        out = getattr(sys.stdout, "unwrapped", sys.stdout)  # JSON escapes what it must itself: written as is
        out.write(text)
        out.flush()
    else:
        from bisector.files import write_text_atomic

        write_text_atomic(json_out, text)


def plain(text: Any) -> str:
    """A name from the model as terminal text (escape sequences and control characters made visible)."""
    from bisector.text import terminal

    return terminal(text)


def refuse_outputs_onto(model: Any, **outputs: Any) -> None:
    """Before any work: an output flag (`json=...`, `junit=...`) naming the input model is refused (exit 2)."""
    from bisector.files import check_not_input, protect

    protect(model, "the input model")
    for flag, path in outputs.items():
        if path is not None and str(path) != "-":
            check_not_input(path, "--" + flag.replace("_", "-"))


def raw_stream(stream):
    """The terminal under the CLI's SafeStream filter, for rich consoles: rich draws colours with escape sequences
    of its own and strips control characters from text itself (names are printed with markup off)."""
    return getattr(stream, "unwrapped", stream)


def safe_table(*args: Any, **kwargs: Any):
    """A rich Table whose title and cells pass `text.terminal` (rich keeps escape sequences and NULs of cell text);
    print it on a Console with markup off."""
    from rich.table import Table

    from bisector.text import terminal

    class SafeTable(Table):
        def add_row(self, *cells: Any, **kw: Any) -> None:
            super().add_row(*(terminal(c) if isinstance(c, str) else c for c in cells), **kw)

    if isinstance(kwargs.get("title"), str):
        kwargs["title"] = terminal(kwargs["title"])
    return SafeTable(*args, **kwargs)


def human_output(json_out):
    """Where human-readable lines go: stdout, or stderr when stdout carries `--json -`."""
    if json_to_stdout(json_out):
        return lambda message: typer.echo(message, err=True)
    return typer.echo


__all__ = ["command", "build_groups", "Model", "Fp16", "Fp32Nodes", "ConstraintsIn", "JunitOut", "JsonOut",
           "Verbose", "setup_logging", "write_json", "human_output", "json_to_stdout", "multi_value_flags", "raw_stream",
           "safe_table", "plain", "refuse_outputs_onto"]
