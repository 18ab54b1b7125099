"""Issue 15, seventh round: the `predicted_ranking` hint (bisector/search/vector_ranking.py) and auto's use of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from strategy_oracles import additive, additive_case, is_one_minimal, monotone, names, random_culprits  # noqa: E402
from movement_models import movement_chain_model  # noqa: E402

from bisector.search.vector_ranking import _greedy, predicted_ranking  # noqa: E402
from bisector.strategies import CountingOracle  # noqa: E402
from bisector.strategies.auto import Auto  # noqa: E402
from bisector.strategies.gt import GroupTesting  # noqa: E402


class _Recorder(CountingOracle):
    def __init__(self, f):
        super().__init__(f)
        self.asked: list[frozenset[str]] = []

    def __call__(self, s):
        self.asked.append(frozenset(s))
        return super().__call__(s)


def _excess_hint(f, oracle):
    """The driver's `excess`: only for sets already asked."""
    return lambda s: f.excess(s) if frozenset(s) in oracle.asked else None


def _heaviest_first(w):
    return lambda first=(), excess=None: list(first) + sorted((x for x in w if x not in set(first)),
                                                              key=lambda x: -w[x])


def test_auto_ranks_by_the_predicted_ranking_in_the_diffuse_search():
    """With a ranking that knows the weights (a perfect prediction) the diffuse search finds the optimum for fewer
    evaluations than with its own probes; the hint is called once, from all-FP16, with that plan's excess."""
    for seed in range(3):
        cands, w, t = additive_case(200, 1.0, 0.25, seed)
        f = additive(w, t)
        calls: list[tuple] = []
        perfect = _heaviest_first(w)

        def hint(first=(), excess=None):
            calls.append((tuple(first), excess() if callable(excess) else excess))
            return perfect(first, excess)

        a = _Recorder(f)
        got = Auto().search(cands, a, predicted_ranking=hint, excess=_excess_hint(f, a))
        b = _Recorder(f)
        probed = Auto().search(cands, b, excess=_excess_hint(f, b))
        assert f(got) and is_one_minimal(f, got)
        assert len(calls) == 1 and calls[0][0] == () and calls[0][1] == f.excess(frozenset())
        assert len(got) <= len(probed) and a.distinct < b.distinct
        off = _Recorder(f)  # use_prediction=False: the hint is ignored, the probes as before
        assert Auto(use_prediction=False).search(cands, off, predicted_ranking=hint,
                                                 excess=_excess_hint(f, off)) == probed
        assert off.asked == b.asked and len(calls) == 1


def test_the_hint_is_not_called_while_the_error_looks_sparse():
    """≤ 8 culprits: auto is gt call for call and never asks for the prediction (it costs emulator runs)."""
    cands = names(128)
    for seed in range(4):
        culprits = random_culprits(cands, 1 + seed % 4, seed)

        def hint(first=(), excess=None):
            raise AssertionError("called in a sparse search")

        a, g = _Recorder(monotone(culprits)), _Recorder(monotone(culprits))
        assert Auto().search(cands, a, predicted_ranking=hint) == GroupTesting().search(cands, g) == culprits
        assert a.asked == g.asked


def test_a_failing_or_wrong_hint_falls_back_to_the_probes():
    cands, w, t = additive_case(200, 1.0, 0.25, 0)
    f = additive(w, t)
    base = _Recorder(f)
    expected = Auto().search(cands, base, excess=_excess_hint(f, base))

    def broken(first=(), excess=None):
        raise RuntimeError("no emulator")

    def calibrated_then_wrong(first=(), excess=None):
        excess()
        return cands[:10]

    for hint in (broken, lambda first=(), excess=None: None, lambda first=(), excess=None: cands[:10],
                 lambda first=(), excess=None: cands + ["ghost"], calibrated_then_wrong):
        r = _Recorder(f)
        got = Auto().search(cands, r, predicted_ranking=hint, excess=_excess_hint(f, r))
        assert got == expected and f(got) and is_one_minimal(f, got)
        # the calibration's all-FP16 evaluation only when the hint asked for it (a hint that cannot rank: free)
        assert r.distinct == base.distinct + (hint is calibrated_then_wrong and frozenset() not in base.asked)


def test_budget_runs_out_in_the_calibration():
    from bisector.strategies import BudgetExhausted

    cands, w, t = additive_case(200, 1.0, 0.25, 0)
    f = additive(w, t)
    probe = _Recorder(f)
    Auto().search(cands, probe, predicted_ranking=_heaviest_first(w), excess=_excess_hint(f, probe))
    before = probe.asked.index(frozenset())  # the calibration set: asked right after the switch
    r = CountingOracle(f, budget=before)
    r.asked = []
    try:
        Auto().search(cands, r, predicted_ranking=lambda first=(), excess=None: (excess(), cands)[1],
                      excess=lambda s: f.excess(s))
    except BudgetExhausted:
        return
    raise AssertionError("the budget did not propagate")


def test_greedy_moves_the_largest_errors_first_and_predicts_the_prefix():
    q = np.array([[9.0, 0.0], [0.0, 4.0], [0.1, 0.1], [0.1, 0.0], [0.0, 0.1]])  # squared errors, 2 elements
    order, predicted = _greedy(q, [], None)
    assert order[:2] == [0, 1] and sorted(order) == [0, 1, 2, 3, 4]
    assert predicted == 2  # the rest: sqrt(0.2) < 1 on both elements
    order, predicted = _greedy(q, [1], None)
    assert order[0] == 0 and 1 not in order and predicted == 2
    # calibrated to a real excess 10x the model's: the small errors matter too
    order, predicted = _greedy(q, [], 10 * float(np.sqrt(q.sum(0)).max()))
    assert order[:2] == [0, 1] and predicted == 5


def _job(stat: str = "elemwise"):
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    args = json.loads((ROOT / "fixtures" / "planted.json").read_text())["args"]
    if stat != "elemwise":
        args = args + ["--check-error-stat", stat]
    return open_job(ROOT / "fixtures" / "planted.onnx", no_cache=True, **options_from_flags(args))


