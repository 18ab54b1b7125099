"""The emulate backend against the independent test vectors, the canary, and executor cone reuse."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bisector.backends.emulate.backend import EmulateBackend
from bisector.backends.canary import run_canary
from bisector.model.catalog import Catalog
from bisector.errors import BackendFailure
from bisector.fp16.plan import Plan

from .conftest import PLANTED, SEED, TESTVECTORS

INDEX = json.loads((TESTVECTORS / "index.json").read_text())
CASES = [(case, i) for case, plans in INDEX.items() for i in range(len(plans))]


@pytest.mark.parametrize("case,i", CASES, ids=[f"{c}-{i}" for c, i in CASES])
def test_emulate_matches_test_vectors(case, i):
    plan_spec = INDEX[case][i]
    cat = Catalog.load(TESTVECTORS / case / "model.onnx")
    feeds = dict(np.load(TESTVECTORS / case / "inputs.npz"))
    expected = dict(np.load(TESTVECTORS / case / plan_spec["file"]))
    be = EmulateBackend()
    be.open(cat)
    out = be.run(Plan(frozenset(plan_spec["fp32_nodes"]), cat.candidates), feeds)
    for name, e in expected.items():
        o = out[name]
        np.testing.assert_array_equal(np.isnan(o), np.isnan(e))
        np.testing.assert_array_equal(np.isposinf(o), np.isposinf(e))
        np.testing.assert_array_equal(np.isneginf(o), np.isneginf(e))
        fin = np.isfinite(e)
        np.testing.assert_allclose(o[fin], e[fin], rtol=1e-6, atol=0)
        mn, mx, n_inf, n_nan = plan_spec["min_max_inf_nan"][name]
        assert int(np.isinf(o).sum()) == n_inf and int(np.isnan(o).sum()) == n_nan


def test_seed_numbers_match_tensorrt():
    """DESIGN §4: real TensorRT FP16 gives add_out all 65504, sub_out all 0, median abs error 1.5."""
    cat = Catalog.load(SEED)
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 2, size=(1, 1, 256, 256)).astype(np.float32)
    be = EmulateBackend()
    be.open(cat)
    out = be.run(Plan.all_fp16(cat.candidates), {"x": x}, ["add_out", "sub_out", "y"])
    assert np.all(out["add_out"] == 65504) and np.all(out["sub_out"] == 0)
    ref = be.reference({"x": x})
    assert np.median(np.abs(out["y"] - ref["y"])) == pytest.approx(1.5, abs=0.01)
    ok = be.run(Plan(frozenset({"Add", "Sub"}), cat.candidates), {"x": x})["y"]
    assert np.max(np.abs(ok - ref["y"])) < 1e-2


def test_only_the_forward_cone_is_recomputed():
    cat = Catalog.load(SEED)
    be = EmulateBackend()
    be.open(cat)
    x = {"x": np.ones((1, 1, 256, 256), np.float32)}
    be.reference(x)
    calls = []
    real = be.executor.run_node
    be.executor.run_node = lambda node, *a: calls.append(node.name) or real(node, *a)
    be.run_all(Plan(frozenset({"MatMul_0", "Add", "Sub"}), cat.candidates), x)  # only MatMul_1 FP16
    assert calls == ["MatMul_1"]
    calls.clear()
    be.run_all(Plan(frozenset(cat.candidates), cat.candidates), x)
    assert calls == []


def test_fused_blocks_agree_with_node_by_node_and_skip_untouched_blocks():
    cat = Catalog.load(PLANTED)
    be = EmulateBackend()
    be.open(cat)
    x = {"x": np.random.default_rng(0).uniform(0, 1, (1, 4, 16, 16)).astype(np.float32)}
    rng = np.random.default_rng(1)
    for _ in range(6):
        fp32 = frozenset(n for n in cat.candidates if rng.random() < 0.5)
        plan = Plan(fp32, cat.candidates)
        fused, single = be.run(plan, x)["y"], be.run_all(plan, x)["y"]
        np.testing.assert_array_equal(np.isnan(fused), np.isnan(single))
        np.testing.assert_allclose(fused, single, rtol=1e-5, atol=1e-5)
    ran = []
    real = be.executor._run_block
    be.executor._run_block = lambda block, *a, **kw: ran.append(block.index) or real(block, *a, **kw)
    last = cat.candidates[-1]
    be.run(Plan(frozenset(cat.candidates) - {last}, cat.candidates), x)
    assert ran == [be.executor.blocks[-1].index]  # only the block holding the one FP16 node


class _SilentFP32(EmulateBackend):
    """A stand-in for a backend that claims FP16 but computes FP32 (what ORT's CPU provider does)."""

    def run(self, plan, feeds, outputs=None):
        return super().run(Plan.all_fp32(plan.candidates), feeds, outputs)


def test_canary_refuses_a_backend_that_does_not_round():
    with pytest.raises(BackendFailure, match="canary"):
        run_canary(_SilentFP32)
    run_canary(EmulateBackend)  # the real one passes


def test_canary_failure_is_exit_3(monkeypatch, tmp_path):
    from bisector.app import job as session
    from bisector.cli.main import main

    monkeypatch.setattr(session, "backend_factory", lambda name, **kw: _SilentFP32)
    code = main(["precision", str(SEED), "--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]",
                 "-o", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")])
    assert code == 3
    assert not (tmp_path / "o" / "constraints.json").exists()


def test_one_off_plans_run_the_same_and_leave_no_block_variants_behind():
    """The predicted ranking's single-node plans: inside `one_off_plans` their block variants are used and
    freed (all-FP32 ones kept), the outputs are the same, and the executor keeps variants again after."""
    from bisector.model.inputs import generate_inputs

    cat = Catalog.load(PLANTED)
    be = EmulateBackend()
    be.open(cat)
    feeds = generate_inputs(cat, {"x": (0.0, 1.0)}, {})[0]
    everything = frozenset(cat.candidates)
    be.run(Plan(everything, cat.candidates), feeds)  # the reference and the all-FP32 variants
    kept = set(be.executor._sessions)
    single = [Plan(everything - {n}, cat.candidates) for n in cat.candidates[:12]]
    with be.one_off_plans():
        inside = [be.run(p, feeds) for p in single]
        assert set(be.executor._sessions) == kept
    assert be.executor.keep_variants
    outside = [be.run(p, feeds) for p in single]
    assert len(be.executor._sessions) > len(kept)
    for a, b in zip(inside, outside):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
