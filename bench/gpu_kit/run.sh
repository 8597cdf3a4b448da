#!/usr/bin/env bash
# The command of every GPU-machine call (docs/gpu.md gives the sequence): the same command each
# time, only the call's `carry` (one part folder) changes.
#
#   bash bench/gpu_kit/run.sh
#
# 1. collect: the part carried this call joins those of earlier calls in $KIT_HOME (default
#    /tmp/gpu-kit, kept while the machine stays warm); what is complete is cut out and checked,
#    and each complete group of wheels installed (serve: the server's stack; ort: onnxruntime-gpu).
# 2. once the serve group is in: the models are exported in the background (setsid, so they
#    outlive the call) with the machine's own torch, and its onnxruntime 1.30 for the parity
#    check (bench/gpu_kit/models.sh).
# 3. once ONNX Runtime is in too: the kit's onnxruntime-gpu must be the one imported and get
#    CUDA (bench.gpu_kit verify); then bench.gpu with the Python load generator, results in $OUT.
#
# The environment changes what is done (the CPU dry run, tests/bench/test_gpu_kit.py, sets them):
#   KIT_TARGET (cp312-gpu)  KIT_PARTS (.gpu-kit/$KIT_TARGET/parts)  KIT_HOME (/tmp/gpu-kit)
#   KIT_PYTHON (python3)    KIT_DEVICE (cuda)   KIT_EXPORT ("vit-b16 detr-r50": `export random` configs)
#   KIT_COPY (model version folders benchmarked as they are)   KIT_FP16 (models also run in float16)
#   KIT_BENCH_ARGS (bench.gpu's protocol)   KIT_WAIT (seconds to wait for the exports, 300)
set -uo pipefail
cd "$(dirname "$0")/../.."
export KIT_TARGET=${KIT_TARGET:-cp312-gpu}
export KIT_HOME=${KIT_HOME:-/tmp/gpu-kit}
export KIT_PYTHON=${KIT_PYTHON:-python3}
export KIT_EXPORT=${KIT_EXPORT-vit-b16 detr-r50}
export KIT_COPY=${KIT_COPY-}
export KIT_FP16=${KIT_FP16-vit-b16-random}
PARTS=${KIT_PARTS:-.gpu-kit/$KIT_TARGET/parts}
DEVICE=${KIT_DEVICE:-cuda}
BENCH_ARGS=${KIT_BENCH_ARGS:---seconds 4 --warmup 1 --raw-seconds 1.5 --concurrency 1,8,64 --batch-sizes 1,4,16,64}
OUT=${OUT:-$KIT_HOME/out}
mkdir -p "$OUT" "$KIT_HOME"
installed() { compgen -G "$KIT_HOME/$1/.installed-*" >/dev/null; }

echo "run.sh $(date -u +%T) boot $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo ?)"  # a new boot id: parts lost
"$KIT_PYTHON" -m bench.gpu_kit collect --parts "$PARTS" --home "$KIT_HOME"
status=$?
if [ "$status" != 0 ] && [ "$status" != 3 ]; then exit "$status"; fi

if [ -e "$KIT_HOME/models.failed" ]; then  # an export failed in an earlier call: say so, start them again
  tail -n 20 "$KIT_HOME/models.log"
  rm -f "$KIT_HOME/models.failed" "$KIT_HOME/models.started"
fi
if installed site && [ ! -e "$KIT_HOME/models.started" ]; then
  touch "$KIT_HOME/models.started"
  PYTHONPATH=$KIT_HOME/site setsid nohup bash bench/gpu_kit/models.sh >"$KIT_HOME/models.log" 2>&1 </dev/null &
  echo "exports started in the background: $KIT_HOME/models.log"
fi
if ! installed site-ort; then
  [ -e "$KIT_HOME/models.log" ] && tail -n 3 "$KIT_HOME/models.log"
  exit 0  # carry the next part
fi

export PYTHONPATH=$KIT_HOME/site-ort:$KIT_HOME/site  # the kit's onnxruntime first: it shadows the machine's
"$KIT_PYTHON" -m bench.gpu_kit verify --device "$DEVICE" --home "$KIT_HOME" --report "$OUT/verify.json" || exit 1
for _ in $(seq "${KIT_WAIT:-300}"); do
  [ -e "$KIT_HOME/models.done" ] || [ -e "$KIT_HOME/models.failed" ] && break
  sleep 1
done
cp "$KIT_HOME/models.log" "$OUT/models.log"
if [ ! -e "$KIT_HOME/models.done" ]; then
  tail -n 20 "$KIT_HOME/models.log"
  echo "the exports have not finished: run this command again (no carry) in a moment"
  exit 1
fi
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
"$KIT_PYTHON" -m bench.gpu --device "$DEVICE" --loadgen python --images "$KIT_HOME/files/images" \
  --work "$KIT_HOME/work" --out "$OUT" $BENCH_ARGS "$KIT_HOME"/models/*/*/1
status=$?
tar -czf "$OUT/server-logs.tar.gz" -C "$KIT_HOME/work" logs 2>/dev/null
exit "$status"
