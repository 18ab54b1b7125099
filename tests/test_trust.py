"""Issue 12 "Trust at the seams": artifacts written atomically and never through a planted link, constraints.json
last, normal modes, stale temporaries of killed runs cleaned; unambiguous keys; the journal's integrity; the
--time-limit bounding the whole command; hostile names escaped per sink; Ctrl-C. Each test uses the input that
broke it before."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import sqlite3
import stat
import xml.dom.minidom
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest

from .conftest import SEED, main_cli
from .test_bad_input import _chain

BASE = ["--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]"]


def _run(out, cache, *extra):
    return main_cli("precision", SEED, *BASE, "-o", out, "--cache-dir", cache, *extra)


# ---- 1. artifacts ------------------------------------------------------------------------------------------------
def test_symlink_planted_at_artifact_paths_is_replaced_never_followed(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    victims = {}
    for name in ("report.md", "constraints.json", "model.mixed.onnx", "add_constraints.py", "profile.png"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("precious")
        os.symlink(victim, out / name)
        victims[name] = victim
    assert _run(out, tmp_path / "c", "--plot") == 0
    for name, victim in victims.items():
        assert victim.read_text() == "precious", name  # the link was not followed
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    json.loads((out / "constraints.json").read_text())


def test_artifacts_get_ordinary_modes_from_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert _run(tmp_path / "o", tmp_path / "c", "--junit", tmp_path / "j.xml", "--json", tmp_path / "s.json") == 0
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "o").iterdir()] + [tmp_path / "j.xml", tmp_path / "s.json"]
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, (p.name, oct(p.stat().st_mode))  # mkstemp's 0600 before


def _dead_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 7  # beyond pid_max: no such process, ever


def test_stale_temporaries_of_killed_runs_are_cleaned_and_nothing_else(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    stale = out / f".report.md.bisector-{_dead_pid()}.k2j4h1x0.tmp"
    live = out / ".report.md.bisector-1.abcdefgh.tmp"  # pid 1 exists: maybe another run writing right now
    mine = out / ".report.md.tmp"  # not our pattern
    other = out / f".notes.txt.bisector-{_dead_pid()}.abcdefgh.tmp"  # not an artifact name of ours
    for p in (stale, live, mine, other):
        p.write_text("x")
    assert _run(out, tmp_path / "c") == 0
    assert not stale.exists()
    assert live.exists() and mine.exists() and other.exists()


def test_every_write_cleans_the_temporaries_a_killed_run_left_of_its_file(tmp_path):
    from bisector.files import write_text_atomic

    stale = tmp_path / f".s.json.bisector-{_dead_pid()}.abcdefgh.tmp"
    stale.write_text("half")
    write_text_atomic(tmp_path / "s.json", "{}")
    assert not stale.exists() and (tmp_path / "s.json").read_text() == "{}"


def _recording_writes(monkeypatch, fail_on=None):
    from bisector import files

    real, order = files._write, []

    def write(f, data, path):
        if not order or order[-1] != path.name:
            order.append(path.name)
        if path.name == fail_on:
            real(f, data[: max(len(data) // 2, 1)], path)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data, path)

    monkeypatch.setattr(files, "_write", write)
    return order


def test_constraints_json_is_written_last_profile_files_included(tmp_path, monkeypatch):
    order = _recording_writes(monkeypatch)
    assert _run(tmp_path / "o", tmp_path / "c", "--plot") == 0
    assert order[-1] == "constraints.json" and {"profile.json", "profile.png"} <= set(order), order


@pytest.mark.parametrize("failing", ["profile.png", "profile.json", "constraints.json", "report.md"])
def test_disk_full_at_any_artifact_leaves_no_stale_or_truncated_constraints(tmp_path, monkeypatch, capsys, failing):
    out = tmp_path / "o"
    assert _run(out, tmp_path / "c", "--plot") == 0  # a complete earlier result
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _recording_writes(monkeypatch, fail_on=failing)
    code = _run(out, tmp_path / "c", "--plot")
    err = capsys.readouterr().err
    assert code == 2 and "disk is full" in err and failing in err and "Traceback" not in err
    assert not (out / "constraints.json").exists()  # the stale one went first: no "complete" marker
    assert not list(out.glob(".*.tmp"))
    if failing != "constraints.json":
        assert (out / failing).read_bytes() == before[failing]  # the old file, not half of a new one


def test_json_and_junit_on_a_full_disk_leave_the_old_files(tmp_path, monkeypatch, capsys):
    for name in ("s.json", "j.xml"):
        (tmp_path / name).write_text("old")
    _recording_writes(monkeypatch, fail_on="s.json")
    assert _run(tmp_path / "o", tmp_path / "c", "--json", tmp_path / "s.json") == 2
    assert (tmp_path / "s.json").read_text() == "old"
    _recording_writes(monkeypatch, fail_on="j.xml")
    assert _run(tmp_path / "o", tmp_path / "c", "--junit", tmp_path / "j.xml") == 2
    assert (tmp_path / "j.xml").read_text() == "old"
    assert not list(tmp_path.glob(".*.tmp"))


# ---- 2. unambiguous keys ------------------------------------------------------------------------------------------
def test_input_digests_are_framed():
    from bisector.model.inputs import feeds_digest

    # Before: name + dtype + shape + bytes, concatenated: these two different feeds had one digest.
    one = {"a": np.array([1, 2], np.uint8), "b": np.array([3], np.uint8)}
    two = {"auint8(2,)\x01\x02b": np.array([3], np.uint8)}
    assert feeds_digest(one) != feeds_digest(two)


def test_golden_digest_sees_shape_and_dtype():
    from bisector.app.job import golden_digest
    from bisector.model.golden import Golden

    a = np.arange(4, dtype=np.float32)
    digests = {golden_digest(Golden([{"y": v}], "file", 0, 0.0)) for v in (a, a.reshape(2, 2), a.view(np.int32))}
    assert len(digests) == 3  # before: name + bytes only, all three the same key of the journal


def test_plans_whose_names_contain_separators_are_distinct_journal_rows(tmp_path):
    from bisector.fp16.plan import Plan
    from bisector.search.journal import SqliteJournal
    from bisector.search.judge import Verdict

    cands = ("a,b", "a", "b", 'c"]')
    j = SqliteJournal(tmp_path / "j.sqlite", {"k": 1})
    for fp32, passed in ((frozenset({"a,b"}), True), (frozenset({"a", "b"}), False), (frozenset({'c"]'}), True)):
        j.record(Plan(fp32, cands), Verdict(fp32, passed, {}, 0))
    assert j.count() == 3
    assert j.lookup(Plan(frozenset({"a", "b"}), cands)).passed is False
    assert j.lookup(Plan(frozenset({"a,b"}), cands)).passed is True


# ---- 6. the journal -----------------------------------------------------------------------------------------------
def _journal(cache):
    return cache / "journal.sqlite"


def test_damaged_journal_with_no_resume_is_set_aside(tmp_path, capsys):
    cache = tmp_path / "c"
    assert _run(tmp_path / "a", cache) == 0
    db = sqlite3.connect(str(_journal(cache)))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with open(_journal(cache), "r+b") as f:
        f.seek(4096)
        f.write(b"\x00\xff" * 2048)
    assert _run(tmp_path / "b", cache) == 2
    assert "--no-resume" in capsys.readouterr().err
    assert _run(tmp_path / "b", cache, "--no-resume") == 0
    assert list(cache.glob("journal.sqlite.corrupt-*"))
    assert _run(tmp_path / "d", cache) == 0  # the new journal is healthy


def test_tampered_journal_rows_are_not_trusted(tmp_path, capsys):
    cache = tmp_path / "c"
    assert _run(tmp_path / "a", cache) == 0
    first = json.loads((tmp_path / "a" / "constraints.json").read_text())
    db = sqlite3.connect(str(_journal(cache)))
    # flip every failing verdict to passing, as a bit flip or a hand edit would: the checksums no longer match
    db.execute("""UPDATE evaluations SET verdict = replace(verdict, '"passed": false', '"passed": true'),
                  passed = 1""")
    db.commit()
    db.close()
    assert _run(tmp_path / "b", cache) == 0
    second = json.loads((tmp_path / "b" / "constraints.json").read_text())
    assert second["fp32_nodes"] == first["fp32_nodes"]  # the forged passes were not believed
    assert second["evaluations"]["new"] > 0
    assert "not trusted" in capsys.readouterr().err


def test_the_final_set_is_judged_again_when_its_verdict_came_from_the_journal(tmp_path, monkeypatch):
    from bisector.search.oracle import Oracle

    cache = tmp_path / "c"
    assert _run(tmp_path / "a", cache) == 0
    judged = []
    real = Oracle._judge
    monkeypatch.setattr(Oracle, "_judge", lambda self, plan, **kw: judged.append(plan) or real(self, plan, **kw))
    assert _run(tmp_path / "b", cache) == 0
    c = json.loads((tmp_path / "b" / "constraints.json").read_text())
    assert c["evaluations"]["new"] == 0 and c["evaluations"]["cached"] == c["evaluations"]["total"]
    assert [sorted(p.fp32) for p in judged] == [c["fp32_nodes"]]  # exactly the final set, judged in this run


# ---- 4. --time-limit ----------------------------------------------------------------------------------------------
def test_tiny_time_limit_still_writes_the_best_set_and_skips_the_plot(tmp_path, capsys):
    out = tmp_path / "o"
    code = _run(out, tmp_path / "c", "--time-limit", "0.001", "--plot")
    err = capsys.readouterr().err
    assert code == 0, err  # before: exit 1 "the budget ran out before any evaluation", no artifacts
    c = json.loads((out / "constraints.json").read_text())
    assert c["passed"] and not c["minimal"] and "time-limit" in c["stop_reason"]
    assert (out / "model.mixed.onnx").exists() and (out / "report.md").exists()
    assert not (out / "profile.png").exists() and "--time-limit spent" in err
    # the set's own search verdict is reported (lean: no medians), and the report says so instead of printing nan
    report = (out / "report.md").read_text()
    lean = any(o.get("lean") for o in c["outputs"].values())
    assert lean == ("were not computed" in report) and "| nan |" not in report


# ---- 5. hostile names ---------------------------------------------------------------------------------------------
HOSTILE = ["mm\x1b[31m", "add[/]", "<script>alert(1)</script>", "a|b`c`\x07", "m$\\frac{$"]  # $: mathtext


def test_hostile_names_are_escaped_in_every_sink(tmp_path, capsys):
    model = _chain(tmp_path / "hostile.onnx", names=HOSTILE, tensors=["t\x00a", "t|b", "t<c>", "t$d"])
    out = tmp_path / "o"
    code = main_cli("precision", model, "--fp16", "--atol", "1e-7", "--rtol", "1e-7", "-o", out, "--cache-dir",
                    tmp_path / "c", "--junit", out / "j.xml", "--plot", "--no-progress")
    cap = capsys.readouterr()
    assert code == 0, cap.err
    c = json.loads((out / "constraints.json").read_text())
    assert sorted(c["fp32_nodes"]) == sorted(HOSTILE)  # JSON keeps them exactly
    # terminal: no control characters but newlines
    for text in (cap.out, cap.err):
        assert not re.search("[\x00-\x09\x0b-\x1f\x7f]", text), repr(text[:300])
    assert "\\x07" in cap.out
    # report.md: no live HTML, no control characters, every table row keeps its column count
    report = (out / "report.md").read_text()
    outside_code = re.sub(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", "", report)  # code spans show HTML as text
    assert "<script" not in outside_code and "<" not in outside_code.replace("&lt;", ""), outside_code
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f]", report)
    rows = [ln for ln in report.splitlines() if ln.startswith("| ") and "`" in ln and "|---" not in ln]
    for row in rows:
        cells = re.split(r"(?<!\\)\|", row)
        assert len(cells) in (4, 9), row  # 2 columns (nodes, pinned) or 7 (comparison)
    for name in HOSTILE:
        assert name.split("\x1b")[0].split("\x07")[0].replace("|", "\\|") in report
    # JUnit: well-formed XML 1.0 with the names visible
    doc = xml.dom.minidom.parse(str(out / "j.xml"))
    assert doc.documentElement.tagName == "testsuites"
    # the plot and profile.json exist (matplotlib got the names as data too)
    assert (out / "profile.png").stat().st_size > 0


def test_xml_text_strips_what_xml_cannot_carry():
    from bisector.artifacts.junit import Case, Suite

    s = Suite(cases=[Case("m\x00\x1b", "out\x07<&>", False, "bad \x01 \ud800 value")])
    doc = xml.dom.minidom.parseString(s.to_xml())
    case = doc.getElementsByTagName("testcase")[0]
    assert case.getAttribute("name") == "out\\x07<&>" and case.getAttribute("classname") == "m\\x00\\x1b"


@dataclass
class _Verdict:
    fp32: frozenset
    passed: bool
    seconds: dict = field(default_factory=lambda: {"run": 0.01})
    source: str = "new"


def test_live_progress_shows_markup_names_as_text():
    stream = io.StringIO()
    p = SearchProgressLive(stream)
    p.begin(4)
    p({"phase": "[bold]split[/]"})
    p.on_verdict(_Verdict(frozenset({"add[/]", "[red]x", "mm\x1b[31m"}), True))  # raised MarkupError before
    p.end()
    text = stream.getvalue()
    assert "add[/]" in text and "[red]x" in text and "\x1b[31m" not in text.replace("\x1b[31m", "", 0)


def SearchProgressLive(stream):
    from bisector.cli.progress import SearchProgress

    return SearchProgress(stream=stream, live=True)


# ---- 3. Ctrl-C ----------------------------------------------------------------------------------------------------
def test_ctrl_c_is_exit_130_with_how_to_resume(tmp_path, monkeypatch, capsys):
    import time

    import bisector.app.precision as precision_api

    def interrupted_search(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("SIGINT did not arrive")

    monkeypatch.setattr(precision_api, "run_search", interrupted_search)
    # what was there before (a shell's background job inherits SIGINT ignored, not Python's default handler)
    before = signal.getsignal(signal.SIGINT)
    code = _run(tmp_path / "o", tmp_path / "c")
    err = capsys.readouterr().err
    assert code == 130, err  # before: click's "Aborted!", exit 1
    assert "interrupted" in err and "same command" in err and "journal" in err
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_a_read_only_or_full_journal_is_not_called_damaged(tmp_path):
    from bisector.errors import UsageError
    from bisector.fp16.plan import Plan
    from bisector.search.journal import JournalCorrupt, SqliteJournal
    from bisector.search.judge import Verdict

    j = SqliteJournal(tmp_path / "j.sqlite", {"k": 1})

    class Failing:
        def __init__(self, exc):
            self.exc = exc

        def execute(self, *a):
            raise self.exc

        def close(self):
            pass

    plan = Plan(frozenset({"a"}), ("a", "b"))
    for exc, fragment, corrupt in ((sqlite3.OperationalError("attempt to write a readonly database"), "readonly", False),
                                   (sqlite3.OperationalError("database or disk is full"), "disk is full", False),
                                   (sqlite3.DatabaseError("database disk image is malformed"), "damaged", True)):
        j.db = Failing(exc)
        with pytest.raises(UsageError) as info:
            j.record(plan, Verdict(plan.fp32, True, {}, 0))
        assert fragment in str(info.value) and isinstance(info.value, JournalCorrupt) is corrupt


def test_large_files_go_to_disk_while_written_and_come_out_whole(tmp_path, monkeypatch):
    """`write_file_atomic` pushes a large file's pages to the disk while the rest is written (fdatasync on a
    thread every FLUSH_BEHIND_BYTES), so the final fsync waits for the tail only; the file is byte for byte what
    was written, and a write that fails part way still leaves nothing behind."""
    from bisector import files

    monkeypatch.setattr(files, "FLUSH_BEHIND_BYTES", 1000)
    synced_while_filling: list[int] = []
    real = os.fdatasync
    filling = {"on": False}

    def fdatasync(fd):
        if filling["on"]:
            synced_while_filling.append(os.fstat(fd).st_size)
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    chunks = [bytes([i]) * 700 for i in range(20)] + [memoryview(np.arange(900, dtype=np.float32).view(np.uint8))]

    def fill(f):
        filling["on"] = True
        for c in chunks:
            f.write(c)
        import time

        deadline = time.monotonic() + 10  # the flusher thread gets its turn before the fill returns
        while not synced_while_filling and time.monotonic() < deadline:
            time.sleep(0.01)
        filling["on"] = False

    target = tmp_path / "big.bin"
    files.write_file_atomic(target, fill)
    assert target.read_bytes() == b"".join(bytes(c) for c in chunks)
    assert synced_while_filling and min(synced_while_filling) >= 1000  # flushed while it was written

    def failing(f):
        f.write(b"x" * 5000)
        raise OSError(errno.ENOSPC, "full")

    with pytest.raises(Exception, match="disk is full"):
        files.write_file_atomic(tmp_path / "other.bin", failing)
    assert not (tmp_path / "other.bin").exists() and not list(tmp_path.glob(".*.tmp"))


def test_a_journal_opened_by_several_processes_at_once_is_waited_for(tmp_path, monkeypatch):
    """Processes opening a new journal together race to switch it to WAL and SQLite answers "database is locked"
    at once (no busy wait): the open is tried again until OPEN_TIMEOUT, and only a lock that outlasts it is the
    usual UsageError. Six real processes opening one new journal together all get it."""
    import subprocess
    import sys
    import time

    from bisector.errors import UsageError
    from bisector.search import journal

    real = journal.SqliteJournal._open_once
    fails = {"left": 3}

    def locked_at_first(self):
        if fails["left"]:
            fails["left"] -= 1
            raise journal._Busy()
        return real(self)

    monkeypatch.setattr(journal.SqliteJournal, "_open_once", locked_at_first)
    j = journal.SqliteJournal(tmp_path / "a" / "journal.sqlite", {"k": 1}, resume=True)
    assert fails["left"] == 0 and j.count() == 0
    j.close()

    monkeypatch.setattr(journal, "OPEN_TIMEOUT", 0.2)
    monkeypatch.setattr(journal.SqliteJournal, "_open_once", lambda self: (_ for _ in ()).throw(journal._Busy()))
    with pytest.raises(UsageError, match="database is locked"):
        journal.SqliteJournal(tmp_path / "b" / "journal.sqlite", {"k": 1}, resume=True)
    monkeypatch.undo()

    start = time.time() + 2.0
    code = ("import sys, time\nfrom pathlib import Path\nfrom bisector.search.journal import SqliteJournal\n"
            "while time.time() < float(sys.argv[2]): pass\n"
            "SqliteJournal(Path(sys.argv[1]), {'k': int(sys.argv[3]) % 2}, resume=True).close()\n")
    for trial in range(3):
        path = tmp_path / f"race{trial}" / "journal.sqlite"
        path.parent.mkdir()
        procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(start + 2.0 * trial), str(i)],
                                  stderr=subprocess.PIPE, text=True) for i in range(6)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err


@pytest.mark.parametrize("stage", ["fill", "fsync"])
def test_files_committed_together_are_renamed_only_once_all_are_on_the_disk(tmp_path, monkeypatch, stage):
    """`files.write_files_atomic` (the artifacts after the search): a full disk while one file is written or
    synced leaves every target as it was (none renamed, no temporary file), and the error names that file."""
    import os

    from bisector import files
    from bisector.errors import UsageError

    names = ["a.data", "a.onnx", "b.py", "c.md"]
    for n in names:
        (tmp_path / n).write_text("old " + n)
    if stage == "fill":
        _recording_writes(monkeypatch, fail_on="b.py")
    else:
        real_fsync, tmp_b = os.fsync, []

        def fsync(fd):
            if os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].startswith(".b.py."):
                tmp_b.append(fd)
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
    items = [(tmp_path / n, (lambda data: lambda f: f.write(data))(f"new {n}".encode()), None) for n in names]
    with pytest.raises(UsageError, match=r"b\.py.*disk is full"):
        files.write_files_atomic(items)
    assert {n: (tmp_path / n).read_text() for n in names} == {n: "old " + n for n in names}
    assert not list(tmp_path.glob(".*.tmp"))
    if stage == "fsync":
        assert tmp_b
    monkeypatch.undo()
    files.write_files_atomic(items)  # and without the failure: every file new, in one commit
    assert {n: (tmp_path / n).read_text() for n in names} == {n: "new " + n for n in names}


def test_an_output_name_with_a_newline_stays_on_one_line(tmp_path, capsys):
    """A graph output named "y\\nFAKE" printed raw by `verify` ("pass y", then a line "FAKE: ...") and `run` could
    forge a line of the report; each line names it escaped."""
    from onnx import TensorProto, helper

    from .test_bad_input import _model

    name = "y\nFAKE"
    model = _model(tmp_path / "nl.onnx", [helper.make_node("Relu", ["x"], [name], name="relu")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])])
    out = tmp_path / "o"
    assert main_cli("precision", model, "--fp16", "--atol", "1e-1", "-o", out, "--cache-dir", tmp_path / "c",
                    "--no-progress") == 0
    capsys.readouterr()
    assert main_cli("verify", model, "--constraints", out / "constraints.json", "--cache-dir", tmp_path / "c") == 0
    assert main_cli("run", model, "--onnxrt", "--trt", "--fp16", "--atol", "1e-1", "--cache-dir", tmp_path / "c") == 0
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert "y\\nFAKE" in text and not re.search(r"(?m)^FAKE", text), text
