#!/usr/bin/env bash
# Issue 19 measurements on the device, one call (after the payload chunks were assembled; scripts/device/README.md):
# the per-op FP16 table, the thin-margin sets judged on ort-cuda and on this machine's CPU, and the CPU-variant
# verdicts. Run from .device-gpu/code/src with PYTHONPATH=/tmp/site; writes at most 6 files to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
SETS=${SETS:-docs/verification/thin/sets.json}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  grep -m1 'model name' /proc/cpuinfo; nproc
  python3 -c 'import onnxruntime as o, torch; print(o.__version__, o.__file__, o.get_available_providers(), torch.__version__)'
} 2>&1 | tee "$OUT/env.txt"
python3 scripts/device/ops_table.py --out "$OUT" 2>&1 | tail -n 20
echo "ops done $(( $(date +%s) - T0 ))s"
python3 scripts/device/thin_margin.py judge --sets "$SETS" --out "$OUT/judge.json" 2>&1 | cut -c1-300
echo "judge done $(( $(date +%s) - T0 ))s"
timeout "${CPU_LIMIT:-200}" python3 scripts/device/thin_margin.py cpu --sets "$SETS" --out "$OUT/cpu_device.json" 2>&1 | cut -c1-400
echo "cpu done $(( $(date +%s) - T0 ))s"
