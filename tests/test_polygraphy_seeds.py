"""Issue 18 acceptance: every `polygraphy` command line of the seed walkthroughs, with the program name changed.

Each line (tests/data/polygraphy_seed_commands.txt) runs in a fresh working directory laid out like the seed's
(models in ../models, scripts beside them); lines that save inputs/outputs earlier in the same walkthrough run
first, so `--load-inputs/--load-outputs` find what the seed expects. Fixture models stand in for the seeds' models.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from .conftest import FIXTURES, SEED, main_cli
from .polyseed_models import write_all

DATA = Path(__file__).parent / "data"
COMMANDS = DATA / "polygraphy_seed_commands.txt"
SCRIPTS = DATA / "polyseed"
NEEDS_TRT = "needs TensorRT"


def _lines() -> list[tuple[str, str, str]]:
    out = []
    for line in COMMANDS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            source, expect, command = line.split("\t")
            out.append((source, expect, command))
    return out


LINES = _lines()


def _debug_exists() -> bool:
    from bisector.cli.main import app

    import typer

    return "debug" in typer.main.get_command(app).commands  # type: ignore[attr-defined]


def to_bisector(command: str) -> tuple[list[str], dict[str, str]]:
    """The seed's command with the program name changed: env assignments apart, `> file` dropped, `...` (the
    seed's "the rest of the command") standing for the command before it, and gpen_input.json (a file the seed never
    writes; its next line names net_input.json) for net_input.json."""
    tokens = shlex.split(command.split(" > ")[0])
    env = {}
    while re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        k, v = tokens.pop(0).split("=", 1)
        env[k] = v
    assert tokens[0] == "polygraphy"
    tokens = tokens[1:]
    out = []
    for t in tokens:
        if t == "...":
            out += ELLIPSIS
        else:
            out.append("net_input.json" if t == "gpen_input.json" else t)
    return out, env


# `polygraphy run ... --trt-npps my_script.py:custom_func`: the seed's `...` is the command just before it.
ELLIPSIS = ["needs_constraints.onnx", "--onnxrt", "--trt", "--fp16", "--precision-constraints", "obey",
            "--val-range", "x:[1,2]", "--check-error-stat", "median"]


def _workdir(root: Path) -> Path:
    models = root / "models"
    write_all(models)
    work = root / "work"
    work.mkdir()
    shutil.copy(SEED, work / "needs_constraints.onnx")
    shutil.copy(FIXTURES / "planted.onnx", work / "superpoint_128dim_300_repvgg_0921_repvgg_acc_float32_simple.onnx")
    shutil.copy(models / "net_bs8.onnx", work / "net_bs8.onnx")
    for script in SCRIPTS.iterdir():
        shutil.copy(script, work / script.name)
    for engine in ("polygraphy_debug.engine", "net_bs8_fp32.engine", "net_bs8.engine"):
        (work / engine).write_bytes(b"not a real engine")
    return work


def _run(tokens: list[str], env: dict[str, str], monkeypatch) -> int:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return main_cli(*tokens)


@pytest.mark.parametrize("source,expect,command", LINES, ids=[s for s, _, _ in LINES])
def test_seed_command(source, expect, command, tmp_path, monkeypatch, capsys):
    if expect == "skip":
        if not _debug_exists():
            pytest.skip("`debug` lines belong to `bisector debug` (the debug-precision work), not on main yet")
    work = _workdir(tmp_path)
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # What the walkthrough saved before this line, it saves again here.
    for s, e, c in LINES:
        if s == source:
            break
        if s.split(":")[0] == source.split(":")[0] and e == "pass" and re.search(r"--save-(inputs|outputs)", c):
            tokens, env = to_bisector(c)
            assert _run(tokens, env, monkeypatch) == 0, c
    capsys.readouterr()
    tokens, env = to_bisector(command)
    code = _run(tokens, env, monkeypatch)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "No such option" not in text, text
    if expect == "pass":
        assert code == 0, text
    elif expect == "fail":
        assert code == 1, text
    elif expect == "compare":
        assert code in (0, 1), text
        assert "PASSED" in text or "FAILED" in text, text
    elif expect == "needs-trt":
        assert code == 2, text
        assert NEEDS_TRT in text, text
    else:
        assert expect == "skip"


def test_seed_walkthrough_numbers(monkeypatch, tmp_path, capsys):
    """000_71cc…:19 — Add in FP16 overflows to 65504, Sub in FP32 then yields 0; the median absolute error of both
    is 1.5 (the seed's TensorRT numbers)."""
    monkeypatch.chdir(_workdir(tmp_path))
    tokens, _ = to_bisector(LINES[0][2])
    assert main_cli(*tokens, "--cache-dir", tmp_path / "cache") == 1
    text = capsys.readouterr().out
    add = text[text.index("Comparing Output: 'add_out'"):]
    assert re.search(r"trt-runner-N0-\S+: add_out \| Stats: mean=65504, .*median=65504", add)
    assert "Minimum Required Tolerance: median error | [abs=1.5]" in add
    sub = text[text.index("Comparing Output: 'sub_out'"):]
    assert re.search(r"trt-runner-N0-\S+: sub_out \| Stats: mean=0, .*median=0,", sub)
    assert "Minimum Required Tolerance: median error | [abs=1.5] OR [rel=1]" in sub
    assert "FAILED | Output: 'add_out'" in text and "FAILED | Output: 'sub_out'" in text
    # Line for line the seed's log (000_71cc…): the same generated inputs give the same FP32 reference statistics
    # (down to the argmin/argmax positions) and the same error metrics.
    for line in (
        ": add_out | Stats: mean=65506, std-dev=0.28889, var=0.083457, median=65506, min=65505 at (0, 0, 0, 5), "
        "max=65506 at (0, 0, 5, 165), avg-magnitude=65506",
        "Minimum Required Tolerance: median error | [abs=1.5] OR [rel=2.2899e-05]",
        "Absolute Difference | Stats: mean=1.4995, std-dev=0.28889, var=0.083457, median=1.5, min=1 at (0, 0, 0, 5), "
        "max=2 at (0, 0, 5, 165), avg-magnitude=1.4995",
        "Relative Difference | Stats: mean=2.2892e-05, std-dev=4.4101e-06, var=1.9449e-11, median=2.2899e-05, "
        "min=1.5266e-05 at (0, 0, 0, 5), max=3.0532e-05 at (0, 0, 5, 165), avg-magnitude=2.2892e-05",
        ": sub_out | Stats: mean=1.4995, std-dev=0.28889, var=0.083457, median=1.5, min=1 at (0, 0, 0, 5), "
        "max=2 at (0, 0, 5, 165), avg-magnitude=1.4995",
        "Relative Difference | Stats: mean=1, std-dev=0, var=0, median=1, min=1 at (0, 0, 0, 0), max=1 at "
        "(0, 0, 0, 0), avg-magnitude=1",
        "FAILED | Output: 'sub_out' | Difference exceeds tolerance (rel=1e-05, abs=1e-05)",
    ):
        assert line in text, line


SEEDS = Path("/work/shared/seeds")


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed walkthroughs are not on this machine")
def test_data_file_holds_every_seed_command_line():
    """The data file is the seeds' command lines, none missing (continuation lines joined)."""
    found = []
    for f in sorted(SEEDS.glob("*.txt")):
        lines = f.read_text().split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            if re.search(r"(^|\s)polygraphy ", line) and not line.lstrip().startswith("#"):
                start, cmd = i + 1, line
                while cmd.rstrip().endswith("\\"):
                    i += 1
                    cmd = cmd.rstrip()[:-1].rstrip() + " " + lines[i].strip()
                found.append((f"{f.name}:{start}", " ".join(cmd.split())))
            i += 1
    assert found == [(s, c) for s, _, c in LINES]
