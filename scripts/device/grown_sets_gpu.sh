#!/usr/bin/env bash
# Thirty-fourth round: sets found with `--margin 0.5 --held-out 4 --grow-inputs 3` (bench/held_out.py --grown --save),
# judged by ORT-CUDA at margin 1 on the four input sets of the command's last held-out check (which passed on
# emulate) and on the four after them, which nothing saw; emulate on the latter beside it. Run from the repository
# root after the chunk calls and installing `.device-gpu/code/whl` into /tmp/site.
# SETS: folders `<case>/constraints.json`; MODELS: `<name>/<file>` as bench/registry_models.py's cache;
# CASES: "case=name/file=seed;..." (seed: the first seed of the last held-out check).
#   SETS=.device-gpu/gsets MODELS=.device-gpu/gmodels CASES="yolo3=yolov8n/320n.onnx=2;..." bash $0
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
IFS=';' read -r -a cases <<< "${CASES:?CASES: case=name/file=seed;...}"
source "$(dirname "$0")/verdict_line.sh"  # line FILE: one verify's verdict
for c in "${cases[@]}"; do
  case=${c%%=*}; rest=${c#*=}; model="$MODELS/${rest%%=*}"; seed=${rest##*=}
  set_=$SETS/$case/constraints.json
  [ -f "$set_" ] || { echo "$case: no set"; continue; }
  t0=$(date +%s)
  python3 -m bisector.cli verify "$model" --constraints "$set_" --backend ort-cuda --margin 1 --no-second-opinion \
    --seed "$seed" --iterations 4 --json /tmp/v_last.json > /tmp/v_last.log 2>&1
  python3 -m bisector.cli verify "$model" --constraints "$set_" --backend ort-cuda --margin 1 --no-second-opinion \
    --seed $((seed + 4)) --iterations 4 --json /tmp/v_new.json > /tmp/v_new.log 2>&1
  python3 -m bisector.cli verify "$model" --constraints "$set_" --margin 1 --no-second-opinion \
    --seed $((seed + 4)) --iterations 4 --json /tmp/v_emu.json > /tmp/v_emu.log 2>&1
  echo "$case | gpu, last held-out seeds $seed-$((seed + 3)): $(line /tmp/v_last.json) | gpu, seeds $((seed + 4))-$((seed + 7)): $(line /tmp/v_new.json) | emulate, same: $(line /tmp/v_emu.json) | $(( $(date +%s) - t0 )) s"
  grep -h "Error\|error:" /tmp/v_last.log /tmp/v_new.log | head -2
done
