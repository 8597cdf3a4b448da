"""The ``center_crop`` preprocessing policy by hand, and the manifest's optional ``attention`` field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import Manifest, Preprocessing
from tests.conftest import MODEL_REPOSITORY


def crop(width: int, height: int, interpolation: str = "box") -> Preprocessor:
    spec = Preprocessing(
        color_mode="L",
        resize="center_crop",
        size={"height": height, "width": width},
        interpolation=interpolation,
        scale=1.0,
        mean=[0.0],
        std=[1.0],
    )
    return Preprocessor(spec)


def columns(width: int, height: int) -> Image.Image:
    """An "L" image whose pixel value is twice its column index (pair means stay integers)."""
    return Image.fromarray(np.tile(2 * np.arange(width, dtype=np.uint8), (height, 1)))


def test_same_aspect_same_size_is_untouched() -> None:
    image = Image.fromarray(np.arange(16, dtype=np.uint8).reshape(4, 4))
    assert crop(4, 4)(image)[0].tolist() == np.arange(16).reshape(4, 4).tolist()


def test_a_wide_image_keeps_its_centre_columns() -> None:
    # 8x4 -> 4x4: the scale is 1 (the shorter side already fits); columns 2..5 remain.
    out = crop(4, 4)(columns(8, 4))
    assert out.shape == (1, 4, 4)
    assert out[0].tolist() == [[4, 6, 8, 10]] * 4


def test_a_larger_wide_image_is_scaled_then_cropped() -> None:
    # 16x8 -> 4x4: scale 0.5, the input covers columns 4..11, each output pixel the mean of 2x2 (box).
    out = crop(4, 4)(columns(16, 8))
    assert out[0].tolist() == [[9, 13, 17, 21]] * 4


def test_a_tall_image_keeps_its_centre_rows() -> None:
    rows = Image.fromarray(np.tile(2 * np.arange(12, dtype=np.uint8)[:, None], (1, 6)))  # 6 wide, 12 tall
    out = crop(3, 3)(rows)  # scale 0.5: rows 3..8 -> 3 rows, pairs averaged
    assert out[0, :, 0].tolist() == [7, 11, 15]


def test_input_region_by_hand() -> None:
    assert crop(32, 32).input_region(451, 300) == pytest.approx((75.5, 0.0, 375.5, 300.0))
    assert crop(32, 32).input_region(300, 451) == pytest.approx((0.0, 75.5, 300.0, 375.5))
    assert crop(4, 2).input_region(10, 10) == pytest.approx((0.0, 2.5, 10.0, 7.5))  # a non-square input
    stretch = Preprocessor(Preprocessing(color_mode="L", size={"height": 4, "width": 4}, mean=[0], std=[1]))
    assert stretch.input_region(10, 7) == (0.0, 0.0, 10.0, 7.0)


def test_attention_field_is_optional_and_checked() -> None:
    data = json.loads((MODEL_REPOSITORY / "vit-digits" / "1" / "model.json").read_text())
    assert Manifest.model_validate(data).attention is None  # manifests written before it still load
    data["attention"] = {"output": "attentions", "grid": {"height": 4, "width": 4}}
    with pytest.raises(ValueError, match="not one of outputs"):
        Manifest.model_validate(data)
    data["outputs"] = [*data["outputs"], "attentions"]
    assert Manifest.model_validate(data).attention.grid.width == 4
