"""Parallel evaluation (issue 16): executors behind the oracle; the journal, budget and memo stay in the driver."""

from __future__ import annotations

import json
import time

import pytest

from bisector.budget import Budget, BudgetExhausted
from bisector.errors import BackendFailure, UsageError
from bisector.search.driver import run_search
from bisector.search.executors import (FailOn, InProcess, KillOnce, ProcessPool, SlowOpen, SyntheticSpec,
                                       ThreadSlots, start_executor, synthetic_verdict)
from bisector.search.judge import Verdict
from bisector.search.oracle import Oracle

from .conftest import SEED, planted_spec, PLANTED

CANDS = [f"n{i}" for i in range(40)]
CULPRITS = frozenset({"n3", "n17", "n30"})


class DictJournal:
    def __init__(self, preset: dict | None = None):
        self.rows: dict[frozenset, Verdict] = dict(preset or {})
        self.recorded: list[frozenset] = []

    def lookup(self, plan):
        v = self.rows.get(plan.fp32)
        return None if v is None else Verdict.from_json(v.to_json())

    def record(self, plan, verdict):
        self.rows[plan.fp32] = verdict
        self.recorded.append(plan.fp32)


class Counting:
    """An in-process evaluate that records what reached the executor."""

    def __init__(self, culprits=CULPRITS):
        self.culprits = culprits
        self.asked: list[frozenset] = []

    def __call__(self, fp32):
        self.asked.append(frozenset(fp32))
        return synthetic_verdict(fp32, self.culprits <= frozenset(fp32))


