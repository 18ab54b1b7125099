# Twenty-fourth round (device): held-out models on emulate and ort-cuda, and a sample of the onnx wheel's node
# tests through `--backend ort-cuda`. Run from the repository root after the chunk calls (scripts/device/README.md),
# carrying .device-gpu/code and .device-gpu/models (oww/*.onnx from openwakeword 0.4.0, node/*/model.onnx from
# bench/onnx_node_sweep.py --out); writes to $OUT.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$(pwd)/.device-gpu
M=$R/models; S=$R/code/src/fixtures/constructs/sequences.onnx
cd /tmp
b() { python3 -m bisector.cli "$@"; }
pair() {  # name model flags...: emulate search, ort-cuda search, emulate's set verified on ort-cuda
  n=$1; m=$2; shift 2
  echo "== $n"
  b precision $m --fp16 "$@" --no-cache -o $OUT/e_$n 2>&1 | grep -E "^(FP32 nodes|PASSED|FAILED|bisector:)" | cut -c1-300
  b precision $m --fp16 "$@" --no-cache --backend ort-cuda -o $OUT/g_$n 2>&1 | grep -E "^(FP32 nodes|PASSED|FAILED|bisector:)" | cut -c1-300
  b verify $m --fp16 "$@" --no-cache --backend ort-cuda --constraints $OUT/e_$n/constraints.json 2>&1 | tail -2
}
pair mel $M/oww/melspectrogram.onnx --input-shapes 'input:[1,16000]' --val-range 'input:[-32768,32767]' --atol 1e-2 --rtol 1e-2
pair timer $M/oww/timer_v0.1.onnx --atol 1e-5 --rtol 1e-5
pair alexa $M/oww/alexa_v0.1.onnx --atol 1e-4 --rtol 1e-4
pair sequences $S --val-range 'x:[-1,1]' --atol 1e-3 --rtol 1e-3
echo "== node tests on ort-cuda"
ls -d $M/node/*/ | xargs -P 4 -I{} sh -c 'd={}; n=$(basename $d); timeout 120 python3 -m bisector.cli precision $d/model.onnx --fp16 --no-cache --backend ort-cuda -o /tmp/o_$n > /tmp/l_$n 2>&1; echo "$? | $n | $(grep -E "^(PASSED|FAILED|bisector:)" /tmp/l_$n | tail -1 | cut -c1-250)"; rm -rf /tmp/o_$n' > $OUT/node_gpu.txt
cut -d'|' -f1 $OUT/node_gpu.txt | sort | uniq -c
grep -v "^0 \|^2 " $OUT/node_gpu.txt | head -40
