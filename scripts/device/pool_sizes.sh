#!/usr/bin/env bash
# Device: dddd-det's emulate search (3e-3) per pool size N and mode (shared pool / a pool per session), wall and
# peak by /usr/bin/time; $OUT/pool_sizes.log. Run from outside the source tree: MODEL=... SRC=... bash pool_sizes.sh
set -uo pipefail
LOG=$OUT/pool_sizes.log
nproc | sed 's/^/cores: /' | tee -a "$LOG"
for n in ${SIZES:-4 8 16}; do
  for mode in shared own; do
    if [ "$mode" = own ]; then export BISECTOR_SHARED_POOL=0; else unset BISECTOR_SHARED_POOL; fi
    out=$OUT/pool_${n}_$mode
    /usr/bin/time -f "wall %e s, peak %M KB" python3 "$SRC/scripts/device/pool_sizes.py" "$n" precision "$MODEL" \
      --fp16 --atol 3e-3 --rtol 3e-3 -o "$out" --no-cache > "$out.stdout" 2> "$out.stderr"
    echo "N=$n $mode: exit $? | $(tail -1 "$out.stderr") | $(grep -o "ort_threads[^,]*" "$out/constraints.json") | $(tail -1 "$out.stdout" | cut -c1-60)" | tee -a "$LOG"
  done
done
unset BISECTOR_SHARED_POOL
