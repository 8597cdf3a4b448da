"""Numpy helpers shared by the tasks' post-processing (``service/tasks/``), outside the graph."""

from __future__ import annotations

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
    probabilities: np.ndarray = exp / np.sum(exp, axis=axis, keepdims=True)  # numpy types the quotient Any
    return probabilities
