#!/usr/bin/env bash
# Download the GPU-only wheels (here, where pip can reach the registry), recompress them and split the payload
# into chunks small enough to travel with the device tool (64 MiB per call, tree included). See README.md.
#
#   scripts/device/prepare.sh [DEST]        DEST defaults to .device-gpu (must be git-ignored, e.g. via
#                                           .git/info/exclude, and lie inside the checkout the device tool sends)
#
# Result: DEST/dl/*.whl (the registry wheels, untouched), DEST/c0 … DEST/cN (one chunk each, ≤ 58 MiB) and
# DEST/c*/MANIFEST (part count and sha256 of the whole payload; every chunk folder carries a copy).
set -euo pipefail
DEST=${1:-.device-gpu}
PY=${PYTHON:-python3}
CHUNK=${CHUNK:-49M}
XZ_LEVEL=${XZ_LEVEL:-3}  # -3: under a minute for the ORT-GPU wheel (334 MB stored -> 198 MB); -6 took ~13 minutes here
# PKGS="onnxruntime-gpu==1.31.1" prepares the ORT-CUDA wheel alone (ort-cuda runs need no TensorRT-RTX wheels).
read -r -a PKGS <<< "${PKGS:-onnxruntime-gpu==1.31.1 tensorrt-rtx-cu13-libs==1.7.1.116 tensorrt-rtx-cu13-bindings==1.7.1.116}"
HERE=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$DEST/dl"
# The flags of the device tool's notes: cp312 manylinux x86_64 binaries, no dependencies (numpy, protobuf,
# flatbuffers, packaging and the CUDA 13 / cuDNN 9 libraries are already in the device image).
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST/dl" "${PKGS[@]}"

# Wheels are deflate-compressed; xz over *stored* wheels is ~40 % smaller (fewer device calls). Re-storing keeps
# every file byte-identical, so the wheels' RECORD hashes still hold and pip installs them unchanged.
rm -rf "$DEST/stored" && mkdir -p "$DEST/stored"
"$PY" "$HERE/restore_wheel.py" "$DEST/stored" "$DEST"/dl/*.whl
rm -f "$DEST/payload.tar.xz"
tar -C "$DEST/stored" -cf - . | xz -T0 "-$XZ_LEVEL" > "$DEST/payload.tar.xz"
rm -rf "$DEST"/c[0-9]* "$DEST/stored"
split -b "$CHUNK" -d -a 2 "$DEST/payload.tar.xz" "$DEST/part."
n=0
for p in "$DEST"/part.*; do mkdir -p "$DEST/c$n"; mv "$p" "$DEST/c$n/"; n=$((n + 1)); done
sum=$(sha256sum "$DEST/payload.tar.xz" | cut -d' ' -f1)
for ((i = 0; i < n; i++)); do printf 'parts=%d\nsha256=%s\n' "$n" "$sum" > "$DEST/c$i/MANIFEST"; done
rm -f "$DEST/payload.tar.xz"
du -sh "$DEST"/c*
echo "prepared $n chunk folder(s) in $DEST: c0..c$((n - 1))"
