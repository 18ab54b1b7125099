#!/usr/bin/env bash
# Issue 19 measurements on the device, one call (after the payload chunks were assembled; scripts/device/README.md):
# the per-op FP16 table, the thin-margin sets (found with --fp16-arithmetic storage and gpu) judged on emulate,
# emulate-gpu and ort-cuda, and (CPU=1) the CPU-variant verdicts. Run from .device-gpu/code/src with
# PYTHONPATH=/tmp/site; writes at most 7 files to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
D=docs/verification/thin
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  grep -m1 'model name' /proc/cpuinfo; nproc
  python3 -c 'import onnxruntime as o, torch; print(o.__version__, o.__file__, o.get_available_providers(), torch.__version__)'
} 2>&1 | tee "$OUT/env.txt"
python3 scripts/device/ops_table.py --out "$OUT" 2>&1 | grep -v onnxruntime | tail -n 20
echo "ops done $(( $(date +%s) - T0 ))s"
for s in sets sets_gpu; do
  [ -f $D/$s.json ] && python3 scripts/device/thin_margin.py judge --sets $D/$s.json --out "$OUT/judge_$s.json" 2>&1 | grep -v onnxruntime | cut -c1-200
done
echo "judge done $(( $(date +%s) - T0 ))s"
if [ "${CPU:-0}" = 1 ]; then
  timeout 200 python3 scripts/device/thin_margin.py cpu --sets $D/sets.json --out "$OUT/cpu_device.json" 2>&1 | cut -c1-400
fi
echo "done $(( $(date +%s) - T0 ))s"
