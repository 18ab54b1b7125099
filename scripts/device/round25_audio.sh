# Twenty-fifth round (device): three audio models no round tuned on (Basic Pitch, DNSMOS, PLCMOS), on emulate and
# ort-cuda: each search's wall, set and evaluations, and emulate's set verified on ort-cuda. Run from the
# repository root after the chunk calls (scripts/device/README.md), carrying .device-gpu/code and
# .device-gpu/models (audio/ with nmp.onnx from basic-pitch 0.4.0, sig_bak_ovr.onnx and plcmos_v2.onnx from
# speechmos 0.0.1.1); writes to $OUT. ONLY=<name> runs one case.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
M=$(pwd)/.device-gpu/models/audio
HERE=$(cd "$(dirname "$0")" && pwd)  # this script's folder (compare_sets.py)
cd /tmp
b() { python3 -m bisector.cli "$@"; }
timed() {  # label cmd...: the command's wall time on its own line, then its summary lines
  t0=$(date +%s.%N); out=$("${@:2}" 2>&1); rc=$?; t1=$(date +%s.%N)
  echo "$1: exit $rc, wall $(python3 -c "print(round($t1 - $t0, 2))") s"
  echo "$out" | grep -E "^(PASSED|FAILED|bisector:)|predicted ranking:" | cut -c1-300
}
pair() {  # name model flags...: emulate search, ort-cuda search, emulate's set verified on ort-cuda
  n=$1; m=$2; shift 2
  [ -n "$ONLY" ] && [ "$ONLY" != "$n" ] && return
  echo "== $n"
  timed "emulate" b precision $m --fp16 "$@" --no-cache -o $OUT/e_$n
  timed "ort-cuda" b precision $m --fp16 "$@" --no-cache --backend ort-cuda -o $OUT/g_$n
  b verify $m --fp16 "$@" --no-cache --backend ort-cuda --constraints $OUT/e_$n/constraints.json 2>&1 | tail -2
  python3 "$HERE/compare_sets.py" "$OUT/e_$n/constraints.json" "$OUT/g_$n/constraints.json"
}
BP="--input-shapes serving_default_input_2:0:[1,43844,1]"
pair bp-1e-2 $M/nmp.onnx $BP --atol 1e-2 --rtol 1e-2
pair dnsmos-1e-3 $M/sig_bak_ovr.onnx --input-shapes input_1:[1,144160] --atol 1e-3 --rtol 1e-3
pair dnsmos-1e-4 $M/sig_bak_ovr.onnx --input-shapes input_1:[1,144160] --atol 1e-4 --rtol 1e-4
pair plcmos-1e-5 $M/plcmos_v2.onnx --input-shapes degraded_audio:[1,1,200,257] rater_embed:[1,64] --atol 1e-5 --rtol 1e-5
pair bp-3e-3 $M/nmp.onnx $BP --atol 3e-3 --rtol 3e-3
