# patchserve: each target sets up what it needs on a fresh machine. Every target a user calls:
#   make serve        serving environment only (no torch), then the server on $PATCHSERVE_HOST:$PATCHSERVE_PORT; ORT=gpu: onnxruntime-gpu
#   make test         training + hf + dev environment (torch 2.13.0 first), the tools, then make lint's checks, then the whole suite, every marker
#   make test-fast    the fast subset (no slow or docker tests): a plain pytest
#   make lint         ruff check ., ruff format --check . (Python files only) and mypy ([tool.mypy] in pyproject.toml)
#   make typecheck    mypy alone: service/ at --strict's flags, export/ and models/ fully annotated ([tool.mypy] in pyproject.toml)
#   make tools        Debian's prometheus (promtool) and chromium (chromedriver) for the operation tests (installed as root, else named)
#   make models       retrain and re-export every committed model, in this order (the model targets below, then the pictures)
#   make model-vit-digits   train the digits ViT (runs/vit-digits), export model_repository/vit-digits/1
#   make model-detr-digits  train DETR on the synthetic canvases (issue 21's recipe, resumable), export model_repository/detr-digits/3
#   make model-detr-digits-calibrated  Platt-scale version 3's scores on val, write model_repository/detr-digits/4
#   make model-vit-cifar10  train the CIFAR-10 photo ViT (runs/vit-cifar10; ~90 min on 2 free cores), export model_repository/vit-cifar10/1
#   make model-cnn-cifar10  train the reference CNN, DeiT's teacher (runs/cnn-cifar10), copy its metrics and curves to docs/cnn-cifar10/
#   make model-deit-cifar10  train the distilled ViT from that teacher (runs/deit-cifar10; 100 epochs, resumable), export model_repository/vit-cifar10/2
#   make model-deit-cifar10-finer  fine-tune version 2 on a grid twice as fine (10 epochs), export model_repository/vit-cifar10/3
#   make digits-experiments  the reference experiments on the digits ViT, five seeds each (docs/digits-experiments/)
#   make pictures     render examples/chelsea.vit-cifar10.png and examples/canvas.detr-digits.png with the models in model_repository/
#   make hf-parity    import random-weight versions of three hub checkpoints and print their parity (runs/hf-repository/)
#   make bench        the side-by-side benchmark (bench/run.py); not part of make test. BENCH_ARGS=... passes options
#   make profile      where patchserve's time goes under load (bench/profile.py); PROFILE_ARGS=... passes options
#   make bench-tracing    what OpenTelemetry tracing costs at c=16, off and on in interleaved rounds (bench/tracing.py)
#   make bench-detectors  one end-to-end run per DETR-family preset (bench/hf_detectors.py, docs/detectors.md)
#   make bench-detr-buckets  DETR-R50 at 800: padding buckets vs exact-shape batching (bench/detr_buckets.py, docs/detector-batching.md)
#   make bench-tools  wrk, the benchmarks' load generator (Debian's package), when missing and we may
#   make gpu-kit      the offline kit for the GPU machine (docs/gpu.md): locked wheels in parts of <= 38 MiB, in .gpu-kit/
#   make clean        remove .venv-serve, .venv, runs/, .pytest_cache, .mypy_cache, bench/.work, .venv-gpu-bench and .gpu-kit
# and the files the targets above build, for one step alone:
#   make .venv/.installed             the dev environment only (torch 2.13.0, then .[cpu,train,hf,dev,heic,otel])
#   make .venv-serve/.installed-cpu   the serving environment only (.venv-serve/.installed-gpu: with onnxruntime-gpu)
#   make bench/.work/model_repository/vit-ti16-random/1/model.onnx   ViT-Ti/16 with random weights, the benchmarks' model

PYTHON ?= python3
SERVE_VENV := .venv-serve
DEV_VENV := .venv
# onnxruntime for the CPU; `make serve ORT=gpu` installs onnxruntime-gpu instead (never both).
ORT ?= cpu
PIP_QUIET ?= -q

