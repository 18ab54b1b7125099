"""Weights as a file's pages (bisector.model.pages): same values, pages given back after use, nothing left on
disk, and everything in memory as before where the file cannot be written."""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.backends.emulate import EmulateBackend
from bisector.fp16.plan import Plan
from bisector.model import pages
from bisector.model.catalog import Catalog


@pytest.fixture(autouse=True)
def disk_dir(tmp_path, monkeypatch):
    """A disk-backed temporary directory for the page file (nothing is paged into a tmpfs, which some machines'
    /tmp is): pytest's own where it is on a disk, else one beside the tests."""
    where = tmp_path
    made = None
    if pages.in_ram(str(tmp_path)):
        made = where = Path(tempfile.mkdtemp(prefix=".pages-", dir=Path(__file__).resolve().parent))
        if pages.in_ram(str(where)):
            shutil.rmtree(made)
            pytest.skip("no disk-backed directory for a page file here")
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    yield where
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_put_keeps_values_dtype_and_shape_read_only():
    file = pages.PageFile()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((7, 13)).astype(np.float32), np.arange(5000, dtype=np.int64),
              rng.standard_normal(3).astype(np.float16), np.asfortranarray(rng.standard_normal((40, 30))),
              rng.standard_normal((300, 1000)).astype(np.float32)]
    paged = [file.put(a) for a in arrays]
    for a, p in zip(arrays, paged):
        assert p is not None and pages.file_backed(p)
        assert p.dtype == a.dtype and p.shape == a.shape
        np.testing.assert_array_equal(p, a)
        assert not p.flags.writeable
        assert p.ctypes.data % 4096 == 0  # page-aligned: releasing one drops no page of another
    for p in paged:
        pages.release(p)
    for a, p in zip(arrays, paged):  # read back from the file after the release
        np.testing.assert_array_equal(p, a)
    assert not pages.file_backed(arrays[0]) and not pages.file_backed(np.asarray(arrays[0]).view())


def test_arrays_larger_than_a_segment_and_many_segments(monkeypatch):
    monkeypatch.setattr(pages, "SEGMENT_BYTES", 1 << 16)
    file = pages.PageFile()
    big = np.arange(100_000, dtype=np.float32)  # 400 KB: a segment of its own
    small = [np.full(3000, i, np.float32) for i in range(20)]
    out = [file.put(a) for a in [*small[:10], big, *small[10:]]]
    np.testing.assert_array_equal(out[10], big)
    for i, p in enumerate(out[:10] + out[11:]):
        assert (p == i).all()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_release_gives_the_pages_back_and_a_read_brings_them_in():
    file = pages.PageFile()
    a = file.put(np.ones(64 << 18, np.float32))  # 64 MiB
    assert float(a.sum()) == a.size  # every page read: resident
    before = _rss_bytes()
    pages.release(a)
    after = _rss_bytes()
    assert before - after > 48 << 20, (before, after)
    assert float(a[::1024].sum()) == a.size // 1024  # faulted back in, same values


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_release_gives_back_an_external_data_map(tmp_path):
    path = tmp_path / "w.bin"
    np.ones(16 << 18, np.float32).tofile(path)
    m = np.memmap(path, dtype=np.float32, mode="r", offset=4096, shape=(15 << 18,))
    assert float(m.sum()) == m.size
    before = _rss_bytes()
    pages.release(m)
    assert before - _rss_bytes() > 10 << 20


def test_the_file_is_gone_from_the_directory_at_once(disk_dir):
    before = set(disk_dir.iterdir())
    file = pages.PageFile()
    assert file.put(np.ones(10_000, np.float32)) is not None
    assert set(disk_dir.iterdir()) == before  # unlinked: a killed search leaves nothing behind


def test_a_full_disk_keeps_arrays_in_memory(monkeypatch):
    file = pages.PageFile()
    assert file.put(np.ones(5000, np.float32)) is not None

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", full)
        assert file.put(np.ones(5000, np.float32)) is None
    assert file.put(np.ones(5000, np.float32)) is None  # a full disk stays full: no retry per array


def test_the_switch_keeps_everything_in_memory(monkeypatch):
    monkeypatch.setenv(pages.ENV, "0")
    assert pages.PageFile().put(np.ones(5000, np.float32)) is None


