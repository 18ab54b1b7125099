"""`bisector batch nightly.toml`: several models, one command, one summary, a non-zero exit if any regressed.

    [defaults]                       # flags every model gets (Polygraphy spelling, as on the command line)
    args = ["--fp16", "--atol", "1e-1"]
    output_dir = "nightly_out"

    [[model]]
    name = "seed"                    # optional; default: the file's stem
    path = "fixtures/needs_constraints.onnx"
    mode = "precision"               # precision (search) | verify (check a recorded set)
    args = ["--val-range", "x:[1,2]"]
    expect_fp32 = ["Add", "Sub"]     # optional: a different set found is a regression

    [[model]]
    path = "fixtures/planted.onnx"
    mode = "verify"
    constraints = "planted_constraints.json"

Relative paths are resolved against the config file's folder. Each model runs in-process through the same
code as its command; a model's error (exit 2/3) is reported and the batch goes on with the next one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
import tomllib
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from pydantic import BaseModel, ConfigDict, ValidationError

from bisector.cli.options import (
    JsonOut,
    JunitOut,
    Verbose,
    human_output,
    json_to_stdout,
    setup_logging,
    write_json,
)
from bisector.errors import UsageError

log = logging.getLogger("bisector")


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path
    name: Optional[str] = None
    mode: Literal["precision", "verify"] = "precision"
    args: list[str] = []
    constraints: Optional[Path] = None
    expect_fp32: Optional[list[str]] = None


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: list[str] = []
    output_dir: Path = Path("bisector_batch")


class BatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    defaults: Defaults = Defaults()
    model: list[ModelEntry]


def load_config(path: Path) -> BatchConfig:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML ({exc})") from None
    try:
        config = BatchConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"{path}: invalid batch config ({problems})") from None
    base = Path(path).parent
    names = set()
    for entry in config.model:
        entry.path = entry.path if entry.path.is_absolute() else base / entry.path
        if entry.constraints is not None and not entry.constraints.is_absolute():
            entry.constraints = base / entry.constraints
        entry.name = entry.name or entry.path.stem
        if entry.name in names:
            raise UsageError(f"{path}: two models are named {entry.name!r}; give them distinct `name`s")
        names.add(entry.name)
        if entry.mode == "verify" and entry.constraints is None:
            raise UsageError(f"{path}: model {entry.name!r} has mode verify but no `constraints` file")
    if not config.defaults.output_dir.is_absolute():
        config.defaults.output_dir = base / config.defaults.output_dir
    return config


def batch(
    config: Annotated[Path, typer.Argument(help="TOML file describing the models and their flags.")],
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only the named models.")] = None,
    json_out: JsonOut = None,
    junit: JunitOut = None,
    verbose: Verbose = False,
) -> None:
    """Run several models from a config file; print a summary; exit non-zero if any model regressed."""
    from rich.console import Console
    from rich.table import Table

    from bisector.cli.main import main as cli_main
    from bisector.artifacts.junit import Case, Suite

    setup_logging(verbose)
    cfg = load_config(config)
    entries = [e for e in cfg.model if not only or e.name in only]
    if only and len(entries) != len(set(only)):
        known = [e.name for e in cfg.model]
        raise UsageError(f"--only names unknown model(s) {sorted(set(only) - set(known))}; the config has {known}")
    results, suite = [], Suite()
    for e in entries:
        out_dir = cfg.defaults.output_dir / e.name
        summary_path = out_dir / "summary.json"
        args = [e.mode, str(e.path), *cfg.defaults.args, *e.args, "--json", str(summary_path)]
        if e.mode == "precision":
            args += ["-o", str(out_dir)]
        else:
            args += ["--constraints", str(e.constraints)]
        if verbose:
            args.append("--verbose")
        log.info("batch: %s (%s)", e.name, e.mode)
        t0 = time.perf_counter()
        if summary_path.exists():
            summary_path.unlink()  # never report a stale summary as this run's
        if json_to_stdout(json_out):  # stdout carries the batch JSON alone: the models' own lines go to stderr
            with contextlib.redirect_stdout(sys.stderr):
                code = cli_main(args)
        else:
            code = cli_main(args)
        seconds = time.perf_counter() - t0
        summary = json.loads(summary_path.read_text()) if summary_path.exists() and code in (0, 1) else {}
        found = summary.get("fp32_nodes")
        regression = ""
        if code == 0 and e.expect_fp32 is not None and sorted(e.expect_fp32) != sorted(found or []):
            regression = f"FP32 set changed: expected {sorted(e.expect_fp32)}, found {sorted(found or [])}"
            code = 1
        status = {0: "ok", 1: "REGRESSED", 2: "ERROR (input)", 3: "ERROR (backend)"}.get(code, f"exit {code}")
        results.append({"name": e.name, "mode": e.mode, "exit_code": code, "status": status, "seconds": seconds,
                        "fp32_nodes": found, "regression": regression, "summary": str(summary_path)})
        if summary.get("outputs"):
            suite.add_outputs(e.name, summary["outputs"], seconds)
        if code != 0 and (regression or not summary.get("outputs") or summary.get("missing_nodes")):
            suite.cases.append(Case(e.name, e.mode, False, regression or f"{e.mode} exited {code} ({status})",
                                    seconds, error=code in (2, 3)))

    table = Table(title=f"bisector batch: {config.name}")
    for col in ("model", "mode", "status", "FP32 nodes", "seconds"):
        table.add_column(col)
    for r in results:
        nodes = "-" if r["fp32_nodes"] is None else str(len(r["fp32_nodes"]))
        table.add_row(r["name"], r["mode"], r["status"], nodes, f"{r['seconds']:.1f}")
    say = human_output(json_out)
    Console(stderr=json_to_stdout(json_out)).print(table)
    for r in results:
        if r["regression"]:
            say(f"{r['name']}: {r['regression']}")
    if json_out is not None:
        write_json(json_out, json.dumps({"models": results}, indent=2) + "\n")
    if junit is not None:
        suite.write(junit)
    codes = [r["exit_code"] for r in results]
    worst = next((c for c in (3, 2, 1) if c in codes), 0)
    raise typer.Exit(worst)
