"""Drawing detections: the picture has the displayed size and its drawn pixels lie on the boxes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from service.imaging.render import png_bytes
from service.tasks.detection import PALETTE, draw_detections, font_size, line_width
from tests.service.helpers import allowed_region, drawn_mask


def _detection(class_id: int, score: float, xmin: float, ymin: float, xmax: float, ymax: float) -> dict:
    box = {"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax}
    return {"label": str(class_id), "class_id": class_id, "score": score, "box": box}


def test_drawing_stays_on_the_boxes_and_outlines_them() -> None:
    image = Image.new("L", (300, 200), 40)
    detections = [_detection(3, 0.9, 50.0, 60.0, 120.0, 150.0), _detection(7, 0.6, 200.0, 20.0, 260.0, 80.0)]
    drawn = draw_detections(image, detections, (300, 200))
    assert drawn.size == (300, 200) and drawn.mode == "RGB"
    changed = drawn_mask(image, drawn)
    margin = font_size(300, 200) + 6  # the label tag sits just above the box's top-left corner
    assert not np.any(changed & ~allowed_region(detections, (300, 200), margin))
    pixels = np.asarray(drawn)
    for det in detections:  # each box's left, right and bottom edges are in its class colour
        b, colour = det["box"], PALETTE[det["class_id"]]
        mid_y = int((b["ymin"] + b["ymax"]) / 2)
        assert tuple(pixels[mid_y, int(b["xmin"])]) == colour
        assert tuple(pixels[mid_y, int(b["xmax"]) - 1]) == colour
        assert tuple(pixels[int(b["ymax"]) - 1, int((b["xmin"] + b["xmax"]) / 2)]) == colour
        assert tuple(pixels[mid_y, int((b["xmin"] + b["xmax"]) / 2)]) == (40, 40, 40)  # the inside is untouched


def test_a_draft_decoded_image_is_drawn_at_its_displayed_size() -> None:
    small = Image.new("RGB", (100, 50), (10, 20, 30))
    drawn = draw_detections(small, [_detection(0, 0.8, 300.0, 100.0, 380.0, 180.0)], (400, 200))
    assert drawn.size == (400, 200)
    assert tuple(np.asarray(drawn)[140, 300]) == PALETTE[0]


def test_no_detections_gives_the_image_unchanged() -> None:
    image = Image.new("L", (20, 10), 99)
    assert not drawn_mask(image, draw_detections(image, [], (20, 10))).any()


def test_line_and_font_grow_with_the_image() -> None:
    assert line_width(100, 80) == 1 and line_width(1024, 768) == 4
    assert font_size(100, 80) == 10 and font_size(1600, 1200) == 40


def test_png_bytes_are_a_png() -> None:
    data = png_bytes(Image.new("RGB", (5, 4)))
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(data)).size == (5, 4)
