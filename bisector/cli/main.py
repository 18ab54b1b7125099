"""The `bisector` command line: flags (Polygraphy spellings) -> typed option groups -> the API -> printed results.

Exit codes (DESIGN §9): 0 success, 1 accuracy failure, 2 usage/input/environment error, 3 backend failure.
"""

from __future__ import annotations

import sys

import typer

from bisector import __version__
from bisector.cli.argv import expand_multi_value_flags, split_check
from bisector.errors import BisectorError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the minimal set of ONNX nodes that must stay FP32 in an FP16 build. "
    "Exit codes: 0 success, 1 accuracy failure, 2 usage/input/environment error, 3 backend failure.",
)

from bisector.cli.commands.batch import batch
from bisector.cli.commands.convert import convert
from bisector.cli.commands.debug import debug_app
from bisector.cli.commands.inspect import inspect
from bisector.cli.commands.precision import precision
from bisector.cli.commands.profile import profile
from bisector.cli.commands.run import run
from bisector.cli.commands.verify import verify

app.command()(inspect)
app.command()(precision)
app.command()(profile)
app.command()(run)
app.command()(verify)
app.command()(batch)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(convert)
app.add_typer(debug_app, name="debug")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: Polygraphy-style argv, documented exit codes, no traceback unless --verbose.

    Flag errors are click's (exit 2, its usage message); ours are BisectorError with their own exit code.
    """
    args = split_check(expand_multi_value_flags(list(sys.argv[1:] if argv is None else argv)))
    verbose = "--verbose" in args or "-v" in args
    try:
        app(args=args, prog_name="bisector")  # standalone: click handles its own usage errors and exits
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BisectorError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        typer.echo(f"bisector: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("bisector: interrupted", err=True)
        return 130
    except Exception as exc:  # a bug: say so plainly, traceback on request
        if verbose:
            import traceback

            traceback.print_exc()
        typer.echo(f"bisector: internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback)", err=True)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
