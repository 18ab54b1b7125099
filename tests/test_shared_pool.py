"""One ONNX Runtime intra-op pool for every session of the `bisector` command (bisector.ort_pool).

ORT's Python binding makes the pool a decision for the whole process (once asked for, it refuses sessions with
pools of their own), so each case runs in a subprocess of its own: the test process keeps per-session pools.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .conftest import PLANTED

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BISECTOR_SHARED_POOL"}
    env.update(extra)
    return env


def _precision(out: Path, **env: str) -> dict:
    args = json.loads((ROOT / "fixtures" / "planted.json").read_text())["args"]
    # cwd elsewhere than the source tree: where bisector is installed from a wheel (the GPU machine) the tree's
    # own `bisector/` would shadow it and lack the strategies the wheel maps in
    r = subprocess.run([sys.executable, "-m", "bisector.cli", "precision", str(PLANTED), *args, "-o", str(out),
                        "--no-cache"], capture_output=True, text=True, env=_env(**env), cwd=out.parent, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "constraints.json").read_text())


def test_the_command_shares_one_pool_and_finds_what_pools_per_session_find(tmp_path):
    shared = _precision(tmp_path / "shared")
    own = _precision(tmp_path / "own", BISECTOR_SHARED_POOL="0")
    assert shared["machine"]["ort_threads"].startswith("one shared pool")
    assert own["machine"]["ort_threads"].startswith("a pool per session")
    assert sorted(shared["fp32_nodes"]) == sorted(own["fp32_nodes"])
    assert shared["evaluations"] == own["evaluations"]
    assert shared["headroom"] == own["headroom"]  # the same numbers, not only the same verdicts


# Every kind of session bisector builds, on the pool the process chose: the golden run, the emulator's block and
# node sessions (random plans), the converter of the background writer (`on_this_thread`) and of the search.
_EVERY_SESSION = r"""
import sys
import numpy as np
from bisector import ort_pool
from bisector.backends.emulate.backend import EmulateBackend
from bisector.fp16 import fastcast
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog
from bisector.model.golden import run_reference_model
from bisector.model.inputs import generate_inputs

out = {}
fixtures = sys.argv[2]
cases = {"planted": (f"{fixtures}/planted.onnx", {"x": (0, 1)}, {}),
         "cnn": (f"{fixtures}/exported/cnn.onnx", {}, {}),
         "encoder": (f"{fixtures}/exported/encoder.onnx", {"ids": (0, 999), "mask": (1, 1)},
                     {"ids": (1, 32), "mask": (1, 32)})}
for name, (path, ranges, shapes) in cases.items():
    cat = Catalog.load(path)
    rng = np.random.default_rng(0)
    feeds = generate_inputs(cat, ranges, shapes)[0]
    for k, v in run_reference_model(cat, [feeds])[0].items():
        out[f"{name}/golden/{k}"] = v
    be = EmulateBackend(block_size=3)
    be.open(cat)
    for j, p in enumerate(np.linspace(0.1, 0.9, 4)):
        plan = Plan(frozenset(c for c in cat.candidates if rng.random() < p), cat.candidates)
        for k, v in be.run(plan, feeds).items():
            out[f"{name}/plan{j}/{k}"] = v
    be.close()
a = np.random.default_rng(1).normal(0, 3e4, 100_000).astype(np.float32)
out["round"] = fastcast.round_half(a)
with fastcast.on_this_thread():
    out["round_alone"] = fastcast.round_half(a)
    out["half_alone"] = fastcast.to_half(a)
print(ort_pool.describe())
np.savez(sys.argv[1], **out)
"""


def test_every_session_kind_builds_on_the_shared_pool_and_computes_the_same_bits(tmp_path):
    results = {}
    for setting in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", _EVERY_SESSION, str(tmp_path / f"{setting}.npz"),
                            str(ROOT / "fixtures")], capture_output=True, text=True,
                           env=_env(BISECTOR_SHARED_POOL=setting), cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.startswith("one shared pool" if setting == "1" else "a pool per session"), r.stdout
        results[setting] = dict(np.load(tmp_path / f"{setting}.npz"))
    assert results["1"].keys() == results["0"].keys()
    assert len(results["1"]) >= 18  # 3 models x (golden + 4 plans) + 3 conversions
    for k, v in results["1"].items():
        assert v.tobytes() == results["0"][k].tobytes(), k
    a = np.random.default_rng(1).normal(0, 3e4, 100_000).astype(np.float32)
    assert results["1"]["round_alone"].tobytes() == a.astype(np.float16).astype(np.float32).tobytes()


_HOST_PROGRAM = r"""
import sys
import numpy as np, onnxruntime as ort
import bisector
from bisector import ort_pool
from onnx import TensorProto, helper

g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
ort.InferenceSession(m, opts, providers=["CPUExecutionProvider"])
r = bisector.precision(sys.argv[1], atol=1e-1, rtol=1e-1, val_range={"x": (0, 1)}, max_evals=5)
ort.InferenceSession(m, opts, providers=["CPUExecutionProvider"])  # the program's own session, after bisector's
print(ort_pool.shared(), len(r.fp32_nodes))
"""


def test_a_program_using_the_api_keeps_its_own_sessions_working(tmp_path):
    """Through the API the process is the host program's: bisector leaves its pools per session (a shared pool
    would make ORT refuse the program's own sessions from then on)."""
    r = subprocess.run([sys.executable, "-c", _HOST_PROGRAM, str(PLANTED)], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[0] == "False"


def test_worker_processes_keep_to_their_share_of_the_cores():
    from bisector.search.executors import worker_envs

    envs, threads = worker_envs("emulate", 2)
    assert all(e["BISECTOR_SHARED_POOL"] == "0" for e in envs)
    assert all(e["OMP_NUM_THREADS"] == str(threads) for e in envs)


def test_an_onnxruntime_without_the_shared_pool_keeps_pools_per_session(monkeypatch):
    """Where ONNX Runtime cannot make the pool (a build without it), the command's sessions keep pools of their
    own rather than failing. In this process: the stand-in refuses, so no pool is made here."""
    import onnxruntime as ort

    from bisector import ort_pool

    def refuse(*args):
        raise RuntimeError("not in this build")

    monkeypatch.setattr(ort, "set_global_thread_pool_sizes", refuse)
    monkeypatch.setattr(ort_pool, "_STATE", {})
    monkeypatch.delenv("BISECTOR_SHARED_POOL", raising=False)
    ort_pool.own_process()
    assert ort_pool.shared() is False
    assert ort_pool.describe().startswith("a pool per session")
    opts = ort_pool.session_options(3)
    assert opts.use_per_session_threads and opts.intra_op_num_threads == 3


def test_the_installed_command_is_the_entry_that_owns_its_process():
    """The `bisector` script and `python -m bisector.cli` both go through `entry` (the shared pool); `main` alone
    would leave the command's sessions on pools of their own."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["bisector"] == "bisector.cli.main:entry"
    assert "entry()" in (ROOT / "bisector" / "cli" / "__main__.py").read_text()
