"""Datasets, as uint8 pixels exactly as a client would upload them.

Training, export-time evaluation and the server's end-to-end test all start from the same
uint8 pixels, so the accuracy measured offline is the accuracy served over HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIGITS_LABELS = [str(i) for i in range(10)]


@dataclass(frozen=True)
class Split:
    """A labelled image split.

    Attributes:
        images: uint8 (N, H, W) grayscale or (N, H, W, 3) RGB pixels, 0-255.
        labels: int64 (N,) class ids.
    """

    images: np.ndarray
    labels: np.ndarray


def digits_to_pixels(values: np.ndarray) -> np.ndarray:
    """scikit-learn digits values 0-16 -> uint8 pixels 0-255 (round(v * 255 / 16)), same shape."""
    return np.rint(values.astype(np.float64) * 255.0 / 16.0).astype(np.uint8)


def load_digits_splits(test_size: float = 0.2, random_state: int = 0) -> tuple[Split, Split]:
    """scikit-learn's 1,797 8x8 digits, stratified 80/20 (random_state 0): 1,437 train, 360 test.

    Returns:
        (train, test), images uint8 (N, 8, 8), ink bright on a dark background.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = digits_to_pixels(digits.images)  # (1797, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(
        pixels, digits.target, test_size=test_size, stratify=digits.target, random_state=random_state
    )
    return Split(x_train, y_train.astype(np.int64)), Split(x_test, y_test.astype(np.int64))
