"""Post-processing in numpy, outside the graph: the graphs output raw logits and boxes."""

from __future__ import annotations

from typing import Any

import numpy as np


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax.

    Args:
        logits: float array of any shape.
        axis: the class axis.

    Returns:
        float32 probabilities of the same shape, summing to 1 along ``axis``.
    """
    shifted = logits.astype(np.float32) - np.max(logits, axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return exp / np.sum(exp, axis=axis, keepdims=True)


def classify(logits: np.ndarray, labels: list[str], top_k: int) -> list[dict[str, Any]]:
    """The ``top_k`` classes of one image, best first.

    Args:
        logits: float array (num_classes,), raw scores for one image.
        labels: class index -> name, ``len(labels) == num_classes``.
        top_k: how many to return, >= 1; clamped to ``num_classes`` (as the Hugging Face
            image-classification pipeline does).

    Returns:
        ``[{"label": str, "class_id": int, "score": float}, ...]``, scores are softmax
        probabilities in [0, 1], sorted descending; ties keep the lower class id first.
    """
    if logits.ndim != 1 or logits.shape[0] != len(labels):
        raise ValueError(f"expected logits ({len(labels)},), got {logits.shape}")
    probabilities = softmax(logits)
    k = min(top_k, len(labels))
    order = np.argsort(-probabilities, kind="stable")[:k]
    return [{"label": labels[i], "class_id": int(i), "score": float(probabilities[i])} for i in order]


def detect(
    logits: np.ndarray,
    boxes: np.ndarray,
    labels: list[str],
    *,
    threshold: float,
    max_detections: int,
    box_scale: tuple[float, float],
    image_size: tuple[int, int],
) -> list[dict[str, Any]]:
    """DETR's set prediction for one image, read directly: no NMS, no matching.

    Each query's class probabilities are a softmax over all classes; its best class other than
    "no object" (the last) and that class's probability are its label and score (DETR's
    ``PostProcess``). Queries scoring at least ``threshold`` are kept, best first.

    Args:
        logits: float (num_queries, num_classes + 1) raw class scores, "no object" last.
        boxes: float (num_queries, 4) boxes (cx, cy, w, h) normalised to [0, 1] of the model's
            input frame.
        labels: class index -> name, ``len(labels) == num_classes + 1``, "no object" last.
        threshold: the lowest score kept, in [0, 1].
        max_detections: the most detections returned, >= 1 (the best ones).
        box_scale: (sx, sy), pixels of the displayed image per unit of normalised input
            coordinate (:meth:`service.preprocess.Preprocessor.box_scale`).
        image_size: (width, height) of the displayed image; boxes are clipped to it.

    Returns:
        ``[{"label", "class_id", "score", "box": {"xmin", "ymin", "xmax", "ymax"}}, ...]``,
        boxes in pixels of the displayed image (x right, y down, edges), sorted by score
        descending (ties keep the lower query index first).
    """
    if logits.ndim != 2 or logits.shape[1] != len(labels) or boxes.shape != (logits.shape[0], 4):
        raise ValueError(f"expected logits (Q, {len(labels)}) and boxes (Q, 4), got {logits.shape} and {boxes.shape}")
    probabilities = softmax(logits)[:, :-1]  # (Q, num_classes): "no object" dropped
    class_ids = np.argmax(probabilities, axis=1)  # (Q,)
    scores = probabilities[np.arange(len(class_ids)), class_ids]  # (Q,)
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] >= threshold][:max_detections]

    cx, cy, w, h = boxes[order].astype(np.float64).T  # each (K,)
    sx, sy = box_scale
    width, height = image_size
    xmin = np.clip((cx - w / 2) * sx, 0, width)
    ymin = np.clip((cy - h / 2) * sy, 0, height)
    xmax = np.clip((cx + w / 2) * sx, 0, width)
    ymax = np.clip((cy + h / 2) * sy, 0, height)
    return [
        {
            "label": labels[c],
            "class_id": int(c),
            "score": float(s),
            "box": {"xmin": float(x0), "ymin": float(y0), "xmax": float(x1), "ymax": float(y1)},
        }
        for c, s, x0, y0, x1, y1 in zip(class_ids[order], scores[order], xmin, ymin, xmax, ymax, strict=True)
    ]
