"""How the digits canvases become DETR's inputs and targets, and how its outputs are read back.

One entry of ``INPUT_FORMATS`` per way of feeding the model; training, evaluation and the
checkpoint's preprocessing record all come from the same entry, so they cannot disagree:

* ``letterbox`` (today's recipe and today's served graph): the server's own
  :class:`service.imaging.preprocess.Preprocessor` letterboxes each canvas to 128x128 (scaled to fit,
  padding bottom and right); no pixel mask; target boxes normalised to that padded 128x128
  frame, as the server's ``box_scale`` reads them.
* ``bucket`` (issue 18): each canvas at its own pixels (64-128 px, any aspect; an image over
  ``MAX_SIZE`` is first shrunk to fit), padded bottom and right to its *bucket*, each side
  rounded up to a multiple of ``BUCKET_STEP`` (16, the backbone's stride, so the mask falls
  on whole feature cells), with a ``pixel_mask`` (B, H, W) 1 on the image and 0 on padding.
  A batch holds one bucket only, as the server's batcher never mixes shapes.
* ``padded``: the same, padded to ``MAX_SIZE`` x ``MAX_SIZE`` with the mask (one shape for all).
* ``resized-bucket``: each canvas first resized, up or down, so that its longer side is
  ``MAX_SIZE`` (the server's ``shortest_edge`` policy with ``shortest_edge = longest_edge =
  MAX_SIZE``: the Hugging Face ``DetrImageProcessor`` arithmetic, :func:`enlarge`), then padded to
  its bucket with the mask as ``bucket``. At their own size, 64-128 px canvases give the
  stride-16 backbone 4x4 to 8x8 feature maps; resized, one side always has 8 cells, as the
  letterboxed model's 128x128 input does (docs/detr-recipe.md: ``baseline`` lost AP75 to
  letterboxing).
* ``resized-served``: ``resized-bucket`` padded to the buckets the exporter serves the model
  with (sides 96 or 128: 96x128, 128x96, 128x128) instead of sides rounded up to 16, so that
  training pads exactly as the server does. A model trained on 16-pixel steps lost AP on the
  served buckets' larger padding (`resized`: test AP 0.686 on its training buckets, 0.615 on
  the served ones, through ONNX Runtime; docs/detr-recipe.md): its convolutions see the padding.

With a mask, target boxes are normalised (cx, cy, w, h) to the *unpadded* image. That is
DETR's own convention (facebookresearch/detr normalises targets before the collate pads, and
its ``PostProcess`` scales by the original size: Massa in detr issue 286), and the only one
this model can learn: its sine encoding is normalised by each image's valid extent and no
attention reads a padded key, so the same image in two buckets decodes (almost) alike and
cannot give two different padded-frame boxes. (Hugging Face's ``DetrImageProcessor.pad``
rescales boxes to the padded frame since transformers PR 28363, while its
``post_process_object_detection`` scales by whatever ``target_sizes`` it is given; for a model
trained here the right ``target_sizes`` are the images' own sizes.) A server serving a masked
checkpoint therefore scales ``pred_boxes`` by the image's own width and height, not the bucket's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from models.box_ops import box_xyxy_to_cxcywh
from models.detection_data import Canvas

MAX_SIZE = 128  # the longest side the model takes, in pixels
BUCKET_STEP = 16  # bucket sides are multiples of this (the digits backbone's total stride)
SCALE = 1 / 255  # pixel -> input value; mean 0, std 1, padding 0, as PREPROCESSING below
PREPROCESSING: dict[str, Any] = {
    "color_mode": "L",
    "resize": "letterbox",
    "size": {"height": MAX_SIZE, "width": MAX_SIZE},
    "interpolation": "bilinear",
    "scale": SCALE,
    "mean": [0.0],
    "std": [1.0],
    "pad_value": 0,
    # light ink on a dark canvas: a transparent pixel is the dark background
    "background": (0, 0, 0),
}

# run(images float32 (B, C, H, W), pixel_mask int64 (B, H, W) or None) -> (logits, boxes), numpy.
MaskedRunFn = Callable[[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray]]


@dataclass
class Prepared:
    """A split ready for training.

    Attributes:
        images: letterbox: float32 (N, 1, 128, 128) model inputs; otherwise uint8 (N, 128, 128)
            pixels at the top-left, zeros elsewhere.
        sizes: int64 (N, 2), (height, width) of each image's content in input pixels.
        buckets: int64 (N,), images of one bucket may share a batch.
        targets: per image, ``labels`` int64 (M,) and ``boxes`` float32 (M, 4) normalised cxcywh.
    """

    images: torch.Tensor
    sizes: torch.Tensor
    buckets: torch.Tensor
    targets: list[dict[str, torch.Tensor]]


def bucket_side(side: int, step: int = BUCKET_STEP) -> int:
    """``side`` rounded up to a multiple of ``step`` (pixels)."""
    return -(-side // step) * step


SERVED_SIDES = (MAX_SIZE * 3 // 4, MAX_SIZE)  # the sides of export.detr.serving_buckets: 96 and 128


def served_side(side: int) -> int:
    """The smallest side of the buckets the exporter serves (``SERVED_SIDES``) that holds ``side`` pixels."""
    return next(s for s in SERVED_SIDES if side <= s)


def fit(pixels: np.ndarray, max_size: int = MAX_SIZE) -> tuple[np.ndarray, float]:
    """uint8 (H, W) pixels shrunk (bilinear) so the longer side is at most ``max_size``; and the scale applied."""
    height, width = pixels.shape
    scale = min(1.0, max_size / max(height, width))
    if scale == 1.0:
        return pixels, 1.0
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR)), scale


def enlarge(pixels: np.ndarray, longest: int = MAX_SIZE) -> np.ndarray:
    """uint8 (H, W) pixels resized (bilinear, up or down) so that the longer side is ``longest``.

    Exactly what the server computes for the ``shortest_edge`` policy with ``shortest_edge =
    longest_edge = longest`` (:func:`service.imaging.resize.keep_aspect_size`, then Pillow's
    bilinear resize, as :class:`service.imaging.preprocess.Preprocessor` does), so training and
    serving see the same pixels. The longer side may come out one pixel short (the Hugging Face
    arithmetic truncates it).
    """
    from service.imaging.resize import keep_aspect_size

    height, width = pixels.shape
    new_h, new_w = keep_aspect_size(height, width, longest, longest)
    size = (max(1, new_w), max(1, new_h))
    if size == (width, height):
        return pixels
    return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR))


def pixel_mask(sizes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """int64 (B, height, width): 1 inside each image's (h, w) = ``sizes[b]`` at the top-left, 0 on padding."""
    rows = torch.arange(height)[None, :, None] < sizes[:, 0, None, None]
    cols = torch.arange(width)[None, None, :] < sizes[:, 1, None, None]
    return (rows & cols).to(torch.int64)