.PHONY: serve test test-fast models lint typecheck clean tools hf-parity bench profile bench-tools gpu-kit bench-tracing bench-detectors \
	bench-detr-buckets \
	$(MODEL_TARGETS)

$(SERVE_VENV)/.installed-$(ORT): pyproject.toml
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install $(PIP_QUIET) --upgrade pip
	$(SERVE_VENV)/bin/pip uninstall -y -q onnxruntime onnxruntime-gpu >/dev/null 2>&1 || true
	$(SERVE_VENV)/bin/pip install $(PIP_QUIET) -e '.[$(ORT)]'
	rm -f $(SERVE_VENV)/.installed-*
	touch $@

$(DEV_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DEV_VENV)
	$(DEV_VENV)/bin/pip install $(PIP_QUIET) --upgrade pip
	# torch first, from the local CPU wheel: a bare `torch` requirement would pull a CUDA build.
	$(DEV_VENV)/bin/pip install $(PIP_QUIET) torch==2.13.0
	$(DEV_VENV)/bin/pip install $(PIP_QUIET) -e '.[cpu,train,hf,dev,heic,otel]'
	touch $@

# The tests' real servers also need the otel extra (the tracing test exports their spans); a plain
# `make serve` leaves it out. Installing another ORT build removes this stamp, so it is redone.
$(SERVE_VENV)/.installed-cpu-otel: $(SERVE_VENV)/.installed-cpu
	$(SERVE_VENV)/bin/pip install $(PIP_QUIET) -e '.[cpu,otel]'
	touch $@

serve: $(SERVE_VENV)/.installed-$(ORT)
	$(SERVE_VENV)/bin/python -m service

