"""The mixed model's large weights written while the search runs (bisector.artifacts.prewrite): the final files
hold exactly what a write after the search holds, a prewritten file the final model reads too little of is
dropped, and nothing is left behind by a failure or a discard."""

from __future__ import annotations

import onnx
import pytest
from onnx import numpy_helper

from bisector.artifacts import data_file, prewrite, write
from bisector.files import write_file_atomic
from bisector.fp16.plan import Plan
from bisector.model import weights as weight_store
from bisector.model.catalog import Catalog

from .conftest import FIXTURES, main_cli

CNN = FIXTURES / "exported" / "cnn.onnx"


@pytest.fixture
def small_external(monkeypatch):
    """The CNN's weights count as large: detached, and its mixed model goes to .onnx + .onnx.data."""
    monkeypatch.setattr(weight_store, "DETACH_MIN_BYTES", 64)
    monkeypatch.setattr(data_file, "EXTERNAL_DATA_FROM_BYTES", 0)


def _write(cat, plan, path, prewritten=None):
    files = write.mixed_model_files(cat, plan, path, prewritten=prewritten)
    reused = getattr(files[0][1], "into", None) is not None
    for p, fill in files:
        write_file_atomic(p, fill, into=getattr(fill, "into", None))
    return reused


def _content(path):
    m = onnx.load(str(path))
    return ([n.SerializeToString() for n in m.graph.node],
            {i.name: numpy_helper.to_array(i).tobytes() for i in m.graph.initializer})


