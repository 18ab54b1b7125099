#!/usr/bin/env bash
# Issue 14: the default command on the generated models, pinned to 2 CPU cores of the device machine (`taskset`,
# no other job there; this checkout's own machine is shared), and an A/B of the mixed model's prewrite
# (BISECTOR_PREWRITE=0 against 1, pair by pair) on the 48-layer transformer. Run from .device-gpu/code/src after
# bundle.sh's wheels are installed into /tmp/site; writes prewrite_ab.log to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
[ -d ../whl ] && [ ! -e bisector/strategies ] && ln -s ../strategies bisector/strategies  # only in the device copy
CORES=${CORES:-0,1}
PY=${PYTHON:-python3}
{
  date -u; grep -m1 'model name' /proc/cpuinfo; echo "taskset -c $CORES"; df -h /tmp | tail -1
  taskset -c "$CORES" $PY - <<'PYEOF'
import json, os, shutil, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, "bench")
import scale
d = Path("/tmp/ab"); (d / "large").mkdir(parents=True, exist_ok=True)
m, _ = scale.transformer_model(48, 768, 64)
scale.save(m, d / "large" / "t48.onnx", external=True)
del m
for i in range(int(os.environ.get("PAIRS", "3"))):
    for pre in ("0", "1"):
        shutil.rmtree(d / "out", ignore_errors=True)
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "bisector.cli", "precision", str(d / "large" / "t48.onnx"), "--fp16",
                            "--atol", "1e-1", "--rtol", "1e-1", "--val-range", "x:[-1,1]", "-o", str(d / "out"),
                            "--no-cache"], env={**os.environ, "BISECTOR_PREWRITE": pre}, capture_output=True, text=True)
        wall = time.perf_counter() - t
        tm = json.loads((d / "out" / "constraints.json").read_text())["timings"]
        print(f"pair {i} prewrite={pre} exit {r.returncode} wall {wall:.2f} s search {tm['search']:.2f} "
              f"artifacts {tm['artifacts']:.2f} setup {tm['setup']:.2f} post/search {tm['artifacts'] / tm['search']:.0%}",
              flush=True)
PYEOF
  [ "${TABLE:-1}" = 1 ] && taskset -c "$CORES" timeout ${LIMIT:-400} $PY bench/default_command.py --repeats 2 --large ${BENCH_ARGS:-}
} 2>&1 | tee "$OUT/prewrite_ab.log"
