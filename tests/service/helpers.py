"""Helpers shared by tests/service's modules: one test module never imports another (tests/test_layout_of_tests.py)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest
from tests.conftest import MODEL_REPOSITORY, ROOT

DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()
CLASSIFY = "/v1/models/vit-digits/classify"
CHUNK = 64 * 1024
MANIFEST = load_manifest(MODEL_REPOSITORY / "vit-digits" / "1" / "model.json")


def assert_problem(response, status: int, detail_part: str = "") -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["type"].startswith("urn:patchserve:problem:")
    assert problem["instance"] == response.headers["x-request-id"]
    assert detail_part in problem["detail"]
    return problem


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus text format (0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


class Chunks:
    """An async body of ``count`` chunks that records how many the server pulled."""

    def __init__(self, count: int, prefix: bytes = b"") -> None:
        self.count, self.prefix, self.pulled = count, prefix, 0

    async def __aiter__(self):
        if self.prefix:
            yield self.prefix
        for _ in range(self.count):
            self.pulled += 1
            yield b"\0" * CHUNK


def asgi_post(path: str, body: bytes, extra_headers: list[tuple[bytes, bytes]] | None = None) -> dict:
    """The ASGI scope of ``POST path`` with a PNG body of ``len(body)`` bytes (the body itself is sent by receive)."""
    headers = [(b"host", b"test"), (b"content-type", b"image/png"), (b"content-length", str(len(body)).encode())]
    headers += extra_headers or []
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }


class HeldRequest:
    """A raw ASGI POST of one PNG whose body is sent only when ``release()`` is called."""

    def __init__(self, app, path: str = CLASSIFY, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.release_body = asyncio.Event()
        self.messages: list[dict] = []
        self.body_reads = 0
        self.task = asyncio.create_task(app(asgi_post(path, DIGIT_7, headers), self._receive, self._send))

    async def _receive(self) -> dict:
        self.body_reads += 1
        if self.body_reads > 1:
            await asyncio.Event().wait()  # after the body: wait for a disconnect that never comes
        await self.release_body.wait()
        return {"type": "http.request", "body": DIGIT_7, "more_body": False}

    async def _send(self, message: dict) -> None:
        self.messages.append(message)

    def release(self) -> None:
        self.release_body.set()

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def body(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"))


async def until(condition, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


INFER = "/v2/models/vit-digits/infer"


def digit_tensor(*pngs: bytes) -> np.ndarray:
    """The server's own decoding and preprocessing of ``pngs``: float32 (B, 1, 8, 8)."""
    preprocess = Preprocessor(MANIFEST.preprocessing)
    return np.stack([preprocess(decode_image(p, color_mode="L", max_pixels=10**6).image) for p in pngs])


def json_request(x: np.ndarray, **extra: object) -> dict:
    return {
        "inputs": [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}],
        **extra,
    }


def drawn_mask(before: Image.Image, after: Image.Image) -> np.ndarray:
    """bool (H, W): the pixels drawing changed."""
    a = np.asarray(before.convert("RGB"), dtype=np.int16)
    b = np.asarray(after.convert("RGB"), dtype=np.int16)
    return np.any(a != b, axis=2)


def allowed_region(detections: list[dict], size: tuple[int, int], margin: int) -> np.ndarray:
    """bool (H, W): each box grown by ``margin`` px (outline width and the label tag above it)."""
    width, height = size
    region = np.zeros((height, width), dtype=bool)
    for det in detections:
        b = det["box"]
        x0, y0 = max(0, int(b["xmin"]) - margin), max(0, int(b["ymin"]) - margin)
        region[y0 : int(b["ymax"]) + margin, x0 : int(b["xmax"]) + margin] = True
    return region


def run_server(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service"],
        cwd=ROOT,
        env={**os.environ, "PATCHSERVE_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


BIG = 1 << 20  # a buffer this large, found in a reference cycle, is a refused body kept alive


def big_buffers_in_cycles() -> list[str]:
    """The large buffers that only unreachable objects (reference cycles) hold, found by a full collection."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [
            f"{type(held).__name__} of {len(held):,} held by {type(holder).__name__}"
            for holder in gc.garbage
            for held in gc.get_referents(holder)
            if isinstance(held, bytes | bytearray | str | memoryview | np.ndarray) and len(held) >= BIG
        ]
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    return found
