#!/usr/bin/env bash
# Thirty-fourth round: `--grow-inputs` with `--backend ort-cuda` (the searches on and the held-out verdicts on the
# GPU, the held-out golden from ONNX Runtime's CPU run): DNSMOS at 1e-4 and Magika at 5e-6, --margin 0.5 --grow-inputs 2.
# Run after the chunk calls and installing .device-gpu/code/whl into /tmp/site; $1: a folder with dnsmos/ and magika/
# as bench/registry_models.py's cache. > $OUT/grow_ort_cuda.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
G=$1; cd /tmp
t0=$(date +%s)
python3 -m bisector.cli precision $G/dnsmos/sig_bak_ovr.onnx --fp16 --backend ort-cuda --input-shapes "input_1:[1,144160]" \
  --atol 1e-4 --rtol 1e-4 --margin 0.5 --grow-inputs 2 --no-cache -o /tmp/o_dn > /tmp/o_dn.log 2>&1; echo "dnsmos rc=$? $(( $(date +%s) - t0 )) s"
grep -E "FP32 nodes \(|PASSED|FAILED|WARNING|internal" /tmp/o_dn.log | cut -c1-300
python3 -c "import json;h=json.load(open('/tmp/o_dn/constraints.json'))['held_out'];print(h)"
t0=$(date +%s)
python3 -m bisector.cli precision $G/magika/model.onnx --fp16 --backend ort-cuda --input-shapes "bytes:[1,2048]" --val-range "bytes:[0,256]" \
  --atol 5e-6 --rtol 5e-6 --margin 0.5 --grow-inputs 2 --no-cache -o /tmp/o_mg > /tmp/o_mg.log 2>&1; echo "magika rc=$? $(( $(date +%s) - t0 )) s"
grep -E "FP32 nodes \(|PASSED|FAILED|WARNING|internal" /tmp/o_mg.log | cut -c1-300
python3 -c "import json;h=json.load(open('/tmp/o_mg/constraints.json'))['held_out'];print(h)"