class Recording(InProcess):
    """In-process, declaring `workers`: asks exactly what a real pool of that size is asked; records each batch."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches: list[list[frozenset]] = []

    def run(self, plans, may_start=lambda: True):
        self.batches.append([frozenset(p) for p in plans])
        return super().run(plans, may_start)


def sequential(cands=CANDS, culprits=CULPRITS, workers=1):
    """The reference search: in-process; with `workers` > 1 the strategy is told so (what a pool of that size
    gets asked, deterministically)."""
    ex = Recording(SyntheticSpec(culprits), workers=workers)
    oracle = Oracle(None, cands, [], [], None, executor=ex)
    r = run_search(oracle, "auto")
    r.batches = ex.batches
    return r, oracle


def batched_plan(reference) -> frozenset:
    """A plan the reference search judged inside a batch of several (so a pool judges it beside another)."""
    return next(b[0] for b in reference.batches if len(b) > 1)


def test_batch_hint_goes_through_the_executor_and_counts_rounds():
    base, base_oracle = sequential()
    ev = Counting()
    oracle = Oracle(None, CANDS, [], [], None, executor=InProcess(evaluate=ev, workers=4))
    r = run_search(oracle, "auto")
    assert r.fp32 == base.fp32 == CULPRITS and r.minimal  # the same answer as sequential
    assert r.evaluations["new"] <= 1.6 * base.evaluations["new"]
    assert len(ev.asked) == len(set(ev.asked)) == r.evaluations["new"]  # memo: each plan sent once
    assert r.workers == 4 and r.rounds < base.evaluations["new"]


def test_memo_and_journal_answer_first_only_new_plans_are_sent():
    known = frozenset(CANDS)
    journal = DictJournal({known: Verdict.from_json(synthetic_verdict(known, True))})
    ev = Counting()
    oracle = Oracle(None, CANDS, [], [], None, journal=journal, executor=InProcess(evaluate=ev, workers=2))
    sets = [known, known - {"n1"}, known - {"n3"}, known - {"n1"}]
    verdicts = oracle.evaluate_many(sets)
    assert [v.passed for v in verdicts] == [True, True, False, True]
    assert ev.asked == [known - {"n1"}, known - {"n3"}]
    assert oracle.cached == 1 and oracle.new == 2
    assert journal.recorded == [known - {"n1"}, known - {"n3"}]
    assert oracle.evaluate_many(sets) == verdicts and len(ev.asked) == 2  # all from memory now


def test_a_batch_never_overshoots_max_evals():
    ev = Counting()
    journal = DictJournal()
    oracle = Oracle(None, CANDS, [], [], None, journal=journal, budget=Budget(max_evals=3),
                    executor=InProcess(evaluate=ev, workers=4))
    sets = [frozenset(CANDS) - {f"n{i}"} for i in range(5)]
    with pytest.raises(BudgetExhausted):
        oracle.evaluate_many(sets)
    assert oracle.new == 3 and ev.asked == sets[:3]  # the first ones in order, like a sequential run
    assert journal.recorded == sets[:3]
    with pytest.raises(BudgetExhausted):
        oracle.evaluate_many(sets[3:])
    assert oracle.evaluate_many(sets[:2])[0].passed  # known sets still answered


def test_process_pool_same_answer_as_sequential_and_deterministic():
    seq, _ = sequential()
    ref, ref_oracle = sequential(workers=2)
    with ProcessPool(SyntheticSpec(CULPRITS, latency=0.01), 2) as pool:
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        r = run_search(oracle, "auto")
    assert r.fp32 == seq.fp32 and r.minimal
    assert r.evaluations == ref.evaluations and r.rounds == ref.rounds
    assert [v.fp32 for v in oracle.history] == [v.fp32 for v in ref_oracle.history]  # deterministic order


def test_killed_worker_plan_is_retried_and_no_evaluation_is_lost(tmp_path):
    base, base_oracle = sequential(workers=2)
    victim = batched_plan(base)
    marker = tmp_path / "killed"
    journal = DictJournal()
    with ProcessPool(KillOnce(SyntheticSpec(CULPRITS, latency=0.01), victim, marker), 2) as pool:
        oracle = Oracle(None, CANDS, [], [], None, journal=journal, executor=pool)
        r = run_search(oracle, "auto")
        assert pool.retried == 1
    assert marker.exists()  # a worker really died mid-evaluation
    assert r.fp32 == base.fp32 and r.minimal and r.evaluations == base.evaluations
    assert sorted(map(sorted, journal.recorded)) == sorted(map(sorted, base_oracle.verdicts))
    assert not oracle.verdicts[victim].passed


def test_worker_exception_is_a_backend_failure_not_a_verdict():
    victim = frozenset(CANDS) - {"n0"}
    with ProcessPool(FailOn(SyntheticSpec(CULPRITS), victim), 2) as pool:
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        with pytest.raises(BackendFailure, match="injected backend failure") as info:
            oracle.evaluate_many([victim, frozenset(CANDS) - {"n1"}])
        assert info.value.exit_code == 3
        assert victim not in oracle.verdicts
        assert (frozenset(CANDS) - {"n1"}) in oracle.verdicts  # the other plan of the batch was recorded
        assert oracle.evaluate(frozenset(CANDS)).passed  # the pool still works


def test_start_from_batches_sets_together_with_start():
    """_search_from's inner search asks sets without `start`; its batch hint must add `start` like `passes`."""
    seen = []

    class BatchOnly:
        def search(self, candidates, passes, batch=None, **hints):
            sets = [frozenset(candidates)]
            seen.extend(sets)
            assert batch(sets) == [passes(s) for s in sets]
            return frozenset(candidates)

    from bisector.search.driver import _search_from

    ev = Counting()
    oracle = Oracle(None, CANDS, [], [], None, executor=InProcess(evaluate=ev, workers=2))
    start = frozenset({"n3"})
    hints = {"batch": lambda sets: [v.passed for v in oracle.evaluate_many(list(sets))]}
    _search_from(BatchOnly(), start, CANDS, oracle, hints)
    assert all(start <= s for s in ev.asked)


def test_options_check_workers_and_ray():
    from bisector.app.options import Search

    with pytest.raises(UsageError):
        Search(workers=0)
    with pytest.raises(UsageError):
        Search(ray="nonsense")
    assert Search(workers=2, ray="ray://head:10001").ray == "ray://head:10001"


