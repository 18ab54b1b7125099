#!/usr/bin/env bash
# Device (after assemble.sh; ORT-CUDA wheel only): the eighteenth round's shared ORT intra-op pool
# (bisector/ort_pool.py) on the GPU machine. The `bisector` command now builds every session, ORT-CUDA's included,
# on one process-wide pool; this checks that ort-cuda searches run there and find what pools per session find,
# and what the pool does to emulate on a 16-core host (this machine's 2 cores measured it).
#
#   MODEL=path/to/common_det.onnx bash scripts/device/shared_pool_gpu.sh      (from the bisector source tree)
#
# Per case and setting (BISECTOR_SHARED_POOL unset = the command's default, the shared pool; =0 = a pool per
# session): the default command (--no-cache, fresh process, wall and peak by /usr/bin/time), its set and
# evaluations from constraints.json. Everything goes to $OUT/shared_pool_gpu.log.
set -uo pipefail
LOG=$OUT/shared_pool_gpu.log
B="python3 -m bisector.cli"
MODEL=${MODEL:?MODEL=the dddd-det model}
SRC=$(pwd)
PLANTED_ARGS=$(python3 -c 'import json; print(" ".join(json.load(open("fixtures/planted.json"))["args"]))')
# outside the source tree: its own bisector/ would shadow the installed wheel (which maps in the strategies)
WORK=$(mktemp -d); cd "$WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
nproc | sed 's/^/cores: /' | tee -a "$LOG"
cases=(
  "planted emulate|$SRC/fixtures/planted.onnx|$PLANTED_ARGS --backend emulate"
  "planted ort-cuda|$SRC/fixtures/planted.onnx|$PLANTED_ARGS --backend ort-cuda"
  "dddd-det 3e-3 emulate|$MODEL|--atol 3e-3 --rtol 3e-3 --backend emulate"
  "dddd-det 1e-2 ort-cuda|$MODEL|--atol 1e-2 --rtol 1e-2 --backend ort-cuda"
)
for c in "${cases[@]}"; do
  IFS='|' read -r label model args <<< "$c"
  for setting in shared own; do
    out=$OUT/$(echo "$label" | tr -c 'a-z0-9\n' '_')_$setting
    if [ "$setting" = own ]; then export BISECTOR_SHARED_POOL=0; else unset BISECTOR_SHARED_POOL; fi
    /usr/bin/time -f "wall %e s, peak %M KB" $B precision "$model" --fp16 $args -o "$out" --no-cache \
      > "$out.stdout" 2> "$out.stderr"
    rc=$?
    summary=$(python3 - "$out/constraints.json" <<'EOF' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
print(f"set {len(d['fp32_nodes'])} {sorted(d['fp32_nodes'])[:6]}... evals {d['evaluations']['total']} "
      f"headroom {d['headroom']} threads '{d['machine'].get('ort_threads')}' search {d['timings']['search']:.2f} s")
EOF
)
    echo "$label [$setting]: exit $rc | $(tail -1 "$out.stderr") | $summary" | tee -a "$LOG"
  done
  unset BISECTOR_SHARED_POOL
done
