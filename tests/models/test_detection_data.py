"""The synthetic digits detection set: deterministic, held-out test digits, tight boxes, COCO format."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from models.datasets import digits_to_pixels, load_digits_splits
from models.detection_data import (
    CANVAS_SIZE,
    DIGIT_SIZE,
    INK_OPACITY,
    MAX_OBJECTS,
    digit_crops,
    digit_pools,
    distort,
    ink_box,
    load_split,
    make_canvas,
    make_split,
    to_coco,
)


def test_a_canvas_depends_only_on_its_seed() -> None:
    first = make_canvas("train", 7)
    again = make_split("train", 8)[7]
    assert np.array_equal(first.image, again.image)
    assert np.array_equal(first.boxes, again.boxes) and np.array_equal(first.labels, again.labels)
    assert not np.array_equal(make_canvas("test", 7).image, first.image)  # another split, another seed


def test_canvases_follow_the_recipe() -> None:
    canvases = make_split("val", 60)
    counts = [len(c.labels) for c in canvases]
    assert min(counts) >= 1 and max(counts) <= MAX_OBJECTS and len(set(counts)) >= 4
    for canvas in canvases:
        height, width = canvas.image.shape
        assert canvas.image.dtype == np.uint8
        assert CANVAS_SIZE[0] <= height <= CANVAS_SIZE[1] and CANVAS_SIZE[0] <= width <= CANVAS_SIZE[1]
        boxes = canvas.boxes
        assert np.all(boxes[:, :2] >= 0) and np.all(boxes[:, 2] <= width) and np.all(boxes[:, 3] <= height)
        sides = boxes[:, 2:] - boxes[:, :2]
        assert np.all(sides > 0) and np.all(sides <= DIGIT_SIZE[1])
        assert set(canvas.labels.tolist()) <= set(range(10))
        for i in range(len(boxes)):  # no box holds another's ink
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]


def test_boxes_are_tight_around_the_ink() -> None:
    alpha = np.zeros((12, 12), dtype=np.float32)
    alpha[3:9, 4:7] = 0.9
    alpha[2, 5] = 0.2  # faint: not ink
    alpha[9, 8] = 0.25  # exactly the threshold: ink
    assert ink_box(alpha) == (4, 3, 9, 10)
    # On real canvases the ink is bright against its surroundings: the mean inside the boxes
    # is well above the mean outside them.
    for canvas in make_split("test", 20):
        inside = np.zeros(canvas.image.shape, dtype=bool)
        for x0, y0, x1, y1 in canvas.boxes.astype(int):
            inside[y0:y1, x0:x1] = True
        assert canvas.image[inside].mean() > canvas.image[~inside].mean() + 30


def test_test_canvases_use_only_held_out_digits() -> None:
    pools = digit_pools()
    _, test_split = load_digits_splits()
    assert np.array_equal(digits_to_pixels(pools["test"][0]), test_split.images)
    assert np.array_equal(pools["test"][1], test_split.labels)
    assert [len(pools[s][1]) for s in ("train", "val", "test")] == [1149, 288, 360]
    train_val = {v.tobytes() for s in ("train", "val") for v in pools[s][0]}
    test_only = [v for v in pools["test"][0] if v.tobytes() not in train_val]
    assert len(test_only) >= 355  # scikit-learn's digits repeat a handful of identical images


def test_coco_annotations_load_in_pycocotools(tmp_path) -> None:
    from pycocotools.coco import COCO

    canvases = make_split("test", 5)
    coco = to_coco(canvases)
    assert [image["id"] for image in coco["images"]] == [1, 2, 3, 4, 5]
    first = coco["annotations"][0]
    box = canvases[0].boxes[0]
    assert first["id"] == 1 and first["image_id"] == 1
    assert first["bbox"] == pytest.approx([box[0], box[1], box[2] - box[0], box[3] - box[1]])
    assert first["category_id"] == canvases[0].labels[0]
    with contextlib.redirect_stdout(io.StringIO()):
        api = COCO()
        api.dataset = coco
        api.createIndex()
    assert len(api.getAnnIds()) == sum(len(c.labels) for c in canvases)
    assert sorted(api.getCatIds()) == list(range(10))


def test_a_cached_split_reads_back_exactly(tmp_path) -> None:
    written = load_split("test", tmp_path, count=4)
    assert sorted(p.name for p in (tmp_path / "test").iterdir()) == ["00001.png", "00002.png", "00003.png", "00004.png"]
    read = load_split("test", tmp_path, count=4)
    for a, b in zip(written, read, strict=True):
        assert np.array_equal(a.image, b.image) and np.array_equal(a.boxes, b.boxes)
        assert np.array_equal(a.labels, b.labels)
    (tmp_path / "test" / "00002.png").unlink()  # a damaged cache is regenerated, not trusted
    again = load_split("test", tmp_path, count=4)
    assert np.array_equal(again[1].image, written[1].image) and (tmp_path / "test" / "00002.png").exists()


def test_pretraining_crops_come_from_the_pool_asked_for() -> None:
    crops, labels = digit_crops("train", 20, np.random.default_rng(0))
    assert crops.shape == (20, 64, 64) and crops.dtype == np.uint8
    assert set(labels.tolist()) <= set(range(10)) and len(set(labels.tolist())) > 3
    again, _ = digit_crops("train", 20, np.random.default_rng(0))
    assert np.array_equal(crops, again)


def test_augmented_digits_are_distorted_and_boxed_after_the_distortion() -> None:
    plain, augmented = make_canvas("train", 11), make_canvas("train", 11, augment=True)
    assert not np.array_equal(plain.image, augmented.image)
    assert np.array_equal(make_canvas("train", 11, augment=True).image, augmented.image)  # deterministic
    # Without augment, nothing changed: the same draws, the same canvas as make_split's.
    assert np.array_equal(plain.image, make_split("train", 12)[11].image)
    side = 24
    alpha = np.zeros((side, side), np.float32)
    alpha[4:20, 10:14] = 1.0  # an upright bar
    rng = np.random.default_rng(3)
    moved = [distort(alpha, rng) for _ in range(20)]
    assert all(m.shape == alpha.shape and m.dtype == np.float32 and m.min() >= 0 and m.max() <= 1 for m in moved)
    assert len({ink_box(m) for m in moved}) > 5  # rotated, sheared, stretched: other boxes
    with_ink = 0
    for canvas in make_split("train", 30, augment=True):  # the boxes still hold the bright ink tightly
        for x0, y0, x1, y1 in canvas.boxes.astype(int):
            window = canvas.image[y0:y1, x0:x1].astype(float)
            assert window.max() >= 150 * INK_OPACITY  # ink blended at 150-255 brightness
            with_ink += 1
    assert with_ink >= 30


def test_an_augmented_split_is_cached_apart_from_the_plain_one(tmp_path) -> None:
    augmented = load_split("train", tmp_path, 3, augment=True)
    assert load_split("train", tmp_path, 3, augment=True)[2].image.tobytes() == augmented[2].image.tobytes()
    plain = load_split("train", tmp_path, 3)  # the cache holds the augmented split: regenerated
    assert np.array_equal(plain[2].image, make_canvas("train", 2).image)
