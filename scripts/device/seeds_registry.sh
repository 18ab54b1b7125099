#!/usr/bin/env bash
# Twenty-ninth round: issue 15's registry cases on other inputs (`bench/strategies.py --input-seed S`), every
# built-in strategy, in 2-core slots of the device machine's CPU (`taskset`, the shared pool, as the command runs
# on this checkout's 2-core machine). Run from the repository root after bundle.sh's wheels are installed into
# /tmp/site; the models in $MODELS laid out as bench/registry_models.py's cache (NAME/FILE).
#   JOBS="slanet atol = rtol = 1e-3|2;yolov8n atol = rtol = 3e-3|2" SLOTS=8 scripts/device/seeds_registry.sh
# Each job's table goes to $OUT/seed<S>_<n>.log; a free slot takes the next job in the order given (longest first).
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BISECTOR_BENCH_CACHE=${MODELS:?MODELS: the model cache}
SLOTS=${SLOTS:-8}
LIMIT=${LIMIT:-560}
IFS=';' read -r -a jobs <<< "${JOBS:?JOBS: case|seed;case|seed;...}"
grep -m1 'model name' /proc/cpuinfo > "$OUT/cpu.txt"
echo 0 > /tmp/seeds_next
for ((slot = 0; slot < SLOTS; slot++)); do
  (
    while true; do
      j=$(flock /tmp/seeds_next sh -c 'n=$(cat /tmp/seeds_next); echo $((n + 1)) > /tmp/seeds_next; echo $n')
      [ "$j" -lt ${#jobs[@]} ] || break
      case=${jobs[$j]%|*}; seed=${jobs[$j]##*|}
      taskset -c $((2 * slot)),$((2 * slot + 1)) timeout "$LIMIT" python3 bench/strategies.py --registry \
        --shared-pool --case "$case" --input-seed "$seed" > "$OUT/seed${seed}_$j.log" 2>&1
      echo "job $j rc=$? slot $slot $(date -u +%T) $case | $seed" >> "$OUT/slots.txt"
    done
  ) &
done
wait
cat "$OUT/slots.txt"
