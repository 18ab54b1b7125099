"""The journal: every evaluation committed to SQLite (WAL) the moment it completes, so a killed search resumes.

Entries are keyed by everything that decides a verdict — model digest, inputs digest, golden digest, backend and
its options, tolerances, tool version — plus the plan. A resumed search replays the (deterministic) strategy and
gets each repeated plan from here; entries under other keys are kept, never overwritten. A kill -9 loses at most
the evaluation in flight: each verdict is its own committed transaction.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from bisector.errors import UsageError
from bisector.search.judge import Verdict
from bisector.fp16.plan import Plan

SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    key TEXT NOT NULL,
    plan TEXT NOT NULL,
    passed INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (key, plan)
);
CREATE TABLE IF NOT EXISTS keys (key TEXT PRIMARY KEY, description TEXT NOT NULL);
"""


def journal_key(description: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


class SqliteJournal:
    def __init__(self, path: Path, description: dict[str, Any], resume: bool = True):
        self.path = Path(path)
        self.description = description
        self.key = journal_key(description)
        self.resume = resume
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a killed process
            self.db.executescript(SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO keys VALUES (?, ?)",
                            (self.key, json.dumps(description, sort_keys=True, default=str)))
        except sqlite3.Error as exc:
            raise UsageError(f"cannot open the journal {self.path}: {exc}") from None

    def lookup(self, plan: Plan) -> Verdict | None:
        if not self.resume:
            return None
        row = self.db.execute("SELECT verdict FROM evaluations WHERE key=? AND plan=?", (self.key, plan.key())).fetchone()
        return None if row is None else Verdict.from_json(json.loads(row[0]))

    def record(self, plan: Plan, verdict: Verdict) -> None:
        # Same key and plan: a --no-resume run re-judged it; the newer verdict replaces the older one.
        self.db.execute(
            "INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?, ?)",
            (self.key, plan.key(), int(verdict.passed), json.dumps(verdict.to_json()), time.time()),
        )

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM evaluations WHERE key=?", (self.key,)).fetchone()[0]

    def close(self) -> None:
        self.db.close()