def _temporaries(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("fp32_share", [0, 0.1])
def test_the_prewritten_mixed_model_holds_what_a_write_after_the_search_holds(tmp_path, small_external, fp32_share):
    cat = Catalog.load(CNN)
    fp32 = frozenset(cat.candidates[: int(len(cat.candidates) * fp32_share)])
    plan = Plan(fp32, cat.candidates)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert not _write(cat, plan, tmp_path / "a" / "m.onnx")
    pre = prewrite.WeightPrewrite.start(cat, tmp_path / "b" / "m.onnx")
    assert pre is not None
    assert _write(cat, plan, tmp_path / "b" / "m.onnx", pre) == (fp32_share == 0 or _unused_share(cat, plan) <= 0.2)
    onnx.checker.check_model(str(tmp_path / "b" / "m.onnx"))
    assert _content(tmp_path / "a" / "m.onnx") == _content(tmp_path / "b" / "m.onnx")
    assert not _temporaries(tmp_path / "b")
    pre.discard()  # after the commit: nothing to do, and the files stay
    assert (tmp_path / "b" / "m.onnx.data").exists()


def _unused_share(cat, plan) -> float:
    from bisector.fp16.mixed import build_mixed_detached

    _, everything = build_mixed_detached(cat, frozenset())
    _, final = build_mixed_detached(cat, plan)
    keys = {data_file.value_key(n, v) for n, v in final.items()}
    total = sum(v.nbytes for v in everything.values())
    return sum(v.nbytes for n, v in everything.items() if data_file.value_key(n, v) not in keys) / total


def test_a_prewritten_file_the_final_model_reads_little_of_is_dropped(tmp_path, small_external):
    """All FP32: none of the FP16 copies is read; the data file is written compactly, the prewritten one goes."""
    cat = Catalog.load(CNN)
    plan = Plan.all_fp32(cat.candidates)
    pre = prewrite.WeightPrewrite.start(cat, tmp_path / "m.onnx")
    assert not _write(cat, plan, tmp_path / "m.onnx", pre)
    plain = tmp_path / "plain"
    plain.mkdir()
    _write(cat, plan, plain / "m.onnx")
    assert (tmp_path / "m.onnx.data").stat().st_size == (plain / "m.onnx.data").stat().st_size
    assert _content(tmp_path / "m.onnx") == _content(plain / "m.onnx")
    assert not _temporaries(tmp_path)


def test_a_failing_prewrite_falls_back_to_writing_after_the_search(tmp_path, small_external, monkeypatch):
    cat = Catalog.load(CNN)
    plan = Plan(frozenset(), cat.candidates)

    real = prewrite.WeightPrewrite._put
    calls = []

    def put(self, f, name, raw):  # the disk fills up at the third weight, whichever thread writes it
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(self, f, name, raw)

    monkeypatch.setattr(prewrite.WeightPrewrite, "_put", put)
    pre = prewrite.WeightPrewrite.start(cat, tmp_path / "m.onnx")
    assert not _write(cat, plan, tmp_path / "m.onnx", pre)
    assert len(calls) == 3
    onnx.checker.check_model(str(tmp_path / "m.onnx"))
    assert not _temporaries(tmp_path)


def test_a_discarded_prewrite_leaves_nothing(tmp_path, small_external):
    cat = Catalog.load(CNN)
    pre = prewrite.WeightPrewrite.start(cat, tmp_path / "m.onnx")
    pre.discard()
    pre.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_small_mixed_model_is_not_prewritten(tmp_path, monkeypatch):
    """Below EXTERNAL_DATA_FROM_BYTES the mixed model is one file: nothing to write ahead, and the mixed model is
    not even built to find that out (a 5000-node chain's took 0.44 s)."""
    from bisector.fp16 import mixed

    calls = []
    real = mixed.build_mixed_detached
    monkeypatch.setattr(mixed, "build_mixed_detached", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert prewrite.WeightPrewrite.start(Catalog.load(CNN), tmp_path / "m.onnx") is None
    assert list(tmp_path.iterdir()) == [] and not calls


def test_precision_writes_the_same_mixed_model_as_convert_with_the_prewrite(tmp_path, small_external):
    out = tmp_path / "out"
    assert main_cli("precision", CNN, "--fp16", "--atol", "1e-3", "-o", out, "--cache-dir", tmp_path / "c") == 0
    import json

    fp32 = json.loads((out / "constraints.json").read_text())["fp32_nodes"]
    assert (out / "model.mixed.onnx.data").stat().st_size > 0
    conv = tmp_path / "conv.onnx"
    assert main_cli("convert", CNN, "--fp16", *(a for n in fp32 for a in ("--fp32", n)), "-o", conv) == 0
    assert _content(out / "model.mixed.onnx") == _content(conv)
    assert not _temporaries(out)


def test_no_mixed_drops_nothing_into_the_output_directory(tmp_path, small_external):
    out = tmp_path / "out"
    assert main_cli("precision", CNN, "--fp16", "--atol", "1e-3", "-o", out, "--cache-dir", tmp_path / "c",
                    "--no-mixed") == 0
    assert not (out / "model.mixed.onnx.data").exists() and not _temporaries(out)


def test_bisector_prewrite_0_writes_after_the_search(tmp_path, small_external, monkeypatch):
    monkeypatch.setenv("BISECTOR_PREWRITE", "0")
    assert prewrite.WeightPrewrite.start(Catalog.load(CNN), tmp_path / "m.onnx") is None
    monkeypatch.setenv("BISECTOR_PREWRITE", "1")
    pre = prewrite.WeightPrewrite.start(Catalog.load(CNN), tmp_path / "m.onnx")
    assert pre is not None
    pre.discard()


def test_the_caller_finishes_what_the_thread_left(tmp_path, small_external, monkeypatch):
    """`take` while the thread is still at its first weight: the caller's thread writes the rest, and the
    mixed model is the one written after the search."""
    import threading

    cat = Catalog.load(CNN)
    plan = Plan(frozenset(), cat.candidates)
    gate, threads = threading.Event(), []
    real = prewrite.WeightPrewrite._put

    def put(self, f, name, raw):
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            gate.wait(5)  # the thread holds its first weight until `take` has asked for the hand-over
        real(self, f, name, raw)

    monkeypatch.setattr(prewrite.WeightPrewrite, "_put", put)
    pre = prewrite.WeightPrewrite.start(cat, tmp_path / "b.onnx")
    threading.Timer(0.2, gate.set).start()
    assert _write(cat, plan, tmp_path / "b.onnx", pre)
    assert threads[0] == "bisector-prewrite" and set(threads[1:]) == {threading.current_thread().name}
    (tmp_path / "a").mkdir()
    _write(cat, plan, tmp_path / "a" / "b.onnx")
    assert _content(tmp_path / "a" / "b.onnx") == _content(tmp_path / "b.onnx")


def test_the_prewrite_runs_at_the_processs_own_priority(tmp_path, small_external):
    """Not lowered: the search's shared ONNX Runtime pool spins between parallel sections, and a thread at nice 19
    beside it got almost no CPU, so the write waited for the search's end (a 1.27 GB model: 51-63% of a
    3-evaluation search after it, against 5-7% at normal priority; docs/benchmarks.md, "Scale, nineteenth round")."""
    import os
    import sys
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread priorities are Linux's")
    seen = {}
    real = prewrite.WeightPrewrite._put

    def put(self, f, name, raw):
        seen.setdefault("nice", os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return real(self, f, name, raw)

    import unittest.mock

    with unittest.mock.patch.object(prewrite.WeightPrewrite, "_put", put):
        pre = prewrite.WeightPrewrite.start(Catalog.load(CNN), tmp_path / "m.onnx")
        pre._thread.join()
    pre.discard()
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0)

