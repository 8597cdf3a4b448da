"""The GPU kit's CPU dry run (slow): the kit built for this interpreter, carried part by part, benchmarked.

It is the GPU machine's procedure (docs/gpu.md) with two substitutions: the kit is built for
CPython 3.11 with ``onnxruntime`` in place of ``onnxruntime-gpu`` (``cp311-cpu``: 28 MiB, so
CI does not download 244 MiB), and the GPU machine's own packages (numpy, pillow, httpx,
onnx, uvloop, ..., onnxruntime 1.30 for the CPU) are stood in for by a fresh virtualenv
holding exactly those (``cp311-device``), so that anything the kit forgot to carry fails here
as it would there. The parts (8 MiB here, to have several) are handed to
``bench/gpu_kit/run.sh`` one per call, as the device tool's ``carry`` would, and the last call
must show the kit's onnxruntime shadowing the stand-in's and write bench.gpu's results.

Cost, measured on the 2-core development machine shared with other work: 133, 149 and 162 s in
three runs (2026-12-01; the kit's build and the stand-in about 35 s with the wheels in pip's
cache, the five calls the rest, most of it bench.gpu's servers starting and being measured).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.gpu_kit import kit
from bench.gpu_kit.__main__ import build
from tests.conftest import MODEL_REPOSITORY, ROOT

PART_BYTES = 8 * 2**20


def jpegs(folder: Path, count: int = 6) -> list[Path]:
    """``count`` 640x480 JPEGs: a seeded noise texture over a gradient, quality 90."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 640)[None, :, None]  # (1, W, 1)
    paths = []
    for i in range(count):
        pixels = np.clip(ramp + rng.normal(0, 40, (480, 640, 3)) + 20 * i, 0, 255).astype(np.uint8)
        paths.append(folder / f"image-{i}.jpg")
        Image.fromarray(pixels).save(paths[-1], quality=90)
    return paths


def stand_in_for_the_gpu_machine(tmp_path: Path) -> Path:
    """A virtualenv with only what the GPU machine has that the kit relies on; its python."""
    target = kit.TARGETS["cp311-device"]
    wheels = tmp_path / "device-wheels"
    kit.download(target, wheels)
    venv = tmp_path / "device"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # with pip, as the machine has
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    options = ["--quiet", "--no-index", "--no-deps", "--no-compile", "--require-hashes", "--find-links", str(wheels)]
    kit.pip(["install", *options, "--target", str(site), "-r", str(target.lock)], offline=True)
    return venv / "bin" / "python"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_kit_travels_in_parts_installs_offline_and_runs_bench_gpu_on_the_cpu(tmp_path) -> None:
    started = time.monotonic()
    target = kit.TARGETS["cp311-cpu"]
    manifest = build(target, tmp_path / "kit", part_bytes=PART_BYTES, images=jpegs(tmp_path / "images"))
    sizes = [part["size"] for part in manifest["parts"]]
    assert len(sizes) >= 3 and max(sizes) <= PART_BYTES
    assert "Would install" in manifest["check"] and "onnxruntime-1.31.1" in manifest["check"]
    python = stand_in_for_the_gpu_machine(tmp_path)
    home, out = tmp_path / "home", tmp_path / "out"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "KIT_TARGET": target.name,
        "KIT_HOME": str(home),
        "KIT_PYTHON": str(python),
        "KIT_DEVICE": "cpu",
        "KIT_EXPORT": "",  # no torch on the stand-in: a committed model instead of ViT-B/16 and DETR-R50
        "KIT_COPY": str(MODEL_REPOSITORY / "vit-digits" / "1"),
        "KIT_FP16": "vit-digits",
        "KIT_BENCH_ARGS": "--seconds 1 --warmup 0.3 --raw-seconds 0.3 --concurrency 4 --batch-sizes 1,8",
        "OUT": str(out),
    }
    names = [part["name"] for part in manifest["parts"]]
    calls = [names[0], names[0], *names[1:]]  # the first part twice: the second time it is already there
    outputs = []
    for name in calls:
        carried = tmp_path / "carried"
        shutil.rmtree(carried, ignore_errors=True)
        shutil.copytree(tmp_path / "kit" / "parts" / name, carried / name)
        done = subprocess.run(
            ["bash", "bench/gpu_kit/run.sh"],
            cwd=ROOT,
            env=env | {"KIT_PARTS": str(carried)},
            capture_output=True,
            text=True,
            timeout=900,
        )
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, outputs[-1]
    first, again = outputs[0], outputs[1]
    assert f"carry parts {' '.join(names[1:])} next" in first and "exports started in the background" in first
    assert "took in part" not in again and f"carry parts {' '.join(names[1:])} next" in again
    assert "kit incomplete" not in outputs[-1]

    verified = json.loads((out / "verify.json").read_text())
    assert verified["onnxruntime"] == "1.31.1"  # the kit's, not the stand-in's 1.30.0
    assert verified["file"].startswith(str(home / "site-ort")) and verified["session"] == ["CPUExecutionProvider"]
    assert "top-1 agreement with float32 on 6 images" in (out / "models.log").read_text()
    (results_file,) = out.glob("gpu-*-cpu.json")
    results = json.loads(results_file.read_text())
    assert results["device"] == "cpu" and results["protocol"]["load_generator"].startswith("bench/pyloadgen.py")
    assert results["machine"]["versions"]["fastapi"] is not None
    assert {m["model"] for m in results["models"]} == {"vit-digits", "vit-digits-fp16"}
    for model in results["models"]:
        assert (
            model["a"]["plain"]["provider"] == "CPUExecutionProvider" and model["a"]["io_binding"]["images_per_s"] > 0
        )
        assert {r["server"] for r in model["http"]} == {"patchserve", "patchserve-no-batching"}
        assert all(r["errors"] == 0 and r["throughput"] > 0 for r in model["http"]), model["http"]
    print(f"GPU kit dry run: {time.monotonic() - started:.0f} s, {len(names)} parts, {len(calls)} calls")
