"""A synthetic detection set: scikit-learn digits pasted onto noisy canvases, in COCO format.

Every canvas is generated from its own seed ``(seed, split, index)``, so any canvas of any split
can be regenerated alone, bit for bit, without the others:

* canvas: grayscale, width and height each drawn from 64-128 px, a background level (0-70)
  with a linear gradient and Gaussian noise;
* 1-5 digits, each an 8x8 scikit-learn digit enlarged (bilinear) to a square of 12-32 px,
  blended in with a random brightness (150-255) at a random position; digits never overlap;
* each box is tight around the digit's ink (the pixels where the enlarged digit's opacity is
  >= 0.25), not around the pasted square: (xmin, ymin, xmax, ymax) in pixel edges;
* with ``augment`` (the train split of issue 21's generalisation lever), each digit's enlarged
  opacity is first distorted by a random affine map about its centre (:func:`distort`:
  rotation, shear and aspect, the affine distortions of Simard et al. 2003, Sec. 2), so that the
  detector sees more shapes than the 1,149 training digits; the boxes are measured after it;
* the digits come from disjoint pools: ``test`` canvases only from the 360 held-out test digits
  of :func:`models.datasets.load_digits_splits` (the ViT's test digits), ``val`` and ``train``
  from a stratified split of the remaining 1,437.

    python -m models.detection_data --out data/detr-digits

writes ``<split>/<image id>.png`` and ``annotations/<split>.json`` (COCO instances format,
category id = the digit) for the train, val and test splits;
``python -m models.detection_data --example examples/canvas.png`` writes the README's example.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

DIGIT_CLASSES = [str(i) for i in range(10)]
SPLIT_SIZES = {"train": 60_000, "val": 500, "test": 500}
_SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
SEED = 2020  # DETR's year
EXAMPLE_INDEX, EXAMPLE_SCALE = 4, 3  # examples/canvas.png: test canvas 4 (five digits), enlarged 3x
GENERATOR_VERSION = 1  # bump when a change alters the canvases; cached splits are then regenerated

CANVAS_SIZE = (64, 128)  # min, max side in pixels, inclusive
DIGIT_SIZE = (12, 32)  # side of the pasted square, inclusive
MAX_OBJECTS = 5
INK_OPACITY = 0.25  # an enlarged digit's pixels at or above this opacity are ink
PLACEMENT_TRIES = 50
# ``augment``'s affine distortion of a digit: rotation (degrees), shear and aspect, each drawn
# uniformly from +-these (aspect: width x (1 + a), height / (1 + a)).
DISTORTION = {"rotation": 15.0, "shear": 0.2, "aspect": 0.15}


@dataclass(frozen=True)
class Canvas:
    """One generated image and its objects.

    Attributes:
        image: uint8 (H, W) grayscale pixels.
        boxes: float32 (N, 4) boxes (xmin, ymin, xmax, ymax) in pixels, tight around the ink.
        labels: int64 (N,) digit classes 0-9.
    """

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray


@cache
def digit_pools() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The digits each split draws from: ``{split: (values float32 (N, 8, 8) in 0-16, labels (N,))}``.

    ``test``: the 360 held-out digits of the 80/20 split (random_state 0); ``train`` and
    ``val``: the other 1,437 split 80/20 again, stratified (random_state 0): 1,149 and 288.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_rest, x_test, y_rest, y_test = train_test_split(
        digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=0
    )
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=0.2, stratify=y_rest, random_state=0)
    return {
        split: (x.astype(np.float32), y.astype(np.int64))
        for split, x, y in (("train", x_train, y_train), ("val", x_val, y_val), ("test", x_test, y_test))
    }


def _opacity(values: np.ndarray, side: int) -> np.ndarray:
    """An 8x8 digit (0-16) enlarged bilinearly to float32 opacity (side, side) in [0, 1]."""
    image = Image.fromarray((values / 16.0).astype(np.float32))  # float32 (8, 8): mode "F"
    enlarged = image.resize((side, side), Image.Resampling.BILINEAR)
    return np.clip(np.asarray(enlarged, dtype=np.float32), 0.0, 1.0)


def distort(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random affine distortion of a digit's opacity about its centre, same size (:data:`DISTORTION`).

    Rotation, shear and aspect change drawn from ``rng`` (Simard, Steinkraus & Platt 2003,
    "Best practices for convolutional neural networks applied to visual document analysis",
    Sec. 2: affine distortions of handwritten digits); bilinear, ink moved past the square's
    edges is cut.

    Args:
        alpha: float32 (side, side) opacity in [0, 1].

    Returns:
        float32 (side, side) in [0, 1].
    """
    side = alpha.shape[0]
    angle = np.deg2rad(rng.uniform(-DISTORTION["rotation"], DISTORTION["rotation"]))
    shear = rng.uniform(-DISTORTION["shear"], DISTORTION["shear"])
    aspect = 1.0 + rng.uniform(-DISTORTION["aspect"], DISTORTION["aspect"])
    cos, sin = np.cos(angle), np.sin(angle)
    forward = np.array([[cos, -sin], [sin, cos]]) @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag([aspect, 1 / aspect])
    inverse = np.linalg.inv(forward)  # Pillow maps each output pixel (x, y) back to the input
    centre = np.array([side / 2, side / 2])
    offset = centre - inverse @ centre
    coefficients = (inverse[0, 0], inverse[0, 1], offset[0], inverse[1, 0], inverse[1, 1], offset[1])
    image = Image.fromarray(alpha).transform(
        (side, side), Image.Transform.AFFINE, coefficients, Image.Resampling.BILINEAR
    )
    return np.clip(np.asarray(image, dtype=np.float32), 0.0, 1.0)


