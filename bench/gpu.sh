#!/usr/bin/env bash
# The GPU benchmark: (a), (c), (d) on a CUDA host with onnxruntime-gpu (bench/gpu.py says what each is).
#
#   bench/gpu.sh                                  ViT-B/16 at 224, random weights, exported here by export/
#   bench/gpu.sh bench/.work/model_repository/detr-r50-random/1
#                                                 ... and DETR-R50 (or any model version folder) given by path
#   DEVICE=cpu VIT_B=0 bench/gpu.sh bench/.work/model_repository/vit-ti16-random/1 \
#       GPU_BENCH_ARGS="--seconds 3 --warmup 1 --raw-seconds 1 --concurrency 1,16"
#                                                 the same protocol on the CPU provider: a dry run without a GPU
#
# It builds .venv-gpu-bench with onnxruntime-gpu (never beside onnxruntime) and the bench extra, installs wrk
# if missing (as root), exports ViT-B/16 with .venv (torch; `make` builds it) unless VIT_B=0, and writes
# bench/results/gpu-<date>-<host>-<device>.json. DETR-R50 is not exported by this script: write it
# first with `.venv/bin/python -m export random detr-r50 --to bench/.work/model_repository/detr-r50-random/1`
# (800x800, random weights) and pass the folder; detectors are posted to /detect.
# On a GPU machine without a package registry (the one lent here), use the offline kit instead:
# bench/gpu_kit/run.sh, docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
VIT_B=${VIT_B:-1}
VENV=.venv-gpu-bench
EXTRA=$([ "$DEVICE" = cuda ] && echo gpu || echo cpu)

if [ ! -f "$VENV/.installed-$EXTRA" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" uninstall -y -q onnxruntime onnxruntime-gpu >/dev/null 2>&1 || true
  "$VENV/bin/pip" install -q -e ".[$EXTRA,dev,bench]"
  rm -f "$VENV"/.installed-*
  touch "$VENV/.installed-$EXTRA"
fi
make -s bench-tools

models=()
if [ "$VIT_B" = 1 ]; then
  vit_b=bench/.work/gpu/model_repository/vit-b16-random/1
  if [ ! -f "$vit_b/model.onnx" ]; then
    make -s .venv/.installed
    .venv/bin/python -m export random vit-b16 --to "$vit_b"
  fi
  models+=("$vit_b")
fi
models+=("$@")
if [ ${#models[@]} -eq 0 ]; then
  echo "bench/gpu.sh: no model to run (VIT_B=0 and no folder given)" >&2
  exit 2
fi
# shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of options
"$VENV/bin/python" -m bench.gpu --device "$DEVICE" ${GPU_BENCH_ARGS:-} "${models[@]}"
