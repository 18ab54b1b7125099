#!/usr/bin/env bash
# Issue 16: `--workers 1` against `--workers 2` on emulate, pinned to 2 CPU cores of the device machine (`taskset`),
# where no other job shares them (this checkout's own machine is shared with other sessions). Run from
# .device-gpu/code/src after bundle.sh's wheels are installed into /tmp/site; writes cpu_parallel.log to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# bench/ puts the source tree first on sys.path; the wheel maps strategies/ to bisector.strategies, the tree not
[ -d ../whl ] && [ ! -e bisector/strategies ] && ln -s ../strategies bisector/strategies  # only in the device copy
CORES=${CORES:-0,1}
{
  date -u; grep -m1 'model name' /proc/cpuinfo; echo "taskset -c $CORES"
  for model in ${MODELS:-transformer conv}; do
    if [ "$model" = transformer ]; then args="--model transformer ${TF_ARGS:---layers 4 --d 512 --seq 256}"
    else args="--model conv ${CONV_ARGS:---blocks 48 --size 160 --channels 32}"; fi
    taskset -c "$CORES" timeout ${LIMIT:-200} ${PYTHON:-python3} bench/parallel.py --no-table --emulate $args \
      --repeats ${REPEATS:-5} --variants ${VARIANTS:-1,2}
  done
} 2>&1 | grep -v '^search stopped' | tee "$OUT/cpu_parallel.log"