def test_predicted_ranking_on_emulate_ranks_every_candidate_and_runs_each_alone():
    job = _job()
    try:
        oracle = job.oracle()
        cands = list(oracle.candidates)
        stats: dict = {}
        assert predicted_ranking(oracle, []) is None  # 16 output numbers: below MIN_ELEMENTS, no ranking
        rank = predicted_ranking(oracle, [], oracle.evaluate(frozenset()).excess, min_elements=0, stats=stats)
        assert sorted(rank) == sorted(cands) and len(rank) == len(cands)
        # one run per candidate and input set, but one for a twin pair (the planted head's Reshape -> Transpose)
        assert stats["runs"] == (len(cands) - 1) * len(oracle.feeds_list) and stats["seconds"] >= 0
        assert oracle.new == 1  # the calibration above; the single-node runs are not evaluations
        # the planted fixture: the model's predicted prefix is exactly the seven planted culprits, and it passes
        planted = json.loads((ROOT / "fixtures" / "planted.json").read_text())["fp32_nodes"]
        assert stats["predicted_prefix"] == len(planted) and sorted(rank[: len(planted)]) == sorted(planted)
        assert oracle.passes(frozenset(rank[: len(planted)]))
        assert predicted_ranking(oracle, cands[-2:], None, min_elements=0)[:2] == cands[-2:]
    finally:
        job.close()
    job = _job("mean")
    try:
        assert predicted_ranking(job.oracle(), [], min_elements=0) is None  # mean/median/quantile: not modelled
    finally:
        job.close()


def test_driver_offers_the_predicted_ranking(monkeypatch):
    from bisector.search import driver

    seen: dict = {}

    class Probe:
        def search(self, candidates, passes, **hints):
            seen["rank"] = hints["predicted_ranking"]((), None)
            return frozenset(candidates)

    monkeypatch.setattr(driver, "load_strategy", lambda name, options=None: Probe())
    from bisector.search import vector_ranking

    monkeypatch.setattr(vector_ranking, "MIN_ELEMENTS", 0)  # the planted model has 16 output numbers
    job = _job()
    try:
        oracle = job.oracle()
        events: list[dict] = []
        result = driver.run_search(oracle, "auto", progress=events.append)
        assert sorted(seen["rank"]) == sorted(oracle.candidates)
        # the runs reach the progress display as they go (no evaluations): the last one always
        runs = [e["ranking"] for e in events if "ranking" in e]
        assert runs and runs[-1]["runs"] == runs[-1]["total"] == len(oracle.candidates) - 1  # one twin pair
        # the ranking's runs are reported apart from the evaluations (constraints.json, the report)
        assert result.evaluations["emulator_runs"] == len(oracle.candidates) - 1
        assert result.evaluations["new"] == oracle.new
    finally:
        job.close()


def test_elements_at_risk_from_vectors_kept_on_disk_match_vectors_held_in_memory(monkeypatch):
    """The vectors wait in an unlinked temporary file and are read back at the k elements with the largest
    sum of squares: exactly the columns the vectors held in memory give, in the same order; with no temporary
    file possible, two passes over the candidates give them too."""
    import tempfile

    from bisector.search import vector_ranking

    rng = np.random.default_rng(5)
    n, size, k = 70, 3000, 64  # 70 rows: more than one block of 64 read back
    rows = [rng.standard_normal(size).astype(np.float32) * rng.uniform(0.1, 3) for _ in range(n)]
    calls = [0]

    def vector(i):
        calls[0] += 1
        return rows[i].copy()

    z = np.stack(rows)
    want = z[:, np.argsort(-(z.astype(np.float64) ** 2).sum(0))[:k]]
    got = vector_ranking._at_risk(vector, list(range(n)), size, k)
    assert calls[0] == n and got.dtype == np.float32 and np.array_equal(got, want)

    def no_disk(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_disk)
    calls[0] = 0
    assert np.array_equal(vector_ranking._at_risk(vector, list(range(n)), size, k), want) and calls[0] == 2 * n


def test_vectors_that_would_fill_the_temporary_directory_are_computed_twice(monkeypatch, tmp_path):
    """All n vectors go to TMPDIR only when they take at most half its free space (on a tmpfs that space is
    memory): beyond that the two passes give the same columns without the file."""
    import shutil
    import tempfile
    from collections import namedtuple

    from bisector.search import vector_ranking

    rng = np.random.default_rng(6)
    n, size, k = 20, 500, 16
    rows = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    z = np.stack(rows)
    want = z[:, np.argsort(-(z.astype(np.float64) ** 2).sum(0))[:k]]
    calls = [0]

    def vector(i):
        calls[0] += 1
        return rows[i].copy()

    opened = []
    real_tf = tempfile.TemporaryFile
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda *a, **kw: opened.append(1) or real_tf(*a, **kw))
    usage = namedtuple("usage", "total used free")
    need = n * size * 4
    for free, file_used in ((2 * need, True), (2 * need - 8, False)):
        monkeypatch.setattr(shutil, "disk_usage", lambda path, free=free: usage(free * 4, free * 3, free))
        calls[0], opened[:] = 0, []
        assert np.array_equal(vector_ranking._at_risk(vector, list(range(n)), size, k), want)
        assert bool(opened) == file_used and calls[0] == (n if file_used else 2 * n)


def test_single_node_runs_stop_at_the_time_limit():
    """The ranking's emulator runs are search work: a spent --time-limit stops them (BudgetExhausted, which the
    driver turns into the best set so far), and they run on several threads in candidate order."""
    from bisector.budget import Budget, BudgetExhausted
    from bisector.search import vector_ranking

    job = _job()
    try:
        oracle = job.oracle(budget=Budget(time_limit=0.0))
        with pytest.raises(BudgetExhausted):
            predicted_ranking(oracle, [], None, min_elements=0)
    finally:
        job.close()
    seen: list[int] = []
    got = list(vector_ranking.in_order(lambda i: seen.append(i) or np.full(3, i, np.float32), 20, threads=3))
    assert [int(v[0]) for v in got] == list(range(20)) and sorted(seen) == list(range(20))


