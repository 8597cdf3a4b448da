"""COCO average precision of detections, with pycocotools' COCOeval.

The detections are the server's own response format (``{"label", "class_id", "score", "box":
{"xmin", "ymin", "xmax", "ymax"}}`` in pixels of the displayed image), so the same function
scores the PyTorch model while training, the ONNX graph at export, and the server over HTTP:

    python -m models.detection_eval --url http://127.0.0.1:8000

posts the test split to a running server (threshold 0: every query) and prints its COCO AP.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

# (B, C, H, W) float32 inputs -> (pred_logits (B, N, K + 1), pred_boxes (B, N, 4)), numpy.
RunFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def detect_images(
    run: RunFn,
    images: Sequence[np.ndarray],
    preprocessing: Any,
    labels: list[str],
    *,
    threshold: float = 0.0,
    max_detections: int = 100,
    batch_size: int = 50,
) -> list[list[dict[str, Any]]]:
    """Detections for uint8 images, through the server's own preprocessing and post-processing.

    Args:
        run: the model (PyTorch or ONNX Runtime) on a batch of preprocessed inputs.
        images: uint8 (H, W) grayscale or (H, W, 3) RGB pixels, each image its own size.
        preprocessing: the manifest's :class:`service.manifest.Preprocessing`.
        labels: class names, "no object" last.
        threshold, max_detections: as the detect route's parameters (0 and 100 keep every
            query, as COCO evaluation wants).
        batch_size: images per call of ``run``.

    Returns:
        Per image, :func:`service.tasks.detection.detect`'s list, boxes in the image's pixels.
    """
    from service.preprocess import Preprocessor
    from service.tasks.detection import detect

    preprocess = Preprocessor(preprocessing)
    results: list[list[dict[str, Any]]] = []
    for start in range(0, len(images), batch_size):
        chunk = [
            Image.fromarray(pixels).convert(preprocessing.color_mode) for pixels in images[start : start + batch_size]
        ]
        logits, boxes = run(np.stack([preprocess(image) for image in chunk]))  # (B, N, K + 1), (B, N, 4)
        for image, image_logits, image_boxes in zip(chunk, logits, boxes, strict=True):
            results.append(
                detect(
                    image_logits,
                    image_boxes,
                    labels,
                    threshold=threshold,
                    max_detections=max_detections,
                    box_scale=preprocess.box_scale(image.size, image.size),
                    image_size=image.size,
                )
            )
    return results


def to_coco_results(image_id: int, detections: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One image's detections -> COCO result entries (``bbox`` = [x, y, width, height], pixels)."""
    results = []
    for det in detections:
        box = det["box"]
        results.append(
            {
                "image_id": image_id,
                "category_id": int(det["class_id"]),
                "bbox": [box["xmin"], box["ymin"], box["xmax"] - box["xmin"], box["ymax"] - box["ymin"]],
                "score": float(det["score"]),
            }
        )
    return results


def coco_ap(ground_truth: dict[str, Any], detections: Sequence[Sequence[dict[str, Any]]]) -> dict[str, float]:
    """COCO box AP of per-image detections against COCO-format ground truth.

    Args:
        ground_truth: a COCO instances dict (``images``, ``annotations``, ``categories``).
        detections: ``detections[i]`` are the detections of ``ground_truth["images"][i]``.

    Returns:
        ``AP`` (IoU 0.50:0.95), ``AP50``, ``AP75``, ``AP_small``, ``AP_medium``, ``AP_large``
        and ``AR100``, as COCOeval's summary computes them (area ranges: < 32^2, 32^2-96^2,
        > 96^2 pixels); -1 where a range holds no object.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images = ground_truth["images"]
    if len(detections) != len(images):
        raise ValueError(f"{len(detections)} detection lists for {len(images)} images")
    results = [r for image, dets in zip(images, detections, strict=True) for r in to_coco_results(image["id"], dets)]
    names = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")
    if not results:  # COCO.loadRes refuses an empty list
        return {**dict.fromkeys(names, 0.0), "AR100": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and summary
        gt = COCO()
        gt.dataset = {"info": {}, **ground_truth}
        gt.createIndex()
        evaluation = COCOeval(gt, gt.loadRes(results), iouType="bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    stats = evaluation.stats
    return {**{name: float(stats[i]) for i, name in enumerate(names)}, "AR100": float(stats[8])}


async def _detect_over_http(url: str, model: str, pngs: list[bytes], concurrency: int) -> list[list[dict[str, Any]]]:
    import asyncio

    import httpx

    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(png: bytes) -> list[dict[str, Any]]:
            async with limit:
                response = await client.post(f"/v1/models/{model}/detect?threshold=0", files={"image": png})
                response.raise_for_status()
                return response.json()["detections"]

        return list(await asyncio.gather(*(one(png) for png in pngs)))


def main(argv: list[str] | None = None) -> None:
    """COCO AP of a served detector on the test split, posted over HTTP with threshold 0."""
    import argparse
    import asyncio

    from models.detection_data import SPLIT_SIZES, load_split, to_coco

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running server")
    parser.add_argument("--model", default="detr-digits")
    parser.add_argument("--count", type=int, default=SPLIT_SIZES["test"], help="test canvases to post")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    canvases = load_split("test", None, args.count)
    pngs = []
    for canvas in canvases:
        buffer = io.BytesIO()
        Image.fromarray(canvas.image).save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    detections = asyncio.run(_detect_over_http(args.url, args.model, pngs, args.concurrency))
    ap = coco_ap(to_coco(canvases), detections)
    objects = sum(len(c.labels) for c in canvases)
    print(f"{args.model} over HTTP, {len(canvases)} test canvases ({objects} objects), every query kept (threshold 0):")
    print(", ".join(f"{name} {value:.4f}" for name, value in ap.items() if value >= 0))


if __name__ == "__main__":
    main()