def _conv_gemm_model(tmp_path):
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((64, 3, 3, 3)).astype(np.float32) * 0.3, "w conv/é")
    g = numpy_helper.from_array(rng.standard_normal((64 * 8 * 8, 40)).astype(np.float32) * 0.05, "g")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w conv/é"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "g"], ["m"], name="fc"),
             helper.make_node("Tanh", ["m"], ["y"], name="tanh")]
    graph = helper.make_graph(nodes, "cg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40])], [w, g, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "cg.onnx"
    onnx.save(model, path)
    return path, model


def _all_plans(cat):
    names = cat.candidates  # a plan names its FP32 nodes: none, every one, the first, all but the first
    return [Plan(frozenset(s), names) for s in ((), names, names[:1], names[1:])]


def test_a_loaded_model_keeps_its_weights_in_pages_with_the_same_results(tmp_path, monkeypatch):
    path, model = _conv_gemm_model(tmp_path)
    x = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)}
    results = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(pages.ENV, switch)
        cat = Catalog.load(path)
        for init in model.graph.initializer:
            np.testing.assert_array_equal(cat.value(init.name), numpy_helper.to_array(init))
        large = [cat.weight_arrays[n] for n in ("w conv/é", "g")]
        assert all(pages.file_backed(v) for v in large) == (switch == "1")
        be = EmulateBackend(block_size=2)
        be.open(cat)
        results[switch] = [be.run(p, x) for p in _all_plans(cat)]
        rounded = be.rounded_weights()
        assert set(rounded) >= {"w conv/é", "g"}  # the mixed model's writer reuses them
        assert all(pages.file_backed(rounded[n]) for n in ("w conv/é", "g")) == (switch == "1")
        be.close()
    for a, b in zip(results["1"], results["0"]):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_the_emulator_gives_back_what_each_build_and_run_read(tmp_path, monkeypatch):
    """The constant ones (Conv's, which ORT copied) after every build; the fed weights (MatMul's, FP32 and FP16
    copies) after every run once the process has grown past its threshold, and not before."""
    path, _ = _conv_gemm_model(tmp_path)
    x = {"x": np.zeros((1, 3, 8, 8), np.float32)}
    released = []
    real = pages.release
    monkeypatch.setattr(pages, "release", lambda a: (released.append(a), real(a)))
    for grown in (True, False):
        released.clear()
        cat = Catalog.load(path)
        be = EmulateBackend(block_size=2)
        be.open(cat)
        ex = be.executor
        ex._release_above = 0 if grown else 1 << 62
        for plan in _all_plans(cat):
            be.run(plan, x)
        ids = {id(a) for a in released}
        assert id(cat.weight_arrays["w conv/é"]) in ids and id(ex._paged["w conv/é"]) in ids
        # FP32 "g" is released once for its FP16 copy's conversion whatever the threshold: count runs' releases
        fed_releases = sum(1 for a in released if a is ex._paged[("half", "g")])
        assert (fed_releases > 0) == grown
        be.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_switch_keeps_mapped_pages_too(monkeypatch):
    file = pages.PageFile()
    a = file.put(np.ones(16 << 18, np.float32))
    monkeypatch.setenv(pages.ENV, "0")
    assert float(a.sum()) == a.size
    before = _rss_bytes()
    pages.release(a)
    assert before - _rss_bytes() < 4 << 20


def test_converting_a_slice_at_a_time_gives_the_rule_bit_for_bit(monkeypatch):
    """The weight rule per slice equals it on the whole weight (it is elementwise), across slice edges and its
    slow path (values past FP16's range, NaN, inf) and the lift of tiny values."""
    from bisector.fp16 import rules

    monkeypatch.setattr(pages, "CONVERT_SLICE_BYTES", 4096)  # 1024 float32 values a slice
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((37, 101)) * 10.0 ** rng.integers(-9, 6, (37, 101))).astype(np.float32)
    w.flat[[5, 2000, 3735]] = [np.nan, np.inf, -1e9]
    w.flat[[7, 1500]] = [1e-30, -3e-8]
    file = pages.PageFile()
    for convert in (rules.weight_rule, rules.round_weight):
        whole = convert(w)
        paged = file.put_converted(w, convert)
        assert paged.shape == w.shape and paged.dtype == whole.dtype and pages.file_backed(paged)
        assert paged.tobytes() == whole.tobytes()
    fortran = np.asfortranarray(w)
    assert file.put_converted(fortran, rules.weight_rule).tobytes() == rules.weight_rule(w).tobytes()


