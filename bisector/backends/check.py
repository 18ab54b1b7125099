"""The check-command backend of `debug precision`: run the user's command once and read its end.

Its end is classified the way Polygraphy's `CheckCmdArgs` does (`--fail-code`, `--ignore-fail-code`,
`--fail-regex`), with two outcomes Polygraphy folds into "fail": a check that ran past `--check-timeout`
(`timeout`, its whole process group killed) and one killed by a signal (`crash`). See `OUTCOMES`. The candidate's
files the command reads are written beforehand by `bisector.artifacts.candidate`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bisector.errors import UsageError

log = logging.getLogger("bisector")

# status -> meaning (README "debug precision"): the first two are answers, the others are not
OUTCOMES = {
    "pass": "the check passed (exit code 0, or not a --fail-code, or an --ignore-fail-code; no --fail-regex match)",
    "fail": "the check failed: a failing exit code, or its output matched --fail-regex",
    "timeout": "the check ran past --check-timeout and was killed (with its process group)",
    "crash": "the check was killed by a signal (segfault, OOM killer, kill -9)",
    "error": "the candidate could not be prepared (engine build failure) or the check could not start",
}
ANSWERS = frozenset({"pass", "fail"})
OUTPUT_TAIL = 4000  # characters of the check's output kept per verdict (report, journal)


@dataclass
class CheckSpec:
    """The check command and how its end is read (Polygraphy's CheckCmdArgs)."""

    command: list[str]
    fail_codes: list[int] | None = None
    ignore_fail_codes: list[int] | None = None
    fail_regex: list[str] | None = None
    show_output: bool = False
    hide_fail_output: bool = False
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("--check needs a command: everything after --check is the check command "
                             "(e.g. --check polygraphy run polygraphy_debug.onnx --onnxrt --load-outputs golden.json)")
        if self.fail_codes and self.ignore_fail_codes:
            raise UsageError("--fail-code and --ignore-fail-code exclude each other (as in Polygraphy)")
        try:
            self.patterns = [re.compile(p) for p in (self.fail_regex or [])]
        except re.error as exc:
            raise UsageError(f"--fail-regex: not a regular expression: {exc}") from None
        if self.timeout is not None and not self.timeout > 0:
            raise UsageError(f"--check-timeout {self.timeout}: must be a positive number of seconds")

    def describe(self) -> dict[str, Any]:
        """What decides a verdict (the journal key): the command and how its end is read."""
        return {"command": list(self.command), "fail_codes": self.fail_codes,
                "ignore_fail_codes": self.ignore_fail_codes, "fail_regex": self.fail_regex}


@dataclass
class CheckOutcome:
    status: str  # a key of OUTCOMES
    returncode: int | None
    seconds: float
    reason: str
    signal: str | None = None
    output: str = ""  # the tail of stdout + stderr
    timeout: float | None = None  # the limit the check ran under


def classify(spec: CheckSpec, returncode: int, output: str) -> tuple[bool, str]:
    """Polygraphy's `is_status_success`, with the reason spelled out."""
    if spec.ignore_fail_codes and returncode in spec.ignore_fail_codes:
        return True, f"exit code {returncode} is an --ignore-fail-code"
    matched = None
    if spec.patterns:
        matched = next((p.pattern for p in spec.patterns if p.search(output)), None)
    if spec.fail_codes is not None:
        failed = returncode in spec.fail_codes
        if spec.patterns:
            failed = failed and matched is not None
        if failed:
            return False, (f"exit code {returncode} is a --fail-code" + (f" and the output matched --fail-regex "
                                                                       f"{matched!r}" if matched else ""))
        return True, f"exit code {returncode}: not a failure under --fail-code" + (
            "/--fail-regex" if spec.patterns else "")
    if spec.patterns:
        if matched is not None:
            return False, f"output matched --fail-regex {matched!r} (exit code {returncode})"
        return True, f"no --fail-regex match (exit code {returncode})"
    return (returncode == 0), f"exit code {returncode}"


def run_check(spec: CheckSpec, timeout: float | None = None, env: dict[str, str] | None = None) -> CheckOutcome:
    """Run the command once (in the current directory, like Polygraphy) and classify its end. `timeout`: the
    limit for this run (the smaller of --check-timeout and what --time-limit leaves)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(spec.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={**os.environ, **(env or {})})
    except OSError as exc:
        return CheckOutcome("error", None, time.perf_counter() - t0, f"the check could not start: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        text = _text(out) + _text(err)
        return CheckOutcome("timeout", None, time.perf_counter() - t0, f"ran past {timeout:g}s and was killed",
                            output=text[-OUTPUT_TAIL:], timeout=timeout)
    except BaseException:  # Ctrl-C: take the check down with us
        _kill_group(proc)
        raise
    seconds = time.perf_counter() - t0
    stdout, stderr = _text(out), _text(err)
    text = stdout + stderr
    rc = proc.returncode
    if rc < 0:
        name = _signal_name(-rc)
        return CheckOutcome("crash", rc, seconds, f"killed by signal {name}", signal=name, output=text[-OUTPUT_TAIL:],
                            timeout=timeout)
    ok, reason = classify(spec, rc, text)
    outcome = CheckOutcome("pass" if ok else "fail", rc, seconds, reason, output=text[-OUTPUT_TAIL:], timeout=timeout)
    if (spec.show_output or (not ok and not spec.hide_fail_output)) and text.strip():
        level = logging.INFO if ok else logging.WARNING
        log.log(level, "check output (%s):\n========== CAPTURED STDOUT ==========\n%s"
                "========== CAPTURED STDERR ==========\n%s", outcome.status, stdout, stderr)
    return outcome


def in_process_command(command: Sequence[str]) -> list[str] | None:
    """The argv of `bisector …` when the check is bisector itself (`bisector run …`, `python -m bisector.cli.main
    run …`), else None. Such a check can run in this process: no interpreter start per candidate."""
    cmd = list(command)
    if cmd and Path(cmd[0]).name == "bisector":
        rest = cmd[1:]
    elif len(cmd) >= 3 and Path(cmd[0]).name.startswith("python") and cmd[1] == "-m" and \
            cmd[2] in ("bisector", "bisector.cli", "bisector.cli.main"):
        rest = cmd[3:]
    else:
        return None
    return rest if rest and rest[0] in ("run", "verify") else None


def run_in_process(spec: CheckSpec, argv: list[str], main: Callable[[list[str]], int]) -> CheckOutcome:
    """`bisector run …` as the check, called in this process through `main` (the CLI's entry point, handed down by
    the CLI) with its output captured (no --check-timeout: it cannot be killed; --subprocess-check for that)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    if rc == 130:  # the inner command caught Ctrl-C: it is ours
        raise KeyboardInterrupt
    seconds = time.perf_counter() - t0
    stdout, stderr = out.getvalue(), err.getvalue()
    text = stdout + stderr
    ok, reason = classify(spec, rc, text)
    if (spec.show_output or (not ok and not spec.hide_fail_output)) and text.strip():
        log.log(logging.INFO if ok else logging.WARNING, "check output (%s):\n========== CAPTURED STDOUT "
                "==========\n%s========== CAPTURED STDERR ==========\n%s", "pass" if ok else "fail", stdout, stderr)
    return CheckOutcome("pass" if ok else "fail", rc, seconds, reason + " (in process)", output=text[-OUTPUT_TAIL:])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the check's process group, SIGKILL what is left after two seconds."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


# ---- what a check command names ----------------------------------------------------------------------------


def names_engine(command: Sequence[str], engine_path: str | None = None) -> str | None:
    """The token of `command` that makes it need a TensorRT engine (a `*.engine` path, `--trt`, `--model-type
    engine`), or None."""
    for i, tok in enumerate(command):
        if tok.endswith(".engine") or (engine_path is not None and tok == engine_path):
            return tok
        if tok == "--trt":
            return tok
        if tok in ("--model-type", "--model-type=engine") and (tok.endswith("=engine") or
                                                             (i + 1 < len(command) and command[i + 1] == "engine")):
            return "--model-type engine"
    return None


def tensorrt_installed() -> bool:
    """A real TensorRT (not the stubs' empty namespace package) imports here."""
    try:
        from bisector.backends.trt_import import import_tensorrt

        import_tensorrt()
        return True
    except Exception:
        return False
