"""The input formats: letterboxed as served today, or each canvas at its own size in a bucket with a pixel mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.detection_data import Canvas, make_split
from models.detr_inputs import BUCKET_STEP, INPUT_FORMATS, bucket_side, epoch_batches, fit, pixel_mask


def test_bucket_targets_are_normalised_to_the_unpadded_image() -> None:
    canvases = make_split("val", 12)
    form = INPUT_FORMATS["bucket"]
    prepared = form.prepare(canvases)
    for canvas, image, size, target in zip(canvases, prepared.images, prepared.sizes, prepared.targets, strict=True):
        height, width = canvas.image.shape
        assert size.tolist() == [height, width]
        assert torch.equal(image[:height, :width], torch.from_numpy(canvas.image))
        assert not image[height:].any() and not image[:, width:].any()
        cx, cy, w, h = target["boxes"].T.numpy()
        np.testing.assert_allclose((cx - w / 2) * width, canvas.boxes[:, 0], atol=1e-4)
        np.testing.assert_allclose((cy - h / 2) * height, canvas.boxes[:, 1], atol=1e-4)
        np.testing.assert_allclose((cx + w / 2) * width, canvas.boxes[:, 2], atol=1e-4)
        np.testing.assert_allclose((cy + h / 2) * height, canvas.boxes[:, 3], atol=1e-4)
        assert torch.equal(target["labels"], torch.from_numpy(canvas.labels))


def test_a_bucket_batch_is_padded_bottom_right_with_its_mask() -> None:
    canvases = make_split("val", 40)
    form = INPUT_FORMATS["bucket"]
    prepared = form.prepare(canvases)
    for batch in epoch_batches(prepared.buckets, 4, torch.Generator().manual_seed(0)):
        images, mask, targets = form.batch(prepared, batch)
        sizes = prepared.sizes[batch]
        height, width = images.shape[-2:]
        assert len(prepared.buckets[batch].unique()) == 1  # one bucket per batch
        assert height % BUCKET_STEP == 0 and width % BUCKET_STEP == 0
        assert height == bucket_side(int(sizes[:, 0].max())) and width == bucket_side(int(sizes[:, 1].max()))
        assert images.dtype == torch.float32 and images.shape[1] == 1 and mask.shape == (len(batch), height, width)
        for k, i in enumerate(batch.tolist()):
            h, w = canvases[i].image.shape
            assert mask[k, :h, :w].all() and mask[k].sum() == h * w  # 1 on the image, 0 on the padding
            torch.testing.assert_close(images[k, 0, :h, :w], torch.from_numpy(canvases[i].image).float() / 255)
            assert not images[k, 0][mask[k] == 0].any()
            assert targets[k] is prepared.targets[i]


def test_padded_batches_are_all_128_square() -> None:
    form = INPUT_FORMATS["padded"]
    prepared = form.prepare(make_split("val", 6))
    images, mask, _ = form.batch(prepared, torch.arange(6))
    assert images.shape == (6, 1, 128, 128) and mask.shape == (6, 128, 128)
    assert mask.sum((1, 2)).tolist() == (prepared.sizes[:, 0] * prepared.sizes[:, 1]).tolist()


def test_letterbox_is_todays_recipe_without_a_mask() -> None:
    from models.train_detr import to_inputs_and_targets

    canvases = make_split("test", 3)
    form = INPUT_FORMATS["letterbox"]
    prepared = form.prepare(canvases)
    images, mask, targets = form.batch(prepared, torch.arange(3))
    inputs, expected = to_inputs_and_targets(canvases)
    assert mask is None and torch.equal(images, inputs) and images.shape == (3, 1, 128, 128)
    assert all(torch.equal(a["boxes"], b["boxes"]) for a, b in zip(targets, expected, strict=True))
    assert form.preprocessing()["resize"] == "letterbox" and INPUT_FORMATS["bucket"].preprocessing()["pixel_mask"]


def test_one_bucket_draws_the_order_todays_recipe_draws() -> None:
    """A permutation cut into full batches, the tail dropped: what train_detr always did."""
    order = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    batches = epoch_batches(torch.zeros(10, dtype=torch.int64), 4, torch.Generator().manual_seed(3))
    assert [b.tolist() for b in batches] == [order[:4].tolist(), order[4:8].tolist()]
    fewer = epoch_batches(torch.zeros(3, dtype=torch.int64), 4, torch.Generator())
    assert len(fewer) == 1 and sorted(fewer[0].tolist()) == [0, 1, 2]  # fewer than a batch: all in one


def test_several_buckets_cover_every_image_once_per_epoch() -> None:
    buckets = torch.tensor([0, 1, 1, 2, 0, 1, 2, 2, 2, 1])
    batches = epoch_batches(buckets, 3, torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b.tolist()) == list(range(10))
    assert all(len(buckets[b].unique()) == 1 and len(b) <= 3 for b in batches)


def test_larger_images_are_shrunk_to_fit_and_their_boxes_with_them() -> None:
    pixels = np.zeros((100, 256), dtype=np.uint8)
    small, scale = fit(pixels)
    assert small.shape == (50, 128) and scale == 0.5
    canvas = Canvas(pixels, np.array([[64.0, 20.0, 128.0, 60.0]], dtype=np.float32), np.array([3]))
    box = INPUT_FORMATS["bucket"].prepare([canvas]).targets[0]["boxes"][0].tolist()
    assert box == pytest.approx([96 / 256, 40 / 100, 64 / 256, 40 / 100])


def test_the_pixel_mask_marks_the_top_left_rectangle() -> None:
    mask = pixel_mask(torch.tensor([[2, 3], [1, 1]]), 3, 4)
    assert mask.tolist() == [
        [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]],
        [[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    ]


def test_masked_detections_are_scaled_by_the_image_not_the_bucket() -> None:
    """A model that always says 'the whole image' gives each canvas its own full-size box."""
    canvases = make_split("val", 5)
    seen = []

    def run(images: np.ndarray, mask: np.ndarray | None):
        seen.append((images.shape, None if mask is None else mask.shape))
        logits = np.full((len(images), 2, 11), -9.0)
        logits[:, 0, 4] = 9.0  # query 0: class 4, sure
        boxes = np.tile(np.array([0.5, 0.5, 1.0, 1.0]), (len(images), 2, 1))
        return logits, boxes

    labels = [str(i) for i in range(10)] + ["no-object"]
    results = INPUT_FORMATS["bucket"].detections(run, canvases, labels, "softmax", threshold=0.5)
    assert all(mask is not None and shape[-2:] == mask[-2:] for shape, mask in seen)
    for canvas, dets in zip(canvases, results, strict=True):
        height, width = canvas.image.shape
        assert [d["class_id"] for d in dets] == [4]
        assert dets[0]["box"] == {"xmin": 0.0, "ymin": 0.0, "xmax": float(width), "ymax": float(height)}


def test_resized_buckets_feed_exactly_the_pixels_the_server_computes() -> None:
    """resized-bucket: the longer side becomes 128 (up or down), as the manifest's shortest_edge policy serves it."""
    from PIL import Image

    from export.detr import served_preprocessing
    from service.imaging.preprocess import Preprocessor

    wide = Canvas(np.full((150, 300), 9, np.uint8), np.zeros((0, 4), np.float32), np.zeros(0, np.int64))  # shrinks
    canvases = [*make_split("val", 12), wide]
    form = INPUT_FORMATS["resized-bucket"]
    record = form.preprocessing()
    served = served_preprocessing({"pixel_mask": True, "preprocessing": record})
    assert (served.resize, served.shortest_edge, served.longest_edge) == ("shortest_edge", 128, 128)
    assert [(b.height, b.width) for b in served.buckets] == [(96, 128), (128, 96), (128, 128)]
    preprocess = Preprocessor(served)
    prepared = form.prepare(canvases)
    for canvas, image, size, target in zip(canvases, prepared.images, prepared.sizes, prepared.targets, strict=True):
        expected = preprocess(Image.fromarray(canvas.image))  # float32 (1, h, w), unpadded
        h, w = expected.shape[1:]
        assert size.tolist() == [h, w] and max(h, w) in (127, 128)  # HF's arithmetic may truncate one pixel
        assert served.bucket_for(h, w) is not None
        np.testing.assert_array_equal(image[:h, :w].numpy(), np.rint(expected[0] * 255).astype(np.uint8))
        assert not image[h:].any() and not image[:, w:].any()
        canvas_h, canvas_w = canvas.image.shape
        cx, cy, bw, bh = target["boxes"].T.numpy()  # normalised to the canvas, which the resized image shows whole
        np.testing.assert_allclose((cx - bw / 2) * canvas_w, canvas.boxes[:, 0], atol=1e-4)
        np.testing.assert_allclose((cy + bh / 2) * canvas_h, canvas.boxes[:, 3], atol=1e-4)
    assert len(prepared.buckets.unique()) > 1  # landscape and portrait canvases: several buckets


