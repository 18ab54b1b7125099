#!/usr/bin/env bash
# Thirty-third round: sets searched on one generated input set (`--iterations 1`) and on four (`--iterations 4`),
# judged by ORT-CUDA at margin 1 on the inputs they were searched on and on four input sets neither search saw
# (seeds 5-8); the same held-out judgement on emulate beside it. Run from the repository root after the chunk
# calls and installing `.device-gpu/code/whl` into /tmp/site. SETS: folders `<case>_<iterations>/constraints.json`;
# MODELS: `<name>/<file>` as bench/registry_models.py's cache; CASES: "case=name/file;..." (case as in SETS).
#   SETS=.device-gpu/hsets MODELS=.device-gpu/hmodels CASES="yolov8n_3e-3=yolov8n/320n.onnx;..." bash $0
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
IFS=';' read -r -a cases <<< "${CASES:?CASES: case=name/file;...}"
source "$(dirname "$0")/verdict_line.sh"  # line FILE: one verify's verdict
for c in "${cases[@]}"; do
  case=${c%%=*}; model="$MODELS/${c#*=}"
  for it in 1 4; do
    set_=$SETS/${case}_$it/constraints.json
    [ -f "$set_" ] || continue
    t0=$(date +%s)
    python3 -m bisector.cli verify "$model" --constraints "$set_" --backend ort-cuda --margin 1 --no-second-opinion \
      --json /tmp/v_rec.json > /tmp/v_rec.log 2>&1
    python3 -m bisector.cli verify "$model" --constraints "$set_" --backend ort-cuda --margin 1 --no-second-opinion \
      --seed 5 --iterations 4 --json /tmp/v_held.json > /tmp/v_held.log 2>&1
    python3 -m bisector.cli verify "$model" --constraints "$set_" --margin 1 --no-second-opinion \
      --seed 5 --iterations 4 --json /tmp/v_emu.json > /tmp/v_emu.log 2>&1
    echo "$case iterations=$it | gpu searched: $(line /tmp/v_rec.json) | gpu seeds 5-8: $(line /tmp/v_held.json) | emulate seeds 5-8: $(line /tmp/v_emu.json) | $(( $(date +%s) - t0 )) s"
    grep -h "Error\|error:" /tmp/v_rec.log /tmp/v_held.log | head -2
  done
done
