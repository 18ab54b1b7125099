"""The `bisector` command line: flags (Polygraphy spellings) -> typed option groups -> the API -> printed results.

Exit codes (DESIGN §9): 0 success, 1 accuracy failure, 2 usage/input/environment error, 3 backend failure,
130 interrupted. `main` is the one exception boundary: every error a user can cause arrives here as a
BisectorError with its code, or as an OSError/MemoryError (the environment: exit 2, naming the file); anything
else is a bug, reported as one (exit 3, traceback with --verbose).
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading

import typer

from bisector import __version__
from bisector.cli.argv import expand_multi_value_flags, split_check
from bisector.errors import BisectorError
from bisector.heap import keep_large_blocks_mapped
from bisector.text import terminal

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the minimal set of ONNX nodes that must stay FP32 in an FP16 build. "
    "Exit codes: 0 success, 1 accuracy failure, 2 usage/input/environment error, 3 backend failure, "
    "130 interrupted.",
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

RESUME_HINT = ("interrupted; every finished evaluation is kept in the journal (unless --no-cache): run the same "
               "command again to resume where it stopped")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


class Interrupted(BaseException):
    """Ctrl-C, raised by our SIGINT handler: a BaseException that click's own KeyboardInterrupt handling (exit 1,
    "Aborted!") does not swallow, so it reaches the boundary and becomes exit 130."""


def entry() -> int:
    """The `bisector` command and `python -m bisector.cli`: a process bisector owns, whose ONNX Runtime sessions
    share one intra-op pool (bisector.ort_pool; `main` alone, as tests and programs call it, leaves the choice
    to the process)."""
    from bisector import ort_pool

    ort_pool.own_process()
    return main()


def main(argv: list[str] | None = None) -> int:
    """Console entry point: Polygraphy-style argv, documented exit codes, no traceback unless --verbose.

    Flag errors are click's (exit 2, its usage message); ours are BisectorError with their own exit code.
    """
    keep_large_blocks_mapped()  # freed activations go back to the system (bisector.heap)
    args = split_check(expand_multi_value_flags(list(sys.argv[1:] if argv is None else argv)))
    verbose = "--verbose" in args or "-v" in args
    with _safe_streams(), _sigint():
        try:
            app(args=args, prog_name="bisector")  # standalone: click handles its own usage errors and exits
            return 0
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BisectorError as exc:
            return _fail(exc.exit_code, str(exc), verbose)
        except (Interrupted, KeyboardInterrupt):
            typer.echo(f"bisector: {RESUME_HINT}", err=True)
            return 130
        except MemoryError as exc:
            return _fail(2, f"out of memory ({exc or 'MemoryError'}); use smaller --input-shapes or fewer "
                            "--iterations", verbose)
        except OSError as exc:  # the environment: a file, a directory, a device (exit 2, naming it)
            return _fail(2, _os_message(exc), verbose)
        except Exception as exc:  # a bug: say so plainly, traceback on request
            return _fail(3, f"internal error: {type(exc).__name__}: {exc} (a bug; run with --verbose for the "
                            "traceback)", verbose, prefix=False)


def _fail(code: int, message: str, verbose: bool, prefix: bool = True) -> int:
    if verbose:
        import traceback

        traceback.print_exc()
    typer.echo(f"bisector: {'error: ' if prefix else ''}{message}", err=True)
    return code


def _os_message(exc: OSError) -> str:
    name = exc.filename if exc.filename is not None else None
    reason = exc.strerror or str(exc)
    if name is None:
        return f"{reason}"
    other = f" -> {exc.filename2}" if getattr(exc, "filename2", None) else ""
    return f"{name}{other}: {reason}"


@contextlib.contextmanager
def _sigint():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted()

    try:
        old = signal.signal(signal.SIGINT, handler)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class SafeStream(io.TextIOBase):
    """stdout/stderr as the commands see them: every line passes `text.terminal` (escape sequences, bells, NULs
    and undecodable surrogates from model and file names become visible escapes). A live display that draws
    with escape sequences of its own writes to `.unwrapped`."""

    def __init__(self, inner):
        self.unwrapped = inner

    def write(self, s) -> int:
        if isinstance(s, (bytes, bytearray)):
            s = bytes(s).decode("utf-8", errors="backslashreplace")
        self.unwrapped.write(terminal(s))
        return len(s)

    def flush(self) -> None:
        self.unwrapped.flush()

    def isatty(self) -> bool:
        try:
            return self.unwrapped.isatty()
        except (AttributeError, ValueError):
            return False

    def fileno(self) -> int:
        return self.unwrapped.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self):  # type: ignore[override]
        return getattr(self.unwrapped, "encoding", "utf-8")

    @property
    def errors(self):  # type: ignore[override]
        return getattr(self.unwrapped, "errors", "strict")


def unwrap(stream):
    """The real stream under a SafeStream (for rich's live display, which draws with its own escapes)."""
    return getattr(stream, "unwrapped", stream)


@contextlib.contextmanager
def _safe_streams():
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(old[0]), SafeStream(old[1])
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = old


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
