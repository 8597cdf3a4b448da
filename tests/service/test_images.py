"""Decoding and preprocessing, on hand-computed values."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.core.errors import BadRequest, InvalidImage, PayloadTooLarge
from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing
from tests.conftest import png_bytes


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


def test_decode_applies_exif_orientation_and_reports_displayed_size() -> None:
    pixels = np.zeros((20, 40), dtype=np.uint8)  # stored 40 wide, 20 high
    pixels[:, :10] = 255  # white stripe on the stored left
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", exif=exif)
    decoded = decode_image(buffer.getvalue(), color_mode="L", max_pixels=10_000)
    assert (decoded.width, decoded.height) == (20, 40)
    shown = np.asarray(decoded.image)
    assert shown.shape == (40, 20)
    assert shown[:10].mean() == 255 and shown[10:].mean() == 0  # the stripe is now on top


def test_decode_converts_rgb_to_grayscale_and_back() -> None:
    rgb = np.full((4, 4, 3), (255, 0, 0), dtype=np.uint8)
    decoded = decode_image(png_bytes(rgb), color_mode="L", max_pixels=100)
    assert decoded.image.mode == "L" and np.asarray(decoded.image)[0, 0] == 76  # ITU-R 601-2 luma of pure red
    gray = np.full((4, 4), 200, dtype=np.uint8)
    assert np.asarray(decode_image(png_bytes(gray), color_mode="RGB", max_pixels=100).image)[0, 0].tolist() == [200] * 3


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"", BadRequest, "empty"),
        (b"definitely not an image", InvalidImage, "not an image"),
        (png_bytes(np.zeros((64, 64), np.uint8))[:60], InvalidImage, "the PNG image is truncated"),
        (png_bytes(np.zeros((101, 100), np.uint8)), PayloadTooLarge, "10100 pixels"),
    ],
)
def test_decode_errors(data: bytes, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        decode_image(data, color_mode="L", max_pixels=10_000)


def test_jpeg_draft_mode_decodes_a_large_photo_smaller() -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (1600, 2400, 3), dtype=np.uint8)).save(buffer, "JPEG")
    decoded = decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**7, draft_size=(224, 224))
    assert (decoded.width, decoded.height) == (2400, 1600)  # the full-resolution size is reported
    # DCT-scaled by 1/4 while decoding: the smallest scale that keeps both sides >= 224 (1/8 gives 300x200).
    assert decoded.image.size == (600, 400)


def test_a_strip_one_pixel_wide_keeps_a_side_of_at_least_one_pixel_under_shortest_edge() -> None:
    from PIL import Image

    from service.imaging.preprocess import Preprocessor
    from service.imaging.spec import Preprocessing

    spec = Preprocessing(
        color_mode="RGB", resize="shortest_edge", shortest_edge=800, longest_edge=1333, mean=[0.5] * 3, std=[0.5] * 3
    )
    preprocessor = Preprocessor(spec)
    assert preprocessor.content_size(40000, 1) == (1333, 1)  # (width, height); the exact arithmetic gives 0
    assert preprocessor(Image.new("RGB", (40000, 1))).shape == (3, 1, 1333)


def test_reading_a_png_header_decodes_no_pixel_and_its_late_exif_still_turns_it(monkeypatch) -> None:
    """Issue 14: the request path opens each file once; its header count must not decode a PNG
    (Pillow's getexif loads a PNG to find an eXIf chunk after the pixels)."""
    import io
    import struct
    import zlib

    from PIL import Image, ImageFile

    from service.imaging.images import open_image

    buffer = io.BytesIO()
    Image.new("L", (30, 20), 200).save(buffer, "PNG")
    plain = buffer.getvalue()
    exif = Image.Exif()
    exif[0x0112] = 6  # turn 90 degrees clockwise to display: 30x20 stored is 20x30 displayed
    payload = exif.tobytes()
    chunk = struct.pack(">I", len(payload)) + b"eXIf" + payload
    chunk += struct.pack(">I", zlib.crc32(b"eXIf" + payload))
    late = plain[:-12] + chunk + plain[-12:]  # eXIf after IDAT, before IEND

    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(1) or real_load(self))
    opened = open_image(late, color_mode="L", max_pixels=10_000)
    assert loads == [] and opened.pixels == 600
    decoded = opened.decode((0, 0, 0))
    assert (decoded.width, decoded.height) == (20, 30) and decoded.image.size == (20, 30)
    with pytest.raises(RuntimeError, match="decoded already"):
        opened.decode((0, 0, 0))
