"""The committed vit-digits' ONNX Runtime session, wrapped to record the batch size of every run
and to hold the runner busy; shared by the pipeline's tests that post through the HTTP API."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest

from service.runtime.sessions import OrtRunner
from tests.conftest import png_bytes

CLASSIFY = "/v1/models/vit-digits/classify"
HANG_GUARD = 30.0  # seconds; only so that a broken server fails a test instead of hanging it


class RecordedRunner:
    """Patches ``OrtRunner.run``: records each call's batch size; waits while ``gate`` is cleared."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None
        original = OrtRunner.run

        def run(runner: OrtRunner, batch: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
            self.calls.append(batch.shape[0])
            self.gate.wait(HANG_GUARD)
            if self.fail_with is not None:
                raise self.fail_with
            return original(runner, batch, mask)  # mask: a detector with padding buckets (detr-digits 2)

        monkeypatch.setattr(OrtRunner, "run", run)

    async def plug(self, client: httpx.AsyncClient, png: bytes) -> asyncio.Future:
        """Post ``png`` and hold its run at the gate: the runner stays busy until ``gate.set()``."""
        self.gate.clear()
        before = len(self.calls)
        plug = asyncio.ensure_future(client.post(CLASSIFY, content=png, headers={"content-type": "image/png"}))
        await until(lambda: len(self.calls) == before + 1)
        return plug


async def until(condition) -> None:
    """Wait for something another thread or task does (a hang guard, not a timing assertion)."""
    for _ in range(int(HANG_GUARD / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never became true")


def one_of_each(split, digits: range) -> list[bytes]:
    """The first test image of each digit in ``digits``, as PNG files."""
    return [png_bytes(split.images[int(np.flatnonzero(split.labels == d)[0])]) for d in digits]


def batcher_of(client: httpx.AsyncClient):
    return client.app.state.server.repository.get("vit-digits").batcher