class InputFormat:
    """Canvases -> inputs, pixel mask and targets, and outputs -> detections, for one format.

    Args:
        name: the key in ``INPUT_FORMATS``.
        pad_to: "bucket" (each image's own bucket, sides rounded up to ``BUCKET_STEP``), "served"
            (the buckets the exporter serves the model with, sides ``SERVED_SIDES``: training pads
            exactly as the server will) or "max" (``MAX_SIZE`` square); ignored by letterbox.
        resize: "fit" (only an image over ``MAX_SIZE`` shrinks: :func:`fit`) or "longest" (every
            image's longer side becomes ``MAX_SIZE``: :func:`enlarge`); ignored by letterbox.
    """

    def __init__(self, name: str, pad_to: str = "bucket", resize: str = "fit") -> None:
        if resize not in ("fit", "longest"):
            raise ValueError(f"resize must be 'fit' or 'longest', not {resize!r}")
        self.name = name
        self.pad_to = pad_to
        self.resize = resize

    @property
    def mask(self) -> bool:
        """Whether the model takes a ``pixel_mask``."""
        return self.name != "letterbox"

    def preprocessing(self) -> dict[str, Any]:
        """What the checkpoint records as its preprocessing (the manifest's for letterbox)."""
        if not self.mask:
            return dict(PREPROCESSING)
        spec = {k: v for k, v in PREPROCESSING.items() if k not in ("resize", "size")}
        # The server's resize policy that computes this format's resize: shortest_edge as enlarge()
        # does, or fit (only a larger image shrinks); then padding bottom and right, with a pixel mask.
        if self.resize == "longest":
            resize: dict[str, Any] = {"resize": "shortest_edge", "shortest_edge": MAX_SIZE}
        else:
            resize = {"resize": "fit"}
        return {
            **spec,
            **resize,
            "longest_edge": MAX_SIZE,
            # the server pads to export.detr.serving_buckets for "bucket" and "served" alike
            "pad_to": "max" if self.pad_to == "max" else "bucket",
            "bucket_step": BUCKET_STEP if self.pad_to == "bucket" else None,
            "trained_on_served_buckets": self.pad_to == "served",
            "pixel_mask": True,
            "boxes": "normalised cxcywh of the unpadded image",
        }

    def prepare(self, canvases: list[Canvas]) -> Prepared:
        """A split's inputs and targets (see :class:`Prepared`)."""
        if not self.mask:
            return self._letterbox(canvases)
        images = torch.zeros(len(canvases), MAX_SIZE, MAX_SIZE, dtype=torch.uint8)
        sizes, targets = [], []
        for i, canvas in enumerate(canvases):
            if self.resize == "longest":
                pixels = enlarge(canvas.image)
                full_h, full_w = canvas.image.shape  # the whole canvas fills the resized image
                boxes = torch.from_numpy(canvas.boxes) / torch.tensor([full_w, full_h] * 2, dtype=torch.float32)
            else:
                pixels, scale = fit(canvas.image)
                fit_h, fit_w = pixels.shape
                boxes = torch.from_numpy(canvas.boxes) * scale / torch.tensor([fit_w, fit_h] * 2, dtype=torch.float32)
            h, w = pixels.shape
            images[i, :h, :w] = torch.from_numpy(np.array(pixels))  # a writable copy
            sizes.append((h, w))
            targets.append({"labels": torch.from_numpy(canvas.labels), "boxes": box_xyxy_to_cxcywh(boxes)})
        sizes_t = torch.tensor(sizes, dtype=torch.int64).reshape(-1, 2)
        return Prepared(images, sizes_t, self._bucket_ids(sizes_t), targets)

    def _letterbox(self, canvases: list[Canvas]) -> Prepared:
        from service.imaging.preprocess import Preprocessor
        from service.imaging.spec import Preprocessing

        preprocess = Preprocessor(Preprocessing.model_validate(PREPROCESSING))
        inputs, sizes, targets = [], [], []
        for canvas in canvases:
            image = Image.fromarray(canvas.image)  # uint8 (H, W): mode "L"
            inputs.append(torch.from_numpy(preprocess(image)))
            w, h = preprocess.content_size(*image.size)
            sizes.append((h, w))
            sx, sy = preprocess.box_scale(image.size, image.size)
            boxes = torch.from_numpy(canvas.boxes) / torch.tensor([sx, sy, sx, sy], dtype=torch.float32)
            targets.append({"labels": torch.from_numpy(canvas.labels), "boxes": box_xyxy_to_cxcywh(boxes)})
        images = torch.stack(inputs) if inputs else torch.zeros(0, 1, MAX_SIZE, MAX_SIZE)
        return Prepared(
            images, torch.tensor(sizes).reshape(-1, 2), torch.zeros(len(canvases), dtype=torch.int64), targets
        )

    def _bucket_ids(self, sizes: torch.Tensor) -> torch.Tensor:
        if self.pad_to == "served":
            sides = torch.tensor([[served_side(int(v)) for v in size] for size in sizes.tolist()]).reshape(-1, 2)
            return sides[:, 0] * (MAX_SIZE + 1) + sides[:, 1]
        if self.pad_to != "bucket":
            return torch.zeros(len(sizes), dtype=torch.int64)
        sides = (sizes + BUCKET_STEP - 1) // BUCKET_STEP  # (N, 2) bucket rows, cols in steps
        return sides[:, 0] * (MAX_SIZE // BUCKET_STEP + 1) + sides[:, 1]

    def batch(
        self, prepared: Prepared, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[dict[str, torch.Tensor]]]:
        """Images float32 (B, 1, H, W), pixel_mask int64 (B, H, W) or None, and targets, for ``index``.

        H, W: 128 for letterbox and ``padded``; the bucket of the batch's largest image for
        ``bucket`` and ``served``.
        """
        targets = [prepared.targets[i] for i in index.tolist()]
        if not self.mask:
            return prepared.images[index], None, targets
        sizes = prepared.sizes[index]
        if self.pad_to == "bucket":
            height, width = (bucket_side(int(v)) for v in sizes.max(0).values)
        elif self.pad_to == "served":
            height, width = (served_side(int(v)) for v in sizes.max(0).values)
        else:
            height = width = MAX_SIZE
        images = prepared.images[index, :height, :width].to(torch.float32).mul_(SCALE).unsqueeze(1)
        return images, pixel_mask(sizes, height, width), targets

    def detections(
        self,
        run: MaskedRunFn,
        canvases: list[Canvas],
        labels: list[str],
        postprocess: str,
        *,
        threshold: float = 0.0,
        max_detections: int = 100,
        batch_size: int = 50,
    ) -> list[list[dict[str, Any]]]:
        """Per canvas, the detections as the server's format, boxes in the canvas's pixels.

        Args:
            run: the model on a batch (with the mask for the masked formats).
            canvases: the images, each its own size.
            labels, postprocess: the class names and :func:`models.detection_eval.score_rule`'s name.
            threshold, max_detections: as the detect route's (0 and 100: every query, for COCO AP).
        """
        from models.detection_eval import detect_images, score_rule

        if not self.mask:
            from service.imaging.spec import Preprocessing

            spec = Preprocessing.model_validate(PREPROCESSING)
            return detect_images(
                lambda batch: run(batch, None),
                [c.image for c in canvases],
                spec,
                labels,
                threshold=threshold,
                max_detections=max_detections,
                batch_size=batch_size,
                postprocess=postprocess,
            )
        detect = score_rule(postprocess)
        prepared = self.prepare(canvases)
        results: list[list[dict[str, Any]] | None] = [None] * len(canvases)
        for bucket in prepared.buckets.unique().tolist():
            members = torch.nonzero(prepared.buckets == bucket)[:, 0]
            for chunk in members.split(batch_size):
                images, mask, _ = self.batch(prepared, chunk)
                assert mask is not None  # a masked format (self.mask): batch() gives its pixel mask
                logits, boxes = run(images.numpy(), mask.numpy())
                for i, image_logits, image_boxes in zip(chunk.tolist(), logits, boxes, strict=True):
                    height, width = canvases[i].image.shape
                    results[i] = detect(
                        image_logits,
                        image_boxes,
                        labels,
                        threshold=threshold,
                        max_detections=max_detections,
                        box_scale=(float(width), float(height)),  # boxes are relative to the unpadded image
                        image_size=(width, height),
                    )
        return results  # type: ignore[return-value]


INPUT_FORMATS: dict[str, InputFormat] = {
    "letterbox": InputFormat("letterbox"),
    "bucket": InputFormat("bucket", pad_to="bucket"),
    "padded": InputFormat("padded", pad_to="max"),
    "resized-bucket": InputFormat("resized-bucket", pad_to="bucket", resize="longest"),
    "resized-served": InputFormat("resized-served", pad_to="served", resize="longest"),
}


def epoch_batches(buckets: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch's batches of image indices, in training order, each within one bucket.

    With one bucket: a random permutation cut into full batches (the last, partial one
    dropped; all images in one batch when there are fewer than ``batch_size``), the order
    today's recipe has always drawn. With several: the permutation's indices grouped by
    bucket, each group cut into batches (partial ones kept), the batches then shuffled.
    """
    order = torch.randperm(len(buckets), generator=generator)
    if len(buckets) == 0 or bool((buckets == buckets[0]).all()):
        if len(order) <= batch_size:
            return [order]
        return [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    batches = []
    for bucket in buckets.unique().tolist():
        members = order[buckets[order] == bucket]
        batches.extend(members.split(batch_size))
    shuffle = torch.randperm(len(batches), generator=generator)
    return [batches[i] for i in shuffle.tolist()]
