"""COCO average precision of detections, with pycocotools' COCOeval.

The detections are the server's own response format (``{"label", "class_id", "score", "box":
{"xmin", "ymin", "xmax", "ymax"}}`` in pixels of the displayed image), so the same function
scores the PyTorch model while training, the ONNX graph at export, and the server over HTTP:

    python -m models.detection_eval --url http://127.0.0.1:8000

posts the test split to a running server (threshold 0: every query) and prints its COCO AP
and what users see at the default ``threshold=0.5`` (:func:`set_quality`): the share of
canvases holding a duplicate pair, precision and recall.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

# (B, C, H, W) float32 inputs -> (pred_logits (B, N, K + 1), pred_boxes (B, N, 4)), numpy.
# (B, C, H, W) [, int64 (B, H, W) pixel mask for a model with padding buckets] -> (logits, boxes)
RunFn = Callable[..., tuple[np.ndarray, np.ndarray]]


def sigmoid_detect(
    logits: np.ndarray,
    boxes: np.ndarray,
    labels: list[str],
    *,
    threshold: float,
    max_detections: int,
    box_scale: tuple[float, float],
    image_size: tuple[int, int],
) -> list[dict[str, Any]]:
    """A sigmoid-classified detector's set for one image (Deformable DETR's ``PostProcess``).

    Every (query, class) pair scores the sigmoid of its logit; the ``max_detections`` best pairs
    over all queries and classes are kept (so one query may give two labels), then those
    scoring at least ``threshold``, best first, as the Hugging Face
    ``DeformableDetrImageProcessor.post_process_object_detection`` does (``top_k`` = ``max_detections``).

    Args:
        logits: float (num_queries, num_classes) raw scores, no "no object" column.
        boxes: float (num_queries, 4) boxes (cx, cy, w, h) normalised to the model's input frame.
        labels: class index -> name, ``len(labels) == num_classes``.
        threshold, max_detections, box_scale, image_size: as
            :func:`service.tasks.detection.detect`.

    Returns:
        :func:`service.tasks.detection.detect`'s list: label, class_id, score and box
        (xmin, ymin, xmax, ymax) in pixels of the displayed image, clipped to it, best first
        (ties: lower query, then lower class first).
    """
    if logits.ndim != 2 or logits.shape[1] != len(labels) or boxes.shape != (logits.shape[0], 4):
        raise ValueError(f"expected logits (Q, {len(labels)}) and boxes (Q, 4), got {logits.shape} and {boxes.shape}")
    scores = 1 / (1 + np.exp(-logits.astype(np.float64).ravel()))  # (Q * C,) query-major
    order = np.argsort(-scores, kind="stable")[:max_detections]
    order = order[scores[order] >= threshold]
    queries, class_ids = np.divmod(order, logits.shape[1])
    cx, cy, w, h = boxes[queries].astype(np.float64).T  # each (K,)
    (sx, sy), (width, height) = box_scale, image_size
    corners = (
        np.clip((cx - w / 2) * sx, 0, width),
        np.clip((cy - h / 2) * sy, 0, height),
        np.clip((cx + w / 2) * sx, 0, width),
        np.clip((cy + h / 2) * sy, 0, height),
    )
    return [
        {
            "label": labels[c],
            "class_id": int(c),
            "score": float(s),
            "box": {"xmin": float(x0), "ymin": float(y0), "xmax": float(x1), "ymax": float(y1)},
        }
        for c, s, x0, y0, x1, y1 in zip(class_ids, scores[order], *corners, strict=True)
    ]


def score_rule(name: str) -> Callable[..., list[dict[str, Any]]]:
    """The post-processing of one image's outputs by name: ``"softmax"`` (DETR's, the server's
    :func:`service.tasks.detection.detect`) or ``"sigmoid"`` (:func:`sigmoid_detect`; the
    manifest's ``"sigmoid_top_k"`` is the same, with ``top_k`` = ``max_detections``).

    Raises:
        ValueError: an unknown name.
    """
    if name == "softmax":
        from service.tasks.detection import detect

        return detect
    if name in ("sigmoid", "sigmoid_top_k"):
        return sigmoid_detect
    raise ValueError(f"unknown post-processing {name!r}; known: softmax, sigmoid, sigmoid_top_k")


def served_rule(manifest: Any) -> str:
    """The :func:`score_rule` name a served detector's manifest asks for: its ``task_options.scores``
    (``"softmax"`` without task_options, as the server reads it)."""
    return str((manifest.task_options or {}).get("scores", "softmax"))


def detect_images(
    run: RunFn,
    images: Sequence[np.ndarray],
    preprocessing: Any,
    labels: list[str],
    *,
    threshold: float = 0.0,
    max_detections: int = 100,
    batch_size: int = 50,
    postprocess: str = "softmax",
) -> list[list[dict[str, Any]]]:
    """Detections for uint8 images, through the server's own preprocessing and post-processing.

    Args:
        run: the model (PyTorch or ONNX Runtime) on a batch of preprocessed inputs.
        images: uint8 (H, W) grayscale or (H, W, 3) RGB pixels, each image its own size.
        preprocessing: the manifest's :class:`service.imaging.spec.Preprocessing`.
        labels: class names, "no object" last (``postprocess="sigmoid"``: none).
        threshold, max_detections: as the detect route's parameters (0 and 100 keep every
            query, as COCO evaluation wants).
        batch_size: images per call of ``run``.
        postprocess: :func:`score_rule`'s name.

    Returns:
        Per image, :func:`service.tasks.detection.detect`'s list, boxes in the image's pixels.
    """
    from service.batching.arrays import pad_inputs
    from service.imaging.preprocess import Preprocessor

    detect = score_rule(postprocess)
    preprocess = Preprocessor(preprocessing)
    results: dict[int, list[dict[str, Any]]] = {}
    for start in range(0, len(images), batch_size):
        chunk = [
            Image.fromarray(pixels).convert(preprocessing.color_mode) for pixels in images[start : start + batch_size]
        ]
        inputs = [preprocess(image) for image in chunk]
        # With padding buckets (a masked graph), images of one bucket run together, as the server batches them.
        groups: dict[tuple[int, int] | None, list[int]] = {}
        for i, x in enumerate(inputs):
            groups.setdefault(preprocessing.bucket_for(x.shape[1], x.shape[2]), []).append(i)
        for bucket, members in groups.items():
            if bucket is None:
                logits, boxes = run(np.stack([inputs[i] for i in members]))  # (B, N, K + 1), (B, N, 4)
            else:
                batch = np.empty((len(members), inputs[0].shape[0], *bucket), np.float32)
                mask = np.empty((len(members), *bucket), np.int64)
                logits, boxes = run(*pad_inputs([inputs[i] for i in members], batch, mask))
            for i, image_logits, image_boxes in zip(members, logits, boxes, strict=True):
                image = chunk[i]
                results[start + i] = detect(
                    image_logits,
                    image_boxes,
                    labels,
                    threshold=threshold,
                    max_detections=max_detections,
                    box_scale=preprocess.box_scale(image.size, image.size),
                    image_size=image.size,
                )
    return [results[i] for i in range(len(images))]


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


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes a (N, 4) and b (M, 4) -> (N, M)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def objects_by_image(ground_truth: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """A COCO instances dict's annotations grouped by ``image_id`` (every image a key, maybe empty)."""
    objects: dict[int, list[dict[str, Any]]] = {image["id"]: [] for image in ground_truth["images"]}
    for annotation in ground_truth["annotations"]:
        objects[annotation["image_id"]].append(annotation)
    return objects


