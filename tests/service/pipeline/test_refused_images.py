"""A refused image's file does not outlive its request's answer (no reference cycle holds it)."""

from __future__ import annotations

import asyncio
import gc
import io

import numpy as np
import pytest
from PIL import Image

from tests.conftest import running_app
from tests.service.helpers import BIG, asgi_post, big_buffers_in_cycles

pytestmark = pytest.mark.anyio


def noise_jpeg(width: int, height: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


async def post_files(app, path: str, files: list[bytes]) -> int:
    """POST ``files`` as multipart ``image`` fields, as raw ASGI (an HTTP client's own objects hold bodies)."""
    body = b"".join(
        b'--b\r\nContent-Disposition: form-data; name="image"; filename="f"\r\n\r\n' + data + b"\r\n" for data in files
    )
    body += b"--b--\r\n"
    scope = asgi_post(path, body)
    scope["headers"] = [h for h in scope["headers"] if h[0] != b"content-type"]
    scope["headers"].append((b"content-type", b"multipart/form-data; boundary=b"))
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    statuses: list[int] = []

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0]


async def test_refused_images_are_not_kept_alive_by_reference_cycles() -> None:
    # Found after a fresh user's finding on /v2: an image refused in a request of several (its error
    # kept as its outcome, with the traceback that holds the frame that holds the image and the
    # future that holds the error) stayed in memory after the answer, until a full collection.
    photo = noise_jpeg(3000, 2000)
    assert len(photo) > 3 * BIG
    truncated = photo[: len(photo) // 2]  # refused while decoding (415)
    not_png = b"\x89PNG\r\n\x1a\n" + b"\0" * (3 * BIG)  # refused from its header (415)
    gc.collect()
    gc.disable()  # only the full collection below looks for cycles
    try:
        async with running_app() as client:
            for path in ("/v1/models/vit-cifar10/classify", "/v1/models/detr-digits/detect"):
                for bad in (truncated, not_png):
                    assert await post_files(client.app, path, [bad]) == 415
                    assert await post_files(client.app, path, [bad, bad]) == 200  # two entries of 415
            assert big_buffers_in_cycles() == []
    finally:
        gc.enable()
