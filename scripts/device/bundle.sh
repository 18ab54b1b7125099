#!/usr/bin/env bash
# Here: put the code a device call needs into DEST/code (ignored, inside the checkout the device tool sends):
# a wheel of bisector built from this worktree, the small wheels the device image lacks (pydantic & co.), and a
# copy of the tracked tree (fixtures, tests/data, scripts) for validate.py. Re-run before every device call.
#
#   scripts/device/bundle.sh DEST       e.g. /work/main/.device-gpu
set -euo pipefail
DEST=$1
PY=${PYTHON:-python3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$DEST/code/whl"
rm -f "$DEST"/code/whl/bisector-*.whl
"$PY" -m pip wheel -q --no-deps -w "$DEST/code/whl" "$SRC" >/dev/null
# pure-Python deps of bisector missing from the device image (numpy, onnx, typer, rich are there)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST/code/whl" pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing_extensions==4.16.0 platformdirs==4.14.7
rm -rf "$DEST/code/src" && mkdir -p "$DEST/code/src"
(cd "$SRC" && { git ls-files; git ls-files --others --exclude-standard; } | sort -u | while read -r f; do
  [ -f "$f" ] && mkdir -p "$DEST/code/src/$(dirname "$f")" && cp "$f" "$DEST/code/src/$f"; done)
du -sh "$DEST/code"
