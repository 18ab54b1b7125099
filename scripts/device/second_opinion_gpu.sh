#!/usr/bin/env bash
# Device (thirtieth round): do the sets the second opinion gives hold on the GPU better than the search's own?
# For each case folder SETS/<model>_<tol>_{off,on}/constraints.json (found here with `--no-second-opinion` and with
# the default), the set judged on ort-cuda at the recorded tolerance with margin 1 (excess <= 1 holds), inputs as
# recorded. MODELS: a folder with each model as <its folder's name>/<file name> (bench/registry_models.py's cache
# layout: two models share the file name rec.onnx); JUDGES: the backends (default "ort-cuda emulate"). One line
# per set and judge to stdout.
#
#   PYTHONPATH=/tmp/site SETS=DIR MODELS=DIR bash scripts/device/second_opinion_gpu.sh
set -uo pipefail
for c in "$SETS"/*/constraints.json; do
  dir=$(dirname "$c"); case=$(basename "$dir")
  model="$MODELS/$(python3 -c "import json,sys,pathlib; p=pathlib.Path(json.load(open(sys.argv[1]))['model']); print(p.parent.name + '/' + p.name)" "$c")"
  for judge in ${JUDGES:-ort-cuda emulate}; do
    python3 -m bisector.cli verify "$model" --constraints "$c" --backend "$judge" --margin 1 --no-cache \
      --no-second-opinion --json "/tmp/so_$case.$judge.json" >/dev/null 2>"/tmp/so_$case.$judge.err"
    rc=$?
    python3 - "$case" "$judge" "$rc" "/tmp/so_$case.$judge.json" "/tmp/so_$case.$judge.err" "$c" <<'PY'
import json, sys
case, judge, rc, js, err, c = sys.argv[1:]
n = len(json.load(open(c))["fp32_nodes"])
try:
    d = json.load(open(js))
    ex = max((o.get("excess") or float("inf")) for o in d["outputs"].values())
    print(f"{case} | {judge} | exit {rc} | set {n} | excess at margin 1: {ex:.3f}")
except Exception:
    print(f"{case} | {judge} | exit {rc} | set {n} | {open(err).read()[-300:]!r}")
PY
  done
done