def test_precision_with_two_emulate_workers_equals_in_process(tmp_path):
    from bisector.app.precision import precision

    opts = dict(val_range=["x:[1,2]"], atol=["1e-1"], cache_dir=tmp_path / "c1")
    one = precision(SEED, **opts)
    two = precision(SEED, workers=2, **{**opts, "cache_dir": tmp_path / "c2"})
    assert one.fp32_nodes == two.fp32_nodes == ["Add", "Sub"]
    assert two.minimal and two.constraints.evaluations.new <= 1.6 * one.constraints.evaluations.new


def test_planted_with_workers_finds_the_planted_set(tmp_path):
    from bisector.app.options import options_from_flags
    from bisector.app.precision import precision

    spec = planted_spec()
    r = precision(PLANTED, workers=2, no_cache=True, **options_from_flags(spec["args"]))
    assert r.fp32_nodes == sorted(spec["fp32_nodes"], key=r.fp32_nodes.index) and r.minimal


# ---------------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


def test_ray_pool_same_answer_as_sequential(ray_local):
    from bisector.search.executors import RayPool

    seq, _ = sequential()
    base, _ = sequential(workers=2)
    pool = RayPool(SyntheticSpec(CULPRITS, latency=0.01), 2)
    try:
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        r = run_search(oracle, "auto")
    finally:
        pool.close()
    assert r.fp32 == seq.fp32 and r.minimal and r.evaluations == base.evaluations


def test_ray_killed_actor_plan_is_retried(ray_local, tmp_path):
    from bisector.search.executors import RayPool

    base, base_oracle = sequential(workers=2)
    victim = batched_plan(base)
    journal = DictJournal()
    pool = RayPool(KillOnce(SyntheticSpec(CULPRITS, latency=0.01), victim, tmp_path / "killed"), 2)
    try:
        oracle = Oracle(None, CANDS, [], [], None, journal=journal, executor=pool)
        r = run_search(oracle, "auto")
        assert pool.retried == 1
    finally:
        pool.close()
    assert (tmp_path / "killed").exists()
    assert r.fp32 == base.fp32 and r.minimal and r.evaluations == base.evaluations
    assert sorted(map(sorted, journal.recorded)) == sorted(map(sorted, base_oracle.verdicts))


def test_ray_worker_exception_is_a_backend_failure(ray_local):
    from bisector.search.executors import RayPool

    victim = frozenset(CANDS)
    pool = RayPool(FailOn(SyntheticSpec(CULPRITS), victim), 1)
    try:
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        with pytest.raises(BackendFailure, match="injected backend failure"):
            oracle.evaluate(victim)
    finally:
        pool.close()


def test_batch_runs_models_in_parallel_in_config_order(tmp_path, cache_dir):
    from bisector.app.batch import load_config, run_batch
    from bisector.cli.commands.batch import parse_args

    config = tmp_path / "nightly.toml"
    config.write_text(f"""
[defaults]
args = ["--fp16", "--cache-dir", "{cache_dir}", "--atol", "1e-1", "--val-range", "x:[1,2]"]
output_dir = "out"
parallel_models = 2

[[model]]
name = "a"
path = "{SEED}"
expect_fp32 = ["Add", "Sub"]

[[model]]
name = "b"
path = "{SEED}"
args = ["--no-resume", "--no-mixed"]

[[model]]
name = "bad"
path = "{SEED}"
args = ["--workers", "0"]
""")
    result = run_batch(load_config(config), parse_args)
    assert [m.name for m in result.models] == ["a", "b", "bad"]
    assert [m.exit_code for m in result.models] == [0, 0, 2]
    assert result.models[1].fp32_nodes == ["Add", "Sub"]
    assert (tmp_path / "out" / "a" / "constraints.json").exists()
    # each worker process runs its sessions on one ORT pool (bisector.ort_pool)
    from bisector.cores import usable_cores

    n = usable_cores()
    machine = json.loads((tmp_path / "out" / "a" / "constraints.json").read_text())["machine"]
    assert machine["ort_threads"] == f"one shared pool of {n} thread{'s' if n != 1 else ''}"
    assert (tmp_path / "out" / "a" / "model.mixed.onnx").exists()
    assert not (tmp_path / "out" / "b" / "model.mixed.onnx").exists()  # the entry's --no-mixed, honoured


