#!/usr/bin/env bash
# Issue 17, --ray: a local Ray head on the device (`ray start --head`), then parallel_gpu.py's ray-* steps with
# `--ray auto` and --backend ort-cuda, N = 1 and 2 actors (num_gpus=1 each). Needs onnxruntime-gpu and the Ray
# wheels assembled into /tmp/site (scripts/device/README.md, "Ray"). Run from .device-gpu/code/src; writes
# env.txt, ray_start.txt, parallel_ray.{json,log}, smi_samples.csv to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
# pip --target installs no `ray` console script: call its entry point. Actors are started by the raylet and get
# ITS environment (the one of `ray start`), not the driver's: export BISECTOR_ORT_CUDA_OPTIONS before this script
# (or pass it in a runtime_env) for the actors to use it.
RAY=(python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())')
T0=$(date +%s)
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  grep -m1 'model name' /proc/cpuinfo; nproc
  python3 -c 'import onnxruntime as o, torch; print(o.__version__, o.get_available_providers(), torch.__version__)'
  python3 -c 'import ray, grpc; print("ray", ray.__version__, ray.__file__, "grpc", grpc.__version__)' 2>&1 | tail -1
} 2>&1 | tee "$OUT/env.txt"
timeout 90 "${RAY[@]}" start --head --num-gpus 2 --include-dashboard=false --disable-usage-stats \
  --object-store-memory 2000000000 > "$OUT/ray_start.txt" 2>&1
echo "ray start rc=$? $(( $(date +%s) - T0 ))s"; tail -3 "$OUT/ray_start.txt"
timeout 30 python3 -c 'import ray; ray.init(address="auto", log_to_driver=False); print(ray.cluster_resources())' 2>&1 | tail -2 | tee -a "$OUT/ray_start.txt"
LEFT=$(( ${TOTAL:-540} - ($(date +%s) - T0) ))
python3 scripts/device/parallel_gpu.py all --out "$OUT/parallel_ray.json" --smi-dir "$OUT" --deadline $((LEFT - 60)) \
  --ray auto --steps ${STEPS:-ray-planted,ray-heuristic,ray-detector,base-planted,base-heuristic} 2>&1 \
  | tee "$OUT/parallel_ray.log" | cut -c1-400
timeout 20 "${RAY[@]}" stop > /dev/null 2>&1
echo "== done $(( $(date +%s) - T0 ))s"
