# Twenty-third round (device): the light models and the constant_fills construct on emulate and ort-cuda.
# Run from the repository root after the chunk calls (scripts/device/README.md); writes to $OUT.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$(pwd)/.device-gpu
M=$R/models; F=$R/code/src/fixtures/constructs/constant_fills.onnx
cd /tmp
for m in light_squeezenet light_bvlc_alexnet; do
  echo "== $m"
  python3 -m bisector.cli precision $M/$m.onnx --fp16 --atol 1e-3 --rtol 1e-3 --no-cache -o $OUT/e_$m 2>&1 | tail -1
  python3 -m bisector.cli precision $M/$m.onnx --fp16 --atol 1e-3 --rtol 1e-3 --no-cache --backend ort-cuda -o $OUT/g_$m 2>&1 | tail -1
  python3 -m bisector.cli verify $M/$m.onnx --fp16 --atol 1e-3 --rtol 1e-3 --no-cache --backend ort-cuda --constraints $OUT/e_$m/constraints.json 2>&1 | tail -2
done
echo "== constant_fills"
python3 -m bisector.cli precision $F --fp16 --val-range 'x:[-1,1]' --atol 1e-3 --rtol 1e-3 --no-cache -o $OUT/e_cf 2>&1 | tail -2
python3 -m bisector.cli precision $F --fp16 --val-range 'x:[-1,1]' --atol 1e-3 --rtol 1e-3 --no-cache --backend ort-cuda -o $OUT/g_cf 2>&1 | tail -2
python3 -m bisector.cli verify $F --fp16 --val-range 'x:[-1,1]' --atol 1e-3 --rtol 1e-3 --no-cache --backend ort-cuda --constraints $OUT/e_cf/constraints.json 2>&1 | tail -3
python3 -m bisector.cli run $F --onnxrt --trt --fp16 --backend ort-cuda --val-range 'x:[-1,1]' --atol 1e-3 --rtol 1e-3 2>&1 | tail -4
