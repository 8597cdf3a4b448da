"""Helpers shared by tests/models' modules: one test module never imports another (tests/test_layout_of_tests.py)."""

from __future__ import annotations

from typing import Any


def detection(label: int, score: float, x0: float, y0: float, x1: float, y1: float) -> dict[str, Any]:
    """One detection in the server's response format (box xmin, ymin, xmax, ymax in pixels)."""
    return {
        "class_id": label,
        "label": str(label),
        "score": score,
        "box": {"xmin": x0, "ymin": y0, "xmax": x1, "ymax": y1},
    }


def ground_truth(*images: list[tuple[int, float, float, float, float]]) -> dict[str, Any]:
    """A COCO instances dict (no categories): per image, its objects as (label, x, y, width, height) in pixels.

    Image ids from 1; annotation ids unique across images (pycocotools indexes annotations by id:
    a shared id let one image's object stand for another's in COCOeval).
    """
    annotations = [
        {
            "id": (i + 1) * 1000 + k,
            "image_id": i + 1,
            "category_id": label,
            "bbox": [x, y, w, h],
            "area": w * h,
            "iscrowd": 0,
        }
        for i, objects in enumerate(images)
        for k, (label, x, y, w, h) in enumerate(objects)
    ]
    return {"images": [{"id": i + 1} for i in range(len(images))], "annotations": annotations}