def test_emulate_worker_killed_mid_evaluation_loses_nothing(tmp_path):
    """The real worker (build_job + judge on emulate) killed while judging a plan of the search's first batch."""
    from bisector.app.job import open_job
    from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances
    from bisector.app.precision import JobSpec

    from bisector.fp16.plan import Plan

    flags = dict(val_range=["x:[1,2]"], atol=["1e-1"])
    job = open_job(SEED, cache_dir=tmp_path / "c", **flags)
    seq = run_search(job.oracle(), "auto")
    here = Recording(evaluate=lambda fp32: job.judge(Plan(fp32, job.catalog.candidates)).to_json(), workers=2)
    base_oracle = job.oracle()
    base_oracle.executor = here
    base = run_search(base_oracle, "auto")  # what a pool of 2 is asked
    batched = [b[0] for b in here.batches if len(b) > 1]
    assert batched and base.fp32 == seq.fp32
    spec = JobSpec(SEED, Inputs(val_range=["x:[1,2]"]), Tolerances(atol=["1e-1"]), BackendChoice(),
                   Cache(cache_dir=tmp_path / "c"), golden=job.golden.outputs, inputs_digest=job.inputs_info["digest"])
    journal = DictJournal()
    with ProcessPool(KillOnce(spec, batched[0], tmp_path / "killed"), 2) as pool:
        oracle = job.oracle(journal=journal)
        oracle.executor = pool
        r = run_search(oracle, "auto")
        assert pool.retried == 1
    job.close()
    assert (tmp_path / "killed").exists()
    assert r.fp32 == base.fp32 and r.minimal and r.evaluations == base.evaluations
    assert {frozenset(s) for s in journal.recorded} == set(base_oracle.verdicts)
    assert all(oracle.verdicts[s].passed == v.passed for s, v in base_oracle.verdicts.items())


def test_precision_on_ray_actors_equals_in_process(ray_local, tmp_path):
    from bisector.app.precision import precision

    opts = dict(val_range=["x:[1,2]"], atol=["1e-1"], cache_dir=tmp_path / "c", resume=False)
    one = precision(SEED, **opts)
    on_ray = precision(SEED, ray="auto", workers=2, **opts)  # the test's Ray instance is reused
    assert on_ray.fp32_nodes == one.fp32_nodes == ["Add", "Sub"] and on_ray.minimal


def test_cli_workers_flag(tmp_path, cache_dir):
    from .conftest import main_cli

    out = tmp_path / "o"
    assert main_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]", "--workers", "2",
                    "-o", out, "--cache-dir", cache_dir) == 0
    import json

    assert json.loads((out / "constraints.json").read_text())["fp32_nodes"] == ["Add", "Sub"]
    assert main_cli("precision", SEED, "--fp16", "--workers", "0", "--cache-dir", cache_dir) == 2


def test_only_the_first_worker_writes_the_timing_cache(monkeypatch, tmp_path):
    import bisector.app.precision as P
    from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances
    from bisector.search.executors import WORKER_INDEX

    seen = []

    class Stop(Exception):
        pass

    def fake_build_job(model, inputs, tolerances, backend, cache, **kw):
        seen.append(backend.save_timing_cache)
        raise Stop

    monkeypatch.setattr(P, "build_job", fake_build_job)
    spec = P.JobSpec(SEED, Inputs(), Tolerances(), BackendChoice(save_timing_cache=tmp_path / "t.cache"), Cache())
    for index in ("0", "1"):
        monkeypatch.setenv(WORKER_INDEX, index)
        with pytest.raises(Stop):
            spec.open()
    assert seen == [tmp_path / "t.cache", None]


