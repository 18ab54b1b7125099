#!/usr/bin/env bash
# On the device machine: collect the payload chunks prepared by prepare.sh, one device call per chunk folder (or
# several folders per call while they fit in 64 MiB), and install the wheels once every part is there.
#
#   bash scripts/device/assemble.sh .device-gpu/c0 [.device-gpu/c1 ...]
#
# Parts are copied to $WORK (default /tmp/bisector-device), which lives as long as the machine stays warm (30 s
# after a call): make the calls back to back. When the last part arrives the payload is checked against the
# MANIFEST's sha256, unpacked and installed with `pip install --no-deps --target $SITE` (default /tmp/site);
# then `export PYTHONPATH=$SITE` in each later call. Prints READY when $SITE is complete. Calling it again with
# parts already there is harmless; a fresh machine (or a lost part) says which parts are missing.
set -euo pipefail
WORK=${WORK:-/tmp/bisector-device}
SITE=${SITE:-/tmp/site}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
for d in "$@"; do
  [ -f "$d/MANIFEST" ] || { echo "assemble: $d has no MANIFEST (was it named in carry?)" >&2; exit 2; }
  if [ -f "$WORK/MANIFEST" ] && ! cmp -s "$d/MANIFEST" "$WORK/MANIFEST"; then
    echo "assemble: $d belongs to another payload than the parts in $WORK; starting over" >&2
    rm -f "$WORK"/part.* "$WORK/MANIFEST"
  fi
  cp "$d/MANIFEST" "$WORK/MANIFEST"
  for p in "$d"/part.*; do
    cp "$p" "$WORK/$(basename "$p").tmp" && mv "$WORK/$(basename "$p").tmp" "$WORK/$(basename "$p")"
    echo "assemble: got $(basename "$p") ($(du -h "$p" | cut -f1))"
  done
done
[ -f "$WORK/MANIFEST" ] || { echo "assemble: no parts yet" >&2; exit 2; }
parts=$(sed -n 's/^parts=//p' "$WORK/MANIFEST")
sum=$(sed -n 's/^sha256=//p' "$WORK/MANIFEST")
missing=()
for ((i = 0; i < parts; i++)); do
  f=$(printf '%s/part.%02d' "$WORK" "$i")
  [ -f "$f" ] || missing+=("c$i")
done
if [ -f "$SITE/.bisector-device-$sum" ]; then echo "READY (already installed in $SITE)"; exit 0; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "assemble: $((parts - ${#missing[@]})) of $parts parts here; still to send: ${missing[*]}"
  exit 0
fi
cat "$WORK"/part.?? > "$WORK/payload.tar.xz"
echo "$sum  $WORK/payload.tar.xz" | sha256sum -c --quiet - || { echo "assemble: checksum mismatch" >&2; exit 3; }
rm -f "$WORK"/part.??
rm -rf "$WORK/wheels" && mkdir -p "$WORK/wheels"
xz -dc "$WORK/payload.tar.xz" | tar -x -C "$WORK/wheels"
rm -f "$WORK/payload.tar.xz"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WORK"/wheels/*.whl
rm -rf "$WORK/wheels"
touch "$SITE/.bisector-device-$sum"
echo "READY: $(ls "$SITE" | grep -c dist-info) distributions in $SITE"