# Tools the operation tests run: a real Prometheus server and promtool, both from Debian's
# prometheus package, and headless Chromium with its chromedriver for the playground's browser
# test (Debian's chromium and chromium-driver; Selenium uses that driver, never downloads one).
# apt-get, as root; elsewhere install them yourself, or those tests skip — under CI=true they
# fail instead. hadolint and kubernetes-validate come with the dev extra.
TOOL_PACKAGES := prometheus:prometheus prometheus:promtool chromium:chromium chromium-driver:chromedriver
tools:
	@missing=""; for pair in $(TOOL_PACKAGES); do \
	  command -v "$${pair#*:}" >/dev/null || missing="$$missing $${pair%%:*}"; \
	done; \
	missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	if [ -n "$${missing# }" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's packages: $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing tools: install Debian's packages $$missing"; \
	  fi; \
	fi

# The whole suite, every marker (slow and docker included). The docker tests need an engine
# (.ci/run starts one); the compose files are checked with the docker CLI alone.
test: $(DEV_VENV)/.installed $(SERVE_VENV)/.installed-cpu-otel tools
	$(DEV_VENV)/bin/ruff check .
	$(DEV_VENV)/bin/ruff format --check .
	$(DEV_VENV)/bin/mypy
	$(DEV_VENV)/bin/pytest -m "" -p no:cacheprovider --durations=30

# The fast subset (no slow or docker tests).
test-fast: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/pytest

# One target per committed model or committed result; `make models` runs them all, one at a time in
# this order (the pictures last: they are drawn by the models just exported), even under -j.
MODEL_TARGETS := model-vit-digits model-detr-digits model-detr-digits-calibrated model-vit-cifar10 model-cnn-cifar10 model-deit-cifar10 \
	model-deit-cifar10-finer digits-experiments \
	pictures
models: $(MODEL_TARGETS)
.NOTPARALLEL: models

model-vit-digits: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.train_digits --out runs/vit-digits
	$(DEV_VENV)/bin/python -m export checkpoint runs/vit-digits/checkpoint.pt --to model_repository/vit-digits/1 --no-attention

# detr-digits version 3 (issues 18 and 21): the recipe chosen in docs/detr-digits-experiments/ (version 2's,
# on distorted train digits), trained with the pixel mask on bucketed canvases (19,000 steps, about 5.5 h on
# two quiet threads at about 1 s a step; resumable: rerun the same command after a stop). Versions 1 and 2
# stay in model_repository/ for the comparison; config.json serves 1, 3 and 4 (version 4: the next target).
DETR_RECIPE := served-frame-focal-100q-dn5-6dec-long-distorted
model-detr-digits: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.detr_experiments --run $(DETR_RECIPE) --threads 2
	$(DEV_VENV)/bin/python -m export checkpoint runs/detr-experiments/$(DETR_RECIPE)/checkpoint.pt \
		--to model_repository/detr-digits/3

# detr-digits version 4 (issue 21): version 3's graph with its class scores Platt-scaled, fit on the val split
# (models/calibrate_detector.py, about 30 s; docs/detr-recipe.md, "Calibrated scores").
model-detr-digits-calibrated: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.calibrate_detector model_repository/detr-digits/3 --to model_repository/detr-digits/4 \
		--docs docs/detr-digits-experiments/calibrated

# CIFAR-10 photo ViT (~90 min on 2 free CPU cores).
model-vit-cifar10: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.train_cifar --arch vit --out runs/vit-cifar10
	$(DEV_VENV)/bin/python -m export checkpoint runs/vit-cifar10/checkpoint.pt --to model_repository/vit-cifar10/1

# Its reference CNN, which also teaches the distilled ViT: the committed teacher,
# models/weights/cnn-cifar10.pt (models/weights/README.md), is this command's checkpoint.pt (101 min on one quiet thread; 221 min beside other runs).
model-cnn-cifar10: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.train_cifar --arch cnn --out runs/cnn-cifar10 --threads 1
	mkdir -p docs/cnn-cifar10 && cp runs/cnn-cifar10/metrics.json runs/cnn-cifar10/training_curves.png docs/cnn-cifar10/
	cp runs/cnn-cifar10/checkpoint.pt models/weights/cnn-cifar10.pt

# vit-cifar10 version 2: the same ViT with DeiT's distillation token, taught by the committed CNN
# (issue 22; 12.3 h of training on this 2-core CPU, mostly on one thread beside other runs (docs/models.md);
# resumable: rerun the same command after a stop).
model-deit-cifar10: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.train_cifar --arch deit --teacher models/weights/cnn-cifar10.pt \
		--out runs/deit-cifar10 --threads 1 --epochs 100 --erase 0.25 --resume
	$(DEV_VENV)/bin/python -m export checkpoint runs/deit-cifar10/checkpoint.pt --to model_repository/vit-cifar10/2

# vit-cifar10 version 3: version 2's weights, recovered from its committed graph (its training
# checkpoint is not kept), fine-tuned 10 epochs with the image enlarged 2x inside the model (an 8x8
# grid instead of 4x4: DeiT's fine-tuning at a higher resolution; docs/models.md); about 70 min on
# both threads of this 2-core CPU.
model-deit-cifar10-finer: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.onnx_weights model_repository/vit-cifar10/2 --out runs/deit-cifar10-v2/checkpoint.pt
	$(DEV_VENV)/bin/python -m models.train_cifar --arch deit --teacher models/weights/cnn-cifar10.pt \
		--init runs/deit-cifar10-v2/checkpoint.pt --upsample 2 --out runs/deit-v2-upsample2 --threads 2 \
		--epochs 10 --lr 1e-4 --warmup-epochs 1 --erase 0.25 --seed 1 --eval-every 2
	$(DEV_VENV)/bin/python -m export checkpoint runs/deit-v2-upsample2/checkpoint.pt --to model_repository/vit-cifar10/3

# The digits experiments (docs/models.md, "Reference experiments on the digits ViT").
digits-experiments: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m models.digits_experiments --out docs/digits-experiments

# The pictures of the README (the detections) and docs/models.md (both), drawn by the models in model_repository/.
pictures: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python examples/render.py examples/chelsea.png
	$(DEV_VENV)/bin/python examples/render.py examples/canvas.png --model detr-digits --route detect

BENCH_MODEL := bench/.work/model_repository/vit-ti16-random/1

$(DEV_VENV)/.installed-bench: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/pip install $(PIP_QUIET) -e '.[bench]'  # on top of what .installed put there
	touch $@

# wrk, the load generator (Debian's package); installed when missing and we may.
bench-tools:
	@command -v wrk >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq wrk; \
	  else echo "bench needs wrk: sudo apt-get install wrk" >&2; exit 1; fi; }

