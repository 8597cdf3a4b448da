"""Classification: a classifier's logits -> the top-k labels with softmax scores."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.postprocess import softmax


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
