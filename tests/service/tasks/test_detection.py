"""Detection (service/tasks/detection.py): post-processing on hand-computed values, and drawing the boxes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from service.tasks.detection import PALETTE, detect, draw_detections, font_size, line_width
from tests.service.helpers import allowed_region, drawn_mask

LABELS = ["cat", "dog", "no-object"]


def _logits(*probabilities: list[float]) -> np.ndarray:
    return np.log(np.asarray(probabilities, dtype=np.float32))


def test_detect_by_hand() -> None:
    logits = _logits(
        [0.7, 0.2, 0.1],  # query 0: cat 0.7
        [0.05, 0.05, 0.9],  # query 1: mostly nothing; best object class scores only 0.05
        [0.1, 0.8, 0.1],  # query 2: dog 0.8
    )
    boxes = np.array([[0.5, 0.5, 0.2, 0.4], [0.1, 0.1, 0.1, 0.1], [0.25, 0.75, 0.1, 0.1]], dtype=np.float32)
    result = detect(
        logits, boxes, LABELS, threshold=0.5, max_detections=100, box_scale=(200.0, 100.0), image_size=(200, 100)
    )
    assert [(d["label"], d["class_id"]) for d in result] == [("dog", 1), ("cat", 0)]  # by score, no-object gone
    assert result[0]["score"] == pytest.approx(0.8, rel=1e-6) and result[1]["score"] == pytest.approx(0.7, rel=1e-6)
    # dog: cx 0.25 * 200 = 50, w 0.1 * 200 = 20; cy 0.75 * 100 = 75, h 0.1 * 100 = 10.
    assert result[0]["box"] == pytest.approx({"xmin": 40.0, "ymin": 70.0, "xmax": 60.0, "ymax": 80.0})
    assert result[1]["box"] == pytest.approx({"xmin": 80.0, "ymin": 30.0, "xmax": 120.0, "ymax": 70.0})


def test_threshold_is_inclusive_and_max_detections_keeps_the_best() -> None:
    logits = _logits([0.5, 0.25, 0.25], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4])
    boxes = np.full((3, 4), 0.5, dtype=np.float32)
    kwargs = {"box_scale": (10.0, 10.0), "image_size": (10, 10)}
    kept = detect(logits, boxes, LABELS, threshold=0.5, max_detections=100, **kwargs)
    assert [d["class_id"] for d in kept] == [1, 0]  # 0.6, then exactly 0.5
    everything = detect(logits, boxes, LABELS, threshold=0.0, max_detections=100, **kwargs)
    assert [round(d["score"], 6) for d in everything] == [0.6, 0.5, 0.3]  # query 2's best object class is 0.3
    assert everything[2]["class_id"] == 0  # cat and dog tie at 0.3: the lower id
    assert len(detect(logits, boxes, LABELS, threshold=0.0, max_detections=1, **kwargs)) == 1
    assert len(detect(logits, boxes, LABELS, threshold=0.0, max_detections=10**30, **kwargs)) == 3


def test_boxes_are_clipped_to_the_image() -> None:
    logits = _logits([0.9, 0.05, 0.05])
    boxes = np.array([[0.05, 0.95, 0.3, 0.3]], dtype=np.float32)  # sticks out left and bottom
    (result,) = detect(
        logits, boxes, LABELS, threshold=0.5, max_detections=5, box_scale=(100.0, 50.0), image_size=(100, 50)
    )
    assert result["box"] == pytest.approx({"xmin": 0.0, "ymin": 40.0, "xmax": 20.0, "ymax": 50.0})


def test_softmax_includes_no_object_before_it_is_dropped() -> None:
    logits = np.array([[0.0, 0.0, math.log(2.0)]], dtype=np.float32)  # probabilities 1/4, 1/4, 1/2
    (result,) = detect(
        logits,
        np.full((1, 4), 0.5, np.float32),
        LABELS,
        threshold=0,
        max_detections=1,
        box_scale=(1, 1),
        image_size=(1, 1),
    )
    assert result["score"] == pytest.approx(0.25, rel=1e-6)


def test_wrong_shapes_are_an_internal_error() -> None:
    with pytest.raises(ValueError, match="expected logits"):
        detect(
            np.zeros((4, 2)),
            np.zeros((4, 4)),
            LABELS,
            threshold=0.5,
            max_detections=1,
            box_scale=(1, 1),
            image_size=(1, 1),
        )


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