def test_a_device_backend_gets_the_ranking_from_the_emulator():
    """TensorRT or ORT-CUDA cannot run the single-node plans cheaply: the ranking comes from an emulator on the
    same model, inputs and golden (the same ranking the emulate backend gives), closed afterwards; none for a
    BF16 device or a backend without a model."""
    import types

    from bisector.backends.emulate import backend as emulate_backend

    job = _job()
    try:
        oracle = job.oracle()
        excess = oracle.evaluate(frozenset()).excess
        want = predicted_ranking(oracle, [], excess, min_elements=0)
        closed: list = []
        real_close = emulate_backend.EmulateBackend.close

        def close(self):
            closed.append(self)
            real_close(self)

        emulate_backend.EmulateBackend.close = close
        try:
            oracle.backend = types.SimpleNamespace(name="tensorrt", catalog=job.catalog, storage="fp16")
            stats: dict = {}
            assert predicted_ranking(oracle, [], excess, min_elements=0, stats=stats) == want
            assert stats["runs"] == len(oracle.candidates) - 1 and len(closed) == 1  # one twin pair
            oracle.backend = types.SimpleNamespace(name="tensorrt", catalog=job.catalog, storage="bf16")
            assert predicted_ranking(oracle, [], excess, min_elements=0) is None
            oracle.backend = types.SimpleNamespace(name="tensorrt")
            assert predicted_ranking(oracle, [], excess, min_elements=0) is None
        finally:
            emulate_backend.EmulateBackend.close = real_close
    finally:
        job.close()


# ---------------------------------------------------------------- issue 15, eighth round: the model behind the ranking
from bisector.search.vector_ranking import Prediction, Ranking  # noqa: E402


