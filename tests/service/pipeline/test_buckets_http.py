"""Padding buckets through the HTTP API (issue 18), on a random-weight transformers DETR imported with a pixel mask.

``tiny-detr`` (``export.hf_presets``: shortest edge 96, longest 160) has five buckets; photos
of several sizes and aspects are posted alone, then all at once behind a busy runner, so that
they queue and leave in batches of their bucket. The runner is the real ONNX Runtime session,
wrapped to record each run's input shape and to hold the runner busy, without timing.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from service.runtime.manifest import load_manifest
from service.runtime.sessions import OrtRunner
from tests.conftest import running_app
from tests.service.helpers import sample
from tests.service.pipeline.recorded_runner import HANG_GUARD, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DETECT = "/v1/models/tiny-detr/detect"
SKIMAGE = Path("/work/shared/images/skimage")


def photos() -> list[bytes]:
    """Five photos, four buckets: 3:2 and 3:2 (the same bucket, other sizes), square, portrait, 4:3."""
    import io

    chelsea, coffee, astronaut = (
        Image.open(SKIMAGE / n).convert("RGB") for n in ("chelsea.png", "coffee.png", "astronaut.png")
    )
    images = [chelsea, coffee, astronaut, chelsea.transpose(Image.Transpose.ROTATE_90), coffee.crop((0, 0, 532, 400))]
    files = []
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        files.append(buffer.getvalue())
    return files


def same_detections(a: list[dict], b: list[dict]) -> None:
    """Labels identical in order, scores within 1e-3, boxes within 0.5 px (the issue's tolerance)."""
    assert [d["label"] for d in a] == [d["label"] for d in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["score"] - y["score"]) <= 1e-3
        assert max(abs(x["box"][k] - y["box"][k]) for k in ("xmin", "ymin", "xmax", "ymax")) <= 0.5


async def test_each_photo_gets_the_same_detections_alone_and_in_batches_with_photos_of_other_sizes(
    hf_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(hf_repository / "repository" / "tiny-detr", repository / "tiny-detr")
    spec = load_manifest(repository / "tiny-detr" / "1" / "model.json").preprocessing
    assert spec.buckets is not None
    runs: list[tuple[tuple[int, ...], bool]] = []
    gate = threading.Event()
    gate.set()
    original = OrtRunner.run

    def run(runner: OrtRunner, batch: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        runs.append((batch.shape, mask is not None))
        gate.wait(HANG_GUARD)
        return original(runner, batch, mask)

    monkeypatch.setattr(OrtRunner, "run", run)
    files = photos()
    async with running_app(model_repository=repository, max_batch_size=8, max_queue_delay=0.5) as client:
        # Warm-up ran every bucket at every batch size, with a mask.
        warmed = {(shape[0], shape[2], shape[3]) for shape, masked in runs if masked}
        assert warmed == {(b, s.height, s.width) for s in spec.buckets for b in range(1, 9)}
        (described,) = (await client.get("/v1/models/tiny-detr")).json()["versions"]
        assert described["warm_up_seconds"] > 0 and len(described["preprocessing"]["buckets"]) == 5
        runs.clear()
        start = (await client.get("/metrics")).text  # the registry is the process's: count from here

        async def detect(png: bytes) -> httpx.Response:
            return await client.post(
                DETECT, content=png, headers={"content-type": "image/png"}, params={"threshold": 0}
            )

        alone = [await detect(png) for png in files]
        assert all(r.status_code == 200 for r in alone)
        assert all(shape[0] == 1 and masked for shape, masked in runs)
        assert {shape[2:] for shape, _ in runs} == {(96, 160), (96, 96), (160, 96), (96, 128)}  # four buckets
        assert all("pad;dur=" in r.headers["server-timing"] for r in (alone[0], alone[3], alone[4]))

        before = (await client.get("/metrics")).text
        runs.clear()
        gate.clear()  # a plug holds the runner: everything posted next queues behind it
        plug = asyncio.ensure_future(detect(files[2]))
        await until(lambda: len(runs) == 1)
        posted = [asyncio.ensure_future(detect(png)) for png in files + files]
        batcher = client.app.state.server.repository.get("tiny-detr").batcher
        await until(lambda: batcher.queued == len(posted))
        gate.set()
        together = await asyncio.wait_for(asyncio.gather(*posted), HANG_GUARD)
        assert (await plug).status_code == 200
        after = (await client.get("/metrics")).text

    sizes = sorted(shape[0] for shape, _ in runs[1:])
    assert sizes == [2, 2, 2, 4]  # by bucket: chelsea + coffee twice (96x160), then the others in pairs
    for i, response in enumerate(together):
        assert response.status_code == 200
        same_detections(response.json()["detections"], alone[i % len(files)].json()["detections"])
    labels = {"model": "tiny-detr", "version": "1"}
    grew = sample(after, "patchserve_batch_size_count", **labels) - sample(
        before, "patchserve_batch_size_count", **labels
    )
    assert grew == 5  # the plug and four bucket batches
    padded = sample(after, "patchserve_padding_fraction_count", **labels)
    assert padded - sample(start, "patchserve_padding_fraction_count", **labels) == len(files) + 2 * len(files) + 1


async def test_at_the_hubs_800_by_1333_each_photo_gets_the_same_detections_alone_and_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above at DETR's real sizes (issue 18's acceptance: shortest_edge 800, longest 1333):
    the tiny preset's weights with the hub's processor, so its five buckets are 800x800 to 1333x800."""
    import json

    from export.hf import export_hf
    from export.hf_presets import build

    checkpoint = build("tiny-detr", tmp_path / "checkpoint")
    processor = json.loads((checkpoint / "preprocessor_config.json").read_text())
    processor["size"] = {"shortest_edge": 800, "longest_edge": 1333}
    (checkpoint / "preprocessor_config.json").write_text(json.dumps(processor))
    repository = tmp_path / "repository"
    export_hf(checkpoint, repository / "tiny-detr" / "1", opset=18)
    spec = load_manifest(repository / "tiny-detr" / "1" / "model.json").preprocessing
    assert (spec.shortest_edge, spec.longest_edge) == (800, 1333)
    assert sorted((b.height, b.width) for b in spec.buckets or []) == [
        (800, 800),
        (800, 1066),
        (800, 1333),
        (1066, 800),
        (1333, 800),
    ]
    runs: list[tuple[int, ...]] = []
    gate = threading.Event()
    gate.set()
    original = OrtRunner.run

    def run(runner: OrtRunner, batch: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        runs.append(batch.shape)
        gate.wait(HANG_GUARD)
        return original(runner, batch, mask)

    monkeypatch.setattr(OrtRunner, "run", run)
    files = photos()
    async with running_app(model_repository=repository, max_batch_size=4, max_queue_delay=0.5) as client:

        async def detect(png: bytes) -> httpx.Response:
            return await client.post(
                DETECT, content=png, headers={"content-type": "image/png"}, params={"threshold": 0}
            )

        runs.clear()
        alone = [await detect(png) for png in files]
        assert all(r.status_code == 200 for r in alone) and all(shape[0] == 1 for shape in runs)
        # 3:2 landscape (chelsea, coffee), square, 3:2 portrait, 4:3 (the crop): four buckets
        assert {shape[2:] for shape in runs} == {(800, 1333), (800, 800), (1333, 800), (800, 1066)}
        runs.clear()
        gate.clear()  # a plug holds the runner: the photos posted next queue behind it, then leave by bucket
        plug = asyncio.ensure_future(detect(files[2]))
        await until(lambda: len(runs) == 1)
        posted = [asyncio.ensure_future(detect(png)) for png in files]
        batcher = client.app.state.server.repository.get("tiny-detr").batcher
        await until(lambda: batcher.queued == len(posted))
        gate.set()
        together = await asyncio.wait_for(asyncio.gather(*posted), HANG_GUARD)
        assert (await plug).status_code == 200

    assert max(shape[0] for shape in runs[1:]) > 1  # photos of one bucket shared a batch
    for response, single in zip(together, alone, strict=True):
        assert response.status_code == 200
        same_detections(response.json()["detections"], single.json()["detections"])
