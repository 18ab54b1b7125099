#!/usr/bin/env bash
# Here: Ray wheels for the device (no registry there) as chunk folders DEST/r0, DEST/r1 for assemble.sh.
# ray[client] (version of the dev extra: 2.60.0) with its dependency closure for cp312 manylinux x86_64, minus
# what the device image already has (protobuf: onnx; packaging: pytest; click: typer; filelock: torch;
# typing_extensions: bundle.sh); tar | xz -1 (already-compressed wheels: 86 MB -> 88.5 MB, xz is only the
# container assemble.sh expects), split at 49M (the device tool counts the checkout too against 64 MiB per call).
#
#   PYTHON=/work/main/.venv/bin/python scripts/device/prepare_ray.sh /work/main/.device-gpu
set -euo pipefail
DEST=$1
PY=${PYTHON:-python3}
RAY=${RAY_VERSION:-2.60.0}
DL=$(mktemp -d)
"$PY" -m pip download -q "ray[client]==$RAY" --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DL"
rm -f "$DL"/protobuf-* "$DL"/packaging-* "$DL"/click-* "$DL"/filelock-* "$DL"/typing_extensions-*
ls "$DL"
(cd "$DL" && tar -cf - ./*.whl | xz -T0 -1 > "$DL/payload.tar.xz")
SUM=$(sha256sum "$DL/payload.tar.xz" | cut -d' ' -f1)
split -b 49M -d -a 2 "$DL/payload.tar.xz" "$DL/part."
N=$(ls "$DL"/part.?? | wc -l)
HERE=$(cd "$(dirname "$0")" && pwd)
for ((i = 0; i < N; i++)); do
  d="$DEST/r$i"; rm -rf "$d"; mkdir -p "$d"
  mv "$(printf '%s/part.%02d' "$DL" "$i")" "$d/"
  printf 'parts=%d\nsha256=%s\n' "$N" "$SUM" > "$d/MANIFEST"
  cp "$HERE/assemble.sh" "$d/"
done
rm -rf "$DL"
du -sh "$DEST"/r*