def test_a_checkpoint_recorded_before_resized_buckets_is_still_served_by_fit() -> None:
    from export.detr import served_preprocessing

    record = {**INPUT_FORMATS["bucket"].preprocessing(), "resize": "pad"}  # the record's name until 2026-12-03
    served = served_preprocessing({"pixel_mask": True, "preprocessing": record})
    assert served.resize == "fit" and served.longest_edge == 128 and served.shortest_edge is None
    assert [(b.height, b.width) for b in served.buckets] == [(96, 96), (96, 128), (128, 96), (128, 128)]


def test_resized_served_batches_are_padded_to_the_served_buckets_exactly_as_the_server_pads() -> None:
    """resized-served: the batch (pixels and mask) equals the server's Preprocessor + pad_inputs for its bucket."""
    from PIL import Image

    from export.detr import served_preprocessing
    from service.batching.arrays import pad_inputs
    from service.imaging.preprocess import Preprocessor

    canvases = make_split("val", 24)
    form = INPUT_FORMATS["resized-served"]
    record = form.preprocessing()
    assert record["pad_to"] == "bucket" and record["trained_on_served_buckets"] is True
    served = served_preprocessing({"pixel_mask": True, "preprocessing": record})
    preprocess = Preprocessor(served)
    prepared = form.prepare(canvases)
    shapes = set()
    for bucket in prepared.buckets.unique().tolist():
        members = torch.nonzero(prepared.buckets == bucket)[:, 0]
        images, mask, _ = form.batch(prepared, members)
        inputs = [preprocess(Image.fromarray(canvases[i].image)) for i in members.tolist()]
        height, width = served.bucket_for(*inputs[0].shape[1:])
        assert all(served.bucket_for(*x.shape[1:]) == (height, width) for x in inputs)  # one served bucket a batch
        expected, expected_mask = pad_inputs(
            inputs,
            np.empty((len(inputs), 1, height, width), np.float32),
            np.empty((len(inputs), height, width), np.int64),
        )
        assert images.shape == expected.shape and mask is not None
        np.testing.assert_allclose(images.numpy(), expected, atol=1e-6)
        np.testing.assert_array_equal(mask.numpy(), expected_mask)
        shapes.add((height, width))
    assert len(shapes) > 1  # landscape and portrait canvases
