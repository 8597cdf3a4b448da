"""Preprocessing (service/imaging/preprocess.py): a decoded picture to the model's tensor, on hand-computed values.

Each resize policy's own geometry is in test_resize.py."""

from __future__ import annotations

import numpy as np
from PIL import Image

from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing


def spec(**overrides) -> Preprocessing:
    values = {
        "color_mode": "L",
        "size": {"height": 2, "width": 2},
        "interpolation": "nearest",
        "scale": 1 / 255,
        "mean": [0.5],
        "std": [0.25],
    }
    return Preprocessing(**{**values, **overrides})


def test_preprocess_grayscale_by_hand() -> None:
    image = Image.fromarray(np.array([[0, 255], [51, 102]], dtype=np.uint8))
    x = Preprocessor(spec())(image)
    # (p / 255 - 0.5) / 0.25: 0 -> -2, 255 -> 2, 51 -> -1.2, 102 -> -0.4
    expected = np.array([[[-2.0, 2.0], [-1.2, -0.4]]], dtype=np.float32)
    assert x.shape == (1, 2, 2) and x.dtype == np.float32
    np.testing.assert_allclose(x, expected, atol=1e-6)


def test_preprocess_rgb_is_channels_first_with_per_channel_stats() -> None:
    pixels = np.zeros((2, 2, 3), dtype=np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 255, 0, 128
    p = spec(color_mode="RGB", mean=[0.0, 0.5, 0.5], std=[1.0, 0.5, 2.0])
    x = Preprocessor(p)(Image.fromarray(pixels))
    assert x.shape == (3, 2, 2)
    np.testing.assert_allclose(x[0], 1.0, atol=1e-6)  # 255/255
    np.testing.assert_allclose(x[1], -1.0, atol=1e-6)  # (0 - 0.5) / 0.5
    np.testing.assert_allclose(x[2], (128 / 255 - 0.5) / 2.0, atol=1e-6)


def test_preprocess_resizes_with_the_manifest_interpolation() -> None:
    # A 4x4 image of 2x2 blocks; box-resizing to 2x2 averages each block.
    pixels = np.array([[0, 0, 100, 100], [0, 0, 100, 100], [10, 30, 200, 200], [50, 70, 200, 200]], np.uint8)
    x = Preprocessor(spec(interpolation="box", mean=[0.0], std=[1.0], scale=1.0))(Image.fromarray(pixels))
    np.testing.assert_allclose(x[0], [[0, 100], [40, 200]], atol=0.5)
