"""Ordinary image sizes over HTTP, on a real server and every committed model: never a 5xx (issue 15 A).

The sides whose centre crop failed (49, 98, 479, 788, 1003; a 640x479 photo) and 200 random
sizes (strips and random aspect ratios among them), sent as multi-image requests to each
model's route; every image must get its own 200 with its size echoed.
"""

from __future__ import annotations

import io
import random

import httpx
import pytest
from PIL import Image

from tests.conftest import server_process

pytestmark = pytest.mark.slow
ROUTES = {
    "vit-digits": "classify",
    "vit-cifar10": "classify",
    "detr-digits": "detect",
}
FAILING = [(49, 49), (98, 98), (479, 479), (788, 788), (1003, 1003), (640, 479), (479, 640)]


def _sizes() -> list[tuple[int, int]]:
    rng = random.Random(1015)
    strips = [(1, rng.randint(1, 1100)) for _ in range(20)] + [(rng.randint(1, 1100), 1) for _ in range(20)]
    squares = [(s, s) for s in rng.sample(range(1, 1101), 60)]
    aspects = [(rng.randint(1, 1100), rng.randint(1, 1100)) for _ in range(100)]
    return FAILING + strips + squares + aspects


def _png(width: int, height: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (seed % 256, 80, 160)).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def test_failing_and_random_sizes_get_a_200_each_on_every_model() -> None:
    sizes = _sizes()
    files = [_png(w, h, i) for i, (w, h) in enumerate(sizes)]
    with server_process(env={"PATCHSERVE_REQUEST_TIMEOUT": "300"}) as (url, _):
        for model, route in ROUTES.items():
            echoed = []
            for start in range(0, len(files), 32):
                batch = files[start : start + 32]
                response = httpx.post(
                    f"{url}/v1/models/{model}/{route}", files=[("image", f) for f in batch], timeout=300
                )
                assert response.status_code == 200, (model, response.text[:300])
                results = response.json()["results"] if len(batch) > 1 else [response.json()]
                failed = [(sizes[start + i], r) for i, r in enumerate(results) if "status" in r]
                assert not failed, (model, failed[:3])
                echoed += [(r["image"]["width"], r["image"]["height"]) for r in results]
            assert echoed == sizes, model