def detection_arrays(detections: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The server's detections -> float (N, 4) xyxy pixel boxes and int (N,) class ids, in order."""
    boxes = [[d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")] for d in detections]
    return np.array(boxes, float).reshape(-1, 4), np.array([int(d["class_id"]) for d in detections], int)


def object_arrays(annotations: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """COCO annotations (``bbox`` [x, y, width, height] pixels) -> float (M, 4) xyxy and int (M,) ids."""
    boxes = [[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in annotations)]
    return np.array(boxes, float).reshape(-1, 4), np.array([int(a["category_id"]) for a in annotations], int)


def match_greedy(
    boxes: np.ndarray, labels: np.ndarray, gt_boxes: np.ndarray, gt_labels: np.ndarray, *, iou: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """One image's detections matched to its objects, COCO's rule at one IoU.

    Each detection, best score first, takes the unmatched object of its label with the highest IoU
    of at least ``iou``; a detection that takes one is a true positive, the rest (duplicates
    included) false positives.

    Args:
        boxes: float (N, 4) detections, xyxy pixels, **sorted best score first**.
        labels: int (N,) their class ids.
        gt_boxes: float (M, 4) objects, xyxy pixels.
        gt_labels: int (M,) their class ids.

    Returns:
        bool (N,) true positive per detection, bool (M,) matched per object.
    """
    overlap = pairwise_iou(boxes.reshape(-1, 4), gt_boxes.reshape(-1, 4))
    true_positive = np.zeros(len(boxes), bool)
    matched = np.zeros(len(gt_boxes), bool)
    for i in range(len(boxes)):
        candidates = np.where((gt_labels == labels[i]) & ~matched & (overlap[i] >= iou))[0]
        if len(candidates):
            matched[candidates[np.argmax(overlap[i, candidates])]] = True
            true_positive[i] = True
    return true_positive, matched


def set_quality(
    ground_truth: dict[str, Any],
    detections: Sequence[Sequence[dict[str, Any]]],
    *,
    threshold: float = 0.5,
    iou: float = 0.5,
) -> dict[str, float]:
    """What a user sees in a detector's sets at ``threshold``: duplicates, precision, recall.

    A detection is kept when its score is at least ``threshold`` (the detect route's rule). A
    **duplicate pair** is two kept detections of one image with the same label and IoU above
    ``iou`` (the doubles that NMS would remove, and that a converged DETR does not make:
    Carion et al. 2020, Sec. 4.2). Kept detections are matched to the image's objects
    greedily, best score first, each to the unmatched object of its label with the highest
    IoU of at least ``iou`` (COCO's rule at one IoU); a matched detection is a true positive,
    the rest false positives, an unmatched object a miss.

    Args:
        ground_truth: a COCO instances dict; ``bbox`` is [x, y, width, height] in pixels.
        detections: per image of ``ground_truth["images"]``, the server's detections.

    Returns:
        ``duplicate_canvas_fraction`` (images with at least one duplicate pair / images),
        ``duplicate_pairs``, ``detections``, ``objects``, ``false_positives``, ``missed``,
        ``precision`` (TP / kept; 1 when nothing is kept), ``recall`` (TP / objects) and
        ``missed_scored_below_threshold`` (missed objects that a detection of their label scoring
        under ``threshold`` overlaps by at least ``iou``: found, but not confidently; needs
        ``detections`` at a lower threshold than ``threshold``, e.g. 0).
    """
    images = ground_truth["images"]
    if len(detections) != len(images):
        raise ValueError(f"{len(detections)} detection lists for {len(images)} images")
    objects_of = objects_by_image(ground_truth)
    dup_images = dup_pairs = kept_total = tp_total = objects_total = below_total = 0
    for image, dets in zip(images, detections, strict=True):
        kept = sorted((d for d in dets if d["score"] >= threshold), key=lambda d: -d["score"])
        objects = objects_of[image["id"]]
        boxes, labels = detection_arrays(kept)
        gt_boxes, gt_labels = object_arrays(objects)
        pairs = np.triu((pairwise_iou(boxes, boxes) > iou) & (labels[:, None] == labels[None, :]), k=1)
        dup_pairs += int(pairs.sum())
        dup_images += bool(pairs.any())
        _, matched = match_greedy(boxes, labels, gt_boxes, gt_labels, iou=iou)
        kept_total += len(kept)
        tp_total += int(matched.sum())
        objects_total += len(objects)
        if not matched.all():  # a missed object that a detection under the threshold finds in place
            below = [d for d in dets if d["score"] < threshold]
            low_boxes, low_labels = detection_arrays(below)
            in_place = (pairwise_iou(low_boxes, gt_boxes) >= iou) & (low_labels[:, None] == gt_labels[None, :])
            below_total += int((in_place.any(axis=0) & ~matched).sum())
    return {
        "duplicate_canvas_fraction": dup_images / max(len(images), 1),
        "duplicate_pairs": float(dup_pairs),
        "detections": float(kept_total),
        "objects": float(objects_total),
        "false_positives": float(kept_total - tp_total),
        "missed": float(objects_total - tp_total),
        "missed_scored_below_threshold": float(below_total),
        "precision": tp_total / kept_total if kept_total else 1.0,
        "recall": tp_total / objects_total if objects_total else 1.0,
    }


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
    from service.tasks.detection import DEFAULT_THRESHOLD

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running server")
    parser.add_argument("--model", default="detr-digits")
    parser.add_argument("--count", type=int, default=SPLIT_SIZES["test"], help="test canvases to post")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD, help="the detect route's default, for set_quality"
    )
    args = parser.parse_args(argv)
    canvases = load_split("test", None, args.count)
    pngs = []
    for canvas in canvases:
        buffer = io.BytesIO()
        Image.fromarray(canvas.image).save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    detections = asyncio.run(_detect_over_http(args.url, args.model, pngs, args.concurrency))
    ground_truth = to_coco(canvases)
    ap = coco_ap(ground_truth, detections)
    objects = sum(len(c.labels) for c in canvases)
    print(f"{args.model} over HTTP, {len(canvases)} test canvases ({objects} objects), every query kept (threshold 0):")
    print(", ".join(f"{name} {value:.4f}" for name, value in ap.items() if value >= 0))
    quality = set_quality(ground_truth, detections, threshold=args.threshold)
    print(
        f"at threshold {args.threshold}: duplicate pairs on {quality['duplicate_canvas_fraction']:.2%} of canvases "
        f"({quality['duplicate_pairs']:.0f} pairs); {quality['detections']:.0f} detections, precision "
        f"{quality['precision']:.4f}, recall {quality['recall']:.4f} ({quality['missed']:.0f} objects missed, "
        f"{quality['missed_scored_below_threshold']:.0f} of them found in place under the threshold)"
    )


if __name__ == "__main__":
    main()
