# Twenty-seventh round (device): the model kinds issue 14 names as users' (bench/default_command.py --users):
# Stable-Diffusion-style VAE decoders at 64² and 96² latents and a 12 x 768 transformer at 512 tokens, generated
# here by bench/scale.py. Per model: one warm FP32 inference on ORT-CUDA and on the CPU, the default command on
# emulate and on ort-cuda (wall, set, evaluations, peak RSS of the process), and emulate's set verified on
# ort-cuda. Run from the repository root after the chunk calls (scripts/device/README.md), carrying
# .device-gpu/code; writes to $OUT. ONLY=<name> runs one case.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)  # this script's folder (compare_sets.py)
SRC=$(pwd)/.device-gpu/code/src
G=/tmp/users
mkdir -p $G
python3 - "$SRC/bench" "$G" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import onnx
import scale
out = sys.argv[2]
for latent in (64, 96):
    onnx.save(scale.vae_decoder_model(latent=latent), f"{out}/vae{latent}.onnx")
onnx.save(scale.transformer_model(12, 768, 512, heads=12)[0], f"{out}/tf512.onnx")
PY
cd /tmp
b() { python3 -m bisector.cli "$@"; }
infer() {  # model: warm FP32 inference, median of 5, on CUDA (TF32 off, as the backend runs) and on the CPU
  python3 - "$1" <<'PY'
import sys, time
import numpy as np, onnxruntime as ort
path = sys.argv[1]
for name, providers in (("cuda", [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]),
                        ("cpu", ["CPUExecutionProvider"])):
    s = ort.InferenceSession(path, providers=providers)
    i = s.get_inputs()[0]
    x = np.random.default_rng(0).uniform(-1, 1, [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
    s.run(None, {i.name: x})
    ts = []
    for _ in range(5):
        t = time.perf_counter(); s.run(None, {i.name: x}); ts.append(time.perf_counter() - t)
    print(f"one FP32 inference, {name}: {sorted(ts)[2] * 1e3:.1f} ms")
PY
}
timed() {  # label cmd...: wall and peak RSS on one line, then the summary lines
  t0=$(date +%s.%N)
  out=$(python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(r.stdout + r.stderr)
print("peak RSS %d MB" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024))
sys.exit(r.returncode)' "${@:2}" 2>&1); rc=$?
  t1=$(date +%s.%N)
  echo "$1: exit $rc, wall $(python3 -c "print(round($t1 - $t0, 2))") s, $(echo "$out" | grep '^peak RSS' | tail -1)"
  echo "$out" | grep -E "^(PASSED|FAILED|bisector:)|predicted ranking:" | cut -c1-300
}
pair() {  # name model flags...
  n=$1; m=$2; shift 2
  [ -n "$ONLY" ] && [ "$ONLY" != "$n" ] && return
  echo "== $n"
  infer $m
  timed "emulate" python3 -m bisector.cli precision $m --fp16 "$@" --no-cache -o $OUT/e_$n
  timed "ort-cuda" python3 -m bisector.cli precision $m --fp16 "$@" --no-cache --backend ort-cuda -o $OUT/g_$n
  b verify $m --fp16 "$@" --no-cache --backend ort-cuda --constraints $OUT/e_$n/constraints.json 2>&1 | tail -2
  python3 "$HERE/compare_sets.py" "$OUT/e_$n/constraints.json" "$OUT/g_$n/constraints.json"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
nproc
pair vae64 $G/vae64.onnx --atol 1e-2 --rtol 1e-2 --val-range "z:[-1,1]"
pair vae96 $G/vae96.onnx --atol 1e-2 --rtol 1e-2 --val-range "z:[-1,1]"
pair tf512 $G/tf512.onnx --atol 1e-1 --rtol 1e-1 --val-range "x:[-1,1]"