def ink_box(alpha: np.ndarray) -> tuple[int, int, int, int]:
    """The box (xmin, ymin, xmax, ymax), in pixel edges, around the pixels of opacity >= ``INK_OPACITY``.

    Args:
        alpha: float (h, w) opacity in [0, 1] with at least one ink pixel.
    """
    rows, cols = np.nonzero(alpha >= INK_OPACITY)
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """float32 (H, W): a level, a linear gradient in a random direction, Gaussian noise."""
    level = rng.uniform(0, 70)
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    ramp = (np.cos(angle) * xs / width + np.sin(angle) * ys / height) * rng.uniform(0, 40)
    return level + ramp + rng.normal(0, rng.uniform(3, 15), size=(height, width))


def make_canvas(split: str, index: int, seed: int = SEED, augment: bool = False) -> Canvas:
    """Generate canvas ``index`` of ``split``, deterministically from ``(seed, split, index)``.

    ``augment`` distorts each digit first (:func:`distort`); without it the canvas is the same,
    bit for bit, as before the option existed.
    """
    rng = np.random.default_rng((seed, _SPLIT_IDS[split], index))
    pool_values, pool_labels = digit_pools()[split]
    height, width = (int(v) for v in rng.integers(CANVAS_SIZE[0], CANVAS_SIZE[1] + 1, size=2))
    canvas = _background(rng, height, width)
    boxes: list[tuple[int, int, int, int]] = []
    labels: list[int] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        for _ in range(PLACEMENT_TRIES):
            side = int(rng.integers(DIGIT_SIZE[0], DIGIT_SIZE[1] + 1))
            x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            digit = int(rng.integers(len(pool_labels)))
            alpha = _opacity(pool_values[digit], side)  # (side, side)
            if augment:
                alpha = distort(alpha, rng)
                if not (alpha >= INK_OPACITY).any():  # distorted out of its square: draw again
                    continue
            left, top, right, bottom = ink_box(alpha)
            box = (x0 + left, y0 + top, x0 + right, y0 + bottom)
            # Keep a 2 px gap from every other digit's ink box, so no box holds another's ink.
            if all(box[0] >= b[2] + 2 or b[0] >= box[2] + 2 or box[1] >= b[3] + 2 or b[1] >= box[3] + 2 for b in boxes):
                break
        else:
            continue  # no room left for this digit
        brightness = rng.uniform(150, 255)
        window = canvas[y0 : y0 + side, x0 : x0 + side]
        canvas[y0 : y0 + side, x0 : x0 + side] = window * (1 - alpha) + brightness * alpha
        boxes.append(box)
        labels.append(int(pool_labels[digit]))
    image = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    return Canvas(image, np.asarray(boxes, dtype=np.float32).reshape(-1, 4), np.asarray(labels, dtype=np.int64))


