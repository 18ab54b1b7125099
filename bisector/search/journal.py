"""The journal: every evaluation committed to SQLite (WAL) the moment it completes, so a killed search resumes.

Entries are keyed by everything that decides a verdict — model digest, inputs digest, golden digest, backend and
its options, tolerances, tool version — plus the plan. A resumed search replays the (deterministic) strategy and
gets each repeated plan from here; entries under other keys are kept, never overwritten. A kill -9 loses at most
the evaluation in flight: each verdict is its own committed transaction.

Keys are unambiguous: the journal key is the sha256 of the description as canonical JSON, the plan key the sha256
of a JSON list of names (`Plan.key`), so no name (with commas, quotes, newlines) can make two different entries
share a key. (Journals written before the forty-second round keyed a plan by that list itself: 11 KB a row on a
1200-node chain, twice, since the primary key's index holds it too; such rows are still read.) A row keeps what
a search reads back of its verdict (`Verdict.journal_json`), not every output's comparison.

Trust: the file is checked on open (`PRAGMA quick_check`); a damaged file is a UsageError (exit 2) naming it and
saying what to do — delete it, or run with `--no-resume`, which sets the damaged file aside (`*.corrupt-<time>`)
and starts a new journal. Every row carries a sha256 of (key, plan, verdict JSON): a row whose checksum does not
match (or whose verdict does not parse, or is for another plan) is never used — it is judged again and replaced,
with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from bisector.errors import UsageError
from bisector.search.judge import Verdict
from bisector.fp16.plan import Plan

log = logging.getLogger("bisector")
OPEN_TIMEOUT = 30.0  # seconds: SQLite's busy timeout, and how long a locked open is tried again


class _Busy(Exception):
    """The journal was locked while it was being opened (another process switching it to WAL)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    key TEXT NOT NULL,
    plan TEXT NOT NULL,
    passed INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    created REAL NOT NULL,
    checksum TEXT,
    PRIMARY KEY (key, plan)
);
CREATE TABLE IF NOT EXISTS keys (key TEXT PRIMARY KEY, description TEXT NOT NULL);
"""


def journal_key(description: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


def plan_digest(names: str) -> str:
    """A plan's key in the journal: the sha256 of `Plan.key()` (the sorted names as a JSON list), tagged."""
    return "sha256:" + hashlib.sha256(names.encode("utf-8", "surrogatepass")).hexdigest()


def row_checksum(key: str, plan: str, verdict: str) -> str:
    """sha256 of the row's fields, framed as a JSON list (no concatenation ambiguity)."""
    return hashlib.sha256(json.dumps([key, plan, verdict], ensure_ascii=False).encode("utf-8", "surrogatepass")
                          ).hexdigest()


class JournalCorrupt(UsageError):
    pass


