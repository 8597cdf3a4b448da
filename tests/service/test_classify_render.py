"""``classify`` with ``?render=png`` (or ``Accept: image/png``): the attention-rollout picture."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ROOT, png_bytes, running_app
from tests.service.helpers import assert_problem

pytestmark = pytest.mark.anyio
CAT = (ROOT / "examples" / "chelsea.png").read_bytes()  # 451x300, CC0 (scikit-image's "chelsea")
CLASSIFY = "/v1/models/vit-cifar10/classify"


def picture(response) -> Image.Image:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert "compute;dur=" in response.headers["server-timing"]
    image = Image.open(io.BytesIO(response.content))
    assert image.format == "PNG" and image.mode == "RGB"
    return image


async def test_render_png_returns_the_heat_map_at_the_displayed_size() -> None:
    async with running_app() as client:
        as_json = await client.post(CLASSIFY, files={"image": CAT})
        by_query = await client.post(CLASSIFY + "?render=png", files={"image": CAT})
        by_accept = await client.post(CLASSIFY, files={"image": CAT}, headers={"Accept": "image/png"})
        json_wins = await client.post(CLASSIFY + "?render=json", files={"image": CAT}, headers={"Accept": "image/png"})
    body = as_json.json()
    assert body["image"] == {"width": 451, "height": 300}
    image = picture(by_query)
    assert image.size == (451, 300)
    assert by_accept.content == by_query.content
    assert json_wins.json() == body
    pixels = np.asarray(image).astype(int)
    original = np.asarray(Image.open(io.BytesIO(CAT)).convert("RGB")).astype(int)
    # Centre crop of 451x300: columns 75.5..375.5 are coloured, the sides only dimmed (x 0.35).
    assert np.abs(pixels[150, 10] - np.round(original[150, 10] * 0.35)).max() <= 1
    assert np.abs(pixels[150:, 100:350] - original[150:, 100:350]).mean() > 20


async def test_a_model_without_attention_maps_has_no_picture() -> None:
    digit = png_bytes(np.zeros((8, 8), np.uint8))
    async with running_app() as client:
        response = await client.post("/v1/models/vit-digits/classify?render=png", files={"image": digit})
        plain = await client.post("/v1/models/vit-digits/classify", files={"image": digit})
    assert_problem(response, 422, "attention")
    assert plain.status_code == 200 and plain.json()["predictions"]


async def test_picture_errors_are_problems() -> None:
    async with running_app() as client:
        two = await client.post(CLASSIFY + "?render=png", files=[("image", CAT), ("image", CAT)])
        broken = await client.post(CLASSIFY + "?render=png", files={"image": b"not an image"})
        unknown = await client.post(CLASSIFY + "?render=gif", files={"image": CAT})
    assert_problem(two, 400, "one image")
    assert_problem(broken, 415)
    assert_problem(unknown, 422, "render")


@pytest.mark.parametrize(
    ("accept", "png"),
    [
        ("image/png", True),
        ("image/png, application/json", True),
        ("application/json, image/png", False),
        ("application/json;q=0.5, image/png", True),
        ("image/png;q=0, application/json", False),
        ("image/png;q=0", False),
        ("application/json, image/png;q=0.1", False),
        ("image/*", False),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8", False),
        ("", False),
    ],
)
def test_accept_asks_for_the_picture_only_when_it_prefers_png(accept: str, png: bool) -> None:
    from starlette.requests import Request

    from service.http.routes.inference import _wants_png

    request = Request({"type": "http", "headers": [(b"accept", accept.encode())] if accept else []})
    assert _wants_png(request, None) is png