def test_prediction_is_the_root_sum_square_of_the_fp16_nodes_and_calibrates_to_a_real_excess():
    z = np.array([[3.0, 0.0, 1.0], [0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    names_ = ["a", "b", "c", "d"]
    m = Prediction(names_, z**2, margin=2.0)
    for fp32 in [(), ("a",), ("b", "c"), ("a", "b", "c", "d"), ("d", "x")]:  # "x": not a candidate, ignored
        fp16 = [i for i, x in enumerate(names_) if x not in fp32]
        want = float(np.sqrt((z[fp16] ** 2).sum(0).max(initial=0.0))) * 2.0
        assert m.excess(frozenset(fp32)) == pytest.approx(want)
    assert m.excess(names_) == 0.0
    assert m.calibrate({"a"}, 7.0) and m.excess({"a"}) == pytest.approx(7.0)
    # the scale carries over to every plan: without a the largest column sum is 4 + 1 = 5, with it 9 + 1 + 0.25
    assert m.excess(()) == pytest.approx(7.0 * np.sqrt(10.25) / np.sqrt(5.0))
    scale = m.scale
    assert not m.calibrate({"a"}, float("inf")) and not m.calibrate(names_, 1.0) and m.scale == scale


def test_elimination_moves_the_members_that_cost_nothing_first_and_the_heaviest_last():
    q = np.array([[9.0, 0.0], [0.0, 0.0], [0.0, 4.0], [0.01, 0.0], [0.0, 0.0]])
    m = Prediction(["a", "b", "c", "d", "e"], q)
    seq = m.eliminate({"a", "b", "c", "d", "e"})
    order = [x for x, _ in seq]
    assert set(order[:2]) == {"b", "e"} and order[2] == "d" and order[-1] == "a"
    assert [e for _, e in seq][:2] == [0.0, 0.0] and seq[-1][1] == pytest.approx(np.sqrt(9.01))  # all FP16
    assert m.eliminate(()) == []


def test_predicted_ranking_carries_its_model_calibrated_on_the_real_excess():
    job = _job()
    try:
        oracle = job.oracle()
        planted = json.loads((ROOT / "fixtures" / "planted.json").read_text())["fp32_nodes"]
        real = oracle.evaluate(frozenset(planted)).excess  # all-FP16's is inf here: no calibration from it
        assert 0 < real <= 1.0
        rank = predicted_ranking(oracle, planted, real, min_elements=0)
        assert isinstance(rank, Ranking) and isinstance(rank, list) and isinstance(rank.model, Prediction)
        assert rank[:7] == planted and rank.model.excess(frozenset(planted)) == pytest.approx(real, rel=1e-5)
        assert rank.model.excess(frozenset()) > rank.model.margin  # all-FP16 is predicted to fail
        uncalibrated = predicted_ranking(oracle, planted, None, min_elements=0).model
        assert uncalibrated.scale == 1.0 and uncalibrated.excess(frozenset(planted)) > 0
        assert rank.model.q.shape[0] == len(oracle.candidates) and rank.model.q.dtype == np.float32
    finally:
        job.close()


def _rss_additive(w: dict[str, float], t: float):
    """Passes iff Σ_FP16 w ≤ t; excess sqrt(Σ_FP16 w / t): exactly the root-sum-square model, z_i² = w_i / t."""
    def f(s):
        return sum(v for x, v in w.items() if x not in s) <= t

    f.excess = lambda s: float(np.sqrt(sum(v for x, v in w.items() if x not in frozenset(s)) / t))
    return f


def _model_hint(cands, order, q):
    model_q = np.asarray(q, np.float64).reshape(len(cands), -1)

    def hint(first=(), excess=None):
        m = Prediction(cands, model_q)
        if callable(excess):
            m.calibrate(frozenset(first), excess())
        return Ranking(list(first) + [x for x in order if x not in set(first)], m)

    return hint


def test_auto_with_an_exact_model_behind_a_poor_ranking_shrinks_to_a_smaller_set_for_fewer_evaluations():
    """The ranking is half right (its prefix holds many light nodes); the model is exact. Shrinking in the model's
    elimination order reaches the optimum, in fewer evaluations than shrinking in reverse rank order."""
    wins = 0
    for seed in range(4):
        cands, w, t = additive_case(200, 1.0, 0.25, seed)
        f = _rss_additive(w, t)
        rng = np.random.default_rng(seed)
        noisy_order = sorted(cands, key=lambda x: -w[x] * rng.lognormal(0.0, 1.5))
        hint = _model_hint(cands, noisy_order, [w[x] / t for x in cands])
        sizes, evals = [], []
        for on in (False, True):
            o = _Recorder(f)
            got = Auto(predicted_shrink=on).search(cands, o, predicted_ranking=hint, excess=_excess_hint(f, o))
            assert f(got) and is_one_minimal(f, got)
            sizes.append(len(got))
            evals.append(o.distinct)
        assert sizes[1] <= sizes[0]
        wins += evals[1] < evals[0]
    assert wins >= 3


def test_a_wrong_model_or_none_still_ends_passing_and_one_minimal():
    for seed in range(3):
        cands, w, t = additive_case(150, 1.0, 0.25, seed)
        f = additive(w, t)
        order = sorted(cands, key=lambda x: -w[x])
        rng = np.random.default_rng(seed)
        wrong = _model_hint(cands, order, rng.random((len(cands), 8)))
        o = _Recorder(f)
        got = Auto(predicted_shrink=True).search(cands, o, predicted_ranking=wrong, excess=_excess_hint(f, o))
        assert f(got) and is_one_minimal(f, got)
        # a ranking without a model (a plain list): the option changes nothing, call for call
        plain = _heaviest_first(w)
        a, b = _Recorder(f), _Recorder(f)
        Auto(predicted_shrink=True).search(cands, a, predicted_ranking=plain, excess=_excess_hint(f, a))
        Auto().search(cands, b, predicted_ranking=plain, excess=_excess_hint(f, b))
        assert a.asked == b.asked


def _greedy_by_definition(q: np.ndarray, first: list[int], start: float | None) -> list[int]:
    """The greedy order as its docstring defines it, every column every step (the pre-optimisation code)."""
    n = q.shape[0]
    fp16 = np.ones(n, bool)
    fp16[first] = False
    total = q[fp16].sum(0)
    scale = (start / np.sqrt(total.max())) ** 2 if start else 1.0
    q, total, order = q * scale, total * scale, []
    while fp16.any():
        idx = np.flatnonzero(fp16)
        rest = np.sqrt(np.maximum(total[None, :] - q[idx], 0.0))
        if np.sqrt(total.max()) > 1:
            value = np.maximum(rest - 1.0, 0.0).sum(1) + 1e-9 * (rest ** 2).sum(1)
        else:
            value = (rest ** 2).sum(1)
        j = int(idx[int(np.argmin(value))])
        fp16[j] = False
        order.append(j)
        total = np.maximum(total - q[j], 0.0)
    return order


@pytest.mark.parametrize("seed", range(6))
def test_the_greedy_computes_only_violated_columns_and_keeps_the_definitions_order(seed):
    rng = np.random.default_rng(seed)
    n, k = rng.integers(5, 80), rng.integers(1, 300)
    q = rng.lognormal(0, 1.5, (n, 1)) * rng.exponential(1.0, (n, k)) * rng.lognormal(0, 1, (1, k))
    for start in (None, 2.0, 20.0):
        first = sorted(rng.choice(n, size=int(rng.integers(0, 3)), replace=False).tolist())
        order, predicted = _greedy(q.copy(), first, start)
        assert order == _greedy_by_definition(q.copy(), first, start)
        assert set(order) == set(range(n)) - set(first)


@pytest.mark.parametrize("seed", range(4))
def test_the_greedy_on_the_errors_squares_them_as_the_squares_would_be(seed):
    """`_greedy(z, squared=False)` squares float32 errors a chunk at a time (no n x k float64 copy): the order and
    the prefix are those of the float64 squares, bit for bit, and the errors are left as they were."""
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 200)), int(rng.integers(1, 400))  # n past one 64-row chunk on most seeds
    z = (rng.standard_normal((n, k)) * rng.lognormal(0, 1.5, (n, 1)) * 0.3).astype(np.float32)
    z[0, 0] = 1e6  # the value a NaN or inf error becomes (`scaled_error`)
    for start in (None, 0.5, 30.0):
        first = sorted(rng.choice(n, size=int(rng.integers(0, 3)), replace=False).tolist())
        before = z.copy()
        got = _greedy(z, first, start, squared=False)
        assert got == _greedy(np.square(z, dtype=np.float64), first, start)
        np.testing.assert_array_equal(z, before)


def test_auto_switches_after_fewer_culprits_when_the_ranking_is_available():
    """With a hint that says it can rank on the judging backend (``exact_backend``), auto turns to its ranked
    search after ``diffuse_after_ranked`` culprits instead of ``diffuse_after``: the hint is called then; without
    it (or with use_prediction off) the sparse search goes on as gt's up to ``diffuse_after``."""
    cands = names(128)
    culprits = random_culprits(cands, 6, 3)  # 6 culprits: above 4, within 8
    calls = []

    def hint(first=(), excess=None):
        calls.append(tuple(first))
        return list(first) + [c for c in cands if c not in first]

    f = monotone(culprits)
    hint.exact_backend = True
    got = Auto(diffuse_after_ranked=4).search(cands, _Recorder(f), predicted_ranking=hint)
    assert f(got) and is_one_minimal(f, got) and len(calls) == 1  # switched: the ranking was asked for
    calls.clear()
    hint.exact_backend = False
    a, g = _Recorder(f), _Recorder(f)
    assert Auto(diffuse_after_ranked=4).search(cands, a, predicted_ranking=hint) == GroupTesting().search(cands, g)
    assert not calls and a.asked == g.asked
    hint.exact_backend = True
    a = _Recorder(f)
    assert Auto(diffuse_after_ranked=4, use_prediction=False).search(cands, a, predicted_ranking=hint) == culprits
    assert not calls and a.asked == g.asked


def test_rankable_says_beforehand_what_the_ranking_will_do():
    """`rankable` agrees with whether `predicted_ranking` ranks, without running it; the driver's hint says
    `exact_backend` only where it ranks on the emulate backend itself."""
    from bisector.search.vector_ranking import RankingHint, rankable

    job = _job()
    try:
        oracle = job.oracle()
        assert not rankable(oracle) and predicted_ranking(oracle, []) is None  # 16 output numbers
        assert rankable(oracle, min_elements=0)
        hint = RankingHint(oracle)
        assert hint.exact_backend is False and oracle.new == 0
    finally:
        job.close()
    job = _job("mean")
    try:
        assert not rankable(job.oracle(), min_elements=0)  # mean checks: not modelled
    finally:
        job.close()


def test_the_sooner_switch_is_for_the_emulate_backend_only(monkeypatch):
    """The driver's hint says `exact_backend` where the emulator that ranks is the backend that judges; on a
    device backend (ranked by an emulator of its model) it still ranks, but not exactly: auto switches as usual
    (measured on an H100 with ORT-CUDA: the sooner switch cost more device evaluations)."""
    import types

    from bisector.search import vector_ranking

    monkeypatch.setattr(vector_ranking, "MIN_ELEMENTS", 0)
    job = _job()
    try:
        oracle = job.oracle()
        assert vector_ranking.RankingHint(oracle).exact_backend is True
        oracle.backend = types.SimpleNamespace(name="ort-cuda", catalog=job.catalog, storage="fp16")
        assert vector_ranking.rankable(oracle) and vector_ranking.RankingHint(oracle).exact_backend is False
    finally:
        job.close()


@pytest.mark.parametrize("seed", range(4))
def test_scaled_error_is_the_old_definition_bit_for_bit(seed):
    """(out - g) / thr with NaN and ±inf as ±1e6: the guard that skips nan_to_num when nothing is non-finite
    must not skip it when something is, including finite values whose float32 sum would overflow."""
    from bisector.search.vector_ranking import scaled_error

    rng = np.random.default_rng(seed)
    n = 5000
    g = rng.standard_normal(n).astype(np.float32)
    thr = np.abs(rng.standard_normal(n)).astype(np.float32) + np.float32(1e-3)
    outs = [g + rng.standard_normal(n).astype(np.float32)]
    for bad in (np.nan, np.inf, -np.inf):
        o = outs[0].copy()
        o[rng.integers(0, n, 3)] = bad
        outs.append(o)
    huge = outs[0].copy()
    huge[:100] = np.float32(3e38)  # finite, each z finite, the float32 sum overflows
    outs.append(huge)
    tiny = thr.copy()
    tiny[:5] = np.float32(1e-38)  # a finite error over a tiny threshold overflows to inf in the division
    for out in outs:
        for t in (thr, tiny):
            with np.errstate(all="ignore"):
                want = np.asarray(out, np.float32).ravel() - g
                np.divide(want, t, out=want)
                want = np.nan_to_num(want, copy=False, nan=1e6, posinf=1e6, neginf=-1e6)
                got = scaled_error(out, g, t)
            assert got.dtype == np.float32 and np.array_equal(got, want)
            assert np.isfinite(got).all()


@pytest.mark.parametrize("atol,rtol,margin", [(1e-2, 1e-2, 1.0), (0.0, 1e-3, 0.9), (1e-5, 0.0, 1.0),
                                              (np.float64(1e-3), np.float64(2e-3), np.float64(1.1))])
def test_threshold_chunk_by_chunk_is_the_whole_array_formula(monkeypatch, atol, rtol, margin):
    from bisector.compare import EPSILON
    from bisector.search import vector_ranking as vr

    monkeypatch.setattr(vr, "_STEP", 1000)
    rng = np.random.default_rng(0)
    g = (rng.standard_normal(4321) * 10.0 ** rng.integers(-40, 5, 4321)).astype(np.float32)
    g[::7] = 0.0
    g[3] = -0.0
    ge = np.where(g == 0, g + EPSILON, g)
    thr = np.maximum(atol, rtol * np.abs(ge)) * margin
    want = np.maximum(thr, np.finfo(np.float32).tiny).astype(np.float32)
    got = vr._threshold(g, atol, rtol, margin)
    assert got.dtype == np.float32 and np.array_equal(got, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_ranking_runs_are_reported_as_they_come_in_the_callers_thread(monkeypatch, threads):
    """`on_run(done, total)`: once per candidate's vector, in order, in the thread that asked — in memory, through
    the temporary file, and over both passes (total 2n) where no file can be written."""
    import tempfile
    import threading

    from bisector.search import vector_ranking

    rng = np.random.default_rng(7)
    n, size, k = 12, 400, 16
    rows = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    caller = threading.get_ident()

    def vector(i):
        return rows[i].copy()

    for path in ("memory", "file", "two passes"):
        seen: list[tuple[int, int]] = []

        def on_run(done, total):
            assert threading.get_ident() == caller
            seen.append((done, total))

        if path == "memory":
            z = np.stack(list(vector_ranking.in_order(vector, n, threads, vector_ranking._Counter(on_run, n))))
            assert np.array_equal(z, np.stack(rows))
            want = [(i, n) for i in range(n + 1)]
        else:
            if path == "two passes":
                monkeypatch.setattr(tempfile, "TemporaryFile", lambda *a, **kw: (_ for _ in ()).throw(OSError(28, "full")))
            vector_ranking._at_risk(vector, list(range(n)), size, k, threads, on_run)
            total = n if path == "file" else 2 * n
            want = [(i, total) for i in range(total + 1)]  # done = 0 as they start
        assert seen == want, path


def test_the_ranking_hint_sends_progress_at_most_once_a_second_and_always_the_last():
    from bisector.search.vector_ranking import RankingHint

    now = [100.0]
    events: list[dict] = []
    hint = RankingHint.__new__(RankingHint)  # no oracle needed: only the progress part is under test
    hint._progress, hint._every, hint._clock = events.append, 1.0, lambda: now[0]
    on_run = hint._on_run()
    now[0] += 5.0  # the calibration evaluation: not one of the runs
    on_run(0, 10)
    for done in range(1, 11):
        now[0] += 0.4
        on_run(done, 10)
    got = [(e["ranking"]["runs"], round(e["ranking"]["seconds"], 1)) for e in events]
    assert got == [(1, 0.4), (4, 1.6), (7, 2.8), (10, 4.0)]
    assert all(e["ranking"]["total"] == 10 for e in events)

    def broken(event):
        raise RuntimeError("display gone")

    hint._progress = broken
    hint._on_run()(1, 1)  # a failing display never fails the search
    hint._progress = None
    assert hint._on_run() is None


def test_the_switch_estimate_says_how_many_ranking_runs_come_first():
    """On switching, where the hint says beforehand that it can rank (`can_rank`, as the driver's does), the
    estimate counts the single-node runs it will cost (one per candidate; they are not evaluations); where it
    cannot say so (a plain callable) or cannot rank, the estimate makes no such claim. The search is the same."""
    cands, w, t = additive_case(200, 1.0, 0.25, 0)
    f = additive(w, t)
    results = {}
    for can in (True, False, None):
        perfect = _heaviest_first(w)

        def hint(first=(), excess=None):
            return perfect(first, excess)

        if can is not None:
            hint.can_rank = can
        events: list[dict] = []
        a = _Recorder(f)
        results[can] = (Auto().search(cands, a, predicted_ranking=hint, excess=_excess_hint(f, a),
                                      progress=events.append), a.asked)
        switch = next(e["estimate"] for e in events if "estimate" in e and e["estimate"].get("at_least"))
        if can:
            assert switch["ranking_runs"] == len(cands)
        else:
            assert "ranking_runs" not in switch
        assert all("ranking_runs" not in e["estimate"] for e in events if "estimate" in e and e["estimate"] is not switch)
    assert results[True] == results[False] == results[None]


def test_the_drivers_hint_says_beforehand_whether_it_can_rank(monkeypatch):
    from bisector.search import vector_ranking
    from bisector.search.vector_ranking import RankingHint

    job = _job()
    try:
        oracle = job.oracle()
        hint = RankingHint(oracle)
        assert hint.can_rank is False and hint.exact_backend is False  # 16 output numbers: below MIN_ELEMENTS
        monkeypatch.setattr(vector_ranking, "MIN_ELEMENTS", 0)
        hint = RankingHint(oracle)
        assert hint.can_rank is True and hint.exact_backend is True  # emulate: the judge's own emulator
    finally:
        job.close()


def _batched_model(mix: bool = False):
    """x [N, 32] -> six MatMul + Tanh -> y [N, 32]; ``mix``: y is centred on the batch mean (items depend on each
    other, as with batch statistics)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "x"
    for i in range(6):
        inits.append(numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.4).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}")]
        cur = f"t{i}"
    if mix:
        nodes += [helper.make_node("ReduceMean", [cur], ["bm"], name="batch_mean", axes=[0], keepdims=1),
                  helper.make_node("Sub", [cur, "bm"], ["y"], name="centre")]
    else:
        nodes.append(helper.make_node("Mul", [cur, cur], ["y"], name="square"))
    graph = helper.make_graph(nodes, "batched", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])], inits)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _batched_job(tmp_path, batch: int, mix: bool = False, iterations: int = 1):
    import onnx

    from bisector.app.job import open_job

    path = tmp_path / f"batched_{batch}_{mix}.onnx"
    onnx.save(_batched_model(mix), path)
    return open_job(path, no_cache=True, atol=1e-4, rtol=1e-4, input_shapes=[f"x:[{batch},32]"],
                    iterations=iterations)


def _spy_batches(monkeypatch, backend, scales: list | None = None) -> list[int]:
    seen: list[int] = []
    real = backend.run

    def run(plan, feeds, outputs=None):
        seen.append(int(feeds["x"].shape[0]))
        if scales is not None:
            scales.append((seen[-1], backend.executor.run_scale))
        return real(plan, feeds, outputs)

    monkeypatch.setattr(backend, "run", run)
    return seen


def _rank_batched(job, monkeypatch) -> tuple[list[str], list[int], dict]:
    """The ranking of a batched job from all-FP16 (calibrated), with the batch size of every backend run after
    the calibration, and the ranking's stats; every candidate ranked, the sample's references gone after."""
    oracle = job.oracle()
    excess = oracle.evaluate(frozenset()).excess
    scales: list = []
    seen = _spy_batches(monkeypatch, job.backend, scales)
    stats: dict = {}
    rank = predicted_ranking(oracle, [], excess, min_elements=0, stats=stats)
    # the sample's runs tell the executor how much shorter they are than the batch's (its sessions' thread pools)
    batch = max(seen)
    assert {s for n, s in scales[1:] if n < batch} <= {batch / n for n in set(seen) if n < batch}
    assert job.backend.executor.run_scale == 1.0
    assert sorted(rank) == sorted(oracle.candidates)
    assert len(job.backend._boundaries) + len(job.backend._references) == 1  # the whole batch's only
    return rank, seen, stats


@pytest.mark.parametrize("batch, sample", [(16, 2), (8, 1), (15, 1)])
def test_a_batched_input_is_ranked_on_a_sample_of_its_items(tmp_path, monkeypatch, batch, sample):
    """Each single-node run costs one inference of the whole batch: at batch B >= 8 the ranking runs on the first
    B // 8 items (one run checks that they stand for the batch), ranks every candidate, and leaves no
    reference of the sample behind in the backend; the verdicts still judge the whole batch."""
    job = _batched_job(tmp_path, batch)
    try:
        rank, seen, stats = _rank_batched(job, monkeypatch)
        n = len(rank)
        assert seen.count(sample) == n + 1 and seen.count(batch) == 1  # the check; the whole batch's reference
        assert stats["runs"] == n + 1 and stats["batch_sample"] == (sample, batch)
        before = len(seen)
        job.oracle().evaluate(frozenset(rank[:3]))
        assert seen[before:] == [batch]  # an evaluation after the ranking judges the whole batch
    finally:
        job.close()


def test_the_batch_sample_can_be_switched_off(tmp_path, monkeypatch):
    """BISECTOR_RANKING_SAMPLE=0: every single-node run takes the whole batch, no check run."""
    monkeypatch.setenv("BISECTOR_RANKING_SAMPLE", "0")
    job = _batched_job(tmp_path, 8)
    try:
        rank, seen, stats = _rank_batched(job, monkeypatch)
        assert seen == [8] * len(rank) and stats["runs"] == len(rank) and stats["batch_sample"] is None
    finally:
        job.close()


def test_a_model_that_mixes_its_batch_is_ranked_on_the_whole_batch(tmp_path, monkeypatch):
    """Where the items depend on each other (here: centred on the batch mean) the sample's FP32 outputs differ
    from the batch's, and every single-node run takes the whole batch; the check run is counted."""
    job = _batched_job(tmp_path, 8, mix=True)
    try:
        rank, seen, stats = _rank_batched(job, monkeypatch)
        n = len(rank)
        assert seen.count(1) == 1 and seen.count(8) == n + 1
        assert stats["runs"] == n + 1 and stats["batch_sample"] is None
    finally:
        job.close()


def test_batch_sample_keeps_unbatched_and_too_small_sets_whole(tmp_path):
    """Below batch 8 every item is ranked (a ranking seen through one item of 2-4 cost YOLOv8n evaluations for
    little time); below the ranking's minimum of output numbers the sample is not used either."""
    from bisector.search.vector_ranking import batch_sample

    for batch in (1, 2, 7):
        job = _batched_job(tmp_path, batch)
        try:
            oracle = job.oracle()
            feeds, golden, runs = batch_sample(oracle, job.backend, list(oracle.candidates), min_elements=0)
            assert feeds is oracle.feeds_list and golden is oracle.golden and runs == 0
        finally:
            job.close()
    job = _batched_job(tmp_path, 8, iterations=2)
    try:
        oracle = job.oracle()
        feeds, golden, runs = batch_sample(oracle, job.backend, list(oracle.candidates), min_elements=0)
        assert runs == 2 and [f["x"].shape[0] for f in feeds] == [1, 1]
        assert all(np.array_equal(g["y"], o["y"][:1]) for g, o in zip(golden, oracle.golden))
        # 2 sets x 1 item x 32 numbers = 64 < 65: whole again, and the samples' references dropped
        feeds, golden, runs = batch_sample(oracle, job.backend, list(oracle.candidates), min_elements=65)
        assert feeds is oracle.feeds_list and runs == 2
        assert len(job.backend._boundaries) + len(job.backend._references) == 2
    finally:
        job.close()


def test_a_prefix_that_leaves_almost_nothing_fp16_goes_straight_to_the_check():
    """144 of 150 candidates must stay FP32 (each alone breaks the tolerance), the 6 others together do not: the
    threshold search's prefix holds the 144, and instead of group testing them one by one and then checking each
    again (`fallback_prefix`), `auto` checks each member once (`near_all`). The same 1-minimal set, the optimum,
    in about N evaluations instead of about 2N."""
    cands = names(150)
    w = {x: (1.0 if i % 25 else 0.01) for i, x in enumerate(cands)}  # 6 light nodes, spread through the order
    f = additive(w, 0.1)
    need = frozenset(x for x in cands if w[x] == 1.0)
    runs = {}
    for share in (0.05, 0.0):
        r = _Recorder(f)
        got = Auto(near_all=share).search(cands, r, predicted_ranking=_heaviest_first(w), excess=_excess_hint(f, r))
        assert got == need and f(got) and is_one_minimal(f, got)
        runs[share] = r.distinct
    assert runs[0.05] <= len(need) + 50 and runs[0.05] < 0.7 * runs[0.0], runs  # 186 against 316


def test_twin_nodes_change_the_same_values_and_the_ranking_runs_one_of_them(tmp_path, monkeypatch):
    """A chain of element-moving nodes (Reshape -> Transpose -> Unsqueeze -> Squeeze -> Reshape) changes the same
    values whichever one of them alone is FP16: the ranking runs the first and gives its vector to the others.
    The same ranking and model as running every one of them, bit for bit, with five runs fewer."""
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.fp16.points import single_node_twins
    from bisector.fp16.plan import Plan
    from bisector.search import vector_ranking

    model = movement_chain_model(tmp_path / "chain.onnx")
    job = open_job(model, no_cache=True, **options_from_flags(["--atol", "1e-4", "--rtol", "1e-4"]))
    try:
        cat, oracle = job.catalog, job.oracle()
        cands = list(oracle.candidates)
        twins = single_node_twins(cat, cands)
        assert twins == {"t": "r", "u": "r", "s": "r", "s_flat": "r", "t2b": "t2"}
        everything = frozenset(cands)
        alone = {x: job.backend.run(Plan(everything - {x}, tuple(cands)), oracle.feeds_list[0]) for x in cands}
        for j, i in twins.items():
            for out in cat.output_names:
                assert np.array_equal(alone[j][out], alone[i][out]), (j, out)
        # not twins: each changes other values than its producer alone does (the check above would fail)
        for j, i in (("r", "a"), ("t2", "r2"), ("q2", "q")):
            assert any(not np.array_equal(alone[j][o], alone[i][o]) for o in cat.output_names), (j, i)

        excess = oracle.evaluate(frozenset()).excess
        for top in (4096, 8):  # vectors held whole; and the elements at risk through the temporary file
            with_twins: dict = {}
            rank = vector_ranking.predicted_ranking(oracle, [], excess, top=top, min_elements=0, stats=with_twins)
            monkeypatch.setattr(vector_ranking, "single_node_twins", lambda catalog, names: {})
            every: dict = {}
            again = vector_ranking.predicted_ranking(oracle, [], excess, top=top, min_elements=0, stats=every)
            monkeypatch.undo()
            assert list(rank) == list(again)
            assert np.array_equal(rank.model.q, again.model.q)
            assert with_twins["runs"] == every["runs"] - 5 == len(cands) - 5
        # what `auto`'s estimate says before the runs (the hint's `runs`)
        assert vector_ranking.RankingHint(oracle).runs == len(cands) - 5
    finally:
        job.close()


def test_vectors_that_cannot_wait_on_disk_rank_in_one_pass_at_the_elements_all_fp16_errs_most(monkeypatch):
    """Where the vectors fit no temporary file (an image segmenter's 30 M output numbers x 727 candidates), the
    elements come from the all-FP16 plan's error (one run) and every candidate runs once, not twice: exact where
    that plan's largest errors hold the top k, as the root-sum-square model says they do."""
    import tempfile

    from bisector.search import vector_ranking

    rng = np.random.default_rng(7)
    n, size, k = 40, 5000, 64  # PRESELECT x k = 256 of 5000 elements kept
    rows = [rng.standard_normal(size).astype(np.float32) * rng.uniform(0.1, 3) for _ in range(n)]
    z = np.stack(rows)
    ss = (z.astype(np.float64) ** 2).sum(0)
    want = z[:, np.argsort(-ss)[:k]]
    calls = [0]

    def vector(i):
        calls[0] += 1
        return rows[i].copy()

    def no_disk(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_disk)
    everything = [0]

    def all_fp16():  # the model's own picture of the all-FP16 plan: c·sqrt(Σ z²), c arbitrary
        everything[0] += 1
        return (3.0 * np.sqrt(ss)).astype(np.float32)

    got = vector_ranking._at_risk(vector, list(range(n)), size, k, everything=all_fp16)
    assert calls[0] == n and everything[0] == 1 and np.array_equal(got, want)
    # twins run once and share the row, as in the other paths
    rep = [0, 0] + list(range(2, n))
    calls[0] = 0
    got = vector_ranking._at_risk(vector, rep, size, k, everything=all_fp16)
    assert calls[0] == n - 1 and np.array_equal(got[0], got[1])
    # a poor all-FP16 picture still gives k columns of every candidate's vector (a ranking, not an exact one)
    got = vector_ranking._at_risk(vector, list(range(n)), size, k,
                                  everything=lambda: rng.standard_normal(size).astype(np.float32))
    assert got.shape == (n, k) and all(np.isin(got[i], rows[i]).all() for i in range(n))


def test_the_ranking_passes_the_all_fp16_errors_to_the_one_pass_fallback(monkeypatch):
    """`_rank` hands `_at_risk` the all-FP16 plan's scaled errors (one emulator run, counted with the runs)."""
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.search import vector_ranking

    job = open_job(ROOT / "fixtures" / "constructs" / "constant_fills.onnx", no_cache=True,
                   **options_from_flags(["--atol", "1e-4", "--rtol", "1e-4"]))
    try:
        oracle = job.oracle()
        seen: dict = {}
        real = vector_ranking._at_risk

        def spy(vector, rep, size, k, threads=None, on_run=None, everything=None):
            seen["all"] = everything()
            seen["size"] = size
            return real(vector, rep, size, k, threads, on_run)

        monkeypatch.setattr(vector_ranking, "_at_risk", spy)
        stats: dict = {}
        rank = predicted_ranking(oracle, [], None, min_elements=0, stats=stats, top=64)  # 288 numbers > k = 64
        assert sorted(rank) == sorted(oracle.candidates)
        assert seen["all"].shape == (seen["size"],) and np.isfinite(seen["all"]).all()
        assert np.abs(seen["all"]).max() > 0  # the all-FP16 plan errs somewhere: its error, not zeros
    finally:
        job.close()


@pytest.mark.parametrize("seed", range(4))
def test_the_greedy_with_bounds_moves_the_nodes_the_definition_moves_and_computes_few_values(seed, monkeypatch):
    """From PRUNE_FROM nodes a greedy step computes only the values that an upper bound of each node's gain says
    can win (`_pruned_argmin`): the order is the definition's, node for node, on heavy-tailed and on flat error
    matrices, with and without a start, on the squares and on the errors — and far fewer values are computed
    than one per node per step."""
    import bisector.search.vector_ranking as vr

    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(130, 260)), int(rng.integers(1, 300))
    heavy = rng.lognormal(0, 1.5, (n, 1)) * rng.exponential(1.0, (n, k)) * rng.lognormal(0, 1, (1, k))
    flat = rng.exponential(1.0, (n, k)) * 0.05
    computed, asked = [], []
    real = vr._pruned_argmin

    def counting(values, *rest):
        asked.append(len(rest[-1]))
        return real(lambda at: computed.append(len(at)) or values(at), *rest)

    monkeypatch.setattr(vr, "_pruned_argmin", counting)
    monkeypatch.setattr(vr, "PRUNE_ELEMENTS", 0)  # these matrices are below the size the bound is used from
    for q in (heavy, flat):
        for start in (None, 3.0):
            first = sorted(rng.choice(n, size=int(rng.integers(0, 3)), replace=False).tolist())
            order, predicted = _greedy(q.copy(), first, start)
            assert order == _greedy_by_definition(q.copy(), first, start), (start,)
            z = np.sqrt(q).astype(np.float32)
            assert _greedy(z, first, start, squared=False) == _greedy(np.square(z, dtype=np.float64), first, start)
    assert asked and sum(computed) < 0.5 * sum(asked)


@pytest.mark.parametrize("seed", range(6))
def test_the_gain_bound_is_never_below_a_nodes_real_gain(seed):
    """`_gain_bounds` is what lets a greedy step skip nodes: it must be at least the real drop of
    Σ_e relu(sqrt(total_e) − 1) that moving each node gives, on totals far above and near the tolerance, with
    nodes that hold most of an element's error."""
    from bisector.search.vector_ranking import _gain_bounds

    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 150)), int(rng.integers(1, 200))
    q = rng.lognormal(0, 2, (n, 1)) * rng.exponential(1.0, (n, k)) * rng.lognormal(0, 1, (1, k))
    q *= 10.0 ** rng.uniform(-2, 2)
    fp16 = rng.random(n) < 0.8
    fp16[0] = True
    idx = np.flatnonzero(fp16)
    total = q[fp16].sum(0)
    over = np.flatnonzero(total > 1.0)
    for cols in (over, slice(None)):
        base = total[cols]
        h = lambda t: np.maximum(np.sqrt(np.maximum(t, 0.0)) - 1.0, 0.0)  # noqa: E731
        gain = (h(base)[None, :] - h(base[None, :] - q[idx][:, cols])).sum(1)
        bound = _gain_bounds(lambda r, c: np.array(q[r][:, c], np.float64), idx, cols, base, q.max(0))
        assert np.all(bound >= gain), float((gain - bound).max())
