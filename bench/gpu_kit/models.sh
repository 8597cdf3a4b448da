#!/usr/bin/env bash
# The models bench/gpu_kit/run.sh benchmarks, each in a repository of its own
# ($KIT_HOME/models/<name>/<name>/1, so that a server loads one model): `export random` of each
# $KIT_EXPORT config (random weights, the machine's torch), a copy of each $KIT_COPY folder,
# and a float16 copy of each $KIT_FP16 model (its top-1 agreement measured on the kit's images).
# Ends by touching $KIT_HOME/models.done, or models.failed.
set -euo pipefail
trap 'touch "$KIT_HOME/models.failed"' ERR
models=$KIT_HOME/models
for config in $KIT_EXPORT; do
  dest=$models/$config-random/$config-random/1
  [ -f "$dest/model.json" ] || "$KIT_PYTHON" -m export random "$config" --to "$dest"
done
for folder in $KIT_COPY; do
  name=$(basename "$(dirname "$folder")")
  mkdir -p "$models/$name/$name" && cp -r "$folder" "$models/$name/$name/"
done
for name in $KIT_FP16; do
  dest=$models/$name-fp16/$name-fp16/1
  [ -f "$dest/model.json" ] || "$KIT_PYTHON" -m export fp16 "$models/$name/$name/1" --to "$dest" \
    --images "$KIT_HOME/files/images" --limit 16
done
date -u +%T >"$KIT_HOME/models.done"