class SqliteJournal:
    def __init__(self, path: Path, description: dict[str, Any], resume: bool = True):
        self.path = Path(path)
        self.description = description
        self.key = journal_key(description)
        self.resume = resume
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the journal's directory {self.path.parent}: "
                             f"{exc.strerror or exc} (--cache-dir)") from None
        try:
            self._open()
        except JournalCorrupt:
            if resume:
                raise
            self._set_aside()
            self._open()

    def _open(self) -> None:
        # Processes opening a new journal together (`batch` with parallel_models, two nightly jobs on one cache
        # dir) race to switch it to WAL: SQLite answers "database is locked" at once there, without waiting on
        # its busy timeout. The open is tried again for as long as that timeout (seen: 5 of 90 opens of 6
        # processes starting together failed; none with the retry).
        deadline = time.monotonic() + OPEN_TIMEOUT
        delay = 0.02
        while True:
            try:
                self._open_once()
                return
            except _Busy:
                if time.monotonic() >= deadline:
                    raise self._error(sqlite3.OperationalError("database is locked")) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _open_once(self) -> None:
        try:
            self.db = sqlite3.connect(str(self.path), timeout=OPEN_TIMEOUT, isolation_level=None)
        except sqlite3.Error as exc:
            raise UsageError(f"cannot open the journal {self.path}: {exc} (--cache-dir)") from None
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a killed process
            check = [r[0] for r in self.db.execute("PRAGMA quick_check").fetchall()]
            if check != ["ok"]:
                raise sqlite3.DatabaseError(" ".join(" ".join(str(c).split()) for c in check[:2]))
            self.db.executescript(SCHEMA)
            columns = {r[1] for r in self.db.execute("PRAGMA table_info(evaluations)")}
            if "checksum" not in columns:  # a journal of an earlier version: its rows are re-judged, then replaced
                self.db.execute("ALTER TABLE evaluations ADD COLUMN checksum TEXT")
            self.db.execute("INSERT OR IGNORE INTO keys VALUES (?, ?)",
                            (self.key, json.dumps(self.description, sort_keys=True, default=str)))
            # rows keyed by the plan's names themselves (an earlier version's): looked up that way too, only then
            self._legacy = self.db.execute(
                "SELECT 1 FROM evaluations WHERE key=? AND plan NOT LIKE 'sha256:%' LIMIT 1", (self.key,)
            ).fetchone() is not None
        except sqlite3.DatabaseError as exc:
            self.db.close()
            if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
                raise _Busy() from None
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.DatabaseError) -> UsageError:
        """A damaged file (DatabaseError proper) or an environment problem (OperationalError: read-only, locked,
        disk full), each with what to do."""
        if isinstance(exc, sqlite3.OperationalError) and "malformed" not in str(exc):
            full = "full" in str(exc).lower()
            return UsageError(f"cannot use the journal {self.path}: {'the disk is full' if full else exc}; free space "
                              "or choose another --cache-dir (or run with --no-cache)")
        return self._corrupt(exc)

    def _corrupt(self, exc: Exception) -> JournalCorrupt:
        return JournalCorrupt(
            f"the journal {self.path} is damaged ({exc}); delete it (rm '{self.path}'), or run with --no-resume "
            "to set it aside and start a new one (finished evaluations in it are then judged again)")

    def _set_aside(self) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                try:
                    os.replace(src, Path(str(aside) + suffix))
                except OSError as exc:
                    raise UsageError(f"cannot set the damaged journal {self.path} aside: {exc.strerror or exc}; "
                                     "delete it") from None
        log.warning("the journal %s was damaged: set aside as %s, starting a new one", self.path, aside)

    def lookup(self, plan: Plan) -> Verdict | None:
        doc = self.lookup_json(plan)
        if doc is None:
            return None
        try:
            verdict = Verdict.from_json(doc)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("journal %s: unreadable entry for plan %s (%s): judging it again", self.path, plan.key()[:80],
                        exc)
            return None
        if verdict.fp32 != plan.fp32:
            log.warning("journal %s: the entry for plan %s is for another plan: judging it again", self.path,
                        plan.key()[:80])
            return None
        return verdict

    def lookup_json(self, plan: Plan) -> dict | None:
        """The stored verdict of `plan` as JSON, only when its row's checksum holds (None: absent, not resuming,
        or not trusted — then it is judged again and the row replaced)."""
        if not self.resume:
            return None
        names = plan.key()
        key = plan_digest(names)
        try:
            row = self.db.execute("SELECT verdict, checksum FROM evaluations WHERE key=? AND plan=?",
                                  (self.key, key)).fetchone()
            if row is None and self._legacy:
                key = names
                row = self.db.execute("SELECT verdict, checksum FROM evaluations WHERE key=? AND plan=?",
                                      (self.key, key)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None
        if row is None:
            return None
        text, checksum = row
        if checksum != row_checksum(self.key, key, text):
            why = "no checksum (an earlier version's row)" if checksum is None else "checksum mismatch"
            log.warning("journal %s: the entry for plan %s is not trusted (%s): judging it again", self.path,
                        names[:80], why)
            return None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            log.warning("journal %s: unreadable entry for plan %s (%s): judging it again", self.path, names[:80], exc)
            return None
        if not isinstance(doc, dict):
            return None
        # the row's plan is its FP32 set (the checksum binds the verdict to it): rows of an earlier version carry
        # the set themselves, which `lookup` checks against the plan
        doc.setdefault("fp32", sorted(plan.fp32))
        return doc

    def record(self, plan: Plan, verdict: Verdict) -> None:
        # Same key and plan: a --no-resume run (or a distrusted row) re-judged it; the newer verdict replaces it.
        key, text = plan_digest(plan.key()), json.dumps(verdict.journal_json())
        try:
            self.db.execute(
                "INSERT OR REPLACE INTO evaluations (key, plan, passed, verdict, created, checksum) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.key, key, int(verdict.passed), text, time.time(), row_checksum(self.key, key, text)),
            )
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM evaluations WHERE key=?", (self.key,)).fetchone()[0]

    def close(self) -> None:
        self.db.close()
