"""End to end: the real server from `make serve`'s torch-free environment, on a loopback port."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest
from tests.conftest import MODEL_REPOSITORY, SERVE_PYTHON, png_bytes, server_process

pytestmark = pytest.mark.slow
MODEL = MODEL_REPOSITORY / "vit-digits" / "1"


def offline_predictions(pngs: list[bytes]) -> np.ndarray:
    """Top-1 of the committed graph on the same decoded pixels, without any server."""
    manifest = load_manifest(MODEL / "model.json")
    preprocess = Preprocessor(manifest.preprocessing)
    session = ort.InferenceSession(str(MODEL / "model.onnx"), providers=["CPUExecutionProvider"])
    batch = np.stack([preprocess(decode_image(p, color_mode="L", max_pixels=10**6).image) for p in pngs])
    return np.argmax(session.run(None, {"pixel_values": batch})[0], axis=1)


async def post_all(url: str, pngs: list[bytes], concurrency: int) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(png: bytes) -> dict:
            async with limit:
                response = await client.post("/v1/models/vit-digits/classify", files={"image": png})
                assert response.status_code == 200, response.text
                return response.json()

        return await asyncio.gather(*(one(p) for p in pngs))


def loaded_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_every_test_digit_over_http_matches_offline(digits_test_split) -> None:
    pngs = [png_bytes(pixels) for pixels in digits_test_split.images]  # 8x8, values 0-16 scaled to 0-255
    offline = offline_predictions(pngs)
    manifest_accuracy = load_manifest(MODEL / "model.json").provenance.metrics["test_accuracy"]
    with server_process() as (url, process):
        responses = asyncio.run(post_all(url, pngs, concurrency=32))
        maps = loaded_libraries(process.pid)
    http = np.array([r["predictions"][0]["class_id"] for r in responses])
    assert all(r["image"] == {"width": 8, "height": 8} for r in responses)
    assert np.array_equal(http, offline)
    http_accuracy = float(np.mean(http == digits_test_split.labels))
    offline_accuracy = float(np.mean(offline == digits_test_split.labels))
    assert http_accuracy == offline_accuracy == manifest_accuracy
    assert http_accuracy >= 0.96
    assert "torch" not in maps  # no libtorch mapped into the serving process after 360 requests


def test_serving_environment_has_no_torch() -> None:
    result = subprocess.run([str(SERVE_PYTHON), "-c", "import torch"], capture_output=True, text=True)
    assert result.returncode != 0 and "No module named 'torch'" in result.stderr


def test_example_from_the_readme() -> None:
    with server_process() as (url, _):
        response = httpx.post(
            url + "/v1/models/vit-digits/classify",
            files={"image": (MODEL_REPOSITORY.parent / "examples" / "digit-7.png").read_bytes()},
        )
    assert response.status_code == 200 and response.json()["predictions"][0]["label"] == "7"