def test_confirm_on_uses_workers_too(tmp_path):
    from bisector.app.precision import precision

    r = precision(SEED, val_range={"x": (1, 2)}, atol=1e-1, no_cache=True, confirm_on="emulate", workers=2)
    assert r.fp32_nodes == ["Add", "Sub"] and r.minimal and r.constraints.confirmed_on == "emulate"


def test_a_worker_that_cannot_open_the_job_is_an_error_not_a_hang(tmp_path):
    from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances
    from bisector.app.precision import JobSpec

    spec = JobSpec(tmp_path / "missing.onnx", Inputs(), Tolerances(), BackendChoice(), Cache(no_cache=True))
    with ProcessPool(spec, 2) as pool:
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        with pytest.raises(UsageError, match="could not open the job"):
            oracle.evaluate(frozenset(CANDS))


def test_ray_actor_that_cannot_open_the_job_names_the_cause(ray_local, tmp_path):
    from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances
    from bisector.app.precision import JobSpec
    from bisector.search.executors import RayPool

    spec = JobSpec(tmp_path / "missing.onnx", Inputs(), Tolerances(), BackendChoice(), Cache(no_cache=True))
    pool = RayPool(spec, 1)
    try:
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        with pytest.raises(BackendFailure, match="missing.onnx") as info:
            oracle.evaluate(frozenset(CANDS))
        assert info.value.exit_code == 3
    finally:
        pool.close()


def test_time_limit_stops_a_batch_between_plans_and_keeps_what_finished():
    import time as _time

    def slow(fp32):
        _time.sleep(0.15)
        return synthetic_verdict(fp32, CULPRITS <= fp32)

    journal = DictJournal()
    oracle = Oracle(None, CANDS, [], [], None, journal=journal, budget=Budget(time_limit=0.4),
                    executor=InProcess(evaluate=slow, workers=2))
    sets = [frozenset(CANDS) - {f"n{i}"} for i in range(8)]
    with pytest.raises(BudgetExhausted, match="time-limit"):
        oracle.evaluate_many(sets)
    assert 1 <= oracle.new < len(sets)
    assert journal.recorded == sets[:oracle.new]  # in order, each journaled