def digit_crops(split: str, count: int, rng: np.random.Generator, size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Single-digit crops for pretraining a backbone to classify: uint8 (count, size, size) and labels (count,).

    Each crop is a background as the canvases have, with one digit of ``split``'s pool enlarged to
    12-``size - 4`` px (the sizes digits reach in a letterboxed 128 px input) at a random place.
    """
    pool_values, pool_labels = digit_pools()[split]
    crops = np.empty((count, size, size), dtype=np.uint8)
    labels = np.empty(count, dtype=np.int64)
    for i in range(count):
        canvas = _background(rng, size, size)
        side = int(rng.integers(DIGIT_SIZE[0], size - 3))
        x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
        digit = int(rng.integers(len(pool_labels)))
        alpha = _opacity(pool_values[digit], side)
        window = canvas[y0 : y0 + side, x0 : x0 + side]
        canvas[y0 : y0 + side, x0 : x0 + side] = window * (1 - alpha) + rng.uniform(150, 255) * alpha
        crops[i] = np.clip(np.rint(canvas), 0, 255)
        labels[i] = pool_labels[digit]
    return crops, labels


def make_split(split: str, count: int | None = None, seed: int = SEED, augment: bool = False) -> list[Canvas]:
    """The first ``count`` canvases (default: all ``SPLIT_SIZES[split]``) of ``split``; ``augment``: :func:`distort`."""
    return [make_canvas(split, i, seed, augment) for i in range(SPLIT_SIZES[split] if count is None else count)]


def coco_categories() -> list[dict[str, Any]]:
    """COCO categories: id = the digit, name = its string."""
    return [{"id": i, "name": name, "supercategory": "digit"} for i, name in enumerate(DIGIT_CLASSES)]


def to_coco(canvases: list[Canvas], file_names: list[str] | None = None) -> dict[str, Any]:
    """COCO instances annotations for ``canvases``; image ``i`` gets id ``i + 1`` (ids start at 1).

    Boxes are COCO's [x, y, width, height] in pixels; ``area`` is the box area.
    """
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, canvas in enumerate(canvases):
        height, width = canvas.image.shape
        name = file_names[i] if file_names else f"{i + 1:05d}.png"
        images.append({"id": i + 1, "file_name": name, "width": width, "height": height})
        for box, label in zip(canvas.boxes.tolist(), canvas.labels.tolist(), strict=True):
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": int(label),
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    return {"images": images, "annotations": annotations, "categories": coco_categories()}


def write_split(canvases: list[Canvas], out: Path, split: str, info: dict[str, Any] | None = None) -> Path:
    """Write ``<out>/<split>/<id>.png`` and ``<out>/annotations/<split>.json``; returns the JSON path."""
    (out / split).mkdir(parents=True, exist_ok=True)
    names = [f"{i + 1:05d}.png" for i in range(len(canvases))]
    for canvas, name in zip(canvases, names, strict=True):
        Image.fromarray(canvas.image).save(out / split / name)  # uint8 (H, W): mode "L"
    path = out / "annotations" / f"{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"info": info or {}, **to_coco(canvases, names)}))
    return path


def _fingerprint(split: str, count: int, seed: int, augment: bool = False) -> dict[str, Any]:
    return {
        "generator": "models.detection_data",
        "version": GENERATOR_VERSION,
        "split": split,
        "count": count,
        "seed": seed,
        **({"augment": DISTORTION} if augment else {}),  # absent without: earlier caches stay valid
    }


def read_split(root: Path, split: str) -> tuple[list[Canvas], dict[str, Any]]:
    """Read a split written by :func:`write_split`: the canvases and the COCO dict."""
    coco = json.loads((root / "annotations" / f"{split}.json").read_text())
    by_image: dict[int, list[dict[str, Any]]] = {image["id"]: [] for image in coco["images"]}
    for annotation in coco["annotations"]:
        by_image[annotation["image_id"]].append(annotation)
    canvases = []
    for image in coco["images"]:
        with Image.open(root / split / image["file_name"]) as file:
            pixels = np.asarray(file.convert("L"))
        objects = by_image[image["id"]]
        boxes = np.asarray([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in objects)], dtype=np.float32)
        labels = np.asarray([a["category_id"] for a in objects], dtype=np.int64)
        canvases.append(Canvas(pixels, boxes.reshape(-1, 4), labels))
    return canvases, coco


def load_split(
    split: str, root: Path | None = None, count: int | None = None, seed: int = SEED, augment: bool = False
) -> list[Canvas]:
    """A split's canvases, read from ``root`` when it holds this exact split, else generated.

    With ``root``, a freshly generated split is also written there (so the next call reads
    it); a split written by another version of this generator, seed or ``augment`` is regenerated.
    """
    count = SPLIT_SIZES[split] if count is None else count
    fingerprint = _fingerprint(split, count, seed, augment)
    path = root / "annotations" / f"{split}.json" if root else None
    if root is not None and path is not None and path.exists():
        try:
            canvases, coco = read_split(root, split)
        except (OSError, ValueError, KeyError):  # a partly written or damaged cache: regenerate
            coco = {}
        if coco.get("info") == fingerprint:
            return canvases
    canvases = make_split(split, count, seed, augment)
    if root is not None:
        write_split(canvases, root, split, info=fingerprint)
    return canvases


def example_canvas(index: int = EXAMPLE_INDEX, scale: int = EXAMPLE_SCALE) -> Canvas:
    """Test canvas ``index`` enlarged ``scale`` times (nearest neighbour), boxes scaled alike (the README's example)."""
    canvas = make_canvas("test", index)
    height, width = canvas.image.shape
    image = Image.fromarray(canvas.image).resize((width * scale, height * scale), Image.Resampling.NEAREST)
    return Canvas(np.asarray(image), canvas.boxes * scale, canvas.labels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/detr-digits"))
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--example", type=Path, default=None, help="only write the README's example canvas here")
    args = parser.parse_args(argv)
    if args.example is not None:
        example = example_canvas()
        Image.fromarray(example.image).save(args.example)
        for box, label in zip(example.boxes.tolist(), example.labels.tolist(), strict=True):
            print(f"{label}: xmin {box[0]:g}, ymin {box[1]:g}, xmax {box[2]:g}, ymax {box[3]:g}")
        return
    for split, count in SPLIT_SIZES.items():
        canvases = load_split(split, args.out, count, args.seed)
        objects = sum(len(c.labels) for c in canvases)
        print(f"{split}: {count} canvases, {objects} objects -> {args.out / 'annotations' / f'{split}.json'}")


if __name__ == "__main__":
    main()
