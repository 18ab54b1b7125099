from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
SEED = FIXTURES / "needs_constraints.onnx"
PLANTED = FIXTURES / "planted.onnx"
TESTVECTORS = Path(__file__).parent / "data" / "testvectors"


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def run_cli(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a subprocess, exit code and both streams."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "bisector.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=600)


def main_cli(*args) -> int:
    """The CLI in-process (fast); returns the exit code."""
    from bisector.cli.main import main

    return main([str(a) for a in args])


def planted_spec() -> dict:
    return json.loads((FIXTURES / "planted.json").read_text())


def journal_rows(cache_dir) -> int:
    """Evaluations committed to the journal in `cache_dir` so far (0 while it does not exist or is locked)."""
    import sqlite3

    path = Path(cache_dir) / "journal.sqlite"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(str(path), timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    except sqlite3.Error:
        return 0
