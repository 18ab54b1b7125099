"""Evaluation executors: where the oracle's new plans are judged (issue 16).

The oracle keeps the journal, the budget and the memo in the driver process; an executor only turns plans
(frozensets of FP32 node names) into verdicts (`Verdict.to_json()` dicts). Four kinds:

- `InProcess`: judge one plan after another here (the default; `workers` may be set above 1 to *simulate* a
  pool for round counting in benchmarks — the plans still run one at a time);
- `ThreadSlots` (`--workers N` on emulate): N evaluation threads judging with the driver's own loaded job
  (caches built and held once; ONNX Runtime releases the GIL);
- `ProcessPool` (`--workers N` on GPU backends, or emulate with BISECTOR_EMULATE_SLOTS=processes): worker
  processes started with `forkserver`, each opening its own job once
  from a picklable spec and keeping the model loaded; GPU backends get N processes, one GPU each
  (CUDA_VISIBLE_DEVICES); emulate gets N - 1 processes plus the driver itself as the N-th slot (`local`), all
  sharing the cores (ORT intra-op threads = cores // N). The driver's job is already loaded and warm, so a
  round of one plan never waits for a process, and the searches' first, sequential rounds run while the
  workers are still opening their jobs: a slot gets plans only once its worker has said it is ready;
- `RayPool` (`--ray ADDRESS|auto|local`): Ray actors holding a loaded job (`num_gpus=1` for GPU backends).

What runs in a worker is a *spec*: a picklable object with `open() -> (evaluate, close)`, where
`evaluate(fp32: frozenset[str]) -> dict` is a verdict as JSON. `JobSpec` is the real one (model path and the
typed option groups: `build_job` + `judge` in the worker; it lives with the API, in bisector.app.precision);
`SyntheticSpec` (a monotone oracle with a fixed
latency standing in for an engine build) serves the benchmark and the tests; `KillOnce` wraps a spec to kill
its worker while it evaluates one plan (tests of the retry path).

Both pools stream: `run(plans, may_start)` yields `(index, verdict_json)` as each plan finishes, starts a plan
only while `may_start()` is true (the oracle's budget), retries a plan whose worker died on another worker
(at most `max_retries` times), and turns an exception raised in a worker into the backend's error (exit 3,
never an accuracy verdict) after the plans already running have finished and been yielded.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from bisector.cores import usable_cores
from bisector.errors import BackendFailure, BisectorError, UsageError

log = logging.getLogger("bisector")

Evaluate = Callable[[frozenset], dict]
GPU_BACKENDS = ("ort-cuda", "tensorrt", "tensorrt-rtx")


class Spec(Protocol):
    def open(self) -> tuple[Evaluate, Callable[[], None]]: ...


# ---------------------------------------------------------------------------------------------------- specs
@dataclass
class SyntheticSpec:
    """A monotone synthetic oracle: a plan passes iff it keeps every culprit in FP32; each evaluation sleeps
    `latency` seconds (an engine build)."""

    culprits: frozenset
    latency: float = 0.0

    def open(self) -> tuple[Evaluate, Callable[[], None]]:
        def evaluate(fp32: frozenset) -> dict:
            if self.latency:
                time.sleep(self.latency)
            return synthetic_verdict(fp32, self.culprits <= frozenset(fp32), self.latency)

        return evaluate, lambda: None


def synthetic_verdict(fp32: Iterable[str], passed: bool, seconds: float = 0.0) -> dict:
    return {"fp32": sorted(fp32), "passed": bool(passed), "worst_set": 0, "seconds": {"run": seconds},
            "outputs": {}}


@dataclass
class KillOnce:
    """Test hook: the worker that is asked to evaluate `victim` kills itself (SIGKILL) in the middle of it, once
    (`marker` records that it happened, across processes)."""

    spec: Any
    victim: frozenset
    marker: Path
    delay: float = 0.05

    def open(self) -> tuple[Evaluate, Callable[[], None]]:
        evaluate, close = self.spec.open()

        def killing(fp32: frozenset) -> dict:
            if frozenset(fp32) == self.victim:
                try:
                    fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.close(fd)
                    time.sleep(self.delay)  # mid-evaluation
                    os.kill(os.getpid(), signal.SIGKILL)
            return evaluate(fp32)

        return killing, close


@dataclass
class SlowOpen:
    """Test hook: opening the job takes `delay` seconds (a large model loading in a worker)."""

    spec: Any
    delay: float = 2.0

    def open(self) -> tuple[Evaluate, Callable[[], None]]:
        time.sleep(self.delay)
        return self.spec.open()


@dataclass
class FailOn:
    """Test hook: the worker raises `error` when asked to evaluate `victim` (a backend failing on one plan)."""

    spec: Any
    victim: frozenset
    message: str = "injected backend failure"

    def open(self) -> tuple[Evaluate, Callable[[], None]]:
        evaluate, close = self.spec.open()

        def failing(fp32: frozenset) -> dict:
            if frozenset(fp32) == self.victim:
                raise RuntimeError(self.message)
            return evaluate(fp32)

        return failing, close


# ---------------------------------------------------------------------------------------------------- errors
def _describe(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def _error(desc: tuple[str, str], where: str) -> BisectorError:
    """A worker's exception as the driver raises it: a bisector error keeps its class (a BuildFailure stays one,
    a UsageError in a worker's setup stays exit 2); anything else is the backend's failure (exit 3)."""
    import bisector.errors as errors

    name, message = desc
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, BisectorError):
        return cls(f"{where}: {message}")
    return BackendFailure(f"{where}: {name}: {message}")


# ---------------------------------------------------------------------------------------------------- executors
class Executor:
    """Turns plans into verdict dicts. `workers`: how many plans it judges at once."""

    workers: int = 1
    kind: str = "in-process"

    @staticmethod
    def _finish(error: BisectorError | None):
        """End of a `run`: raise the error a slot reported, after the plans already running were yielded."""
        if error is not None:
            raise error
        return None

    def open(self, spec: Spec) -> None:
        raise NotImplementedError

    def run(self, plans: Sequence[frozenset], may_start: Callable[[], bool] = lambda: True
            ) -> Iterator[tuple[int, dict]]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"executor": self.kind, "workers": self.workers}

    def close(self) -> None:
        pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class InProcess(Executor):
    """Judge plans here, one after another. `workers` > 1 only simulates a pool (for counting rounds)."""

    def __init__(self, spec: Spec | None = None, evaluate: Evaluate | None = None, workers: int = 1):
        if evaluate is None:
            assert spec is not None
            evaluate, self._close = spec.open()
        else:
            self._close = lambda: None
        self._evaluate = evaluate
        self.workers = workers
        self.kind = "in-process" if workers == 1 else "in-process (simulated pool)"

    def run(self, plans, may_start=lambda: True):
        for i, fp32 in enumerate(plans):
            if not may_start():
                return
            try:
                yield i, self._evaluate(frozenset(fp32))
            except BisectorError:
                raise
            except Exception as exc:
                raise _error(_describe(exc), "in-process evaluation") from exc

    def close(self) -> None:
        self._close()


class ThreadSlots(Executor):
    """`workers` plans at once in threads of this process, all judged by the driver's own evaluate (`emulate`:
    one loaded job shared by every slot — its block sessions, FP16 weight copies and FP32 reference are built
    once and held once; ONNX Runtime releases the GIL while it runs, and its sessions take concurrent runs).
    Nothing to kill or restart: a slot's exception is the backend's error, after the running plans finish."""

    kind = "threads"
    wants_local = True

    def __init__(self, workers: int, evaluate: Evaluate | None = None):
        from concurrent.futures import ThreadPoolExecutor

        if workers < 1:
            raise UsageError(f"--workers {workers}: must be at least 1")
        self.workers = workers
        self.spec = None
        self._evaluate = evaluate
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bisector-eval")

    def open(self, spec: Spec | None, local: Evaluate | None = None) -> None:
        if local is None:
            raise RuntimeError("thread slots judge in the driver: open(spec, local=evaluate)")
        self.spec, self._evaluate = spec, local

    def run(self, plans, may_start=lambda: True):
        from concurrent.futures import FIRST_COMPLETED, wait

        plans = [frozenset(p) for p in plans]
        queue = deque(range(len(plans)))
        running: dict[Any, int] = {}
        error: BisectorError | None = None
        stopped = False
        while True:
            while queue and len(running) < self.workers and error is None and not stopped:
                if not may_start():
                    stopped = True
                    break
                idx = queue.popleft()
                running[self._pool.submit(self._evaluate, plans[idx])] = idx
            if not running:
                return self._finish(error)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in sorted(done, key=running.__getitem__):  # finished together: in the order asked
                idx = running.pop(f)
                try:
                    payload = f.result()
                except BisectorError as exc:
                    error = error or exc
                except Exception as exc:  # noqa: BLE001 - the backend's error, never a verdict
                    error = error or _error(_describe(exc), "an evaluation thread")
                else:
                    yield idx, payload

    def close(self) -> None:
        self._pool.shutdown(wait=True)


PRELOAD = ["numpy", "onnx", "onnxruntime", "bisector.search.judge"]  # callers add their own (the job's modules)


WORKER_INDEX = "BISECTOR_WORKER_INDEX"  # set in every worker: a spec may treat worker 0 apart (shared files)


def _worker_main(conn, env: dict[str, str], index: int, preload: Sequence[str] = ()) -> None:  # in the worker
    """Import the heavy modules (while the driver builds its own job), wait for the spec, open it, then judge
    plans until told to stop. Nothing in the imports touches a GPU: CUDA_VISIBLE_DEVICES applies."""
    os.environ.update(env)
    os.environ[WORKER_INDEX] = str(index)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it stops the search and closes the pool
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - opening the spec reports what is really missing
            pass
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return
    if msg is None:
        return
    try:
        evaluate, close = msg[1].open()
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises it
        conn.send(("init-error", _describe(exc)))
        return
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg is None:
                break
            task, fp32 = msg
            try:
                conn.send((task, "ok", evaluate(fp32)))
            except Exception as exc:  # noqa: BLE001
                conn.send((task, "error", _describe(exc)))
    finally:
        close()


@dataclass
class _Slot:
    index: int
    process: Any = None
    conn: Any = None
    task: int | None = None  # the task id in flight (possibly of an abandoned run: its answer is dropped)
    restarts: int = 0
    dead: bool = False
    ready: bool = False  # its job is open (with a local slot, plans go only to ready workers)
    env: dict[str, str] = field(default_factory=dict)


class ProcessPool(Executor):
    """N worker processes on this machine, each with its own loaded job. See the module docstring.

    The processes start at once and import what a job needs; `spec` (here or later through `open`, when the
    driver's own job is built) is sent to each. `context`: `forkserver` (default: the modules are imported once,
    in the server, and every worker is forked from it; no CUDA is touched before a worker sets its
    CUDA_VISIBLE_DEVICES) or `spawn`."""

    kind = "processes"

    def __init__(self, spec: Spec | None, workers: int, envs: Sequence[dict[str, str]] | None = None,
                 max_retries: int = 2, max_restarts: int = 2, context: str = "forkserver",
                 preload: Sequence[str] = (), local: bool = False):
        """`local`: the driver judges plans too, as one of the `workers` slots (`workers - 1` processes
        start); its evaluate function comes with `open(spec, local=...)`."""
        import multiprocessing

        if workers < 1:
            raise UsageError(f"--workers {workers}: must be at least 1")
        self.spec = spec
        self.workers = workers
        self.local: Evaluate | None = None  # the driver's own evaluate (a slot that never dies)
        self.wants_local = bool(local)
        processes = workers - 1 if local else workers
        self.max_retries = max_retries
        self.max_restarts = max_restarts
        self._ctx = multiprocessing.get_context(context)
        self._preload = [*PRELOAD, *preload]
        if context == "forkserver":
            self._ctx.set_forkserver_preload(self._preload)
        self._ids = itertools.count()
        self.retried = 0  # plans re-sent after their worker died
        self.slots = [_Slot(i, env=dict(envs[i]) if envs else {}) for i in range(processes)]
        for s in self.slots:
            self._start(s)

    def _start(self, slot: _Slot) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_worker_main, args=(child, slot.env, slot.index, self._preload),
                              name=f"bisector-worker-{slot.index}", daemon=True)
        p.start()
        child.close()
        slot.process, slot.conn, slot.task, slot.dead, slot.ready = p, parent, None, False, False
        if self.spec is not None:
            self._send_spec(slot)

    def _send_spec(self, slot: _Slot) -> None:
        try:
            slot.conn.send(("open", self.spec))
        except (OSError, BrokenPipeError):
            pass  # its death shows up in run()

    def open(self, spec: Spec, local: Evaluate | None = None) -> None:
        """Give the workers started without a spec what to open; `local`: the driver's own evaluate, for the
        local slot (required when the pool was made with `local=True`)."""
        if self.spec is not None:
            raise RuntimeError("the pool already has a spec")
        if self.wants_local and local is None:
            raise RuntimeError("this pool judges in the driver too: open(spec, local=evaluate)")
        self.spec = spec
        self.local = local if self.wants_local else None
        for s in self.slots:
            if not s.dead:
                self._send_spec(s)

    def pids(self) -> list[int | None]:
        return [s.process.pid if s.process is not None and not s.dead else None for s in self.slots]

    def run(self, plans, may_start=lambda: True):
        from multiprocessing.connection import wait

        plans = [frozenset(p) for p in plans]
        queue: deque[int] = deque(range(len(plans)))
        owner: dict[int, int] = {}  # task id -> plan index, for this run
        attempts = [0] * len(plans)
        error: BisectorError | None = None
        stopped = False
        while True:
            if error is None and not stopped:
                for s in self.slots:
                    if not queue:
                        break
                    if s.dead or s.task is not None or (self.local is not None and not s.ready):
                        continue
                    if not may_start():
                        stopped = True
                        break
                    idx = queue.popleft()
                    task = next(self._ids)
                    try:
                        s.conn.send((task, plans[idx]))
                    except (OSError, BrokenPipeError):
                        queue.appendleft(idx)
                        continue  # the death shows up below through the sentinel
                    s.task, owner[task] = task, idx
            busy = [s for s in self.slots if s.task is not None and not s.dead]
            mine = [s for s in busy if s.task in owner]
            here = self.local is not None and bool(queue) and error is None and not stopped
            if not mine and not here and (error is not None or stopped or not queue):
                return self._finish(error)
            if not here and not busy and not [s for s in self.slots if not s.dead]:
                return self._finish(error or BackendFailure("every worker process died; no plan could be judged"))
            if here:  # the driver's slot: take the next plan now, after collecting what has already arrived
                if not may_start():
                    stopped = True
                    continue
                idx = queue.popleft()
                try:
                    payload = self.local(plans[idx])
                except BisectorError as exc:
                    error = error or exc
                except Exception as exc:  # noqa: BLE001 - the backend's error, after the running plans finish
                    error = error or _error(_describe(exc), "the driver's evaluation")
                else:
                    yield idx, payload
            watch = {}
            for s in self.slots:
                if s.dead:
                    continue
                watch[s.conn] = s
                watch[s.process.sentinel] = s
            if not watch:
                continue
            ready = wait(list(watch), timeout=0 if here else None)
            died: list[_Slot] = []
            for r in ready:
                s = watch[r]
                if r is s.process.sentinel:
                    if s not in died:
                        died.append(s)
                    continue
                try:
                    msg = s.conn.recv()
                except (EOFError, OSError):
                    if s not in died:
                        died.append(s)
                    continue
                if msg[0] == "ready":
                    s.ready = True
                    continue
                if msg[0] == "init-error":
                    error = error or _error(msg[1], f"worker {s.index} could not open the job")
                    s.task = None
                    continue
                task, status, payload = msg
                s.task = None if s.task == task else s.task
                idx = owner.pop(task, None)
                if idx is None:
                    continue  # the answer of an abandoned run
                if status == "ok":
                    yield idx, payload
                else:
                    error = error or _error(payload, f"worker {s.index} failed on a plan with {len(plans[idx])} "
                                                     "FP32 node(s)")
            for s in died:
                # drain what it sent before dying
                while True:
                    try:
                        if not s.conn.poll():
                            break
                        msg = s.conn.recv()
                    except (EOFError, OSError):
                        break
                    if msg[0] in ("ready", "init-error"):
                        s.ready = s.ready or msg[0] == "ready"
                        if msg[0] == "init-error":
                            error = error or _error(msg[1], f"worker {s.index} could not open the job")
                        continue
                    task, status, payload = msg
                    if s.task == task:
                        s.task = None
                    idx = owner.pop(task, None)
                    if idx is not None and status == "ok":
                        yield idx, payload
                    elif idx is not None:
                        error = error or _error(payload, f"worker {s.index} failed")
                lost = owner.pop(s.task, None) if s.task is not None else None
                s.process.join(timeout=1)
                code = s.process.exitcode
                try:
                    s.conn.close()
                except OSError:
                    pass
                s.task, s.dead = None, True
                if lost is not None:
                    attempts[lost] += 1
                    if attempts[lost] > self.max_retries:
                        error = error or BackendFailure(
                            f"worker {s.index} died (exit {code}) on a plan with {len(plans[lost])} FP32 node(s), "
                            f"{attempts[lost]} time(s); giving up on it")
                    else:
                        log.warning("worker %d died (exit %s) while judging a plan; retrying it elsewhere",
                                    s.index, code)
                        self.retried += 1
                        queue.appendleft(lost)
                if error is None and s.restarts < self.max_restarts:
                    s.restarts += 1
                    self._start(s)

    def close(self) -> None:
        for s in self.slots:
            if s.dead or s.process is None:
                continue
            try:
                while not s.ready and s.conn.poll():  # a "ready" not read yet (answers of abandoned runs are dropped)
                    s.ready = s.conn.recv()[0] == "ready"
            except (EOFError, OSError):
                pass
            if not s.ready:  # still opening its job (a large model loading): nothing of it to keep
                s.process.terminate()
                continue
            try:
                s.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 10
        for s in self.slots:
            if s.process is None:
                continue
            s.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if s.process.is_alive():
                s.process.terminate()
                s.process.join(timeout=5)
            try:
                s.conn.close()
            except OSError:
                pass
            s.dead = True


def bisector_env() -> dict[str, str]:
    """The BISECTOR_* variables of this process, for workers that do not inherit its environment."""
    return {k: v for k, v in os.environ.items() if k.startswith("BISECTOR_")}


class _RayWorker:
    """A Ray actor holding one loaded job (wrapped by `ray.remote` at run time, so Ray stays optional)."""

    def __init__(self, spec: Spec, index: int = 0, env: dict[str, str] | None = None) -> None:
        # An actor inherits the environment of `ray start`, not of this bisector process: the driver's BISECTOR_*
        # settings (e.g. BISECTOR_ORT_CUDA_OPTIONS) travel with the actor so the backend sees what the journal records.
        os.environ.update(env or {})
        os.environ[WORKER_INDEX] = str(index)
        self._evaluate, self._close = spec.open()

    def pid(self) -> int:
        return os.getpid()

    def evaluate(self, fp32: frozenset) -> dict:
        return self._evaluate(fp32)

    def close(self) -> None:
        self._close()


class RayPool(Executor):
    """Ray actors, each holding a loaded job. `address`: `local` (start a Ray instance here), `auto` (RAY_ADDRESS
    or the cluster this machine belongs to), or `ray://host:10001`. An already initialised Ray is reused."""

    kind = "ray"

    def __init__(self, spec: Spec | None, workers: int | None = None, address: str = "auto", gpu: bool = False,
                 cpus_per_worker: float = 1.0, max_retries: int = 2, max_restarts: int = 2):
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'bisector[ray]'") from None
        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            kw: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False}
            target = None if address == "local" else address
            if address == "auto" and os.environ.get("RAY_ADDRESS"):
                target = os.environ["RAY_ADDRESS"]  # ray://host:10001 (Ray Client) or a GCS address
            try:
                ray.init(address=target, **kw)
            except Exception as exc:  # noqa: BLE001 - a cluster that cannot be reached is the user's setting
                raise UsageError(f"--ray {address}: cannot connect to Ray ({exc})") from None
        if workers is None:
            res = ray.cluster_resources()
            workers = max(1, int(res.get("GPU", 0)) if gpu else int(res.get("CPU", 1) // cpus_per_worker))
        self.workers = workers
        self.address = address
        self.max_retries = max_retries
        self.max_restarts = max_restarts
        self.retried = 0
        self.spec = None
        self._cls = ray.remote(num_gpus=1 if gpu else 0, num_cpus=cpus_per_worker, max_restarts=0)(_RayWorker)
        self.actors: list[Any] = []
        self.restarts = [0] * workers
        if spec is not None:
            self.open(spec)

    def open(self, spec: Spec) -> None:
        """Start the actors, each opening `spec` (a Ray instance is set up before the driver's job is built)."""
        self.spec = spec
        self.actors = [self._cls.remote(spec, i, bisector_env()) for i in range(self.workers)]

    def pids(self) -> list[int]:
        return self._ray.get([a.pid.remote() for a in self.actors])

    def run(self, plans, may_start=lambda: True):
        ray = self._ray
        from ray.exceptions import RayActorError, RayTaskError

        plans = [frozenset(p) for p in plans]
        queue: deque[int] = deque(range(len(plans)))
        pending: dict[Any, tuple[int, int]] = {}  # object ref -> (slot, plan index)
        busy: set[int] = set()
        dead: set[int] = set()
        attempts = [0] * len(plans)
        error: BisectorError | None = None
        stopped = False
        while True:
            if error is None and not stopped:
                for slot in range(self.workers):
                    if not queue:
                        break
                    if slot in busy or slot in dead:
                        continue
                    if not may_start():
                        stopped = True
                        break
                    idx = queue.popleft()
                    pending[self.actors[slot].evaluate.remote(plans[idx])] = (slot, idx)
                    busy.add(slot)
            if not pending:
                if error is not None:
                    raise error
                if queue and not stopped and len(dead) == self.workers:
                    raise BackendFailure("every Ray worker died; no plan could be judged")
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            slot, idx = pending.pop(ref)
            busy.discard(slot)
            try:
                payload = ray.get(ref)
            except RayTaskError as exc:  # the backend raised in the actor
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                error = error or _error(_describe(cause), f"Ray worker {slot} failed on a plan with "
                                                          f"{len(plans[idx])} FP32 node(s)")
                continue
            except RayActorError as exc:  # the actor (its process or node) is gone
                attempts[idx] += 1
                if attempts[idx] > self.max_retries:
                    detail = str(exc).strip().splitlines()
                    error = error or BackendFailure(f"Ray worker {slot} died on a plan {attempts[idx]} time(s) "
                                                    f"({type(exc).__name__}: {' '.join(detail[-3:])[:600]})")
                else:
                    log.warning("Ray worker %d died while judging a plan; retrying it elsewhere", slot)
                    self.retried += 1
                    queue.appendleft(idx)
                if self.restarts[slot] < self.max_restarts:
                    self.restarts[slot] += 1
                    self.actors[slot] = self._cls.remote(self.spec, slot, bisector_env())
                else:
                    dead.add(slot)
                continue
            yield idx, payload

    def describe(self) -> dict[str, Any]:
        return {"executor": self.kind, "workers": self.workers, "address": self.address}

    def close(self) -> None:
        for a in self.actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
        if self._owns_ray:  # the Ray connection (or local instance) this pool set up
            self._ray.shutdown()
            self._owns_ray = False


# ---------------------------------------------------------------------------------------------------- choosing
def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def worker_envs(backend: str, workers: int) -> tuple[list[dict[str, str]], int]:
    """Per-worker environment and the ORT intra-op threads of each (emulate) for `workers` local processes."""
    if backend in GPU_BACKENDS:
        gpus = visible_gpus() or ["0"]
        if workers > len(gpus):
            log.warning("--workers %d but %d GPU(s) visible: several workers share a GPU", workers, len(gpus))
        return [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(workers)], 0
    threads = max(1, usable_cores() // workers)
    override = os.environ.get("BISECTOR_WORKER_THREADS", "")
    if override.isdigit() and int(override) > 0:  # e.g. the cores, when rounds often hold a single plan
        threads = int(override)
    # each worker keeps to its share of the cores: sessions with pools of their own (bisector.ort_pool)
    env = {"OMP_NUM_THREADS": str(threads), "BISECTOR_SHARED_POOL": "0"}
    return [dict(env) for _ in range(workers)], threads


def start_executor(backend: str, workers: int | None, ray: str | None, preload: Sequence[str] = ()
                   ) -> Executor | None:
    """The executor `--workers`/`--ray` ask for, started before the driver builds its job (worker imports, Ray
    set-up overlap the golden run); None: judge in-process, as always. Then `open(spec)` it."""
    gpu = backend in GPU_BACKENDS
    if ray is not None:
        return RayPool(None, workers, address=ray, gpu=gpu)
    if workers is None or workers <= 1:
        return None
    slots = os.environ.get("BISECTOR_EMULATE_SLOTS", "threads")
    if slots not in ("threads", "processes"):
        raise UsageError(f"BISECTOR_EMULATE_SLOTS={slots!r}: threads (default) or processes")
    if not gpu and slots == "threads":
        # one loaded job shared by N evaluation threads: no per-process start-up, caches or memory (issue 16)
        return ThreadSlots(workers)
    envs, threads = worker_envs(backend, workers)
    if not gpu and threads <= 1 and usable_cores() < 2 * workers:
        log.warning("--workers %d on %s with %d usable CPU(s): each slot gets %d thread(s); one evaluation already "
                    "keeps every core busy, so parallel slots pay only where an evaluation does not scale over cores "
                    "(docs/benchmarks.md, \"Parallel evaluation, third round\")", workers, backend, usable_cores(),
                    threads)
    # emulate: the driver is a slot too (its job is loaded anyway); a GPU backend's driver holds no GPU of its own
    return ProcessPool(None, workers, envs=envs, preload=preload, local=not gpu)


def worker_threads(executor: Executor | None, backend: str) -> int:
    """ORT intra-op threads for each worker of `executor` on `backend` (0: the backend's default)."""
    if executor is None:
        return 0
    if isinstance(executor, RayPool):
        return 0 if backend in GPU_BACKENDS else 1
    return worker_envs(backend, executor.workers)[1]
