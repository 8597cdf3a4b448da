"""``render=png`` pictures (service/imaging/render.py): PNG encoding, the bounded picture size, the canvas."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.imaging.render import MAX_PICTURE_PIXELS, displayed_canvas, picture_size, png_bytes, scale_of
from service.tasks.detection import draw_detections


def test_png_bytes_are_a_png() -> None:
    data = png_bytes(Image.new("RGB", (5, 4)))
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(data)).size == (5, 4)


def test_a_large_picture_is_drawn_scaled_down_to_the_bound() -> None:
    assert picture_size((640, 480)) == (640, 480)
    assert picture_size((2048, 2048)) == (2048, 2048)
    width, height = picture_size((8000, 5000))
    assert width * height <= MAX_PICTURE_PIXELS and abs(width / height - 1.6) < 1e-3
    assert picture_size((100_000, 1)) == (100_000, 1)  # within the bound: 0.1 MP
    for size in ((400_000, 20), (10_000_000, 1), (40_000_000, 1), (1, 40_000_000)):  # a side scaled to < 1 px
        width, height = picture_size(size)
        assert width * height <= MAX_PICTURE_PIXELS and width >= 1 and height >= 1


def test_a_one_bit_image_keeps_its_thin_lines() -> None:
    lines = np.zeros((5000, 8000), bool)
    lines[:, ::50] = True  # 160 one-pixel lines
    canvas = np.asarray(displayed_canvas(Image.fromarray(lines), (8000, 5000)))
    inked = canvas[..., 0].max(axis=0) > 0
    # nearest neighbour (Pillow's resize of mode "1") kept 55 of them; greyscale first keeps each one
    runs = np.count_nonzero(inked[1:] & ~inked[:-1]) + int(inked[0])
    assert runs == 160


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "RGBA", "I;16", "CMYK", "F"])
def test_the_canvas_is_rgb_at_the_picture_size(mode: str) -> None:
    canvas = displayed_canvas(Image.new(mode, (4000, 2500)), (8000, 5000))  # decoded at half size (draft)
    assert canvas.mode == "RGB" and canvas.size == picture_size((8000, 5000))
    small = displayed_canvas(Image.new(mode, (30, 20)), (60, 40))
    assert small.mode == "RGB" and small.size == (60, 40)
    assert scale_of(small, (60, 40)) == (1.0, 1.0)


def test_boxes_are_drawn_scaled_with_the_picture() -> None:
    size = (8000, 5000)
    box = {"xmin": 4000.0, "ymin": 1000.0, "xmax": 6000.0, "ymax": 4000.0}
    drawn = draw_detections(Image.new("L", size), [{"class_id": 1, "label": "1", "score": 0.9, "box": box}], size)
    sx, sy = scale_of(drawn, size)
    assert drawn.size == picture_size(size) and sx < 1
    pixels = np.asarray(drawn).any(axis=2)
    mid_y = round(2500 * sy)
    assert pixels[mid_y, round(4000 * sx)] and pixels[mid_y, round(6000 * sx) - 1]  # its left and right edges
    assert not pixels[mid_y, round(5000 * sx)] and not pixels[mid_y, round(3900 * sx)]  # inside and outside
