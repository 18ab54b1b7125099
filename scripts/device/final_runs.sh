#!/usr/bin/env bash
# Issues 19 (final code), 17 (parallel evaluation on one GPU) and 14 (ort-cuda cost) in one device call, after the
# onnxruntime-gpu chunks were assembled (scripts/device/README.md). Run from .device-gpu/code/src; writes 7 files
# to $OUT: env.txt, pytest_gpu.txt, issue19_final.{json,log}, parallel_gpu.{json,log}, smi_samples.csv.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T0=$(date +%s)
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  grep -m1 'model name' /proc/cpuinfo; nproc
  python3 -c 'import onnxruntime as o, torch; print(o.__version__, o.get_available_providers(), torch.__version__)'
  python3 -c 'import ray; print("ray", ray.__version__)' 2>&1 | tail -1
} 2>&1 | tee "$OUT/env.txt"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_ort_cuda.py > "$OUT/pytest_gpu.txt" 2>&1; tail -2 "$OUT/pytest_gpu.txt"
echo "== issue 19 $(( $(date +%s) - T0 ))s"
timeout ${I19_LIMIT:-200} python3 scripts/device/issue19_final.py --out "$OUT/issue19_final.json" --parallel 6 2>&1 \
  | grep -v '^\s*$' | tee "$OUT/issue19_final.log" | cut -c1-300
echo "== issue 17/14 $(( $(date +%s) - T0 ))s"
LEFT=$(( ${TOTAL:-560} - ($(date +%s) - T0) ))
python3 scripts/device/parallel_gpu.py all --out "$OUT/parallel_gpu.json" --smi-dir "$OUT" --deadline $((LEFT - 60)) \
  --steps ${STEPS:-inference,planted,detector,heuristic,emulate} 2>&1 | tee "$OUT/parallel_gpu.log" | cut -c1-400
echo "== done $(( $(date +%s) - T0 ))s"