def test_a_weight_rule_changed_in_its_home_is_applied_whole(monkeypatch, tmp_path):
    """A rule that is not elementwise (here: scaled by the weight's own maximum) must see the whole weight."""
    from bisector.fp16 import rules

    path, _ = _conv_gemm_model(tmp_path)
    cat = Catalog.load(path)
    monkeypatch.setattr(rules, "round_weight", lambda a: np.asarray(a, np.float32) / np.abs(a).max())
    monkeypatch.setattr(pages, "CONVERT_SLICE_BYTES", 4096)
    be = EmulateBackend(block_size=2)
    be.open(cat)
    got = be.executor.converted("g")
    assert pages.file_backed(got)
    np.testing.assert_array_equal(got, cat.value("g") / np.abs(cat.value("g")).max())
    be.close()


@pytest.mark.skipif(not pages.in_ram("/dev/shm"), reason="no tmpfs at /dev/shm here")
def test_nothing_is_paged_into_a_tmpfs(monkeypatch):
    """Pages in a tmpfs are RAM all the same (and a container's memory limit counts them): arrays stay arrays."""
    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm")
    file = pages.PageFile()
    assert file.put(np.ones(5000, np.float32)) is None
    assert file.put_converted(np.ones(5000, np.float32), lambda a: a.astype(np.float16)) is None


def test_a_disk_that_fills_during_the_search_keeps_results(tmp_path, monkeypatch):
    """The model's weights paged at load, then the disk full for the FP16 copies: they are ordinary arrays
    within the budget, as before, and every output is the same."""
    path, _ = _conv_gemm_model(tmp_path)
    x = {"x": np.random.default_rng(4).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)}
    outputs = []
    for full in (False, True):
        cat = Catalog.load(path)
        assert pages.file_backed(cat.weight_arrays["g"])
        be = EmulateBackend(block_size=2)
        be.open(cat)
        with monkeypatch.context() as m:
            if full:
                m.setattr(os, "pwrite", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
            outputs.append([be.run(p, x) for p in _all_plans(cat)])
        assert bool(be.executor._paged) != full
        assert not full or not any(pages.file_backed(v) for v in be.rounded_weights().values())
        be.close()
    for a, b in zip(*outputs):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_pages_go_back_while_a_call_reads_them_one_by_one():
    """`releasing`: a reader that touches 8 arrays of 16 MiB one after another, slowly, never holds them all."""
    import time

    file = pages.PageFile()
    arrays = [file.put(np.full(4 << 20, i, np.float32)) for i in range(8)]
    base = _rss_bytes()
    grown = []
    with pages.releasing(arrays, every=0.01):
        for i, a in enumerate(arrays):
            assert float(a[::1024].sum()) == i * a.size // 1024
            assert float(a.sum()) == i * a.size
            time.sleep(0.05)
            grown.append(_rss_bytes() - base)
    assert max(grown) < 40 << 20, grown  # all eight: 128 MiB
    assert _rss_bytes() - base < 8 << 20  # and nothing after


def test_writing_gives_back_each_source_once_written(monkeypatch):
    """`weights.in_turn` (the mixed model's writer): after the caller has a value, the pages it came from go
    back — the array itself, or an FP16 copy's source — and not before."""
    from bisector.fp16.mixed import FP16Copy
    from bisector.model import weights

    file = pages.PageFile()
    a, b = file.put(np.ones(5000, np.float32)), file.put(np.full(5000, 2, np.float32))
    released = []
    real = pages.release
    monkeypatch.setattr(pages, "release", lambda v: (released.append(id(v)), real(v)))
    seen = []
    for out in weights.in_turn([a, FP16Copy(b)]):
        seen.append((out.dtype, float(out.sum()), list(released)))
    assert seen[0][2] == [] and id(a) in seen[1][2] and id(b) not in seen[1][2]
    assert id(b) in released and seen[1][:2] == (np.float16, 10000.0)
