# Twenty-sixth round (device): the default command before and after idle FP32 members (points.IdleFP32), on the
# same machine: the wheel of the commit before the round (.device-gpu/base/*.whl, installed to /tmp/site_base,
# ahead of /tmp/site on the path) against this round's. Per case and backend: set, evaluations, wall. Run from the
# repository root after the chunk calls (scripts/device/README.md), carrying .device-gpu/code, .device-gpu/models
# (audio/nmp.onnx; idle/ with the tiny recogniser and YOLOv8n 320n) and .device-gpu/base; writes to $OUT.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_base \
  .device-gpu/base/*.whl || exit
M=$(pwd)/.device-gpu/models
cd /tmp
run() {  # label site backend model flags...
  label=$1; site=$2; be=$3; m=$4; shift 4
  t0=$(date +%s.%N)
  PYTHONPATH=$site python3 -m bisector.cli precision $m --fp16 "$@" --no-cache --backend $be -o $OUT/$label > $OUT/$label.log 2>&1
  rc=$?; t1=$(date +%s.%N)
  python3 - "$OUT/$label/constraints.json" "$label" "$rc" "$(python3 -c "print(round($t1 - $t0, 2))")" <<'PY'
import json, sys
path, label, rc, wall = sys.argv[1:]
try:
    c = json.load(open(path))
    print(f"{label}: exit {rc}, wall {wall} s, set {len(c['fp32_nodes'])}, evaluations {c['evaluations']['new']}")
except OSError:
    print(f"{label}: exit {rc}, wall {wall} s, no constraints.json")
PY
}
case_() {  # name model flags...
  n=$1; m=$2; shift 2
  for be in emulate ort-cuda; do
    run "${n}_${be}_before" /tmp/site_base:/tmp/site $be $m "$@"
    run "${n}_${be}_after" /tmp/site $be $m "$@"
  done
  python3 - $OUT "$n" <<'PY'
import json, sys
out, n = sys.argv[1:]
sets = {}
for be in ("emulate", "ort-cuda"):
    for when in ("before", "after"):
        try:
            sets[be, when] = json.load(open(f"{out}/{n}_{be}_{when}/constraints.json"))["fp32_nodes"]
        except OSError:
            pass
same = {be: sets.get((be, "before")) == sets.get((be, "after")) for be in ("emulate", "ort-cuda")}
print(f"{n}: same set before and after: {same}")
PY
}
case_ bp-1e-2 $M/audio/nmp.onnx --input-shapes serving_default_input_2:0:[1,43844,1] --atol 1e-2 --rtol 1e-2
case_ bp-3e-3 $M/audio/nmp.onnx --input-shapes serving_default_input_2:0:[1,43844,1] --atol 3e-3 --rtol 3e-3
case_ yolov8n-3e-3 $M/idle/320n.onnx --input-shapes images:[1,3,320,320] --atol 3e-3 --rtol 3e-3
case_ tiny-rec-3e-3 $M/idle/rec.onnx --input-shapes x:[1,3,48,320] --atol 3e-3 --rtol 3e-3
