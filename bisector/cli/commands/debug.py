"""`bisector debug precision MODEL --fp16 [flags] --check CMD…`: Polygraphy's `debug precision` with any check
command as the oracle. Everything after `--check` is the check command (cut off argv in `cli.argv`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bisector.app.api import Check
from bisector.app.options import BackendChoice, Cache, Inputs, Search
from bisector.cli.options import Fp16, JsonOut, JunitOut, Model, Verbose, command, human_output, setup_logging, write_json
from bisector.cli.progress import SearchProgress

debug_app = typer.Typer(help="Polygraphy-style debugging tools with a check command as the oracle.",
                        no_args_is_help=True)

Progress = Annotated[bool, typer.Option("--progress/--no-progress", rich_help_panel="Output",
                                        help="Live progress on stderr when it is a terminal (plain lines otherwise).")]
OutputDir = Annotated[Path, typer.Option("-o", "--output-dir", help="Where to write the artifacts of the final set.",
                                         rich_help_panel="Output")]
CheckFlag = Annotated[bool, typer.Option("--check", "--check-inference", rich_help_panel="Check",
                                         help="CMD…: the rest of the command line is the check command, run once per "
                                              "candidate after its files are written (exit 0 = pass, unless "
                                              "--fail-code/--fail-regex say otherwise).")]


class CheckProgress(SearchProgress):
    """The search display, each verdict line with the check's verdict, exit code and duration."""

    _last: Any = None

    def on_verdict(self, verdict: Any) -> None:
        self._last = verdict
        super().on_verdict(verdict)

    def _line(self, text: str) -> None:
        v = self._last
        if text.startswith("eval ") and v is not None and hasattr(v, "status"):
            code = v.returncode if v.returncode is not None else (v.signal or "-")
            text += f" | check {v.status} (exit {code}) {v.check_seconds:.2f}s"
        super()._line(text)

    def _render(self) -> Any:
        table = super()._render()
        v = self._last
        if v is not None and hasattr(v, "status"):
            code = v.returncode if v.returncode is not None else (v.signal or "-")
            table.add_row("last check", f"{v.status} (exit {code}) in {v.check_seconds:.2f}s"
                          + (" [journal]" if v.source != "new" else ""))
        return table


@debug_app.command("precision")
@command(Inputs, BackendChoice, Search, Cache, Check)
def precision(model: Model, fp16: Fp16 = True, check: CheckFlag = False,
              output_dir: OutputDir = Path("bisector_out"), progress: Progress = True, json_out: JsonOut = None,
              junit: JunitOut = None, verbose: Verbose = False, *, opts) -> None:
    """Search the FP32 set with a check command as the oracle (Polygraphy's `debug precision`), then write the
    usual artifacts. Exit codes: 0 a passing set, 1 nothing passes, 2 usage/environment (e.g. the check needs a
    TensorRT engine and TensorRT is absent), 3 a check timed out, crashed or could not be prepared."""
    from bisector.app.api import debug_precision
    from bisector.cli.argv import CHECK_COMMAND
    from bisector.cli.main import main as cli_main  # a `bisector run …` check runs in this process through it
    from bisector.errors import UsageError

    setup_logging(verbose)
    command_line = CHECK_COMMAND.get()
    if command_line is None:
        raise UsageError("debug precision needs --check CMD… (the rest of the command line is the check command); "
                         "an interactive session is not supported")
    s = opts[Search]
    display = CheckProgress(live=None if progress else False, max_evals=s.max_evals, time_limit=s.time_limit)
    r = debug_precision(model, command_line, output_dir=output_dir, progress=display, inputs=opts[Inputs],
                        backend=opts[BackendChoice], cache=opts[Cache], search=s, debug=opts[Check],
                        in_process_main=cli_main)
    c = r.constraints
    info = c.check
    if json_out is not None:
        write_json(json_out, c.model_dump_json(indent=2) + "\n")
    if junit is not None:
        from bisector.app.api import Case, Suite

        final = next((v for v in reversed(r.verdicts) if frozenset(v.fp32) == frozenset(r.fp32_nodes)), None)
        suite = Suite()  # one case: the final set under the check (its last verdict, exit code and duration)
        suite.cases.append(Case(Path(model).name, "check: " + " ".join(info["command"] or []), r.passed,
                                "" if r.passed else (final.reason if final is not None else "no passing set"),
                                final.check_seconds if final is not None else 0.0))
        suite.write(junit)
    say = human_output(json_out)
    say(f"FP32 nodes ({len(r.fp32_nodes)}): {' '.join(r.fp32_nodes) if r.fp32_nodes else '(none)'}")
    say(f"{'PASSED' if r.passed else 'FAILED'}; {'1-minimal' if r.minimal else 'not proven minimal'}; "
        f"{c.evaluations.total} evaluations ({c.evaluations.new} new, {c.evaluations.cached} cached); "
        f"{info['checks_run']} check(s) run in {info['check_seconds']:.2f}s"
        + (f"; FP16 inside the branches of {len(c.unjudged_branches)} If node(s) not judged (report.md)"
           if c.unjudged_branches else "") + f"; artifacts in {output_dir}")
    raise typer.Exit(0 if r.passed else 1)