# ViT-Ti/16 at 224 with random weights, exported by export/ (never committed: bench/.work is ignored).
$(BENCH_MODEL)/model.onnx: | $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m export random vit-ti16 --to $(BENCH_MODEL)

bench: $(DEV_VENV)/.installed-bench bench-tools $(BENCH_MODEL)/model.onnx
	$(DEV_VENV)/bin/python -m bench.run $(BENCH_ARGS)

# On a quiet machine only: it voids rounds where other processes took CPU. TRACING_ARGS=... passes options.
bench-tracing: $(DEV_VENV)/.installed-bench bench-tools
	$(DEV_VENV)/bin/python -m bench.tracing $(TRACING_ARGS)

# The realistic random-weight DETR-family presets, each imported, served and timed (ms/image at batch 1
# and 4); rounds with foreign CPU load are marked LOADED. DETECTOR_PRESETS=... picks them.
DETECTOR_PRESETS ?= rtdetr-r50vd rtdetr-v2-r50vd dfine-xlarge lwdetr-small rf-detr-base yolos-tiny conditional-detr-resnet-50
bench-detectors: $(DEV_VENV)/.installed-bench $(SERVE_VENV)/.installed-$(ORT)
	$(DEV_VENV)/bin/python -m bench.hf_detectors $(DETECTOR_PRESETS)

# Random-weight DETR-R50 at shortest_edge 800 served twice, with and without padding buckets, in
# interleaved rounds (about 12 minutes on 2 quiet cores; the import is cached in bench/.work/detr-buckets).
# On a quiet machine only: rounds with foreign CPU load are marked LOADED. DETR_BUCKETS_ARGS=... passes options.
bench-detr-buckets: $(DEV_VENV)/.installed-bench $(SERVE_VENV)/.installed-$(ORT)
	$(DEV_VENV)/bin/python -m bench.detr_buckets $(DETR_BUCKETS_ARGS)

profile: $(DEV_VENV)/.installed-bench bench-tools $(BENCH_MODEL)/model.onnx
	$(DEV_VENV)/bin/python -m bench.profile $(PROFILE_ARGS)

# Downloads ~250 MiB from PyPI (onnxruntime-gpu is 244 MiB), checks every sha256 against
# bench/gpu_kit/lock-cp312-gpu.txt, writes .gpu-kit/cp312-gpu/parts/NN/ and checks that the set
# resolves offline for CPython 3.12. Re-lock after changing the serving dependencies:
# `$(DEV_VENV)/bin/python -m bench.gpu_kit lock --target cp312-gpu` (and cp311-cpu, cp311-device).
gpu-kit: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/python -m bench.gpu_kit build --target cp312-gpu

# The style and type checks of make test, without the suite. mypy reads its scope and flags from
# [tool.mypy] in pyproject.toml (service/, export/, models/; tests/ is not type-checked).
lint: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/ruff check .
	$(DEV_VENV)/bin/ruff format --check .
	$(DEV_VENV)/bin/mypy

typecheck: $(DEV_VENV)/.installed
	$(DEV_VENV)/bin/mypy

clean:
	rm -rf $(SERVE_VENV) $(DEV_VENV) runs .pytest_cache .mypy_cache bench/.work .venv-gpu-bench .gpu-kit

# Import random-weight versions of three hub checkpoints (configs as published, weights seeded;
# nothing is downloaded) and print the parity each import measured: the figures of docs/models.md.
HF_PRESETS := vit-base-patch16-224 deit-base-distilled-patch16-224 detr-resnet-50
hf-parity: $(DEV_VENV)/.installed
	for preset in $(HF_PRESETS); do \
		$(DEV_VENV)/bin/python -m export.hf_presets $$preset --out runs/hf/$$preset && \
		$(DEV_VENV)/bin/python -m export hf runs/hf/$$preset --to runs/hf-repository/$$preset/1 || exit 1; \
	done
