"""DETR end to end: the real server (`make serve`'s torch-free environment) on a loopback port."""

from __future__ import annotations

import asyncio
import io
import re

import httpx
import numpy as np
import pytest
from PIL import Image

from models.detection_data import example_canvas, load_split, to_coco
from models.detection_eval import coco_ap, detect_images, served_rule, set_quality
from service.runtime.manifest import load_manifest
from service.tasks.detection import DEFAULT_THRESHOLD
from tests.conftest import ROOT, num_queries, png_bytes, served_version, server_process

pytestmark = pytest.mark.slow
MODEL = served_version("detr-digits")
DETECT = "/v1/models/detr-digits/detect"


async def post_all(url: str, pngs: list[bytes], query: str, concurrency: int) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(png: bytes) -> dict:
            async with limit:
                response = await client.post(DETECT + query, files={"image": png})
                assert response.status_code == 200, response.text
                return response.json()

        return await asyncio.gather(*(one(p) for p in pngs))


def box_array(detections: list[dict]) -> np.ndarray:
    """float (N, 4) xmin, ymin, xmax, ymax."""
    return np.array([[d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")] for d in detections]).reshape(-1, 4)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_ap_over_http_equals_the_offline_ap() -> None:
    metrics = load_manifest(MODEL / "model.json").provenance.metrics
    canvases = load_split("test", None, int(metrics["test_images"]))
    manifest = load_manifest(MODEL / "model.json")
    # softmax: one detection per query; sigmoid_top_k: the top_k best (query, class) pairs. COCO AP wants them all.
    kept = (manifest.task_options or {}).get("top_k") or num_queries("detr-digits")
    with server_process() as (url, _):
        responses = asyncio.run(post_all(url, [png_bytes(c.image) for c in canvases], "?threshold=0", concurrency=16))
    for canvas, response in zip(canvases, responses, strict=True):
        height, width = canvas.image.shape
        assert response["image"] == {"width": width, "height": height}
        assert len(response["detections"]) == kept
    http = coco_ap(to_coco(canvases), [r["detections"] for r in responses])
    assert abs(http["AP"] - metrics["test_AP"]) <= 0.005
    assert abs(http["AP50"] - metrics["test_AP50"]) <= 0.005
    # Issue 21: duplicates, precision and recall at the default threshold, over HTTP as offline
    # (ONNX Runtime with the server's pre- and post-processing, batched 50 at a time).
    from export.detr import onnx_runner

    offline = detect_images(
        onnx_runner(MODEL / "model.onnx"),
        [c.image for c in canvases],
        manifest.preprocessing,
        manifest.labels,
        postprocess=served_rule(manifest),
    )
    quality = set_quality(to_coco(canvases), [r["detections"] for r in responses], threshold=DEFAULT_THRESHOLD)
    expected = set_quality(to_coco(canvases), offline, threshold=DEFAULT_THRESHOLD)
    assert quality["objects"] == expected["objects"] == metrics["test_objects"]
    assert abs(quality["detections"] - expected["detections"]) <= 2  # a score within 1e-4 of the threshold may flip
    assert abs(quality["duplicate_canvas_fraction"] - expected["duplicate_canvas_fraction"]) <= 0.004
    assert abs(quality["precision"] - expected["precision"]) <= 0.002
    assert abs(quality["recall"] - expected["recall"]) <= 0.002
    if "test_duplicate_canvas_fraction" in metrics:  # recorded by export/detr.py since issue 21
        assert abs(quality["duplicate_canvas_fraction"] - metrics["test_duplicate_canvas_fraction"]) <= 0.004
        assert abs(quality["precision"] - metrics["test_precision"]) <= 0.002
        assert abs(quality["recall"] - metrics["test_recall"]) <= 0.002


def assert_same_detections(got: list[dict], reference: list[dict], scale: float, atol: float = 2.0) -> None:
    """``got`` holds ``reference``'s detections, boxes times ``scale`` (pixels, within ``atol``)."""
    assert sorted(d["label"] for d in got) == sorted(d["label"] for d in reference)
    for d in reference:
        want = scale * box_array([d])[0]
        nearest = min(
            (g for g in got if g["label"] == d["label"]), key=lambda g: np.abs(box_array([g])[0] - want).max()
        )
        np.testing.assert_allclose(box_array([nearest])[0], want, atol=atol)


def test_upscaled_and_exif_rotated_copies_give_the_same_boxes() -> None:
    image = Image.open(ROOT / "examples" / "canvas.png")
    width, height = image.size
    upscaled = png_bytes(np.asarray(image.resize((2 * width, 2 * height), Image.Resampling.NEAREST)))
    # Stored turned 90 degrees anticlockwise, with EXIF Orientation 6 ("rotate 90 clockwise to display").
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.transpose(Image.Transpose.ROTATE_90).save(buffer, format="PNG", exif=exif)
    stored_rotated = buffer.getvalue()
    assert Image.open(io.BytesIO(stored_rotated)).size == (height, width)

    with server_process() as (url, _):
        plain, double, rotated = asyncio.run(
            post_all(url, [(ROOT / "examples" / "canvas.png").read_bytes(), upscaled, stored_rotated], "", 1)
        )
    assert double["image"] == {"width": 2 * width, "height": 2 * height}
    assert rotated["image"] == {"width": width, "height": height}  # as displayed, after EXIF
    # Every digit, the '2' cut by the bottom edge included (version 2 scored it under 0.5; docs/models.md).
    assert {d["label"] for d in plain["detections"]} == {"0", "2", "3", "4", "5"}
    # The same detections, each where the transformation puts it (matched by label and nearest
    # box: two queries of one digit may swap places in the score order).
    assert_same_detections(double["detections"], plain["detections"], scale=2.0)
    assert_same_detections(rotated["detections"], plain["detections"], scale=1.0)
    # In the stored (rotated) file's pixels, a displayed box (x0, y0, x1, y1) sits at
    # (y0, W - x1, y1, W - x0): the boxes turned with the image.
    expected = example_canvas()
    for d in rotated["detections"]:
        x0, y0, x1, y1 = box_array([d])[0]
        stored_box = np.array([y0, width - x1, y1, width - x0])
        truth = [b for b, label in zip(expected.boxes, expected.labels, strict=True) if str(label) == d["label"]]
        # IoU > 0.5, AP50's match: the committed model's boxes are not all tight (docs/models.md, Detection)
        assert any(iou(stored_box, np.array([b[1], width - b[2], b[3], width - b[0]])) > 0.5 for b in truth)


def _batch_sizes(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    values = {}
    for suffix in ("sum", "count"):
        # The served version's series: version 1 is served too (config.json) and has its own.
        labels = rf'(?=[^}}]*model="detr-digits")(?=[^}}]*version="{MODEL.name}")[^}}]*'
        pattern = rf"^patchserve_batch_size_{suffix}\{{{labels}\}} ([0-9.e+]+)$"
        values[suffix] = float(re.search(pattern, text, re.MULTILINE).group(1))
    return values["sum"], values["count"]


def test_an_image_alone_and_in_a_concurrent_batch_of_other_sizes_gives_the_same_detections() -> None:
    canvases = load_split("test", None, 8)
    sizes = {c.image.shape for c in canvases}
    assert len(sizes) == 8  # eight different image sizes
    pngs = [png_bytes(c.image) for c in canvases]
    env = {"PATCHSERVE_MAX_QUEUE_DELAY": "0.5", "PATCHSERVE_MAX_BATCH_SIZE": "8"}
    with server_process(env=env) as (url, _):
        alone = [asyncio.run(post_all(url, [png], "?threshold=0.3", 1))[0] for png in pngs[:2]]
        before = _batch_sizes(url)
        together = asyncio.run(post_all(url, pngs, "?threshold=0.3", 8))
        after = _batch_sizes(url)
    images, batches = after[0] - before[0], after[1] - before[1]
    assert images == 8 and batches < 8  # the eight requests shared batches
    for one, shared in zip(alone, together[:2], strict=True):
        assert [d["label"] for d in one["detections"]] == [d["label"] for d in shared["detections"]]
        assert len(one["detections"]) >= 1
        np.testing.assert_allclose(
            [d["score"] for d in one["detections"]], [d["score"] for d in shared["detections"]], atol=1e-4, rtol=0
        )
        np.testing.assert_allclose(box_array(one["detections"]), box_array(shared["detections"]), atol=0.01, rtol=0)


def test_the_readme_example_and_its_picture() -> None:
    example = example_canvas()
    with server_process() as (url, _):
        response = httpx.post(
            url + DETECT + "?threshold=0.7", files={"image": (ROOT / "examples" / "canvas.png").read_bytes()}
        )
        picture = httpx.post(
            url + DETECT + "?threshold=0.7&render=png", files={"image": (ROOT / "examples" / "canvas.png").read_bytes()}
        )
    detections = response.json()["detections"]
    # Each digit once (no duplicates: issue 21), in place by AP50's criterion, the '2' cut by the bottom edge
    # included: version 4's calibrated score for it is 0.75 (version 3's raw 0.55 was under this 0.7; the
    # README says so).
    assert sorted(d["label"] for d in detections) == sorted(str(label) for label in example.labels)
    for box, label in zip(example.boxes, example.labels, strict=True):
        found = [iou(box_array([d])[0], box) for d in detections if d["label"] == str(label)]
        assert max(found) > 0.5, label
    committed = np.asarray(Image.open(ROOT / "examples" / "canvas.detr-digits.png").convert("RGB"))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(picture.content)).convert("RGB")), committed)