def test_driver_killed_mid_search_with_workers_resumes_from_the_journal(tmp_path, cache_dir):
    import json
    import signal
    import subprocess
    import sys
    import time as _time

    from .conftest import main_cli

    from .conftest import journal_rows

    def rows() -> int:
        return journal_rows(cache_dir)

    spec = planted_spec()
    args = [sys.executable, "-m", "bisector.cli.main", "precision", str(PLANTED), "--fp16", *spec["args"],
            "--workers", "2", "-o", str(tmp_path / "killed"), "--cache-dir", str(cache_dir)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = _time.time() + 120
    while rows() < 6 and _time.time() < deadline and proc.poll() is None:
        _time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = rows()
    assert committed >= 6 and not (tmp_path / "killed" / "constraints.json").exists()
    out = tmp_path / "resumed"
    assert main_cli("precision", PLANTED, "--fp16", *spec["args"], "--workers", "2", "-o", out,
                    "--cache-dir", cache_dir) == 0
    c = json.loads((out / "constraints.json").read_text())
    assert c["fp32_nodes"] == sorted(spec["fp32_nodes"])
    ev = c["evaluations"]
    assert ev["cached"] >= committed and rows() == ev["total"]  # nothing judged twice


def test_ray_actor_gets_the_drivers_bisector_environment(monkeypatch):
    """A Ray actor's process inherits `ray start`'s environment; the driver's BISECTOR_* settings are handed to it
    before it opens its job (the GPU run showed BISECTOR_ORT_CUDA_OPTIONS not reaching the actors)."""
    import os

    from bisector.search import executors

    monkeypatch.setenv("BISECTOR_ORT_CUDA_OPTIONS", "cudnn_conv_algo_search=HEURISTIC")
    env = executors.bisector_env()
    assert env["BISECTOR_ORT_CUDA_OPTIONS"] == "cudnn_conv_algo_search=HEURISTIC"
    monkeypatch.delenv("BISECTOR_ORT_CUDA_OPTIONS")
    seen = {}

    class Spec:
        def open(self):
            seen["options"] = os.environ.get("BISECTOR_ORT_CUDA_OPTIONS")
            return (lambda fp32: {}), (lambda: None)

    monkeypatch.setenv(executors.WORKER_INDEX, "0")  # the worker sets its index in this process: restored after
    executors._RayWorker(Spec(), 1, env)
    assert seen["options"] == "cudnn_conv_algo_search=HEURISTIC"
    monkeypatch.delenv("BISECTOR_ORT_CUDA_OPTIONS")  # the worker set it in this process: undo for other tests


# ---- the driver as one slot of a local pool (emulate: `--workers N` starts N - 1 processes) -----------------------
def test_local_slot_same_answer_as_sequential_and_both_slots_judge():
    ref, ref_oracle = sequential(workers=2)
    here = Counting()
    with ProcessPool(None, 2, local=True) as pool:
        assert len(pool.slots) == 1 and pool.workers == 2
        pool.open(SyntheticSpec(CULPRITS, latency=0.02), local=lambda fp32: (time.sleep(0.02), here(fp32))[1])
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        r = run_search(oracle, "auto")
    assert r.fp32 == ref.fp32 and r.minimal and r.evaluations == ref.evaluations
    assert {v.fp32 for v in oracle.history} == {v.fp32 for v in ref_oracle.history}
    assert 0 < len(here.asked) < r.evaluations["new"]  # the driver judged some plans, the worker the others


def test_local_slot_judges_while_a_worker_is_still_opening_its_job():
    here = Counting()
    plans = [frozenset(CANDS) - {f"n{i}"} for i in range(6)]
    with ProcessPool(None, 2, local=True) as pool:
        pool.open(SlowOpen(SyntheticSpec(CULPRITS), delay=30), local=here)
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        t0 = time.monotonic()
        verdicts = oracle.evaluate_many(plans)
        assert time.monotonic() - t0 < 20  # nobody waited for the worker
        assert not pool.slots[0].ready
    assert time.monotonic() - t0 < 25  # and closing does not wait for it either
    assert [v.passed for v in verdicts] == [not (CULPRITS & {f"n{i}"}) for i in range(6)]
    assert sorted(map(sorted, here.asked)) == sorted(map(sorted, plans))


def test_local_slot_open_requires_the_drivers_evaluate():
    with ProcessPool(None, 2, local=True) as pool:
        with pytest.raises(RuntimeError, match="local=evaluate"):
            pool.open(SyntheticSpec(CULPRITS))


def test_local_slot_killed_worker_plan_is_retried_and_nothing_is_lost(tmp_path):
    marker = tmp_path / "killed"
    victim = frozenset(CANDS) - {"n5"}
    journal = DictJournal()
    with ProcessPool(None, 2, local=True) as pool:
        pool.open(KillOnce(SyntheticSpec(CULPRITS, latency=0.05), victim, marker),
                  local=lambda fp32: (time.sleep(0.05), Counting()(fp32))[1])
        oracle = Oracle(None, CANDS, [], [], None, journal=journal, executor=pool)
        deadline = time.monotonic() + 30
        while not pool.slots[0].ready and time.monotonic() < deadline:  # the worker must get the victim
            oracle.evaluate_many([frozenset(CANDS)])
            list(pool.run([frozenset(CANDS[:1])]))  # collects the worker's "ready"
        assert pool.slots[0].ready
        verdicts = oracle.evaluate_many([victim, frozenset(CANDS) - {"n6"}, frozenset(CANDS) - {"n7"}])
        assert pool.retried == 1
    assert marker.exists()  # the worker really died judging the victim
    assert all(v.passed for v in verdicts)
    assert victim in journal.recorded and oracle.verdicts[victim].passed


def test_local_slot_error_is_the_backends_error():
    def broken(fp32):
        raise RuntimeError("driver-side backend failure")

    with ProcessPool(None, 2, local=True) as pool:
        pool.open(SlowOpen(SyntheticSpec(CULPRITS), delay=30), local=broken)
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        with pytest.raises(BackendFailure, match="driver-side backend failure") as info:
            oracle.evaluate_many([frozenset(CANDS)])
        assert info.value.exit_code == 3


def test_start_executor_emulate_threads_or_processes_gpu_processes(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    threads = start_executor("emulate", 3, None)
    monkeypatch.setenv("BISECTOR_EMULATE_SLOTS", "processes")
    emu = start_executor("emulate", 3, None)
    gpu = start_executor("ort-cuda", 2, None)
    try:
        assert isinstance(threads, ThreadSlots) and threads.workers == 3
        assert emu.wants_local and len(emu.slots) == 2 and emu.workers == 3
        assert not gpu.wants_local and len(gpu.slots) == 2 and gpu.workers == 2
        assert [s.env["CUDA_VISIBLE_DEVICES"] for s in gpu.slots] == ["0", "1"]
    finally:
        for ex in (threads, emu, gpu):
            ex.close()


# ---- thread slots (emulate's default for --workers: one loaded job shared by N evaluation threads) -------------
def test_thread_slots_run_plans_at_once_same_answer_as_sequential():
    ref, ref_oracle = sequential(workers=2)
    live, most = [0], [0]
    here = Counting()

    def slow(fp32):
        live[0] += 1
        most[0] = max(most[0], live[0])
        time.sleep(0.02)
        live[0] -= 1
        return here(fp32)

    with ThreadSlots(2) as pool:
        pool.open(None, local=slow)
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        r = run_search(oracle, "auto")
    assert r.fp32 == ref.fp32 and r.minimal and r.evaluations == ref.evaluations and r.rounds == ref.rounds
    assert {v.fp32 for v in oracle.history} == {v.fp32 for v in ref_oracle.history}
    assert most[0] == 2  # two plans were really judged at the same time


def test_thread_slot_error_is_the_backends_error_and_finished_plans_are_kept():
    victim = frozenset(CANDS) - {"n0"}
    other = frozenset(CANDS) - {"n1"}
    here = Counting()

    def evaluate(fp32):
        if fp32 == victim:
            raise RuntimeError("injected backend failure")
        return here(fp32)

    with ThreadSlots(2) as pool:
        pool.open(None, local=evaluate)
        oracle = Oracle(None, CANDS, [], [], None, executor=pool)
        with pytest.raises(BackendFailure, match="injected backend failure") as info:
            oracle.evaluate_many([victim, other])
        assert info.value.exit_code == 3
        assert victim not in oracle.verdicts and other in oracle.verdicts


def test_emulate_job_judges_alike_from_concurrent_threads(tmp_path):
    """The real emulate job shared by 4 threads (cold caches, so sessions are built concurrently) gives the
    verdicts it gives one plan at a time."""
    import json
    import random

    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.fp16.plan import Plan

    job = open_job(PLANTED, cache_dir=tmp_path / "c", **options_from_flags(planted_spec()["args"]))
    cands = job.catalog.candidates
    rng = random.Random(3)
    plans = [frozenset(rng.sample(list(cands), rng.randrange(len(cands)))) for _ in range(24)]
    ev = lambda fp32: job.judge(Plan(frozenset(fp32), cands)).to_json()  # noqa: E731
    with ThreadSlots(4) as pool:
        pool.open(None, local=ev)
        together = dict(pool.run(plans))
    job.close()
    alone_job = open_job(PLANTED, cache_dir=tmp_path / "c", **options_from_flags(planted_spec()["args"]))
    for i, fp32 in enumerate(plans):
        alone = alone_job.judge(Plan(fp32, cands)).to_json()
        assert together[i]["passed"] == alone["passed"]
        assert json.dumps(together[i]["outputs"], sort_keys=True) == json.dumps(alone["outputs"], sort_keys=True)
    alone_job.close()
